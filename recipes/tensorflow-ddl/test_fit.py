"""Recipe test: WMLCE's four steps, one epoch of model.fit on 2 ranks; the weights must
end identical on both ranks."""

import ddl
import keras
import numpy as np

import ddl_core

keras.utils.set_random_seed(ddl.rank())
model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(3)])
model.compile(optimizer=keras.optimizers.SGD(0.01 * ddl.size()), loss="mse")
x = np.random.default_rng(ddl.rank()).standard_normal((8, 6)).astype(np.float32)
model.fit(x, x[:, :3], batch_size=4, epochs=1, verbose=0,
          callbacks=[ddl.DDLCallback(), ddl.DDLGlobalVariablesCallback()])
w = np.ascontiguousarray(model.get_weights()[0], dtype=np.float32).reshape(1, -1)
everyone = ddl_core.allgather(w)
assert (everyone == everyone[0]).all(), "ranks diverged"
print(f"tensorflow-ddl OK {ddl.rank()}", flush=True)  # one write: ranks share a stdout

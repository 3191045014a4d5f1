"""WMLCE's four tf.keras steps with `import ddl`: model.fit on 2 ranks gives identical
weights equal to one process trained on the concatenated batches; each callback's effect
is checked (variables broadcast from rank 0, metrics averaged, warmup lr); then a custom
loop with DistributedGradientTape."""

import sys

import ddl  # step 1
import keras
import numpy as np
import tensorflow as tf

import ddl_core

mode = sys.argv[1]  # fit | tape
r, n = ddl.rank(), ddl.size()
B, STEPS, LR = 4, 3, 0.05


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3)])


def data(rank):
    g = np.random.default_rng(rank)
    return (g.standard_normal((B * STEPS, 6)).astype(np.float32),
            g.integers(0, 3, B * STEPS).astype(np.int64))


def gather_all(arr):
    return ddl_core.allgather(np.ascontiguousarray(arr, dtype=np.float32).reshape(1, -1))


model = make_model(100 + r)  # different on purpose: the broadcast must fix it
init = [np.asarray(w) for w in model.get_weights()]
init0 = [gather_all(w)[0].reshape(w.shape) for w in init]  # rank 0's, for the reference
assert n == 1 or not np.array_equal(gather_all(init[0])[0], gather_all(init[0])[1])
x, y = data(r)  # step 2: every rank has its own section of the data
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

if mode == "fit":
    class Record(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.loss = []

        def on_epoch_end(self, epoch, logs=None):
            self.loss.append(float(logs["loss"]))

    before, after = Record(), Record()
    warm = ddl.LearningRateWarmupCallback(initial_lr=LR, warmup_epochs=3, steps_per_epoch=1)
    model.compile(optimizer=keras.optimizers.SGD(LR, momentum=0.9), loss=loss_fn)
    # step 4: DDLCallback first, DDLGlobalVariablesCallback last
    cbs = [before, ddl.DDLCallback(), after, ddl.DDLGlobalVariablesCallback()]
    model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=cbs)
    # metrics: averaged after DDLCallback, local before it
    assert np.allclose(after.loss[0], ddl_core.allreduce(np.array([before.loss[0]]), op="avg")[0])
    assert np.all(gather_all([after.loss[0]]) == after.loss[0])
    if n > 1:
        assert not np.all(gather_all([before.loss[0]]) == before.loss[0]), "local losses equal?"
    # warmup: lr/size at the start, rising linearly (checked on a fresh fit of 1 step)
    model2 = make_model(5)
    model2.compile(optimizer=keras.optimizers.SGD(LR), loss=loss_fn)
    lrs = []

    class LR_(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            lrs.append(float(np.asarray(self.model.optimizer.learning_rate)))

    model2.fit(x[:B], y[:B], batch_size=B, epochs=2, verbose=0, callbacks=[warm, LR_()])
    want = [LR * ddl.warmup_factor(e, 3, n) for e in (0, 1)]
    assert np.allclose(lrs, want), (lrs, want)
else:
    opt = keras.optimizers.SGD(LR, momentum=0.9)
    opt.build(model.trainable_variables)
    ddl.broadcast_variables(model.variables + list(opt.variables), root_rank=0)
    ddl.disable_fit_averaging()  # the tape averages; the optimizer must not do it again

    @tf.function
    def train_step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        tape = ddl.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply(grads, model.trainable_variables)
        return loss

    for s in range(STEPS):
        train_step(x[s * B:(s + 1) * B], y[s * B:(s + 1) * B])

# the single-process reference on the concatenated batches (fused order: rank 0's batch s,
# then rank 1's batch s, ...)
ddl.disable_fit_averaging()
parts = [data(k) for k in range(n)]
ref = make_model(0)
ref.set_weights(init0)
ref_opt = keras.optimizers.SGD(LR, momentum=0.9)
for s in range(STEPS):
    xb = np.concatenate([p[0][s * B:(s + 1) * B] for p in parts])
    yb = np.concatenate([p[1][s * B:(s + 1) * B] for p in parts])
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, ref(xb, training=True))
    ref_opt.apply(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables)

for w, q in zip(model.get_weights(), ref.get_weights(), strict=True):
    everyone = gather_all(w)
    assert np.all(everyone == everyone[0]), "weights differ between ranks"
    assert np.allclose(w, q, atol=1e-5), np.abs(w - q).max()
print(f"OK {mode}", flush=True)

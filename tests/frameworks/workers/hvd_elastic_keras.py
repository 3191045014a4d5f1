"""Elastic Horovod's Keras state on a healthy 2-rank job: KerasState.sync makes every
rank's weights rank 0's, restore goes back to the last commit, and hvd.elastic.run
retries after a HorovodInternalError with the committed weights; the callbacks keep
state.batch and state.epoch."""

from __future__ import annotations

import sys

import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf
from checks import bad, expect

hvd.init()
r = hvd.rank()
tf.random.set_seed(10 + r)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2)])
model.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.SGD(0.1)), loss="mse")
state = hvd.elastic.KerasState(model, batch=0, epoch=0)
state.sync()
w = [v.numpy() for v in model.variables]
allw = hvd.allgather_object([a.tolist() for a in w])
expect(all(x == allw[0] for x in allw), "KerasState.sync: weights differ")
state.commit()
model.variables[0].assign(model.variables[0] + 1.0)
state.restore()
expect(all(np.array_equal(a, v.numpy()) for a, v in zip(w, model.variables, strict=True)),
       "KerasState.restore: not the committed weights")
x, y = np.ones((8, 4), "float32"), np.zeros((8, 2), "float32")
tries: list[int] = []


@hvd.elastic.run
def train(state: hvd.elastic.KerasState) -> None:
    tries.append(state.epoch)
    cbs = [hvd.elastic.CommitStateCallback(state), hvd.elastic.UpdateBatchStateCallback(state),
           hvd.elastic.UpdateEpochStateCallback(state)]
    model.fit(x, y, batch_size=4, epochs=2 - state.epoch, callbacks=cbs, verbose=0)
    if len(tries) == 1:
        raise hvd.HorovodInternalError("injected")


train(state)
# (the commit at epoch 1's end runs before UpdateEpochStateCallback moves state.epoch on,
# in Horovod's own callback order, so the retry redoes epoch 1)
expect(tries == [0, 1], f"run entered at epochs {tries}")
expect(state.epoch == 2 and state.batch == 0, f"epoch {state.epoch} batch {state.batch}")
if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_elastic_keras", flush=True)

"""A Horovod Keras script (horovod.tensorflow.keras or horovod.keras) unchanged on
horovod-ddl: the documented recipe trains to the single-process result; the TF API
(allreduce ops, allgather, broadcast, DistributedGradientTape) is checked too."""

import sys

import keras
import numpy as np
import tensorflow as tf

if sys.argv[1] == "horovod.keras":
    import horovod.keras as hvd
else:
    import horovod.tensorflow.keras as hvd
import horovod.tensorflow as hvd_tf

hvd.init()
r, n = hvd.rank(), hvd.size()
B, STEPS, LR = 4, 3, 0.05

# TF API
t = tf.constant([1.0, 2.0]) * (r + 1)
tot = sum(range(1, n + 1))
assert np.allclose(hvd_tf.allreduce(t, op=hvd_tf.Sum), np.array([1.0, 2.0]) * tot)
assert np.allclose(hvd_tf.allreduce(t), np.array([1.0, 2.0]) * tot / n)
assert np.allclose(hvd_tf.allreduce(t, op=hvd_tf.Max), np.array([1.0, 2.0]) * n)
ag = hvd_tf.allgather(tf.fill([r + 1, 2], float(r)))
assert ag.shape[0] == sum(k + 1 for k in range(n))
assert np.allclose(hvd_tf.broadcast(tf.constant([float(r)]), root_rank=n - 1), [n - 1])
assert np.allclose(hvd.allreduce(np.array([float(r)]), op=hvd.Sum), [sum(range(n))])
assert hvd.broadcast_object({"a": r}, root_rank=0) == {"a": 0}
w = tf.Variable([1.0, 1.0])
with tf.GradientTape() as tape:
    loss = tf.reduce_sum(w * float(r + 1))
tape = hvd_tf.DistributedGradientTape(tape)
assert np.allclose(tape.gradient(loss, [w])[0], [tot / n, tot / n])


def make_model(seed):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                             keras.layers.Dense(3)])


def data(rank):
    g = np.random.default_rng(rank)
    return (g.standard_normal((B * STEPS, 6)).astype(np.float32),
            g.integers(0, 3, B * STEPS).astype(np.int64))


model = make_model(100 + r)
init0 = hvd.broadcast_object([np.asarray(v) for v in model.get_weights()], root_rank=0)
x, y = data(r)
loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
opt = keras.optimizers.SGD(LR * n, momentum=0.9)  # Horovod: scale lr by size
opt = hvd.DistributedOptimizer(opt)
model.compile(optimizer=opt, loss=loss_fn)
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
             hvd.callbacks.MetricAverageCallback()]
hist = model.fit(x, y, batch_size=B, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
avg = hist.history["loss"][0]
assert np.allclose(hvd.allgather(np.array([avg])), avg), "metric not averaged"

parts = [data(k) for k in range(n)]
ref = make_model(0)
ref.set_weights(init0)
ref_opt = keras.optimizers.SGD(LR * n, momentum=0.9)
for s in range(STEPS):
    xb = np.concatenate([p[0][s * B:(s + 1) * B] for p in parts])
    yb = np.concatenate([p[1][s * B:(s + 1) * B] for p in parts])
    with tf.GradientTape() as tape:
        loss = loss_fn(yb, ref(xb, training=True))
    ref_opt.apply(tape.gradient(loss, ref.trainable_variables), ref.trainable_variables)
for wt, q in zip(model.get_weights(), ref.get_weights(), strict=True):
    everyone = hvd.allgather(wt.reshape(1, -1))
    assert np.all(everyone == everyone[0]), "weights differ between ranks"
    assert np.allclose(wt, q, atol=1e-5), np.abs(wt - q).max()

# Horovod's local_variables (kept per rank) and LearningRateScheduleCallback (lr =
# initial_lr * multiplier(epoch) from start_epoch until end_epoch).
m2 = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2, trainable=False),
                       keras.layers.Dense(1, trainable=False)])
for v in m2.variables:
    v.assign(tf.fill(v.shape, float(r)))
m2.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
seen = []


class Lr(keras.callbacks.Callback):
    def on_epoch_end(self, epoch, logs=None):
        seen.append(float(np.asarray(self.model.optimizer.learning_rate)))


m2.fit(np.ones((2, 2), np.float32), np.ones((2, 1), np.float32), epochs=4, verbose=0,
       callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(
                      n - 1, local_variables=m2.layers[0].variables),
                  hvd.callbacks.LearningRateScheduleCallback(
                      0.1, lambda e: e + 1, start_epoch=1, end_epoch=3), Lr()])
assert all(np.allclose(v, r) for v in m2.layers[0].get_weights()), "local variables"
assert all(np.allclose(v, n - 1) for v in m2.layers[1].get_weights()), "broadcast"
assert np.allclose(seen, [0.1, 0.2, 0.3, 0.3]), seen
print("OK hvd_keras", flush=True)

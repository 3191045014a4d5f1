"""Process sets and join on horovod-ddl's TensorFlow and Keras front ends, at 3 ranks:
the collectives with process_set= (eager and in a tf.function), Horovod's error outside
a set, DistributedGradientTape on a set, Keras's allreduce and DistributedOptimizer (fit)
on a set, then join with uneven numbers of steps."""

from __future__ import annotations

import sys

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf
from checks import bad, expect

ps = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[ps])
r, n = hvd.rank(), hvd.size()
assert n == 3, "this worker runs on 3 ranks"
m = [0, 2]
expect(ps.process_set_id == 1 and ps.size() == 2 and ps.included() == (r in m), "set")
if r in m:
    me = m.index(r)
    x = tf.constant([1.0, 2.0]) * (r + 1)
    expect(np.allclose(hvd.allreduce(x, op=hvd.Sum, process_set=ps).numpy(),
                       np.array([1.0, 2.0]) * 4), "eager sum")

    @tf.function
    def averaged(t: tf.Tensor) -> tf.Tensor:
        return hvd.allreduce(t, process_set=ps, name="fn")

    expect(np.allclose(averaged(x).numpy(), np.array([1.0, 2.0]) * 2), "tf.function average")
    g = hvd.grouped_allreduce([tf.ones(2) * r, tf.ones(3)], op=hvd.Sum, process_set=ps)
    expect(np.allclose(g[0].numpy(), 2.0) and np.allclose(g[1].numpy(), 2.0), "grouped")
    ag = hvd.allgather(tf.fill([r + 1, 2], float(r)), process_set=ps).numpy()
    expect(np.array_equal(ag, np.concatenate([np.full((q + 1, 2), float(q)) for q in m])),
           f"allgather {ag}")
    b = hvd.broadcast(tf.fill([3], float(r)), root_rank=2, process_set=ps).numpy()
    expect(np.array_equal(b, np.full(3, 2.0)), "broadcast from world rank 2")
    got, rs = hvd.alltoall(tf.range(3, dtype=tf.float32) + 10 * r, splits=[1, 2],
                           process_set=ps)
    off = [0, 1][me]
    want = np.concatenate([np.arange(off, off + [1, 2][me], dtype=np.float32) + 10 * q
                           for q in m])
    expect(np.array_equal(got.numpy(), want) and rs.numpy().tolist() == [[1, 2][me]] * 2,
           f"alltoall {got.numpy()} {rs.numpy()}")
    rs = hvd.reducescatter(tf.range(5, dtype=tf.float32), op=hvd.Sum, process_set=ps).numpy()
    expect(np.array_equal(rs, (np.arange(5, dtype=np.float32) * 2)[[0, 1, 2] if me == 0
                                                                    else [3, 4]]),
           f"reducescatter on the set {rs}")
    hvd.barrier(process_set=ps)
    expect(hvd.broadcast_object({"r": r} if r == 0 else None, root_rank=0,
                                process_set=ps) == {"r": 0}, "broadcast_object")
    expect(hvd.allgather_object(r, process_set=ps) == m, "allgather_object")
    w = tf.Variable([1.0, 1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(w * float(r + 1))
    tape = hvd.DistributedGradientTape(tape, process_set=ps)
    (grad,) = tape.gradient(loss, [w])
    expect(np.allclose(grad.numpy(), 2.0), f"tape on the set {grad.numpy()}")  # (1+3)/2
    k = hvdk.allreduce(np.array([float(r)]), op=hvd.Sum, process_set=ps)
    expect(np.allclose(k, 2.0), "keras allreduce on the set")
    try:
        hvd.allreduce(tf.ones(2 + me), name="bad", process_set=ps)
        bad.append("mismatch did not raise")
    except tf.errors.FailedPreconditionError as e:
        expect("disagree" in str(e), f"mismatch message {e}")
else:
    try:
        hvd.allreduce(tf.ones(2), process_set=ps)
        bad.append("allreduce outside the set did not raise")
    except ValueError as e:
        expect("not a part of process set" in str(e), f"outside message {e}")

# Keras's DistributedOptimizer on the set, through fit (a tf.function): members average
# their gradients, rank 1 (outside the set) applies its own. One sample, mse, no bias:
# dL/dw = 2 * (2 (r + 1)) * (r + 1) = 4 (r + 1)^2 -> members (4 + 36) / 2 = 20, rank 1: 16.
import keras  # noqa: E402

model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, use_bias=False,
                                                                kernel_initializer="ones")])
opt = hvdk.DistributedOptimizer(keras.optimizers.SGD(0.01), process_set=ps)
model.compile(optimizer=opt, loss="mse")
model.fit(np.ones((1, 2), "float32") * (r + 1), np.zeros((1, 1), "float32"), batch_size=1,
          epochs=1, verbose=0, shuffle=False)
want = 1.0 - 0.01 * (20.0 if r in m else 16.0)
expect(np.allclose(model.get_weights()[0], want), f"keras optimizer on a set "
       f"{model.get_weights()[0].ravel()} != {want}")

wrs = hvd.reducescatter(tf.ones([4, 2]) * (r + 1), op=hvd.Sum).numpy()
expect(wrs.shape == ([2, 1, 1][r], 2) and np.allclose(wrs, 6.0), f"world reducescatter {wrs}")

# join with uneven steps on the world: rank q runs q + 1 steps.
for step in range(r + 1):
    active = [q for q in range(n) if step < q + 1]
    s = hvd.allreduce(tf.fill([2], float(r + 1)), op=hvd.Sum, name="s").numpy()
    expect(np.allclose(s, sum(q + 1 for q in active)), f"join step {step}: {s}")
expect(hvd.join() == n - 1, "join's last rank")
expect(hvdk.join() in range(n), "keras join with everyone at once")
hvd.shutdown()

if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_sets_tf", flush=True)

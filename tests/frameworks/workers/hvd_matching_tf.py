"""Horovod's matching contract on horovod-ddl (TensorFlow): named tensors from several
threads meet by name whatever order they are submitted in; shape, dtype and root
mismatches raise FailedPreconditionError (eager) on every rank and the job goes on."""

from __future__ import annotations

import random
import sys
import threading

import horovod.tensorflow as hvd
import horovod.tensorflow.keras as hvdk
import numpy as np
import tensorflow as tf

hvd.init()
r, n = hvd.rank(), hvd.size()
bad: list[str] = []


def expect(cond: bool, what: str) -> None:
    if not cond:
        bad.append(what)


def val(rank: int, i: int, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    return np.random.default_rng(100 * rank + i).integers(-50, 50, shape).astype(np.float32)


def total(i: int, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    return sum(val(q, i, shape) for q in range(n))


# 1. Named allreduces from 8 threads at once, started in a different random order on each
#    rank: each meets its own name on the other ranks.
results: dict[int, np.ndarray] = {}


def worker(i: int) -> None:
    results[i] = hvd.allreduce(tf.constant(val(r, i)), op=hvd.Sum, name=f"t{i}").numpy()


ids = list(range(8))
random.Random(r).shuffle(ids)
threads = [threading.Thread(target=worker, args=(i,)) for i in ids]
for t in threads:
    t.start()
for t in threads:
    t.join()
for i in range(8):
    expect(i in results and np.array_equal(results[i], total(i)), f"thread t{i}: wrong sum")

# 2. The other collectives, named.
g = hvd.grouped_allreduce([tf.constant(val(r, 20)), tf.constant(val(r, 21, (5,)))],
                          op=hvd.Sum, name="grp")
expect(np.array_equal(g[0].numpy(), total(20)) and np.array_equal(g[1].numpy(),
                                                                   total(21, (5,))), "grouped")
ag = hvd.allgather(tf.fill([r + 1, 2], float(r)), name="ag")
expect(np.array_equal(ag.numpy(), np.concatenate([np.full((q + 1, 2), float(q))
                                                  for q in range(n)])), "allgather")
b = hvd.broadcast(tf.fill([2, 3], float(r)), root_rank=n - 1, name="bc")
expect(np.array_equal(b.numpy(), np.full((2, 3), float(n - 1))), "broadcast")
got, rs = hvd.alltoall(tf.range(2 * n, dtype=tf.float64) + 100 * r, splits=[2] * n, name="a2a")
expect(rs.numpy().tolist() == [2] * n, f"alltoall splits {rs}")
expect(np.array_equal(got.numpy(), np.concatenate([np.arange(2 * r, 2 * r + 2) + 100.0 * q
                                                   for q in range(n)])), "alltoall")
expect(np.allclose(hvdk.allreduce(np.array([float(r)]), op=hvd.Sum, name="k"),
                   [sum(range(n))]), "keras allreduce")


@tf.function
def in_graph(x: tf.Tensor) -> tf.Tensor:
    return hvd.allreduce(x, op=hvd.Sum)  # named from the tensor, as Horovod does


expect(np.array_equal(in_graph(tf.constant(val(r, 30))).numpy(), total(30)), "tf.function")

# 3. Mismatches: the same error on every rank, and the next collective works.
other = r == n - 1
cases = [
    ("Mismatched allreduce tensor shapes",
     lambda: hvd.allreduce(tf.ones((3, 2) if other else (2, 3)), name="shape")),
    ("Mismatched data types",
     lambda: hvd.allreduce(tf.ones(4, dtype=tf.float64 if other else tf.float32), name="dt")),
    ("Mismatched allgather tensor shapes",
     lambda: hvd.allgather(tf.ones((2, 4 if other else 3)), name="dims")),
    ("Mismatched broadcast root ranks",
     lambda: hvd.broadcast(tf.ones(3), root_rank=1 if other else 0, name="root")),
]
for topic, fn in cases:
    try:
        fn()
        bad.append(f"{topic}: nothing raised")
    except tf.errors.FailedPreconditionError as e:
        expect(topic in e.message and f"rank {r}" in e.message, f"unclear: {e.message}")
    nxt = hvd.allreduce(tf.ones(2), op=hvd.Sum, name=f"after {topic}")
    expect(np.array_equal(nxt.numpy(), np.full(2, float(n))), f"{topic}: the next allreduce")


@tf.function
def graph_mismatch() -> tf.Tensor:
    return hvd.allreduce(tf.ones((3, 2) if other else (2, 3)), name="graph shape")


try:
    graph_mismatch()
    bad.append("tf.function mismatch: nothing raised")
except tf.errors.OpError as e:  # TensorFlow reports it as UnknownError inside a graph
    expect("Mismatched allreduce tensor shapes" in e.message, f"unclear: {e.message}")
expect(np.array_equal(hvd.allreduce(tf.ones(2), op=hvd.Sum).numpy(), np.full(2, float(n))),
       "after the tf.function mismatch")

if bad:
    print(f"rank {r}: {len(bad)} problems: {bad[:6]}", flush=True)
    sys.exit(1)
print("OK hvd_matching_tf", flush=True)

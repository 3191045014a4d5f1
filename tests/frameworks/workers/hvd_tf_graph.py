"""horovod.tensorflow in a TF1-style graph (what Horovod's own test_tensorflow.py runs
besides eager mode), at 2-3 ranks: many independent collectives fetched in one
session.run must run in the same order on every rank (each blocks its thread until
every rank has it), so each is chained to the one built before it; results checked."""

from __future__ import annotations

import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

hvd.init()
r, n = hvd.rank(), hvd.size()
tot = sum(k + 1 for k in range(n))
bad: list[str] = []

g = tf.Graph()
with g.as_default():
    xs = [tf.constant(np.full((k + 1,), float(r + 1), np.float32)) for k in range(12)]
    sums = [hvd.allreduce(x, op=hvd.Sum) for x in xs]
    gathered = hvd.allgather(tf.constant(np.full((r + 1, 2), r, np.int32)))
    bcast = hvd.broadcast(tf.constant([float(r)] * 3), root_rank=n - 1)
    pyfuncs = [op for op in g.get_operations() if op.type == "PyFunc"]
    if len(pyfuncs) != 14:
        bad.append(f"{len(pyfuncs)} collective ops, not 14")
    for prev, op in zip(pyfuncs, pyfuncs[1:], strict=False):
        if op.control_inputs != [prev]:
            bad.append(f"{op.name} is not chained to {prev.name}: {op.control_inputs}")
    with tf.compat.v1.Session(graph=g) as sess:
        # Fetched in reverse: the chain, not the fetch order, decides the order.
        out = sess.run([bcast, gathered, *reversed(sums)])
for k, s in enumerate(reversed(out[2:])):
    if not np.array_equal(s, np.full((k + 1,), float(tot), np.float32)):
        bad.append(f"sum {k}: {s}")
want = np.concatenate([np.full((k + 1, 2), k, np.int32) for k in range(n)])
if not np.array_equal(out[1], want):
    bad.append(f"allgather {out[1]}")
if not np.array_equal(out[0], [float(n - 1)] * 3):
    bad.append(f"broadcast {out[0]}")

if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_tf_graph", flush=True)

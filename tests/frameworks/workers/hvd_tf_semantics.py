"""horovod.tensorflow as Horovod documents it, at 3 ranks: dtypes libddl lacks (uint16,
int16, bool, uint32, uint64) through allgather/broadcast/alltoall unchanged; the
allreduce of tf.IndexedSlices stays sparse (gathered values and indices; other ops and
scale factors are NotImplementedError); integer pre/post scaling in float64;
grouped_allgather, grouped_reducescatter with scale factors, reducescatter's scalar
error, broadcast_ in place, and broadcast_global_variables' RuntimeError when eager."""

from __future__ import annotations

import sys

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf

hvd.init()
r, n = hvd.rank(), hvd.size()
bad: list[str] = []


def expect(cond: bool, what: str) -> None:
    if not cond:
        bad.append(what)


def raises(exc: type[BaseException], fn, what: str) -> None:  # noqa: ANN001
    try:
        fn()
    except exc:
        return
    except BaseException as e:  # noqa: BLE001
        bad.append(f"{what}: raised {type(e).__name__}: {e!s:.200}")
        return
    bad.append(f"{what}: did not raise")


for dt in (tf.uint16, tf.int16, tf.bool, tf.uint32, tf.uint64):
    npdt = dt.as_numpy_dtype
    unsigned = dt in (tf.uint16, tf.uint32, tf.uint64)

    def val(k: int, dt: tf.DType = dt, unsigned: bool = unsigned) -> object:
        if dt == tf.bool:
            return k % 2 == 1
        return 60000 + k if unsigned else -30000 + k

    g = hvd.allgather(tf.constant(np.full((r + 1, 2), val(r), npdt))).numpy()
    want = np.concatenate([np.full((k + 1, 2), val(k), npdt) for k in range(n)])
    expect(g.dtype == npdt and np.array_equal(g, want), f"{dt.name} allgather {g}")
    b = hvd.broadcast(tf.constant(np.full(3, val(r), npdt)), n - 1).numpy()
    expect(np.array_equal(b, np.full(3, val(n - 1), npdt)), f"{dt.name} broadcast {b}")
    a = hvd.alltoall(tf.constant(np.full(2 * n, val(r), npdt)))
    want = np.concatenate([np.full(2, val(k), npdt) for k in range(n)])
    expect(np.array_equal(a.numpy(), want), f"{dt.name} alltoall {a.numpy()}")

sl = tf.IndexedSlices(tf.ones([1, 3]) * (r + 1), tf.constant([r]), dense_shape=tf.constant([n, 3]))
for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / n)):
    out = hvd.allreduce(sl, op=op)
    expect(isinstance(out, tf.IndexedSlices), f"{op}: {type(out).__name__}, not IndexedSlices")
    dense = tf.math.unsorted_segment_sum(out.values, out.indices, n).numpy()
    want = np.stack([np.full(3, (k + 1) * scale) for k in range(n)])
    expect(np.allclose(dense, want), f"IndexedSlices {op}: {dense}")
for op in (hvd.Min, hvd.Max, hvd.Product, hvd.Adasum):
    raises(NotImplementedError, lambda op=op: hvd.allreduce(sl, op=op), f"slices {op}")
raises(NotImplementedError, lambda: hvd.allreduce(sl, op=hvd.Sum, prescale_factor=0.5),
       "slices prescale")

ga = hvd.grouped_allgather([tf.ones([r + 1]), tf.fill([1, 2], float(r))])
expect(ga[0].shape[0] == sum(k + 1 for k in range(n)) and
       np.array_equal(ga[1].numpy(), np.stack([[float(k)] * 2 for k in range(n)])),
       "grouped_allgather")
rs = hvd.grouped_reducescatter([tf.ones([2 * n]), tf.ones([n, 2]) * (r + 1)], op=hvd.Sum,
                               prescale_factor=0.5, postscale_factor=4.0)
expect(np.allclose(rs[0].numpy(), np.full(2, 2.0 * n)) and
       np.allclose(rs[1].numpy(), np.full((1, 2), 2.0 * sum(k + 1 for k in range(n)))),
       f"grouped_reducescatter {[x.numpy() for x in rs]}")
raises(ValueError, lambda: hvd.reducescatter(tf.constant(1.0)), "reducescatter scalar")
vals = [-7, -3, 5, 9, 11, 13]
xi = tf.constant(vals, tf.int32) * (r + 1)
pre = hvd.allreduce(xi, op=hvd.Sum, prescale_factor=0.7).numpy()
want = [sum(int(0.7 * (v * (k + 1))) for k in range(n)) for v in vals]  # int(): truncation
expect(pre.dtype == np.int32 and pre.tolist() == want, f"int prescale {pre} != {want}")
post = hvd.allreduce(xi, op=hvd.Sum, postscale_factor=0.7).numpy()
want = [int(0.7 * (v * sum(k + 1 for k in range(n)))) for v in vals]
expect(post.tolist() == want, f"int postscale {post} != {want}")
v = tf.Variable([float(r)] * 2)
hvd.broadcast_([v], n - 1)
expect(np.allclose(v.numpy(), float(n - 1)), f"broadcast_ {v.numpy()}")
raises(RuntimeError, lambda: hvd.broadcast_global_variables(0), "eager global variables")

if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_tf_semantics", flush=True)

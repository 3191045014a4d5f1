"""horovod.tensorflow's collectives have Horovod's gradients, at 3 ranks: eagerly
(GradientTape), inside a tf.function and in a TF1 graph (tf.gradients), on the global set
and on the process set [0, 2]. What Horovod's mpi_ops.py registers:
allreduce -> the allreduce of the output's gradient (same op and scale factors);
grouped_allreduce likewise; allgather -> this rank's rows of the set's average of the
output gradients; broadcast -> that average on the root, zeros elsewhere; alltoall ->
the output gradient sent back the way its rows came; reducescatter -> the output
gradients allgathered, times the set's size for Sum and times the factors. Every
rank's loss weights its outputs by (rank + 1), so the expected values below, computed by
hand from the members' ranks, tell which rank's gradient went where."""

from __future__ import annotations

import sys
from collections.abc import Callable

import horovod.tensorflow as hvd
import numpy as np
import tensorflow as tf
from checks import bad, expect

ps = hvd.ProcessSet([0, 2])
hvd.init(process_sets=[ps])
r, n = hvd.rank(), hvd.size()
assert n == 3, "this worker runs on 3 ranks"
w = float(r + 1)  # this rank's weight in its loss


def grads(mode: str, build: Callable[[list], tf.Tensor], xs_np: list[np.ndarray]) -> list:
    """d build(xs) / d xs as numpy arrays, the gradient taken the way `mode` says."""
    if mode == "eager":
        xs = [tf.Variable(x) for x in xs_np]
        with tf.GradientTape() as tape:
            loss = build(xs)
        return [None if g is None else g.numpy() for g in tape.gradient(loss, xs)]
    if mode == "function":
        @tf.function
        def f(*xs: tf.Tensor) -> list:
            with tf.GradientTape() as tape:
                tape.watch(xs)
                loss = build(list(xs))
            return tape.gradient(loss, list(xs))
        return [None if g is None else g.numpy() for g in f(*[tf.constant(x) for x in xs_np])]
    g = tf.Graph()
    with g.as_default():
        xs = [tf.constant(x) for x in xs_np]
        gs = tf.gradients(build(xs), xs)
        if any(x is None for x in gs):
            return gs
        with tf.compat.v1.Session(graph=g) as sess:
            return sess.run(gs)


def close(got: object, want: np.ndarray) -> bool:
    return got is not None and np.shape(got) == want.shape and np.allclose(got, want,
                                                                           atol=1e-5)


def check(mode: str, members: list[int], pset: hvd.ProcessSet) -> None:  # noqa: PLR0915
    me, m = members.index(r), len(members)
    mtot = sum(k + 1.0 for k in members)
    tag = f"{mode} set {members}"
    f32 = np.float32

    # allreduce, with the op and the scale factors of the forward pass
    for op, pre, post, want in ((hvd.Sum, 1.0, 1.0, mtot), (hvd.Average, 1.0, 1.0, mtot / m),
                                (hvd.Sum, 0.5, 3.0, 1.5 * mtot)):
        g = grads(mode, lambda xs, op=op, pre=pre, post=post: tf.reduce_sum(
            hvd.allreduce(xs[0], op=op, prescale_factor=pre, postscale_factor=post,
                          process_set=pset) * w), [np.ones(4, f32)])[0]
        expect(close(g, np.full(4, want, f32)), f"{tag} allreduce {op} {pre} {post}: {g}")
    g = grads(mode, lambda xs: tf.reduce_sum(hvd.allreduce(
        xs[0], op=hvd.Sum, compression=hvd.Compression.fp16, process_set=pset) * w),
        [np.ones((2, 2), np.float64)])[0]
    expect(close(g, np.full((2, 2), mtot)), f"{tag} allreduce fp16: {g}")

    gs = grads(mode, lambda xs: (
        lambda o: tf.reduce_sum(o[0]) * w + tf.reduce_sum(o[1]) * 2 * w)(
            hvd.grouped_allreduce(xs, op=hvd.Sum, process_set=pset)),
        [np.ones(2, f32), np.ones((3, 1), f32)])
    expect(close(gs[0], np.full(2, mtot, f32)) and close(gs[1], np.full((3, 1), 2 * mtot, f32)),
           f"{tag} grouped_allreduce: {gs}")

    # allgather: rows differ per rank; the gradient is my rows of the average
    rows = [k + 1 for k in members]
    weights = np.arange(sum(rows) * 2, dtype=f32).reshape(-1, 2)
    g = grads(mode, lambda xs: tf.reduce_sum(hvd.allgather(xs[0], process_set=pset) *
                                             weights * w), [np.ones((r + 1, 2), f32)])[0]
    off = sum(rows[:me])
    expect(close(g, weights[off: off + r + 1] * mtot / m), f"{tag} allgather: {g}")
    gs = grads(mode, lambda xs: sum(tf.cast(tf.reduce_sum(o), tf.float64) * w
                                    for o in hvd.grouped_allgather(xs, process_set=pset)),
               [np.ones((r + 1, 2), f32), np.ones(1, np.float64)])
    expect(close(gs[0], np.full((r + 1, 2), mtot / m, f32)) and close(gs[1], np.full(1, mtot / m)),
           f"{tag} grouped_allgather: {gs}")

    # broadcast: the average on the root, zeros on the others
    for root in members:
        g = grads(mode, lambda xs, root=root: tf.reduce_sum(
            hvd.broadcast(xs[0], root, process_set=pset) * w), [np.full(3, r, f32)])[0]
        want = np.full(3, mtot / m if r == root else 0.0, f32)
        expect(close(g, want), f"{tag} broadcast root {root}: {g}")

    # alltoall: block j (j + 1 rows) goes to member j; its gradient comes back from there
    splits = [j + 1 for j in range(m)]
    g = grads(mode, lambda xs: tf.reduce_sum(hvd.alltoall(xs[0], splits=splits,
                                                          process_set=pset)[0] * w),
              [np.ones((sum(splits), 2), f32)])[0]
    want = np.concatenate([np.full((j + 1, 2), members[j] + 1.0, f32) for j in range(m)])
    expect(close(g, want), f"{tag} alltoall splits: {g}")
    g = grads(mode, lambda xs: tf.reduce_sum(hvd.alltoall(xs[0], process_set=pset) * w),
              [np.ones((2 * m,), f32)])[0]
    want = np.repeat(np.array([k + 1.0 for k in members], f32), 2)
    expect(close(g, want), f"{tag} alltoall equal: {g}")

    # reducescatter: member j's block carries member j's weight, times m for Sum
    for op, pre, post, scale in ((hvd.Sum, 1.0, 1.0, m), (hvd.Average, 1.0, 1.0, 1.0),
                                 (hvd.Sum, 0.5, 4.0, 2.0 * m)):
        g = grads(mode, lambda xs, op=op, pre=pre, post=post: tf.reduce_sum(
            hvd.reducescatter(xs[0], op=op, prescale_factor=pre, postscale_factor=post,
                              process_set=pset) * w), [np.ones((2 * m, 3), f32)])[0]
        want = np.repeat(np.array([k + 1.0 for k in members], f32), 2)[:, None] * \
            np.ones(3, f32) * scale
        expect(close(g, want), f"{tag} reducescatter {op} {pre} {post}: {g}")
    gs = grads(mode, lambda xs: sum(tf.reduce_sum(o) * w for o in hvd.grouped_reducescatter(
        xs, op=hvd.Sum, process_set=pset)), [np.ones(m, f32), np.ones((m, 2), f32)])
    want = [np.array([k + 1.0 for k in members], f32) * m,
            np.array([[k + 1.0] * 2 for k in members], f32) * m]
    expect(close(gs[0], want[0]) and close(gs[1], want[1]), f"{tag} grouped_reducescatter {gs}")


for mode in ("eager", "function", "graph"):
    check(mode, list(range(n)), hvd.global_process_set)
    if r in ps.ranks:
        check(mode, ps.ranks, ps)

# DistributedGradientTape.register_local_source: that source's gradient stays this rank's
# own, divided by the set's size (Horovod's scale_local_gradients); the others averaged.
for members, pset in (([*range(n)], hvd.global_process_set), (ps.ranks, ps)):
    if r not in members:
        continue
    wl, wg = tf.Variable([1.0, 1.0]), tf.Variable([1.0])
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(wl * w) + tf.reduce_sum(wg * w)
    tape = hvd.DistributedGradientTape(tape, process_set=pset)
    tape.register_local_source(wl)
    gl, gg = tape.gradient(loss, [wl, wg])
    m = len(members)
    expect(close(gl.numpy(), np.full(2, w / m, np.float32)) and
           close(gg.numpy(), np.full(1, sum(k + 1.0 for k in members) / m, np.float32)),
           f"local source {members}: {gl.numpy()} {gg.numpy()}")

# Integer tensors still go through (no gradient is asked of them).
got = hvd.allreduce(tf.constant([r, 1]), op=hvd.Sum).numpy()
expect(got.tolist() == [sum(range(n)), n], f"int allreduce {got}")

if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_tf_grads", flush=True)

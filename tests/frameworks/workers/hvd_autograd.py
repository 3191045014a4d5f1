"""horovod.torch's collectives as Horovod documents them, at 3 ranks: every collective is
an autograd function with Horovod's gradient (allreduce: the allreduce of the output's
gradient; allgather: this rank's rows of the gradients' average; broadcast: that average
on the root, zeros elsewhere; alltoall: the gradient sent back the way the rows came;
reducescatter: the gradients gathered, times the size for Sum), on the global set and on
a process set; reducescatter's scale factors, grouped_reducescatter and the scalar
error; integer scaling in float64; alltoall's return values; poll() on handles that are
really asynchronous; sparse_allreduce_async; process sets that are removed and added
again, and what shutdown() resets. Expected values are computed here from every rank's
inputs, not by the collectives under test."""

from __future__ import annotations

import math
import sys
import time

import horovod.torch as hvd
import torch
from checks import bad, expect, raises

hvd.init()
r, n = hvd.rank(), hvd.size()
assert n == 3, "this worker runs on 3 ranks"
tot = sum(k + 1 for k in range(n))   # sum over ranks of (rank + 1)
def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and torch.allclose(a.double(), b.double(), atol=1e-6)


def grads_of(members: list[int], ps: hvd.ProcessSet) -> None:  # noqa: C901
    """Every collective's gradient on process set `ps` (whose members are `members`)."""
    me = members.index(r)
    m = len(members)
    mtot = sum(k + 1 for k in members)
    tag = f"set {members}"

    # allreduce: d/dx of the output's gradient allreduced with the same op.
    for op, scale in ((hvd.Sum, 1.0), (hvd.Average, 1.0 / m)):
        x = torch.ones(4, requires_grad=True)
        (hvd.allreduce(x, op=op, process_set=ps) * (r + 1)).sum().backward()
        expect(close(x.grad, torch.full((4,), mtot * scale)), f"{tag} allreduce grad {x.grad}")
        expect(x.grad_fn is None, "leaf")
    xs = [torch.ones(2, requires_grad=True), torch.ones(3, requires_grad=True)]
    outs = hvd.grouped_allreduce(xs, op=hvd.Sum, process_set=ps)
    expect(all(o.grad_fn is not None for o in outs), f"{tag} grouped_allreduce grad_fn")
    (outs[0].sum() * (r + 1) + outs[1].sum() * 2 * (r + 1)).backward()
    expect(close(xs[0].grad, torch.full((2,), float(mtot))) and
           close(xs[1].grad, torch.full((3,), 2.0 * mtot)), f"{tag} grouped_allreduce grad")

    # allgather: rows differ per rank; the gradient is my rows of the average.
    rows = [k + 1 for k in members]
    x = torch.ones(r + 1, 2, requires_grad=True)
    out = hvd.allgather(x, process_set=ps)
    expect(out.shape == (sum(rows), 2) and out.grad_fn is not None, f"{tag} allgather out")
    g = torch.arange(sum(rows) * 2, dtype=torch.float32).reshape(-1, 2) * (r + 1)
    out.backward(g)
    avg = torch.arange(sum(rows) * 2, dtype=torch.float32).reshape(-1, 2) * mtot / m
    off = sum(rows[:me])
    expect(close(x.grad, avg[off: off + r + 1]), f"{tag} allgather grad {x.grad}")
    xs = [torch.ones(r + 1, requires_grad=True), torch.ones(2, 3, requires_grad=True)]
    outs = hvd.grouped_allgather(xs, process_set=ps)
    (outs[0] * (r + 1)).sum().backward(retain_graph=True)
    outs[1].sum().backward()
    expect(close(xs[0].grad, torch.full((r + 1,), mtot / m)) and
           close(xs[1].grad, torch.ones(2, 3)), f"{tag} grouped_allgather grad")

    # broadcast: the root gets the gradients' average, the others zeros.
    for root in members:
        x = torch.full((3,), float(r), requires_grad=True)
        out = hvd.broadcast(x, root, process_set=ps)
        expect(torch.equal(out.detach(), torch.full((3,), float(root))), f"{tag} bcast value")
        (out * (r + 1)).sum().backward()
        want = mtot / m if r == root else 0.0
        expect(close(x.grad, torch.full((3,), want)), f"{tag} broadcast grad root {root}")

    # alltoall: the gradient goes back to the rows it came from.
    splits = [k + 1 for k in range(m)]
    x = (torch.arange(sum(splits), dtype=torch.float32) + 100 * r).requires_grad_()
    out, received = hvd.alltoall(x, splits=torch.tensor(splits, dtype=torch.int64),
                                 process_set=ps)
    expect(received.dtype == torch.int64 and received.tolist() == [me + 1] * m,
           f"{tag} received splits {received}")
    out.backward(out.detach() * 2)
    expect(close(x.grad, x.detach() * 2), f"{tag} alltoall grad {x.grad}")

    # reducescatter: gathered gradients, times the set's size for Sum, and the factors.
    for op, factor in ((hvd.Sum, m), (hvd.Average, 1)):
        x = torch.ones(2 * m, 3, requires_grad=True)
        out = hvd.reducescatter(x, op=op, process_set=ps, prescale_factor=0.5,
                                postscale_factor=3.0)
        expect(out.shape == (2, 3), f"{tag} reducescatter shape {out.shape}")
        want_out = 1.5 * (m if op == hvd.Sum else 1)
        expect(close(out.detach(), torch.full((2, 3), want_out)), f"{tag} rs value {out}")
        out.backward(torch.full((2, 3), float(r + 1)))
        want = torch.cat([torch.full((2, 3), float(k + 1)) for k in members]) * factor * 1.5
        expect(close(x.grad, want), f"{tag} reducescatter {op} grad {x.grad}")
    xs = [torch.ones(m, requires_grad=True), torch.ones(2 * m, 2, requires_grad=True)]
    outs = hvd.grouped_reducescatter(xs, op=hvd.Sum, process_set=ps)
    expect(close(outs[0].detach(), torch.full((1,), float(m))) and
           close(outs[1].detach(), torch.full((2, 2), float(m))), f"{tag} grouped rs values")
    (outs[0].sum() + outs[1].sum()).backward()
    expect(close(xs[0].grad, torch.full((m,), float(m))) and
           close(xs[1].grad, torch.full((2 * m, 2), float(m))), f"{tag} grouped rs grad")


# -- gradients on the global set and on a process set (ranks 0 and 2; rank 1 alone) ------
grads_of(list(range(n)), hvd.global_process_set)
pair = hvd.add_process_set([0, 2])
alone = hvd.add_process_set([1])
grads_of([0, 2] if r != 1 else [1], pair if r != 1 else alone)

# -- removed sets can be added again; a set still registered cannot (Horovod's rule) ----
raises(ValueError, lambda: hvd.add_process_set([0, 2]), "duplicate set", "already")
expect(hvd.remove_process_set(pair) is True and hvd.remove_process_set(alone) is True,
       "remove")
expect(hvd.remove_process_set(pair) is False, "second removal is False")
again = hvd.add_process_set([0, 2])
expect(again.ranks == [0, 2] and again.process_set_id is not None, "re-added set")
if r != 1:
    expect(torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, process_set=again),
                       torch.full((2,), 2.0)), "re-added set works")
    # 16-bit floats move through a process set bit for bit (bfloat16: numpy has none).
    for dt in (torch.float16, torch.bfloat16):
        base = torch.tensor([1.5, -2.25, 3e-3], dtype=dt)
        got = hvd.allgather(base * (r + 1), process_set=again)
        want = torch.cat([base * (k + 1) for k in (0, 2)])
        expect(got.dtype == dt and torch.equal(got, want), f"{dt} allgather on a set {got}")
        got = hvd.broadcast(base * (r + 1), 2, process_set=again)
        expect(got.dtype == dt and torch.equal(got, base * 3), f"{dt} broadcast on a set")
hvd.remove_process_set(again)

# -- reducescatter: uneven rows, scale factors, integers scaled in float64 ---------------
x = torch.arange(7 * 2, dtype=torch.float32).reshape(7, 2) * (r + 1)
out = hvd.reducescatter(x, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.25)
counts = [3, 2, 2]                       # Horovod: the first blocks one row larger
start = sum(counts[:r])
full = torch.arange(7 * 2, dtype=torch.float32).reshape(7, 2) * tot * 0.5
expect(torch.equal(out, full[start: start + counts[r]]), f"reducescatter scaled {out}")
vals = [-7, -3, 5, 9, 11, 13]
xi = torch.tensor(vals, dtype=torch.int32) * (r + 1)
f = 0.7
pre = hvd.allreduce(xi, op=hvd.Sum, prescale_factor=f)
want = [sum(math.trunc(f * (v * (k + 1))) for k in range(n)) for v in vals]
expect(pre.dtype == torch.int32 and pre.tolist() == want, f"int prescale {pre} != {want}")
post = hvd.allreduce(xi.long(), op=hvd.Sum, postscale_factor=f)
want = [math.trunc(f * (v * tot)) for v in vals]
expect(post.dtype == torch.int64 and post.tolist() == want, f"int postscale {post} != {want}")
rsi = hvd.reducescatter(torch.tensor(vals, dtype=torch.int64) * (r + 1), op=hvd.Sum,
                        prescale_factor=f)
want = [sum(math.trunc(f * (v * (k + 1))) for k in range(n)) for v in vals][2 * r: 2 * r + 2]
expect(rsi.tolist() == want, f"int reducescatter prescale {rsi} != {want}")
raises(ValueError, lambda: hvd.reducescatter(torch.tensor(float(r))), "scalar", "scalar")
raises(ValueError, lambda: hvd.grouped_reducescatter([torch.zeros(3, 1), torch.tensor(1.0)]),
       "grouped scalar", "scalar")
expect(torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum, name="after_scalar"),
                   torch.full((1,), float(n))), "nothing left queued by the scalar errors")

# -- alltoall: without splits a tensor, with splits (tensor, received splits) ------------
eq = torch.arange(3 * n, dtype=torch.float32) + 10 * r
got = hvd.alltoall(eq)
expect(isinstance(got, torch.Tensor), f"alltoall without splits returns {type(got)}")
expect(torch.equal(got, torch.cat([torch.arange(3 * r, 3 * r + 3, dtype=torch.float32) + 10 * k
                                   for k in range(n)])), f"alltoall equal split {got}")
out, rec = hvd.alltoall(eq, splits=[3] * n)
expect(rec.dtype == torch.int32 and rec.tolist() == [3] * n, f"received splits {rec}")
x = torch.ones(2 * n, requires_grad=True)
y = hvd.alltoall(x)
expect(y.grad_fn is not None, "alltoall without splits is differentiable")
y.sum().backward()
expect(torch.equal(x.grad, torch.ones(2 * n)), f"alltoall no-splits grad {x.grad}")

# -- poll(): the handle of a composite collective is not done before the others submit --
if r == 0:
    handles = [hvd.reducescatter_async(torch.ones(n, 2), op=hvd.Sum, name="late"),
               hvd.grouped_allreduce_async([torch.ones(2)], op=hvd.Sum, name="late_g"),
               hvd.alltoall_async(torch.ones(n), name="late_a")]
    expect(not any(hvd.poll(h) for h in handles), "poll True before the others submitted")
else:
    time.sleep(1.0)
    handles = [hvd.reducescatter_async(torch.ones(n, 2), op=hvd.Sum, name="late"),
               hvd.grouped_allreduce_async([torch.ones(2)], op=hvd.Sum, name="late_g"),
               hvd.alltoall_async(torch.ones(n), name="late_a")]
outs = [hvd.synchronize(h) for h in handles]
expect(torch.equal(outs[0], torch.full((1, 2), float(n))) and
       torch.equal(outs[1][0], torch.full((2,), float(n))) and outs[2][0].shape == (n,),
       f"late results {outs}")

# -- sparse_allreduce_async: the same as the dense allreduce ------------------------------
dense = torch.zeros(6, 3)
dense[r] = r + 1.0
dense[5, r] = 10.0
for op in (hvd.Average, hvd.Sum):
    wait = hvd.sparse_allreduce_async(dense.to_sparse(), name=f"sp{op}", op=op)
    got = wait()
    expect(got.is_sparse and close(got.to_dense(), hvd.allreduce(dense, op=op)),
           f"sparse allreduce {op}")

# -- shutdown() resets the registered sets; init() starts again with the global set only --
keep = hvd.add_process_set([1, 2])
hvd.shutdown()
expect(not hvd.is_initialized() and keep.process_set_id is None, "shutdown invalidates")
hvd.init()
expect(hvd.get_process_sets() == {0: [0, 1, 2]}, f"after re-init {hvd.get_process_sets()}")
expect(hvd.add_process_set([1, 2]).ranks == [1, 2], "the same ranks again after re-init")
hvd.shutdown()

if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_autograd", flush=True)

"""Horovod's process sets on horovod-ddl (torch), at 3 ranks: registration (static and
dynamic, collective, a set that differs between ranks raising on every rank), every
collective with process_set= against what it must compute, name matching in any order
within a set, two sets running at once, Horovod's error outside a set, mismatches inside
one, DistributedOptimizer on a set, and removal."""

from __future__ import annotations

import sys

import horovod.torch as hvd
import torch
from checks import bad, expect, raises
from torch import nn

even = hvd.ProcessSet([2, 0])          # given unsorted: Horovod sorts
hvd.init(process_sets=[even])
r, n = hvd.rank(), hvd.size()
assert n == 3, "this worker runs on 3 ranks"
expect(even.ranks == [0, 2] and even.process_set_id == 1, f"static set {even}")
expect(hvd.global_process_set.process_set_id == 0 and hvd.global_process_set.size() == n,
       "global set")
expect(even.size() == 2 and even.included() == (r != 1), "size/included")
expect(even.rank() == {0: 0, 1: -1, 2: 1}[r], f"rank in set {even.rank()}")
low = hvd.add_process_set([0, 1])      # dynamic, collective on every rank
expect(low.process_set_id == 2 and low.ranks == [0, 1], f"dynamic set {low}")
expect(hvd.get_process_sets() == {0: [0, 1, 2], 1: [0, 2], 2: [0, 1]}, "get_process_sets")

# A set that differs between ranks: ValueError on every rank, nothing registered.
raises(ValueError, lambda: hvd.add_process_set([0, r]), "differing set", "differ")
raises(ValueError, lambda: hvd.add_process_set([0, 2]), "duplicate set", "already")
raises(ValueError, lambda: hvd.add_process_set([0, 7]), "rank out of range", "0..2")

members = {1: [0, 2], 2: [0, 1]}
for ps in (even, low):
    m = members[ps.process_set_id]
    if r not in m:
        # Horovod's error for a collective on a set this rank is not in.
        raises(ValueError, lambda ps=ps: hvd.allreduce(torch.ones(2), process_set=ps),
               f"allreduce outside set {m}", "not a part of process set")
        raises(ValueError, lambda ps=ps: hvd.allgather(torch.ones(2), process_set=ps),
               f"allgather outside set {m}", "not a part")
        continue
    me = m.index(r)
    x = torch.arange(4, dtype=torch.float32) + r
    expect(torch.equal(hvd.allreduce(x, op=hvd.Sum, process_set=ps),
                       sum(torch.arange(4, dtype=torch.float32) + q for q in m)), "sum")
    expect(torch.allclose(hvd.allreduce(x, process_set=ps),
                          sum(torch.arange(4, dtype=torch.float32) + q for q in m) / 2), "avg")
    expect(torch.equal(hvd.allreduce(x, op=hvd.Max, process_set=ps),
                       torch.arange(4, dtype=torch.float32) + max(m)), "max")
    h16 = hvd.allreduce(torch.ones(3, dtype=torch.bfloat16) * (r + 1), op=hvd.Sum,
                        process_set=ps)
    expect(h16.dtype == torch.bfloat16 and torch.equal(
        h16, torch.full((3,), float(sum(q + 1 for q in m)), dtype=torch.bfloat16)), "bf16")
    g = hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(5)], op=hvd.Sum, process_set=ps)
    expect(torch.equal(g[0], torch.ones(2) * sum(m)) and torch.equal(g[1], torch.ones(5) * 2),
           "grouped")
    many = hvd.grouped_allreduce([torch.full((3,), float(i)) for i in range(40)], op=hvd.Sum,
                                 name="a.rather.long.name.so.that.one.round.overflows.its.slot",
                                 process_set=ps)   # > 1 KiB of queued requests in one round
    expect(all(torch.equal(t, torch.full((3,), 2.0 * i)) for i, t in enumerate(many)),
           "40 grouped")
    ag = hvd.allgather(torch.full((r + 1, 2), float(r)), process_set=ps)
    expect(torch.equal(ag, torch.cat([torch.full((q + 1, 2), float(q)) for q in m])),
           f"allgather {ag.tolist()}")
    bools = hvd.allgather(torch.tensor([r % 2 == 0]), process_set=ps)
    expect(bools.dtype == torch.bool and bools.tolist() == [q % 2 == 0 for q in m], "bool gather")
    root = m[-1]                         # root_rank is a world rank, as in Horovod
    b = hvd.broadcast(torch.full((3,), float(r)), root_rank=root, process_set=ps)
    expect(torch.equal(b, torch.full((3,), float(root))), f"broadcast {b}")
    outsider = [q for q in range(n) if q not in m][0]
    raises(ValueError, lambda ps=ps, o=outsider: hvd.broadcast(torch.ones(1), root_rank=o,
                                                               process_set=ps),
           "root outside", "root_rank")
    splits = [1, 2]
    got, rs = hvd.alltoall(torch.arange(3, dtype=torch.float32) + 10 * r, splits=splits,
                           process_set=ps)
    expect(rs.tolist() == [splits[me]] * 2, f"alltoall splits {rs}")
    off = sum(splits[:me])
    expect(torch.equal(got, torch.cat([torch.arange(off, off + splits[me],
                                                    dtype=torch.float32) + 10 * q for q in m])),
           f"alltoall {got}")
    red = hvd.reducescatter(torch.arange(5, dtype=torch.float32), op=hvd.Sum, process_set=ps)
    expect(torch.equal(red, (torch.arange(5, dtype=torch.float32) * 2)[[0, 1, 2] if me == 0
                                                                       else [3, 4]]),
           f"reducescatter {red}")
    hvd.barrier(process_set=ps)
    obj = hvd.broadcast_object({"from": r} if r == root else None, root_rank=root,
                               process_set=ps)
    expect(obj == {"from": root}, f"broadcast_object {obj}")
    expect(hvd.allgather_object(("r", r), process_set=ps) == [("r", q) for q in m],
           "allgather_object")

    # Names meet in any submission order within the set.
    names = ["a", "b", "c", "d"]
    order = names if me == 0 else names[::-1]
    hs = {nm: hvd.allreduce_async(torch.full((2,), float(i + r)), op=hvd.Sum, name=nm,
                                  process_set=ps) for i, nm in enumerate(order)}
    for nm, h in hs.items():
        i = order.index(nm)
        want = sum(float(([*names] if q == m[0] else names[::-1]).index(nm) + q) for q in m)
        expect(torch.equal(hvd.synchronize(h), torch.full((2,), want)), f"name {nm}")
    # Mismatched shapes inside the set: HorovodInternalError on every member, job goes on.
    raises(hvd.HorovodInternalError,
           lambda ps=ps, k=me: hvd.allreduce(torch.ones(2 + k), name="bad", process_set=ps),
           "shape mismatch", "disagree")
    raises(ValueError, lambda ps=ps: [hvd.allreduce_async(torch.ones(1), name="dup",
                                                          process_set=ps)
                                      for _ in range(2)], "duplicate name", "already in flight")
    hvd.synchronize(hvd.allreduce_async(torch.ones(1), name="dup.next", process_set=ps))

# Both sets at once on rank 0 (in both), with the world in between.
if r == 0:
    ha = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="both", process_set=even)
    hb = hvd.allreduce_async(torch.ones(2), op=hvd.Sum, name="both", process_set=low)
    expect(torch.equal(hvd.synchronize(hb), torch.full((2,), 2.0)), "both low")
    expect(torch.equal(hvd.synchronize(ha), torch.full((2,), 2.0)), "both even")
elif r in even.ranks:
    expect(torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="both", process_set=even),
                       torch.full((2,), 2.0)), "both even (2)")
else:
    expect(torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum, name="both", process_set=low),
                       torch.full((2,), 2.0)), "both low (1)")
expect(torch.equal(hvd.allreduce(torch.ones(1), op=hvd.Sum), torch.full((1,), float(n))),
       "world still works")

# DistributedOptimizer on a set: members average their gradients, rank 1 trains alone.
torch.manual_seed(0)
model = nn.Linear(4, 1, bias=False)
ps = even if r in even.ranks else None
opt = torch.optim.SGD(model.parameters(), lr=0.1)
if ps is not None:
    opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   process_set=ps)
    expect(isinstance(opt, torch.optim.SGD), "optimizer subclass")
w0 = model.weight.detach().clone()
data = torch.full((1, 4), float(r + 1))
opt.zero_grad()
model(data).sum().backward()
opt.step()
grads = {q: torch.full((1, 4), float(q + 1)) for q in range(n)}
want = grads[r] if ps is None else sum(grads[q] for q in even.ranks) / 2
expect(torch.allclose(model.weight.detach(), w0 - 0.1 * want), "optimizer step on the set")

# join covers the sets too: rank 0 runs one more allreduce on `even` than rank 2, whose
# join contributes zeros to it; rank 1 (not in the set) just joins.
if r in even.ranks:
    for step in range(2 if r == 0 else 1):
        got = hvd.allreduce(torch.full((2,), float(r + 1)), op=hvd.Sum, name="uneven",
                            process_set=even)
        want = 4.0 if step == 0 else 1.0          # (0+1)+(2+1), then rank 0's alone
        expect(torch.equal(got, torch.full((2,), want)), f"join on a set, step {step}: {got}")
expect(hvd.join() in range(n), "join with sets")

# Removal is collective; the removed set is unusable afterwards.
expect(hvd.remove_process_set(low) is True, "remove")
expect(hvd.remove_process_set(hvd.global_process_set) is False, "global cannot be removed")
expect(low.process_set_id is None, "invalidated")
raises(ValueError, lambda: hvd.allreduce(torch.ones(1), process_set=low), "removed set",
       "not registered")
expect(hvd.get_process_sets() == {0: [0, 1, 2], 1: [0, 2]}, "after removal")
hvd.shutdown()

if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_process_sets", flush=True)

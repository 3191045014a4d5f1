"""Horovod's matching contract on horovod-ddl (torch): named tensors meet by name in any
submission order, unnamed ones by order; shape, dtype and root mismatches raise
HorovodInternalError on every rank and the job goes on; a duplicate name in flight is a
ValueError; DistributedOptimizer's gradients meet by parameter name even when the
gradient hooks fire in a different order on each rank."""

from __future__ import annotations

import random
import sys

import horovod.torch as hvd
import torch
from torch import nn

hvd.init()
r, n = hvd.rank(), hvd.size()
bad: list[str] = []


def expect(cond: bool, what: str) -> None:
    if not cond:
        bad.append(what)


def val(rank: int, i: int, shape: tuple[int, ...] = (3, 4)) -> torch.Tensor:
    g = torch.Generator().manual_seed(100 * rank + i)
    return torch.randint(-50, 50, shape, generator=g).float()


def total(i: int, shape: tuple[int, ...] = (3, 4)) -> torch.Tensor:
    return sum(val(q, i, shape) for q in range(n))


def next_works(where: str) -> None:
    t = hvd.allreduce(torch.ones(5), op=hvd.Sum, name=f"after.{where}")
    expect(torch.equal(t, torch.full((5,), float(n))), f"{where}: the next allreduce")
    expect(torch.equal(hvd.allreduce(torch.ones(2), op=hvd.Sum), torch.full((2,), float(n))),
           f"{where}: the next unnamed allreduce")


# 1. The case: two named allreduces of the same shape in opposite orders (they
#    were silently swapped when matched by order), then many in a random order per rank,
#    synchronized in yet another order.
if r % 2 == 0:
    ha = hvd.allreduce_async(val(r, 0), name="a", op=hvd.Sum)
    hb = hvd.allreduce_async(val(r, 1), name="b", op=hvd.Sum)
else:
    hb = hvd.allreduce_async(val(r, 1), name="b", op=hvd.Sum)
    ha = hvd.allreduce_async(val(r, 0), name="a", op=hvd.Sum)
expect(torch.equal(hvd.synchronize(ha), total(0)), "opposite order: a got the wrong sum")
expect(torch.equal(hvd.synchronize(hb), total(1)), "opposite order: b got the wrong sum")

rng = random.Random(1000 + r)
for it in range(3):
    ids = list(range(40))
    rng.shuffle(ids)
    handles = {i: hvd.allreduce_async(val(r, i), name=f"grad{i}", op=hvd.Sum) for i in ids}
    for i in sorted(ids, key=lambda _: rng.random()):
        expect(torch.equal(hvd.synchronize(handles[i]), total(i)),
               f"iteration {it}: grad{i} got the wrong sum")
    # in place, averaged, mixed with 4 unnamed ones (matched by their order, the same on
    # every rank) at random places
    ts = {i: val(r, i, (7,)) for i in ids}
    spots = set(rng.sample(range(len(ids)), 4))
    hs, k = [], 0
    for j, i in enumerate(ids):
        hs.append((i, hvd.allreduce_async_(ts[i], name=f"inplace{i}")))
        if j in spots:
            hs.append((-1 - k, hvd.allreduce_async(val(r, 500 + k, (2, 2)), op=hvd.Sum)))
            k += 1
    for i, h in hs:
        out = hvd.synchronize(h)
        if i >= 0:
            expect(out is ts[i] and torch.allclose(out, total(i, (7,)) / n),
                   f"iteration {it}: inplace{i} wrong")
        else:
            expect(torch.equal(out, total(500 - 1 - i, (2, 2))),
                   f"iteration {it}: unnamed #{-1 - i} wrong")

hs = [hvd.allreduce_async(val(r, 900 + k, (5,)), op=hvd.Sum) for k in range(6)]
for k, h in enumerate(hs):
    expect(torch.equal(hvd.synchronize(h), total(900 + k, (5,))), f"unnamed #{k} wrong")

# 2. Every other collective with a name, submitted in opposite orders.
grp = [val(r, 40 + j, (j + 1,)) for j in range(3)]
jobs = {
    "grouped": lambda: hvd.grouped_allreduce_async(grp, name="grp", op=hvd.Sum),
    "bcast": lambda: hvd.broadcast_async(torch.full((2, 3), float(r)), root_rank=n - 1,
                                         name="bcast"),
    "gather": lambda: hvd.allgather_async(torch.full((r + 1, 2), float(r)), name="gather"),
    "a2a": lambda: hvd.alltoall_async(torch.arange(n * 2, dtype=torch.float64) + 100 * r,
                                      splits=[2] * n, name="a2a"),
    "rs": lambda: hvd.reducescatter_async(torch.arange(2 * n, dtype=torch.float32), op=hvd.Sum,
                                          name="rs"),
    "bool": lambda: hvd.broadcast_async(torch.tensor([r == 0, True]), root_rank=0, name="b8"),
}
order = list(jobs)
if r % 2:
    order.reverse()
hs2 = {k: jobs[k]() for k in order}
g = hvd.synchronize(hs2["grouped"])
expect(all(torch.equal(g[j], total(40 + j, (j + 1,))) for j in range(3)), "grouped_allreduce")
expect(torch.equal(hvd.synchronize(hs2["bcast"]), torch.full((2, 3), float(n - 1))), "broadcast")
expect(torch.equal(hvd.synchronize(hs2["gather"]),
                   torch.cat([torch.full((q + 1, 2), float(q)) for q in range(n)])), "allgather")
got, rsplits = hvd.synchronize(hs2["a2a"])
expect(rsplits.tolist() == [2] * n, f"alltoall splits {rsplits}")
expect(torch.equal(got, torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float64) + 100 * q
                                   for q in range(n)])), f"alltoall {got}")
expect(torch.equal(hvd.synchronize(hs2["rs"]),
                   torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) * n), "reducescatter")
expect(torch.equal(hvd.synchronize(hs2["bool"]), torch.tensor([True, True])), "bool broadcast")

# 3. Mismatches: HorovodInternalError (a RuntimeError) on every rank, the job goes on.
other = r == n - 1
cases = [
    ("Mismatched allreduce tensor shapes",
     lambda: hvd.allreduce(torch.ones((3, 2) if other else (2, 3)), name="shape")),
    ("Mismatched allreduce tensor shapes",
     lambda: hvd.allreduce(torch.ones((3, 2) if other else (2, 3)))),  # unnamed too
    ("Mismatched data types",
     lambda: hvd.allreduce(torch.ones(4, dtype=torch.float64 if other else torch.float32),
                           name="dtype")),
    ("Mismatched allgather tensor shapes",
     lambda: hvd.allgather(torch.ones((2, 4 if other else 3)), name="gather dims")),
    ("Mismatched broadcast root ranks",
     lambda: hvd.broadcast(torch.ones(3), root_rank=1 if other else 0, name="root")),
    # unnamed: the n-th requests meet (named ones of different collectives never do, as
    # their full names differ: allreduce.x, broadcast.x)
    ("Mismatched operations",
     lambda: hvd.broadcast(torch.ones(4), 0) if other else hvd.allreduce(torch.ones(4))),
]
for topic, fn in cases:
    # between two good requests, in the same batch
    before = hvd.allreduce_async(torch.ones(3), op=hvd.Sum, name="before")
    try:
        fn()
        bad.append(f"{topic}: nothing raised")
    except hvd.HorovodInternalError as e:
        expect(isinstance(e, RuntimeError), "HorovodInternalError is not a RuntimeError")
        expect(topic in str(e) and f"rank {r}" in str(e), f"unclear message: {e}")
    expect(torch.equal(hvd.synchronize(before), torch.full((3,), float(n))),
           f"{topic}: the request beside it is wrong")
    next_works(topic)

# 4. A duplicate name in flight.
h = hvd.allreduce_async(torch.ones(2), name="dup", op=hvd.Sum)
try:
    hvd.allreduce_async(torch.ones(2), name="dup")
    bad.append("duplicate name: nothing raised")
except ValueError as e:
    expect("dup" in str(e) and "in flight" in str(e), f"unclear duplicate message: {e}")
expect(torch.equal(hvd.synchronize(h), torch.full((2,), float(n))), "first of a duplicate")
next_works("duplicate")


# 5. DistributedOptimizer: the gradient hooks fire in another order on odd ranks (autograd
#    runs the branch built last first), and every gradient must still be averaged with
#    its own counterparts. The two weights have the same shape, so a mix-up would not
#    even be a size mismatch.
class TwoBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 4, bias=False)
        self.b = nn.Linear(4, 4, bias=False)

    def forward(self, x: torch.Tensor, flip: bool) -> torch.Tensor:
        if flip:
            lb = (self.b(x) ** 2).sum()
            la = (self.a(x) * 3).sum()
        else:
            la = (self.a(x) * 3).sum()
            lb = (self.b(x) ** 2).sum()
        return la + lb


def inputs(rank: int, step: int) -> torch.Tensor:
    return torch.randn(5, 4, generator=torch.Generator().manual_seed(10 * rank + step))


torch.manual_seed(0)
model = TwoBranch()
start = {k: v.clone() for k, v in model.state_dict().items()}
fired: list[str] = []
for pname, p in model.named_parameters():
    p.register_post_accumulate_grad_hook(lambda _p, pname=pname: fired.append(pname))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.0),
                               named_parameters=model.named_parameters())
for step in range(3):
    fired.clear()
    opt.zero_grad()
    model(inputs(r, step), flip=r % 2 == 1).backward()
    opt.synchronize()
    orders = hvd.allgather_object(list(fired))
    if n > 1:
        expect(orders[0] != orders[1], f"the hooks fired in the same order: {orders}")
    # the expected average, from every rank's inputs on a local copy
    ref = TwoBranch()
    ref.load_state_dict(start)
    for q in range(n):
        ref(inputs(q, step), flip=False).backward()
    for (pname, p), (_, rp) in zip(model.named_parameters(), ref.named_parameters(),
                                   strict=True):
        expect(torch.allclose(p.grad, rp.grad / n, atol=1e-5),
               f"step {step}: {pname}'s gradient is not the average of its own gradients")
    with opt.skip_synchronize():
        opt.step()

if bad:
    print(f"rank {r}: {len(bad)} problems: {bad[:6]}", flush=True)
    sys.exit(1)
print("OK hvd_matching", flush=True)

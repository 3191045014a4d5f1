"""Horovod's join on horovod-ddl (torch), at 3 ranks with uneven numbers of steps: the
ranks still running complete their allreduces (the joined ones contribute zeros: a sum
counts the running ranks, an average still divides by size()), while an allgather or a
broadcast raises on them as in Horovod (join covers allreduce only; Horovod's own
test_horovod_join_allgather/_broadcast), DistributedOptimizer keeps stepping, join() returns the
rank that joined last on every rank, a second join works, a mismatch among the running
ranks is an error rather than a hang, and join with a handle in flight is refused."""

from __future__ import annotations

import sys

import horovod.torch as hvd
import torch
from checks import bad, expect
from torch import nn

hvd.init()
r, n = hvd.rank(), hvd.size()
# Round 1: rank q runs q + 1 steps, then joins; rank n-1 joins last.
for step in range(r + 1):
    active = [q for q in range(n) if step < q + 1]
    s = hvd.allreduce(torch.full((4,), float(r + 1)), op=hvd.Sum, name="sum")
    expect(torch.equal(s, torch.full((4,), float(sum(q + 1 for q in active)))),
           f"step {step}: sum {s.tolist()}")
    a = hvd.allreduce(torch.full((2,), float(r + 1)), name="avg")   # Average
    expect(torch.allclose(a, torch.full((2,), sum(q + 1 for q in active) / n)),
           f"step {step}: average {a.tolist()}")
    u = hvd.allreduce(torch.ones(3, dtype=torch.int32), op=hvd.Sum)  # unnamed, by order
    expect(torch.equal(u, torch.full((3,), len(active), dtype=torch.int32)),
           f"step {step}: unnamed {u.tolist()}")
    if len(active) == n:
        g = hvd.allgather(torch.full((2, 1), float(r)), name="rows")
        expect(torch.equal(g, torch.cat([torch.full((2, 1), float(q)) for q in range(n)])),
               f"step {step}: allgather {g.tolist()}")
        b = hvd.broadcast(torch.full((2,), float(r)), root_rank=n - 1, name="bcast")
        expect(torch.equal(b, torch.full((2,), float(n - 1))), f"step {step}: broadcast")
    else:  # a rank has joined
        for what, call in (("allgather", lambda: hvd.allgather(torch.ones(2, 1), name="rows")),
                           ("broadcast", lambda: hvd.broadcast(torch.ones(2), root_rank=n - 1,
                                                               name="bcast"))):
            try:
                call()
                bad.append(f"step {step}: {what} during join did not raise")
            except RuntimeError as e:
                expect("joined" in str(e), f"step {step}: {what} message: {e}")
last = hvd.join()
expect(last == n - 1, f"join returned {last}, want {n - 1}")

# Round 2: DistributedOptimizer with uneven data; rank 0 has the most batches.
torch.manual_seed(0)
model = nn.Linear(3, 1, bias=False)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters())
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
for step in range(n - r):
    active = [q for q in range(n) if step < n - q]
    opt.zero_grad()
    model(torch.full((1, 3), float(r + 1))).sum().backward()
    opt.step()
    want = sum(torch.full((1, 3), float(q + 1)) for q in active) / n
    expect(torch.allclose(model.weight.grad, want), f"optimizer step {step}: grad "
           f"{model.weight.grad.tolist()} want {want.tolist()}")
last = hvd.join()
expect(last == 0, f"second join returned {last}, want 0")

# Round 3: the running ranks disagree on a shape while rank 0 has joined: an error on
# them, not a hang; then they join too.
if r == 0:
    last = hvd.join()
else:
    try:
        hvd.allreduce(torch.ones(2 + r), name="mismatch")
        bad.append("mismatch during join did not raise")
    except hvd.HorovodInternalError as e:
        expect("shape" in str(e) or "count" in str(e), f"mismatch message: {e}")
    last = hvd.join()
expect(last in range(1, n), f"third join returned {last}")

# join with a handle of this rank still in flight is refused, with the fix in the message
# (the others submit theirs only after rank 0 tried).
if r == 0:
    h = hvd.allreduce_async(torch.ones(1), name="inflight")
    try:
        hvd.join()
        bad.append("join with a handle in flight did not raise")
    except ValueError as e:
        expect("wait" in str(e), f"message: {e}")
hvd.barrier()
if r != 0:
    h = hvd.allreduce_async(torch.ones(1), name="inflight")
hvd.synchronize(h)
hvd.join()

if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_join", flush=True)

"""Horovod's documented PyTorch API on horovod-ddl: every call checked against what it
must compute, then a Horovod-style training loop against the single-process result."""

import horovod.torch as hvd
import torch
from common import batch, check_same_and_close, cnn, reference
from torch import nn

hvd.init()
r, n = hvd.rank(), hvd.size()
assert (hvd.local_rank(), hvd.local_size()) == (r, n), "one host in this test"
assert (hvd.cross_rank(), hvd.cross_size()) == (0, 1)
assert hvd.is_initialized() and hvd.mpi_enabled() and hvd.ddl_built()

x = torch.tensor([1.0, 2.0, 3.0]) * (r + 1)
tot = sum(range(1, n + 1))
assert torch.equal(hvd.allreduce(x, op=hvd.Sum), torch.tensor([1.0, 2.0, 3.0]) * tot)
assert torch.allclose(hvd.allreduce(x), torch.tensor([1.0, 2.0, 3.0]) * tot / n)  # Average
assert torch.equal(hvd.allreduce(x, average=False), torch.tensor([1.0, 2.0, 3.0]) * tot)
assert torch.equal(hvd.allreduce(x, op=hvd.Max), torch.tensor([1.0, 2.0, 3.0]) * n)
assert torch.equal(hvd.allreduce(x, op=hvd.Min), torch.tensor([1.0, 2.0, 3.0]))
assert torch.equal(x, torch.tensor([1.0, 2.0, 3.0]) * (r + 1)), "allreduce must not modify"
h = hvd.allreduce_async_(x, op=hvd.Sum, name="x")
out = hvd.synchronize(h)
assert out is x and torch.equal(x, torch.tensor([1.0, 2.0, 3.0]) * tot)
y = torch.ones(4) * r
assert torch.equal(hvd.allreduce(y, op=hvd.Sum, prescale_factor=2.0, postscale_factor=0.5),
                   torch.ones(4) * sum(range(n)))
g = hvd.grouped_allreduce([torch.ones(2) * r, torch.ones(3) * (r + 1)], op=hvd.Sum)
assert torch.equal(g[0], torch.ones(2) * sum(range(n))) and torch.equal(g[1], torch.ones(3) * tot)

# differentiable allreduce
w = torch.ones(3, requires_grad=True)
hvd.allreduce(w * (r + 1), op=hvd.Sum).sum().backward()
assert torch.equal(w.grad, torch.full((3,), float(n * (r + 1)))), w.grad  # d(sum of losses)

# allgather with different first dimensions
ag = hvd.allgather(torch.full((r + 1, 2), float(r)))
assert ag.shape == (sum(k + 1 for k in range(n)), 2)
assert torch.equal(ag, torch.cat([torch.full((k + 1, 2), float(k)) for k in range(n)]))

b = hvd.broadcast(torch.full((3,), float(r)), root_rank=n - 1)
assert torch.equal(b, torch.full((3,), float(n - 1)))
bi = torch.full((3,), r, dtype=torch.int64)
hvd.broadcast_(bi, root_rank=0)
assert torch.equal(bi, torch.zeros(3, dtype=torch.int64))

# alltoall: rank r sends k+1 rows to rank k
splits = [k + 1 for k in range(n)]
src = torch.arange(sum(splits), dtype=torch.float32) + 100 * r
got, rsplits = hvd.alltoall(src, splits=splits)
assert rsplits.tolist() == [r + 1] * n, rsplits
off = sum(splits[:r])
assert torch.equal(got, torch.cat([torch.arange(off, off + r + 1, dtype=torch.float32) + 100 * k
                                   for k in range(n)]))

rs = hvd.reducescatter(torch.arange(2 * n, dtype=torch.float32), op=hvd.Sum)
assert torch.equal(rs, torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) * n)

obj = hvd.broadcast_object({"epoch": 3} if r == 0 else None, root_rank=0)
assert obj == {"epoch": 3}
assert hvd.allgather_object(r * 10) == [k * 10 for k in range(n)]
hvd.join()
hvd.barrier()

# --- a Horovod training script (the documented recipe) -------------------------------
STEPS, LR = 4, 0.02
torch.manual_seed(99 + r)
model = cnn()
optimizer = torch.optim.SGD(model.parameters(), lr=LR * n, momentum=0.9)  # scale by size
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     op=hvd.Average)
ref_model = cnn()
ref_model.load_state_dict(model.state_dict())
for s in range(STEPS):
    data, target = batch(s, r)
    optimizer.zero_grad()
    loss = nn.functional.cross_entropy(model(data), target)
    loss.backward()
    optimizer.step()
    avg_loss = hvd.allreduce(loss.detach(), name="avg_loss")  # metric averaging
ref = reference(ref_model, STEPS, n, LR * n)
check_same_and_close(model, ref, r, n, lambda t: hvd.allgather(t))
print("OK hvd_torch", flush=True)

"""Recipe test: one DDP training step on the ddl backend, 2 ranks; the parameters must
end identical on both ranks."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("ddl")
r = dist.get_rank()
torch.manual_seed(r)
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(4, 8), torch.randn(4, 2)
torch.nn.functional.mse_loss(model(x), y).backward()
opt.step()
w = model.module.weight.detach().clone()
ws = [torch.empty_like(w) for _ in range(dist.get_world_size())]
dist.all_gather(ws, w)
assert all(torch.equal(ws[0], v) for v in ws), "ranks diverged"
print(f"pytorch-ddl OK {r}", flush=True)  # one write: ranks share a stdout
dist.destroy_process_group()

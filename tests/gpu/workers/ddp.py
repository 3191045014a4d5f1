"""DDP on CUDA: a few SGD steps of a small model, each rank on its shard of a fixed
global batch; rank 0 saves the parameters to argv[2]. argv[1] picks how gradients move:
  nccl      torch.distributed's NCCL backend (one rank per GPU, so 1 rank here);
  gloo      torch.distributed's gloo backend (its CUDA path stages through the host);
  ddl       DDP's gradient buckets allreduced by ddl_core on the CUDA tensors (a DDP
            communication hook; a gloo process group only rendezvouses and broadcasts
            the initial parameters);
  backend   init_process_group("ddl") alone: the ddl backend (ddl-torch) on CUDA tensors.
"""


import os
import sys

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # reproducible GEMMs

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import ddl_core as ddl  # noqa: E402


def ddl_allreduce_hook(state: object,
                       bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    t = bucket.buffer()
    t.div_(ddl.size())  # as DDP's default hook: divide, then sum
    ddl.allreduce(t, op="sum", out=t)
    fut: torch.futures.Future = torch.futures.Future()
    fut.set_result(t)
    return fut


def main() -> None:
    how, out = sys.argv[1], sys.argv[2]
    ddl.init()
    rank, size = ddl.rank(), ddl.size()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # one node
    os.environ.setdefault("MASTER_PORT", os.environ.get("DDP_PORT", "29533"))
    torch.cuda.set_device(0)
    backend = {"nccl": "nccl", "gloo": "gloo", "ddl": "gloo", "backend": "ddl"}[how]
    dist.init_process_group(backend, rank=rank, world_size=size,
                            device_id=torch.device("cuda", 0) if how == "nccl" else None)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                          nn.Linear(256, 10)).cuda()
    # small buckets: several allreduces per step
    ddp = DDP(model, device_ids=[0], bucket_cap_mb=0.1)
    if how == "ddl":
        ddp.register_comm_hook(None, ddl_allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    per = 32
    for _ in range(8):
        xb = torch.randn(per * 4, 64, generator=g)
        yb = torch.randint(0, 10, (per * 4,), generator=g)
        shard = slice(rank * (per * 4 // size), (rank + 1) * (per * 4 // size))
        loss = nn.functional.cross_entropy(ddp(xb[shard].cuda()), yb[shard].cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.synchronize()
    if rank == 0:
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, out)
        print(f"rank 0: {how} on {size} rank(s): {ddl.gpu_info()['mode']} path, loss "
              f"{loss.item():.6f}")
    dist.destroy_process_group()
    print(f"OK ddp-{how}")


if __name__ == "__main__":
    main()

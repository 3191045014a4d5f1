"""PyTorch DistributedDataParallel on the ddl backend.

    ddlrun -n 4 python pytorch_ddp_ddl.py                 # synthetic CIFAR-shaped data
    ddlrun -H a,b python pytorch_ddp_ddl.py --data d.npz   # x (N,3,32,32) float, y (N,) int

The only DDL-specific line is init_process_group("ddl"): the backend comes with the
DDL-enabled pytorch package, and ddlrun needs no MASTER_ADDR.
"""

import argparse
import time

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--data", help="an .npz with x (N,3,32,32) and y (N,)")
ap.add_argument("--batch-size", type=int, default=32, help="per rank")
ap.add_argument("--epochs", type=int, default=1)
ap.add_argument("--samples", type=int, default=2048, help="synthetic samples")
ap.add_argument("--lr", type=float, default=0.001, help="single-process learning rate")
ap.add_argument("--sync-bn", action="store_true", help="batch statistics over all ranks")
args = ap.parse_args()

dist.init_process_group("ddl")
rank, size = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)

if args.data:
    with np.load(args.data) as f:
        x, y = torch.from_numpy(f["x"]).float(), torch.from_numpy(f["y"]).long()
else:
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(args.samples, 3, 32, 32, generator=g), torch.randint(0, 10, (args.samples,),
                                                                          generator=g)
data = TensorDataset(x, y)
sampler = DistributedSampler(data, num_replicas=size, rank=rank, shuffle=True)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)

model = nn.Sequential(
    nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
    nn.Flatten(), nn.Linear(64 * 8 * 8, 10))
if args.sync_bn:
    import ddl_core.torch

    model = ddl_core.torch.SyncBatchNorm.convert_sync_batchnorm(model)
model = DDP(model)
opt = torch.optim.SGD(model.parameters(), lr=args.lr * size, momentum=0.9)  # linear scaling

seen, t0 = 0, time.perf_counter()
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for xb, yb in loader:
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        seen += len(xb)
    if rank == 0:
        print(f"epoch {epoch}: loss {loss.item():.4f}", flush=True)
rate = torch.tensor([seen / (time.perf_counter() - t0)], dtype=torch.float64)
dist.all_reduce(rate)  # every rank's images/sec, summed
if rank == 0:
    print("-" * 64)
    print(f"total images/sec: {rate.item():.2f}")
    print("-" * 64)
dist.destroy_process_group()

"""A Horovod PyTorch training script, unchanged from what runs on upstream Horovod.

    horovodrun -np 4 python horovod_pytorch.py      (or: ddlrun -n 4 python horovod_pytorch.py)
"""

import argparse
import time

import horovod.torch as hvd
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--data", help="an .npz with x (N,1,28,28) and y (N,)")
ap.add_argument("--batch-size", type=int, default=64)
ap.add_argument("--epochs", type=int, default=1)
ap.add_argument("--samples", type=int, default=2048)
ap.add_argument("--lr", type=float, default=0.01)
args = ap.parse_args()

hvd.init()
torch.manual_seed(42)
torch.set_num_threads(1)

if args.data:
    with np.load(args.data) as f:
        x, y = torch.from_numpy(f["x"]).float(), torch.from_numpy(f["y"]).long()
else:
    x, y = torch.randn(args.samples, 1, 28, 28), torch.randint(0, 10, (args.samples,))
train = TensorDataset(x, y)
sampler = DistributedSampler(train, num_replicas=hvd.size(), rank=hvd.rank())
loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 10, kernel_size=5)
        self.conv2 = nn.Conv2d(10, 20, kernel_size=5)
        self.fc1 = nn.Linear(320, 50)
        self.fc2 = nn.Linear(50, 10)

    def forward(self, x):
        x = F.relu(F.max_pool2d(self.conv1(x), 2))
        x = F.relu(F.max_pool2d(self.conv2(x), 2))
        x = F.relu(self.fc1(x.view(-1, 320)))
        return F.log_softmax(self.fc2(x), dim=1)


model = Net()
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr * hvd.size(), momentum=0.5)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
hvd.broadcast_optimizer_state(optimizer, root_rank=0)
optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters(),
                                     compression=hvd.Compression.none, op=hvd.Average)

t0, seen = time.perf_counter(), 0
for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for data, target in loader:
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
        seen += len(data)
    avg = hvd.allreduce(loss.detach(), name="avg_loss")
    if hvd.rank() == 0:
        print(f"epoch {epoch}: loss {avg.item():.4f}", flush=True)
rate = hvd.allreduce(torch.tensor([seen / (time.perf_counter() - t0)]), op=hvd.Sum)
if hvd.rank() == 0:
    print("-" * 64)
    print(f"total images/sec: {rate.item():.2f}")
    print("-" * 64)

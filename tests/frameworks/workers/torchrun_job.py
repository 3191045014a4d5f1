"""Workers that torchrun starts (no MPI launcher): init_process_group("ddl") makes them one
MPI job (ddl_core/torch/torchrun_join.py).

  gloo      DDP on ddl and DDP on a gloo group of the same ranks, same start and batches:
            the parameters after N steps are the same (ddl's result is gloo's), and
            libddl's world is torchrun's (rank, size, MPI rank order = RANK);
  elastic   under torchrun --max-restarts: attempt 0 makes its job, then rank 1 dies
            (os._exit); torchrun restarts the group and attempt 1 makes a new job and
            reduces correctly;
  hold      print "READY <pid>" and wait (a test SIGKILLs the group meanwhile).
"""

import gc
import os
import sys
import time

import torch
import torch.distributed as dist
from common import batch, cnn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddl_core

mode = sys.argv[1]
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
dist.init_process_group("ddl")
rank, size = dist.get_rank(), dist.get_world_size()
assert (ddl_core.rank(), ddl_core.size()) == (rank, size), (ddl_core.rank(), ddl_core.size())
assert rank == int(os.environ["RANK"]) and size == int(os.environ["WORLD_SIZE"])

if mode == "gloo":
    gloo = dist.new_group(backend="gloo")
    torch.manual_seed(7 + rank)  # different per rank: DDP broadcasts rank 0's weights
    a = cnn()
    b = cnn()
    b.load_state_dict(a.state_dict())
    on_ddl, on_gloo = DDP(a), DDP(b, process_group=gloo)
    for model in (on_ddl, on_gloo):
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        for s in range(4):
            x, y = batch(s, rank)
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    worst = 0.0
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        worst = max(worst, (p - q).abs().max().item())
        assert torch.allclose(p, q, atol=1e-6, rtol=1e-5), (name, (p - q).abs().max())
    print(f"max |ddl - gloo| {worst:.3g}", flush=True)
    del on_ddl, on_gloo
    gc.collect()
elif mode == "elastic":
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    assert torch.all(t == size * (size + 1) / 2), t
    if attempt == 0:
        dist.barrier()
        if rank == 1:
            os._exit(3)  # a worker failure: torchrun restarts the whole group
        time.sleep(60)  # (torchrun stops this one)
elif mode == "hold":
    print(f"READY {os.getpid()}", flush=True)
    time.sleep(120)
dist.destroy_process_group()
print(f"OK {mode} attempt {attempt} rank {rank} of {size}", flush=True)

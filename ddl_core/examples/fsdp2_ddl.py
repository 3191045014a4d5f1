"""FSDP2 (fully_shard) of a small transformer on the ddl backend, with a 2-D DeviceMesh:
parameters sharded over one mesh dimension and replicated over the other (HSDP).

    ddlrun -n 4 python fsdp2_ddl.py                  # mesh 2 x 2: replicate x shard
    ddlrun -n 4 python fsdp2_ddl.py --check-ddp      # also DDP on the same data: same losses

Beyond data parallelism: each rank keeps only its shard of the parameters, gradients and
optimizer state (within its replica group); blocks' parameters are all-gathered just before
use and their gradients reduce-scattered, then averaged across replicas - all on libddl
through `init_process_group("ddl")`. With --check-ddp the same model is trained with DDP
on the same batches and the two loss curves must agree.
"""

import argparse
import copy
import statistics
import time

import torch
import torch.distributed as dist
from ddl_core.torch.models import TinyTransformer, lm_loss, shard, token_batch
from torch.distributed.device_mesh import init_device_mesh
from torch.nn.parallel import DistributedDataParallel as DDP

ap = argparse.ArgumentParser(description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
ap.add_argument("--lr", type=float, default=3e-3)
ap.add_argument("--replicas", type=int, default=0,
                help="size of the replicate dimension (default: 2 when the ranks split "
                     "evenly into 2 groups of 2 or more, else 1)")
ap.add_argument("--check-ddp", action="store_true",
                help="also train with DDP and check that the loss curves agree")
args = ap.parse_args()

dist.init_process_group("ddl")
rank, size = dist.get_rank(), dist.get_world_size()
torch.set_num_threads(1)
replicas = args.replicas or (2 if size % 2 == 0 and size >= 4 else 1)
if size % replicas:
    raise SystemExit(f"--replicas {replicas} does not divide {size} ranks")
mesh = init_device_mesh("cpu", (replicas, size // replicas),
                        mesh_dim_names=("replicate", "shard"))

torch.manual_seed(0)  # the same initial weights on every rank
model = TinyTransformer()
ddp_model = DDP(copy.deepcopy(model)) if args.check_ddp else None
shard(model, mesh)
opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
ddp_opt = torch.optim.AdamW(ddp_model.parameters(), lr=args.lr) if ddp_model else None


def train_step(net: torch.nn.Module, optim: torch.optim.Optimizer, step: int) -> float:
    """One step on this rank's batch; returns the loss averaged over all ranks."""
    x, y = token_batch(step, rank, args.batch)
    optim.zero_grad()
    loss = lm_loss(net(x), y)
    loss.backward()
    optim.step()
    avg = loss.detach().clone()
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)
    return avg.item()


losses, ddp_losses, times = [], [], []
for step in range(args.steps):
    t0 = time.perf_counter()
    losses.append(train_step(model, opt, step))
    times.append(time.perf_counter() - t0)
    if ddp_model is not None:
        ddp_losses.append(train_step(ddp_model, ddp_opt, step))
    if rank == 0:
        extra = f"  (DDP {ddp_losses[-1]:.5f})" if ddp_losses else ""
        print(f"step {step:3d}  loss {losses[-1]:.5f}{extra}", flush=True)

if rank == 0:
    print(f"FSDP2 on mesh {tuple(mesh.shape)} (replicate, shard), {size} ranks: "
          f"median step {statistics.median(times) * 1e3:.1f} ms; loss {losses[0]:.4f} -> "
          f"{losses[-1]:.4f}")
if ddp_losses:
    worst = max(abs(a - b) for a, b in zip(losses, ddp_losses, strict=True))
    if worst > 1e-4 * max(1.0, abs(losses[0])):
        raise SystemExit(f"rank {rank}: FSDP2 and DDP loss curves differ by {worst:.3g}")
    if rank == 0:
        print(f"OK same loss curve as DDP (largest difference {worst:.2e})", flush=True)
dist.destroy_process_group()

"""DDP that survives a lost rank: the survivors shrink the world, make a new process group
on it, restore the last committed state and train on.

    ddlrun --elastic -n 4 python pytorch_elastic_ddl.py
    ddlrun --elastic -n 4 python pytorch_elastic_ddl.py --kill-rank 2 --kill-step 20

torch has no way to shrink a process group (a NCCL or gloo group whose member died is
unusable, and torchrun's answer is to restart every worker from a checkpoint). On the ddl
backend under `ddlrun --elastic` (Open MPI's fault tolerance, ULFM) the survivors stay
alive and go on in the same processes:

1. every step ends with a commit: a copy of the model's and the optimizer's state (and
   the step) in host memory, cheap next to the step itself;
2. a member's death makes the survivors' next collective fail (DDP's gradient allreduce
   raises a RuntimeError that carries ddl_core.ProcessFailedError's text);
3. the survivors call ddl_core.shrink_world(), destroy the old process group, make a new
   one on the shrunk world (init_process_group("ddl") again: rank and size are the new
   world's), agree on the newest commit any of them holds, load it into a new DDP model
   (DDP broadcasts rank 0's parameters, so every survivor starts bit-identical) and redo
   the step that failed.

--kill-rank R --kill-step S makes rank R SIGKILL itself before step S (a crash, or the
out-of-memory killer), to show it. Each survivor prints its final rank, the world size
and a digest of its parameters; they must all be the same.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import os
import signal
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddl_core

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--batch", type=int, default=32, help="samples per rank and step")
ap.add_argument("--kill-rank", type=int, default=-1, help="this rank SIGKILLs itself")
ap.add_argument("--kill-step", type=int, default=10, help="... before this step")
args = ap.parse_args()

dist.init_process_group("ddl")
if not ddl_core.fault_tolerant():
    raise SystemExit("run under ddlrun --elastic: without it a lost rank ends the job")
first_rank = dist.get_rank()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)


def make_ddp(module: nn.Module) -> DDP:
    """A DDP model on the current default group (its constructor broadcasts rank 0's
    parameters and buffers: every member starts from the same state)."""
    return DDP(module)


def commit(step: int) -> dict:
    """The state to go back to: what the survivors all hold after `step` finished."""
    return {"step": step, "model": copy.deepcopy(model.state_dict()),
            "optimizer": copy.deepcopy(optimizer.state_dict())}


def restore(saved: dict) -> int:
    model.load_state_dict(saved["model"])
    optimizer.load_state_dict(saved["optimizer"])
    return saved["step"]


def newest_commit(saved: dict) -> dict:
    """The newest commit any survivor holds, on every survivor: a survivor whose last step
    had not finished when the rank died (it was still receiving the allreduce's result)
    catches up from the lowest rank that has it; nobody goes back a step."""
    steps: list[int] = [0] * dist.get_world_size()
    dist.all_gather_object(steps, saved["step"])
    root = steps.index(max(steps))
    box = [saved if dist.get_rank() == root else None]
    dist.broadcast_object_list(box, src=root)
    return box[0]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's share of step `step`'s data (the same whatever world it runs in, so a
    survivor redoing a step sees the batch it would have)."""
    g = torch.Generator().manual_seed(step * 1000 + dist.get_rank())
    x = torch.randn(args.batch, 32, generator=g)
    return x, x.sum(dim=1, keepdim=True)


ddp = make_ddp(model)
saved = commit(0)
step, resets = 0, 0
t_lost = None
while step < args.steps:
    if first_rank == args.kill_rank and step == args.kill_step:
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        x, y = batch(step)
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        optimizer.step()
    except (RuntimeError, ddl_core.ProcessFailedError) as e:
        if "ProcessFailedError" not in f"{type(e).__name__}: {e}":
            raise  # not a lost rank: a real error
        t_lost = time.monotonic()
        resets += 1
        ddl_core.shrink_world()  # collective over the survivors: all agree on who is left
        dist.destroy_process_group()
        dist.init_process_group("ddl")  # the shrunk world's rank and size
        saved = newest_commit(saved)
        step = restore(saved)
        ddp = make_ddp(model)
        if dist.get_rank() == 0:
            print(f"reset {resets}: {dist.get_world_size()} ranks left, back to step {step} "
                  f"({time.monotonic() - t_lost:.2f} s to recover)", flush=True)
        continue
    step += 1
    saved = commit(step)

digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                 for p in model.parameters())).hexdigest()[:16]
digests: list[str] = [""] * dist.get_world_size()
dist.all_gather_object(digests, digest)
if dist.get_rank() == 0:
    same = "identical" if len(set(digests)) == 1 else f"DIFFERENT: {digests}"
    print(f"done: {args.steps} steps on {dist.get_world_size()} ranks after {resets} "
          f"reset(s); parameters {same} ({digest})", flush=True)
dist.destroy_process_group()
if len(set(digests)) != 1:
    raise SystemExit(1)

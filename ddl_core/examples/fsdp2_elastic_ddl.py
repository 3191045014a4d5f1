"""FSDP2 that survives a lost rank: every commit is a rank's own shard of the training state
plus a copy of its neighbour's, so the survivors can put the whole state back together,
shard it anew over the shrunk world and train on.

    ddlrun --elastic -n 4 python fsdp2_elastic_ddl.py
    ddlrun --elastic -n 4 python fsdp2_elastic_ddl.py --kill-rank 2 --kill-step 8

Why a neighbour's copy: FSDP2 (fully_shard) keeps each shard of the parameters and of the
optimizer state on one rank only, so a lost rank's part of an in-memory commit dies with
it. A full copy of the state on every rank would cost what sharding saves; a copy of one
neighbour's shard costs one more shard (2/n of the state) and a send to the next rank per
commit, and it survives the loss of any ranks that are not neighbours (r and r+1 mod n).
When two neighbours die together no copy of one shard is left: the example says so on
every survivor and exits, and the job must go back to a checkpoint on disk
(torch.distributed.checkpoint).

1. After every step each rank packs its shards (the local parts of the DTensors of
   get_model_state_dict and get_optimizer_state_dict) into one buffer in host memory,
   keeps it and sends it to the next rank while it receives the previous rank's. The last
   two commits are kept: a death during the exchange leaves some ranks with the newer one
   only half exchanged.
2. A death makes the survivors' next collective fail (FSDP2's all-gather or
   reduce-scatter raises a RuntimeError carrying ddl_core.ProcessFailedError's text).
3. The survivors call ddl_core.shrink_world(), make a new process group and a 1-D mesh on
   the shrunk world, agree on the newest step at which every old rank's shard is held by
   one of them, gather those shards into the full state, build the model and optimizer
   sharded over the new mesh from it (set_model_state_dict / set_optimizer_state_dict with
   full_state_dict=True) and redo the step that failed.

A second death while the survivors recover is not caught here: it ends the job with
that error (go back to a checkpoint on disk).

With --check (the default) each commit also records a digest of the full state, and a
restore checks the state it put together against the digest of the step it went back to.
--kill-rank R[,R...] --kill-step S makes those ranks SIGKILL themselves before step S (with
--kill-at commit: inside the commit of step S, before sending their shard).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import pickle
import signal
import time
from typing import Any

import torch
import torch.distributed as dist
from ddl_core.torch.models import TinyTransformer, lm_loss, shard, token_batch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor

import ddl_core

ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
ap.add_argument("--steps", type=int, default=20)
ap.add_argument("--batch", type=int, default=8, help="sequences per rank per step")
ap.add_argument("--lr", type=float, default=3e-3)
ap.add_argument("--kill-rank", type=lambda v: {int(r) for r in v.split(",")}, default=set(),
                help="these ranks (R or R,R,...) SIGKILL themselves")
ap.add_argument("--kill-step", type=int, default=8, help="... before this step")
ap.add_argument("--kill-at", choices=("step", "commit"), default="step",
                help="die before step --kill-step (step) or inside the commit of that step, "
                     "its shard not yet sent (commit: the survivors go back one more step)")
ap.add_argument("--no-check", dest="check", action="store_false",
                help="do not digest the full state at every commit")
args = ap.parse_args()

Key = tuple[str, ...]


def build(full: dict[str, Any] | None) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The model and optimizer sharded over the current world (a 1-D mesh of every rank);
    loaded from the full state `full` when given, else fresh (the same seed everywhere)."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("shard",))
    torch.manual_seed(0)
    model = shard(TinyTransformer(), mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    if full is not None:
        whole = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, full["model"], options=whole)
        set_optimizer_state_dict(model, opt, full["optim"], options=whole)
    return model, opt


def pack(model: torch.nn.Module, opt: torch.optim.Optimizer) -> torch.Tensor:
    """This rank's part of the state as one byte buffer: a header (the entries' names,
    dtypes, shapes, whether sharded, and the optimizer's param_groups) and the bytes of
    each local tensor, in a fixed order. A copy: later steps do not change it."""
    msd = get_model_state_dict(model)
    osd = get_optimizer_state_dict(model, opt)
    entries: list[tuple[Key, Any]] = [(("model", k), msd[k]) for k in sorted(msd)]
    for fqn in sorted(osd["state"]):
        for name in sorted(osd["state"][fqn]):
            entries.append((("optim", fqn, name), osd["state"][fqn][name]))
    layout, parts = [], []
    for key, value in entries:
        sharded = isinstance(value, DTensor)
        t = (value.to_local() if sharded else value).detach().contiguous().cpu()
        layout.append((key, sharded, t.dtype, tuple(t.shape)))
        parts.append(t.reshape(-1).view(torch.uint8))
    head = pickle.dumps((layout, osd["param_groups"]))
    size = torch.tensor([len(head)], dtype=torch.int64).view(torch.uint8)
    return torch.cat([size, torch.frombuffer(bytearray(head), dtype=torch.uint8), *parts])


def unpack(buf: torch.Tensor) -> tuple[dict[Key, tuple[bool, torch.Tensor]], Any]:
    """pack's inverse: {key: (sharded, local tensor)} and the param_groups."""
    n = int(buf[:8].clone().view(torch.int64))
    layout, groups = pickle.loads(buf[8:8 + n].numpy().tobytes())
    out, at = {}, 8 + n
    for key, sharded, dtype, shape in layout:
        nbytes = math.prod(shape) * torch.empty((), dtype=dtype).element_size()
        out[key] = (sharded, buf[at:at + nbytes].clone().view(dtype).reshape(shape))
        at += nbytes
    return out, groups


def swap(buf: torch.Tensor) -> torch.Tensor:
    """Send this rank's commit to the next rank and receive the previous rank's."""
    n, r = dist.get_world_size(), dist.get_rank()
    right, left = (r + 1) % n, (r - 1) % n
    mine, theirs = torch.tensor([buf.numel()], dtype=torch.int64), torch.empty(1, dtype=torch.int64)
    for w in (dist.isend(mine, right), dist.irecv(theirs, left)):
        w.wait()
    got = torch.empty(int(theirs.item()), dtype=torch.uint8)
    for w in (dist.isend(buf, right), dist.irecv(got, left)):
        w.wait()
    return got


def full_digest(model: torch.nn.Module, opt: torch.optim.Optimizer) -> str:
    """sha256 of the whole state (every DTensor gathered): the same on every rank."""
    whole = StateDictOptions(full_state_dict=True)
    msd = get_model_state_dict(model, options=whole)
    osd = get_optimizer_state_dict(model, opt, options=whole)
    h = hashlib.sha256()
    for k in sorted(msd):
        h.update(msd[k].detach().contiguous().numpy().tobytes())
    for fqn in sorted(osd["state"]):
        for name in sorted(osd["state"][fqn]):
            h.update(torch.as_tensor(osd["state"][fqn][name]).contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


class Commits:
    """What this rank holds of the last two commits: {step: {rank: buffer}}, its own shard
    and its left neighbour's, by their ranks in the world the commit was made in."""

    def __init__(self) -> None:
        self.held: dict[int, dict[int, torch.Tensor]] = {}
        self.digests: dict[int, str] = {}
        self.world = 0  # the size of the world the commits were made in

    def commit(self, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
        n, r = dist.get_world_size(), dist.get_rank()
        self.world = n
        buf = pack(model, opt)
        maybe_die(step, "commit")
        self.held[step] = {r: buf}
        for old in [s for s in self.held if s < step - 1]:
            del self.held[old]
            self.digests.pop(old, None)
        if n > 1:
            self.held[step][(r - 1) % n] = swap(buf)
        if args.check:
            self.digests[step] = full_digest(model, opt)

    def restore(self, old_rank: int) -> tuple[int, dict[str, Any], str | None]:
        """On the shrunk world: (the newest step whose every shard a survivor holds, the full
        state of that step, its digest as recorded then, or None if nobody has it)."""
        views: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(views, (old_rank, {s: sorted(b) for s, b in self.held.items()},
                                       self.digests))
        holder: dict[int, dict[int, int]] = {}  # step -> old rank -> new rank holding it
        for new_rank, (_, have, _) in enumerate(views):
            for step, ranks in have.items():
                for q in ranks:
                    holder.setdefault(step, {}).setdefault(q, new_rank)
        whole = [s for s, m in holder.items() if len(m) == self.world]
        if not whole:
            lost = sorted(set(range(self.world)) - {v[0] for v in views})
            raise SystemExit(f"rank {dist.get_rank()}: ranks {lost} of {self.world} died and "
                             f"no survivor holds every shard (two neighbours were lost): "
                             f"restart from a checkpoint on disk")
        step = max(whole)
        mine = {q: self.held[step][q] for q, who in holder[step].items()
                if who == dist.get_rank()}
        every: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        shards = {}
        groups = None
        for part in every:
            for q, buf in part.items():
                shards[q], groups = unpack(buf)
        full: dict[str, Any] = {"model": {}, "optim": {"state": {}, "param_groups": groups}}
        for key, (sharded, first) in shards[0].items():
            value = (torch.cat([shards[q][key][1] for q in range(self.world)], dim=0)
                     if sharded else first)
            if key[0] == "model":
                full["model"][key[1]] = value
            else:
                full["optim"]["state"].setdefault(key[1], {})[key[2]] = value
        recorded = next((v[2][step] for v in views if step in v[2]), None)
        self.held, self.digests = {}, {}  # their ranks mean nothing in the new world
        return step, full, recorded


def maybe_die(step: int, where: str) -> None:
    """--kill-rank: a crash (or the out-of-memory killer) at the chosen point."""
    if first_rank in args.kill_rank and step == args.kill_step and where == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)


def is_lost_rank(e: BaseException) -> bool:
    return "ProcessFailedError" in f"{type(e).__name__}: {e}"


dist.init_process_group("ddl")
if not ddl_core.fault_tolerant():
    raise SystemExit("run under ddlrun --elastic: without it a lost rank ends the job")
torch.set_num_threads(1)
first_rank = dist.get_rank()
model, opt = build(None)
commits = Commits()
step, resets, losses = 0, 0, []
commits.commit(step, model, opt)
while step < args.steps:
    maybe_die(step, "step")
    try:
        x, y = token_batch(step, dist.get_rank(), args.batch)
        opt.zero_grad()
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg, op=dist.ReduceOp.AVG)
        commits.commit(step + 1, model, opt)
    except (RuntimeError, ddl_core.ProcessFailedError) as e:
        if not is_lost_rank(e):
            raise  # not a lost rank: a real error
        t_lost = time.monotonic()
        resets += 1
        old_rank, old_size = dist.get_rank(), dist.get_world_size()
        del model, opt
        ddl_core.shrink_world()  # collective over the survivors: all agree on who is left
        dist.destroy_process_group()
        dist.init_process_group("ddl")  # the shrunk world's rank and size
        step, full, recorded = commits.restore(old_rank)
        model, opt = build(full)
        del full
        commits.commit(step, model, opt)  # the new world's first commit
        check = ""
        if args.check:  # (the digest is of the whole state: the same on every rank)
            now = commits.digests[step]
            if recorded is None:
                check = "; not checked (no survivor digested that commit)"
            elif now != recorded:
                raise SystemExit(f"rank {dist.get_rank()}: the restored state {now} differs "
                                 f"from the commit {recorded}") from None
            else:
                check = f"; state identical to the commit ({now})"
        if dist.get_rank() == 0:
            took = time.monotonic() - t_lost
            print(f"reset {resets}: {dist.get_world_size()} of {old_size} ranks left, "
                  f"back to step {step} ({took:.2f} s to recover){check}", flush=True)
        continue
    step += 1
    losses.append(avg.item())
    if dist.get_rank() == 0:
        print(f"step {step:3d}  loss {losses[-1]:.5f}  ({dist.get_world_size()} ranks)",
              flush=True)

if dist.get_rank() == 0:
    print(f"done: {args.steps} steps on {dist.get_world_size()} ranks after {resets} "
          f"reset(s); loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
dist.destroy_process_group()

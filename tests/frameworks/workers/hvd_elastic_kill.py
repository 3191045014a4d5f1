"""Elastic Horovod through a SIGKILL: a DistributedOptimizer training loop inside
hvd.elastic.run, committing every step; at step KILL_AT the last rank kills itself
(SIGKILL: no goodbye, no exception). The survivors' next collective fails
(HorovodInternalError), they restore the last commit, the world shrinks to them, the reset
callback rescales the learning rate, and they finish every step. Each survivor prints
'OK hvd_elastic_kill' and a digest of its parameters, which must be the others'.

argv: STEPS KILL_AT [VICTIMS (comma-separated start ranks; default: the last)]"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
import time

import horovod.torch as hvd
import torch
from checks import bad, expect
from torch import nn

steps, kill_at = int(sys.argv[1]), int(sys.argv[2])
hvd.init()
start_rank, start_size = hvd.rank(), hvd.size()
victims = ({int(v) for v in sys.argv[3].split(",")} if len(sys.argv) > 3
           else {start_size - 1})
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
base_lr = 0.01
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=base_lr * hvd.size(),
                                               momentum=0.9),
                               named_parameters=model.named_parameters())
resets: list[int] = []


def on_reset() -> None:
    resets.append(hvd.size())
    for group in opt.param_groups:
        group["lr"] = base_lr * hvd.size()


state = hvd.elastic.TorchState(model, opt, step=0, steps_done=[])
state.register_reset_callbacks([on_reset])
t_kill: list[float] = []


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    while state.step < steps:
        if state.step == kill_at and start_rank in victims and not resets:
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(state.step * 100 + hvd.rank())
        x, y = torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        if state.step == kill_at and not resets:
            t_kill.append(time.monotonic())
        opt.step()
        state.steps_done.append(state.step)
        state.step += 1
        state.commit()


t0 = time.monotonic()
train(state)
survivors = start_size - len(victims)
expect(hvd.size() == survivors, f"world of {hvd.size()} after the kill, want {survivors}")
# (two deaths at once may be seen in one reset or in two: the last is the survivors')
expect(resets[-1:] == [survivors], f"reset callbacks saw sizes {resets}, want the last "
       f"{survivors}")
expect(state.steps_done == list(range(steps)), f"committed steps {state.steps_done}")
expect(opt.param_groups[0]["lr"] == base_lr * survivors, "learning rate not rescaled")
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                 for p in model.parameters())).hexdigest()[:16]
digests = hvd.allgather_object(digest)
expect(len(set(digests)) == 1, f"survivors' parameters differ: {digests}")
if bad:
    print(f"start rank {start_rank} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print(f"OK hvd_elastic_kill start_rank={start_rank} rank={hvd.rank()} size={hvd.size()} "
      f"params={digest}", flush=True)

"""Elastic Horovod growing onto more slots: the discovery script (the test's) reports one
more slot once EPOCH_FILE exists (or as many more as the number written in it); rank 0
writes it after epoch 0 (and, with GROW_EPOCHS, rewrites it after each of those epochs
with the number of grows so far) and waits, as Horovod's
own elastic_torch_main.py does, for the host update; the commit that follows raises
HostsUpdatedInterrupt on every rank, the survivors spawn the new rank, which starts this
script, joins the world in hvd.init() and gets the state by the sync. Every rank of the
grown world prints 'OK hvd_elastic_grow' with its start rank, the world's size and a
digest of its parameters.

argv: EPOCH_FILE EPOCHS [GROW_EPOCHS, e.g. 0,1: grow after epoch 0 and again after 1]"""

from __future__ import annotations

import hashlib
import os
import sys
import time
from pathlib import Path

import horovod.torch as hvd
import torch
from torch import nn

flag, epochs = Path(sys.argv[1]), int(sys.argv[2])
grow_after = [int(e) for e in (sys.argv[3] if len(sys.argv) > 3 else "0").split(",")]
hvd.init()
start = (int(os.environ["HOROVOD_RANK"]), hvd.size())
torch.manual_seed(0)
model = nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters())
sizes: list[int] = []
state = hvd.elastic.TorchState(model, opt, epoch=0, batch=0)
state.register_reset_callbacks([lambda: sizes.append(hvd.size())])


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> None:
    while state.epoch < epochs:
        while state.batch < 5:
            g = torch.Generator().manual_seed(state.epoch * 100 + state.batch * 10 + hvd.rank())
            opt.zero_grad()
            model(torch.randn(4, 8, generator=g)).sum().backward()
            opt.step()
            state.batch += 1
            state.commit()
        grows = grow_after.index(state.epoch) + 1 if state.epoch in grow_after else 0
        done = int(flag.read_text()) if flag.exists() else 0
        if grows > done and hvd.rank() == 0:
            flag.write_text(str(grows))
            t0 = time.monotonic()
            while state._host_messages.empty():
                if time.monotonic() - t0 > 60:
                    raise TimeoutError("no host update from ddlrun within 60 s")
                time.sleep(0.1)
        state.epoch += 1
        state.batch = 0
        state.commit()


train(state)
digest = hashlib.sha256(b"".join(p.detach().numpy().tobytes()
                                 for p in model.parameters())).hexdigest()[:16]
same = len(set(hvd.allgather_object(digest))) == 1
print(f"OK hvd_elastic_grow start_rank={start[0]} rank={hvd.rank()} size={hvd.size()} "
      f"resets={sizes} same={same} epoch={state.epoch}", flush=True)

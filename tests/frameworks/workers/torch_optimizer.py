"""ddl_core.torch without DDP: DistributedOptimizer + broadcast_parameters +
broadcast_optimizer_state give the single-process result; gradient accumulation
(backward_passes_per_step=2) and fp16 compression too."""

import sys

import ddl_core.torch as dt
import torch
from common import batch, check_same_and_close, cnn, reference
from torch import nn

import ddl_core

ddl_core.init()
rank, size = ddl_core.rank(), ddl_core.size()
STEPS, LR = 4, 0.01

for mode in sys.argv[1:]:  # plain | accumulate | fp16, one after another in one job
    torch.manual_seed(7 + rank)  # different starting points: the broadcast must fix them
    model = cnn()
    opt = torch.optim.Adam(model.parameters(), lr=LR * (rank + 1))  # root's lr must win
    dt.broadcast_parameters(model.state_dict(), root_rank=0)
    dt.broadcast_optimizer_state(opt, root_rank=0)
    assert opt.param_groups[0]["lr"] == LR, opt.param_groups[0]["lr"]
    ref_model = cnn()
    ref_model.load_state_dict(model.state_dict())

    passes = 2 if mode == "accumulate" else 1
    comp = dt.Compression.fp16 if mode == "fp16" else dt.Compression.none
    opt = dt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                  backward_passes_per_step=passes, compression=comp)
    assert isinstance(opt, torch.optim.Adam)
    for s in range(STEPS):
        opt.zero_grad()
        x, y = batch(s, rank)
        if passes == 1:
            nn.functional.cross_entropy(model(x), y).backward()
        else:  # two half batches, losses halved: the same gradient as the whole batch
            for xs, ys in zip(x.chunk(2), y.chunk(2), strict=True):
                (nn.functional.cross_entropy(model(xs), ys) / 2).backward()
        opt.step()

    ref = reference(ref_model, STEPS, size, LR, opt="adam")
    check_same_and_close(model, ref, rank, size,
                         lambda t: ddl_core.allgather(t.reshape(-1)).reshape(size, -1),
                         atol=2e-3 if mode == "fp16" else 1e-5)
    print(f"OK {mode}", flush=True)

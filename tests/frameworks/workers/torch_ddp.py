"""DDP on the ddl backend (and DDL's comm hook on gloo): after N steps the parameters are
identical on every rank and equal to one process trained on the concatenated batches;
ddl_core.torch.SyncBatchNorm under DDP equals BatchNorm on the concatenated batch."""

import gc
import sys

import ddl_core.torch as ddl_torch
import torch
import torch.distributed as dist
from common import check_same_and_close, cnn, reference, train
from torch.nn.parallel import DistributedDataParallel as DDP

mode = sys.argv[1]  # ddl | hook | syncbn
STEPS, LR = 4, 0.05

dist.init_process_group("gloo" if mode == "hook" else "ddl")  # no MASTER_ADDR: ddl rendezvous
rank, size = dist.get_rank(), dist.get_world_size()
assert dist.get_backend() == ("gloo" if mode == "hook" else "ddl")

torch.manual_seed(1234 + rank)  # different on purpose: DDP must broadcast rank 0's weights
model = cnn(bn=mode == "syncbn")
if mode == "syncbn":
    model = ddl_torch.SyncBatchNorm.convert_sync_batchnorm(model)
    assert isinstance(model[1], ddl_torch.SyncBatchNorm)
ddp = DDP(model)
if mode == "hook":
    ddp.register_comm_hook(None, ddl_torch.allreduce_hook)

# rank 0's initial weights are what the reference starts from
init = {k: v.clone() for k, v in model.state_dict().items()}
ref_model = cnn(bn=mode == "syncbn")
ref_model.load_state_dict(init)

train(ddp, STEPS, rank, LR)

ref = reference(ref_model, STEPS, size, LR)


def gather(t):
    out = [torch.empty_like(t) for _ in range(size)]
    dist.all_gather(out, t)
    return out


check_same_and_close(model, ref, rank, size, gather)
print(f"OK {mode}", flush=True)
# The process group goes with its last reference, DDP's: its gloo worker threads are then
# joined here rather than left to drop tensors during interpreter shutdown, which aborts
# the process ("terminate called without an active exception": a torch race, pytorch
# issue 190489, that any gloo script ending right after a collective can hit).
del ddp  # (the optimizer went with train())
gc.collect()
dist.destroy_process_group()

"""DDL for PyTorch.

- `dist.init_process_group("ddl")`: a torch.distributed backend on libddl (backend.py),
  registered when torch is imported (the `torch.backends` entry point) or by importing
  this package; DDP, SyncBatchNorm and the collectives run on it.
- `allreduce_hook` / `fp16_compress_hook`: DDP communication hooks that average
  gradients with DDL while the process group stays gloo or nccl (hooks.py).
- `DistributedOptimizer`, `broadcast_parameters`, `broadcast_optimizer_state`,
  `broadcast_object`: data parallelism without DDP, Horovod style (optimizer.py).
- `SyncBatchNorm`: batch statistics over all ranks on CPU (torch's is GPU-only).
"""

from __future__ import annotations

from .backend import BACKEND_NAME, DDLWork, ProcessGroupDDL, register
from .hooks import allreduce_hook, fp16_compress_hook
from .optimizer import (
    Compression,
    DistributedOptimizer,
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from .sync_bn import SyncBatchNorm

register()

__all__ = [
    "BACKEND_NAME", "DDLWork", "ProcessGroupDDL", "register", "allreduce_hook",
    "fp16_compress_hook", "DistributedOptimizer", "broadcast_parameters",
    "broadcast_optimizer_state", "broadcast_object", "allgather_object",
    "Compression", "SyncBatchNorm",
]


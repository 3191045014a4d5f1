"""DDP communication hooks that average gradient buckets with DDL.

For scripts that keep `init_process_group("gloo")` or `"nccl"` (for the store, for
point-to-point, for GPU tensors elsewhere) but want DDL's topology-aware, fused
allreduce for the gradients:

    model = DDP(model)
    model.register_comm_hook(None, ddl_core.torch.allreduce_hook)

The hook queues the bucket on libddl's progress thread and returns at once; DDP's reducer
waits on the future only when it needs the averaged bucket, so communication overlaps the
rest of the backward pass as it does with the process group's own allreduce.
"""

# No `from __future__ import annotations`: DDP compares the hook's annotations with
# dist.GradBucket and torch.futures.Future[torch.Tensor] as objects.
from typing import Any

import torch
import torch.distributed as dist

import ddl_core

from ._async import COMPLETER
from ._tensors import prepare


def allreduce_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # noqa: ARG001
    """Average the bucket over all ranks in place (what DDP's default does), through DDL."""
    ddl_core.init()
    buf = bucket.buffer()
    work, op, post = prepare(buf, "avg")
    h = ddl_core.allreduce_async(work, op=op, out=work)
    fut, _ = COMPLETER.submit([h], buf, post)  # fails in C++ too when the allreduce fails
    return fut


def fp16_compress_hook(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:  # noqa: ARG001
    """Average in float16: half the bytes on the wire, for bandwidth-bound links.

    The bucket is divided by the number of ranks before the cast, so the float16 sum
    cannot overflow where the float32 average would not.
    """
    ddl_core.init()
    buf = bucket.buffer()
    half = buf.div(ddl_core.size()).to(torch.float16)
    h = ddl_core.allreduce_async(half, op="sum", out=half)
    fut, _ = COMPLETER.submit([h], buf, lambda: buf.copy_(half))
    return fut

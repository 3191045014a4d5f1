"""`import horovod.torch as hvd` on DDL: Horovod's documented PyTorch API.

Collectives go to ddl_core (libddl's progress thread queues and fuses the asynchronous
ones, as Horovod's background thread does); DistributedOptimizer, the broadcasts and
SyncBatchNorm are ddl_core.torch's.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import torch
from ddl_core.torch._tensors import prepare
from ddl_core.torch.optimizer import (
    Compression,
    allgather_object,
    broadcast_object,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from ddl_core.torch.optimizer import DistributedOptimizer as _DistributedOptimizer
from ddl_core.torch.sync_bn import SyncBatchNorm

import ddl_core

from ..common.basics import (  # noqa: F401 - re-exported Horovod API
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    ddl_op,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)

_handles: dict[int, tuple[Any, Any]] = {}
_ids = itertools.count(1)


def _new_handle(ddl_handle: Any, finish: Any) -> int:
    h = next(_ids)
    _handles[h] = (ddl_handle, finish)
    return h


def poll(handle: int) -> bool:
    """True once the asynchronous operation `handle` has finished."""
    entry = _handles.get(handle)
    if entry is None:
        raise ValueError(f"unknown handle {handle}")
    return entry[0] is None or entry[0].test()


def synchronize(handle: int) -> Any:
    """Wait for `handle` and return its output tensor."""
    entry = _handles.pop(handle, None)
    if entry is None:
        raise ValueError(f"unknown or already synchronized handle {handle}")
    h, finish = entry
    try:
        if h is not None:
            h.wait()
    except ddl_core.DDLError as exc:
        raise HorovodInternalError(str(exc)) from exc
    return finish()


# -- allreduce -------------------------------------------------------------------------------

def _allreduce_async_inplace(tensor: torch.Tensor, op: str, compression: Any,
                             prescale: float, postscale: float) -> int:
    wire, ctx = compression.compress(tensor)
    if prescale != 1.0:
        wire.mul_(prescale)
    work, wop, post = prepare(wire, op)
    h = ddl_core.allreduce_async(work, op=wop, out=work)

    def finish() -> torch.Tensor:
        if post is not None:
            post()
        out = compression.decompress(wire, ctx)
        if out is not tensor:
            tensor.copy_(out)
        if postscale != 1.0:
            tensor.mul_(postscale)
        return tensor

    return _new_handle(h, finish)


def allreduce_async_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                     op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                     process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    """Start an in-place allreduce of `tensor`; returns a handle for synchronize()."""
    return _allreduce_async_inplace(tensor, ddl_op(op, average), Compression.none,
                                    prescale_factor, postscale_factor)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    """Start an allreduce into a new tensor; returns a handle for synchronize()."""
    out = tensor.detach().clone().contiguous()
    return allreduce_async_(out, average, name, op, prescale_factor, postscale_factor)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: str, compression: Any, pre: float,
                post: float) -> torch.Tensor:
        ctx.op, ctx.compression, ctx.pre, ctx.post = op, compression, pre, post
        out = tensor.detach().clone().contiguous()
        return synchronize(_allreduce_async_inplace(out, op, compression, pre, post))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        g = grad.detach().clone().contiguous()
        out = synchronize(_allreduce_async_inplace(g, ctx.op, ctx.compression, ctx.pre,
                                                   ctx.post))
        return out, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = Compression.none, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:  # noqa: ARG001
    """A new tensor: `tensor` reduced over all ranks (differentiable for Sum/Average)."""
    dop = ddl_op(op, average)
    if tensor.requires_grad and dop in ("sum", "avg"):
        return _Allreduce.apply(tensor, dop, compression, prescale_factor, postscale_factor)
    out = tensor.detach().clone().contiguous()
    return synchronize(_allreduce_async_inplace(out, dop, compression, prescale_factor,
                                                postscale_factor))


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:  # noqa: ARG001
    """Reduce `tensor` in place over all ranks."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor))


def grouped_allreduce_async_(tensors: list[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: Any = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    hs = [allreduce_async_(t, average, None, op, prescale_factor, postscale_factor)
          for t in tensors]
    return _new_handle(None, lambda: [synchronize(h) for h in hs])


def grouped_allreduce_async(tensors: list[torch.Tensor], *args: Any, **kwargs: Any) -> int:
    return grouped_allreduce_async_([t.detach().clone().contiguous() for t in tensors],
                                    *args, **kwargs)


def grouped_allreduce(tensors: list[torch.Tensor], *args: Any,
                      **kwargs: Any) -> list[torch.Tensor]:
    kwargs.pop("compression", None)
    return synchronize(grouped_allreduce_async(tensors, *args, **kwargs))


def grouped_allreduce_(tensors: list[torch.Tensor], *args: Any,
                       **kwargs: Any) -> list[torch.Tensor]:
    return synchronize(grouped_allreduce_async_(tensors, *args, **kwargs))


# -- allgather / broadcast / alltoall / reducescatter ----------------------------------------

def _gather_rows(tensor: torch.Tensor) -> torch.Tensor:
    """Concatenate every rank's tensor along dim 0; first dimensions may differ."""
    t = tensor.detach().contiguous()
    if t.dim() == 0:
        t = t.reshape(1)
    rows = ddl_core.allgather(np.array([t.shape[0]], dtype=np.int64))
    longest = int(rows.max())
    padded = torch.zeros((longest, *t.shape[1:]), dtype=t.dtype)
    padded[: t.shape[0]] = t
    gathered = torch.empty((len(rows), longest, *t.shape[1:]), dtype=t.dtype)
    ddl_core.allgather(padded.reshape(-1).view(torch.uint8),
                       out=gathered.reshape(-1).view(torch.uint8))
    return torch.cat([gathered[i, : int(rows[i])] for i in range(len(rows))])


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    out = _gather_rows(tensor)
    return _new_handle(None, lambda: out)


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:  # noqa: ARG001
    """Every rank's tensor concatenated along the first dimension (sizes may differ)."""
    return _gather_rows(tensor)


def grouped_allgather(tensors: list[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:  # noqa: ARG001
    return [_gather_rows(t) for t in tensors]


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    work = tensor if tensor.is_contiguous() else tensor.contiguous()
    h = ddl_core.broadcast_async(work.reshape(-1).view(torch.uint8), root_rank)

    def finish() -> torch.Tensor:
        if work is not tensor:
            tensor.copy_(work)
        return tensor

    return _new_handle(h, finish)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    return broadcast_async_(tensor.detach().clone().contiguous(), root_rank, name)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:  # noqa: ARG001
    """A new tensor holding root_rank's `tensor`."""
    return synchronize(broadcast_async(tensor, root_rank, name))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:  # noqa: ARG001
    """Overwrite `tensor` with root_rank's, in place."""
    return synchronize(broadcast_async_(tensor, root_rank, name))


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ARG001
    """Send splits[j] rows of `tensor` (dim 0, in order) to rank j; returns what was
    received, concatenated in rank order, and the received splits."""
    from ddl_core.torch.backend import alltoall_rows

    n = ddl_core.size()
    t = tensor.detach().contiguous()
    rows = t.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError(f"alltoall: {rows} rows do not split evenly over {n} ranks; "
                             "pass splits")
        splits = [rows // n] * n
    splits = [int(s) for s in (splits.tolist() if hasattr(splits, "tolist") else splits)]
    row = int(np.prod(t.shape[1:])) if t.dim() > 1 else 1
    parts = alltoall_rows(t.reshape(rows, row), splits, row)
    received = torch.tensor([p.shape[0] for p in parts], dtype=torch.int32)
    out = torch.cat(parts).reshape(-1, *t.shape[1:])
    return out, received


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = None,  # noqa: ARG001
                  op: Any = Average, process_set: ProcessSet = global_process_set) -> torch.Tensor:  # noqa: ARG001
    """Reduce over ranks and keep this rank's block of dim 0 (the first blocks one row
    larger when rows do not divide evenly, as Horovod does)."""
    n, me = ddl_core.size(), ddl_core.rank()
    t = tensor.detach().contiguous()
    reduced = t.clone()
    work, wop, post = prepare(reduced, ddl_op(op))
    ddl_core.allreduce(work, op=wop, out=work)
    if post is not None:
        post()
    rows = t.shape[0]
    counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    start = sum(counts[:me])
    return reduced[start: start + counts[me]].clone()


def barrier(process_set: ProcessSet = global_process_set) -> None:  # noqa: ARG001
    ddl_core.barrier()


def join(device: int = -1) -> int:  # noqa: ARG001
    """Horovod's join for uneven data: here every rank must reach it (a barrier); returns
    the last rank, as Horovod does when all ranks join together."""
    ddl_core.barrier()
    return ddl_core.size() - 1


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,  # noqa: N802
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,  # noqa: ARG001
                         process_set: ProcessSet = global_process_set) -> Any:  # noqa: ARG001
    """Horovod's DistributedOptimizer: step() applies gradients averaged over all ranks."""
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by horovod-ddl; use op=hvd.Average")
    return _DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                 compression=compression,
                                 backward_passes_per_step=backward_passes_per_step, op=op,
                                 gradient_predivide_factor=gradient_predivide_factor)


__all__ = [
    "init", "shutdown", "is_initialized", "rank", "size", "local_rank", "local_size",
    "cross_rank", "cross_size", "Average", "Sum", "Adasum", "Min", "Max", "Product",
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "grouped_allgather", "broadcast", "broadcast_", "broadcast_async",
    "broadcast_async_", "alltoall", "reducescatter", "poll", "synchronize", "barrier", "join",
    "DistributedOptimizer", "Compression", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "SyncBatchNorm", "ProcessSet", "global_process_set",
]

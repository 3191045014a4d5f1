"""`import horovod.torch as hvd` on DDL: Horovod's documented PyTorch API.

Collectives go to ddl_core (libddl's progress thread queues and fuses the asynchronous
ones, as Horovod's background thread does); DistributedOptimizer, the broadcasts and
SyncBatchNorm are ddl_core.torch's.
"""

from __future__ import annotations

import itertools
from typing import Any

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
from ..common.matching import alltoall_parts, op_name, submit_alltoall

_handles: dict[int, tuple[Any, Any]] = {}
_ids = itertools.count(1)


def _new_handle(ddl_handle: Any, finish: Any) -> int:
    h = next(_ids)
    _handles[h] = (ddl_handle, finish)
    return h


def _submitted(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Queue a request as Horovod does: a duplicate name in flight is a ValueError (as
    upstream's enqueue raises), any other failure a HorovodInternalError."""
    try:
        return fn(*args, **kwargs)
    except ddl_core.InvalidArgumentError:
        raise
    except ddl_core.DDLError as exc:
        raise HorovodInternalError(str(exc)) from exc


def poll(handle: int) -> bool:
    """True once the asynchronous operation `handle` has finished."""
    entry = _handles.get(handle)
    if entry is None:
        raise ValueError(f"unknown handle {handle}")
    if entry[0] is None:
        return True
    try:
        return entry[0].test()
    except ddl_core.DDLError:
        return True  # finished, with the error synchronize() raises


def synchronize(handle: int) -> Any:
    """Wait for `handle` and return its output. A failed collective (e.g. ranks that
    disagree on its shape or dtype, raised on every rank) raises HorovodInternalError."""
    entry = _handles.pop(handle, None)
    if entry is None:
        raise ValueError(f"unknown or already synchronized handle {handle}")
    h, finish = entry
    try:
        if h is not None:
            h.wait()
        return finish()
    except ddl_core.DDLError as exc:
        raise HorovodInternalError(str(exc)) from exc


def _wire(t: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...], Any]:
    """(contiguous tensor libddl moves, the shape ranks compare, tensor -> t's dtype):
    libddl's own dtypes travel as they are, so ranks that disagree on the dtype are told
    so; others (bool, int16, complex) as their bytes, the item size a last dimension."""
    from ddl_core.torch._tensors import NATIVE

    t = t.detach()
    if t.dim() == 0:
        t = t.reshape(1)
    t = t.contiguous()
    if t.dtype in NATIVE:
        return t, tuple(t.shape), lambda out: out
    k = t.element_size()
    wire = t.view(torch.uint8).reshape(*t.shape, k)
    dtype, shape = t.dtype, tuple(t.shape)
    return wire, (*shape, k), lambda out: out.reshape(-1).view(dtype).reshape(-1, *shape[1:])


# -- allreduce -------------------------------------------------------------------------------

def _allreduce_async_inplace(tensor: torch.Tensor, op: str, compression: Any,
                             prescale: float, postscale: float, name: str | None = None,
                             prefix: str = "allreduce") -> int:
    wire, ctx = compression.compress(tensor)
    if prescale != 1.0:
        wire.mul_(prescale)
    work, wop, post = prepare(wire, op)
    h = _submitted(ddl_core.allreduce_async, work, op=wop, out=work,
                   name=op_name(prefix, name), shape=tuple(work.shape))

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
    """Start an in-place allreduce of `tensor`; returns a handle for synchronize().
    Matched across ranks by `name` (any submission order), unnamed ones by order."""
    return _allreduce_async_inplace(tensor, ddl_op(op, average), Compression.none,
                                    prescale_factor, postscale_factor, name)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    """Start an allreduce into a new tensor; returns a handle for synchronize()."""
    out = tensor.detach().clone().contiguous()
    return allreduce_async_(out, average, name, op, prescale_factor, postscale_factor)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: str, compression: Any, pre: float,
                post: float, name: str | None) -> torch.Tensor:
        ctx.op, ctx.compression, ctx.pre, ctx.post = op, compression, pre, post
        out = tensor.detach().clone().contiguous()
        return synchronize(_allreduce_async_inplace(out, op, compression, pre, post, name))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        g = grad.detach().clone().contiguous()
        out = synchronize(_allreduce_async_inplace(g, ctx.op, ctx.compression, ctx.pre,
                                                   ctx.post))
        return out, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = Compression.none, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:  # noqa: ARG001
    """A new tensor: `tensor` reduced over all ranks (differentiable for Sum/Average)."""
    dop = ddl_op(op, average)
    if tensor.requires_grad and dop in ("sum", "avg"):
        return _Allreduce.apply(tensor, dop, compression, prescale_factor, postscale_factor,
                                name)
    out = tensor.detach().clone().contiguous()
    return synchronize(_allreduce_async_inplace(out, dop, compression, prescale_factor,
                                                postscale_factor, name))


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
    dop = ddl_op(op, average)
    hs = [_allreduce_async_inplace(t, dop, Compression.none, prescale_factor,
                                   postscale_factor, None if name is None else f"{name}.{i}",
                                   "grouped_allreduce")
          for i, t in enumerate(tensors)]
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

def _allgather_async(tensor: torch.Tensor, name: str | None, prefix: str = "allgather") -> int:
    """Every rank's tensor concatenated along dim 0 (first dimensions may differ; the
    others, and the dtype, must agree)."""
    wire, shape, back = _wire(tensor)
    h = _submitted(ddl_core.allgatherv_async, wire, name=op_name(prefix, name), shape=shape)
    return _new_handle(h, lambda: back(h.wait()))


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    """Start an allgather; synchronize() returns every rank's tensor concatenated along
    the first dimension."""
    return _allgather_async(tensor, name)


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:  # noqa: ARG001
    """Every rank's tensor concatenated along the first dimension (sizes may differ)."""
    return synchronize(_allgather_async(tensor, name))


def grouped_allgather_async(tensors: list[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    hs = [_allgather_async(t, None if name is None else f"{name}.{i}", "grouped_allgather")
          for i, t in enumerate(tensors)]
    return _new_handle(None, lambda: [synchronize(h) for h in hs])


def grouped_allgather(tensors: list[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:  # noqa: ARG001
    return synchronize(grouped_allgather_async(tensors, name))


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    wire, shape, _ = _wire(tensor)
    h = _submitted(ddl_core.broadcast_async, wire, root_rank, name=op_name("broadcast", name),
                   shape=shape)

    def finish() -> torch.Tensor:
        if wire.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
            tensor.copy_(wire.reshape(-1).view(tensor.dtype).reshape(tensor.shape))
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


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    """Start an alltoall; synchronize() returns (received rows, received splits)."""
    n, me = ddl_core.size(), ddl_core.rank()
    wire, _, back = _wire(tensor)
    rows = wire.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError(f"alltoall: {rows} rows do not split evenly over {n} ranks; "
                             "pass splits")
        splits = [rows // n] * n
    splits = [int(s) for s in (splits.tolist() if hasattr(splits, "tolist") else splits)]
    sh, dh = _submitted(submit_alltoall, wire, splits, name)

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        all_splits = sh.wait().reshape(n, n)
        data = dh.wait()
        parts, received = alltoall_parts(all_splits, me)
        out = torch.cat([data[a:b] for a, b in parts])
        return back(out).reshape(-1, *tensor.shape[1:]), torch.tensor(received,
                                                                      dtype=torch.int32)

    return _new_handle(None, finish)


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ARG001
    """Send splits[j] rows of `tensor` (dim 0, in order) to rank j; returns what was
    received, concatenated in rank order, and the received splits."""
    return synchronize(alltoall_async(tensor, splits, name))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: Any = Average,
                        process_set: ProcessSet = global_process_set) -> int:  # noqa: ARG001
    """Start a reducescatter; synchronize() returns this rank's block of dim 0 of the
    reduction (the first blocks one row larger when rows do not divide, as Horovod)."""
    n, me = ddl_core.size(), ddl_core.rank()
    t = tensor.detach().contiguous()
    reduced = t.clone()
    h = _allreduce_async_inplace(reduced, ddl_op(op), Compression.none, 1.0, 1.0, name,
                                 "reducescatter")
    rows = t.shape[0] if t.dim() else 1
    counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    start = sum(counts[:me])
    return _new_handle(None, lambda: synchronize(h)[start: start + counts[me]].clone())


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = None,  # noqa: ARG001
                  op: Any = Average, process_set: ProcessSet = global_process_set) -> torch.Tensor:  # noqa: ARG001
    """Reduce over ranks and keep this rank's block of dim 0 (the first blocks one row
    larger when rows do not divide evenly, as Horovod does)."""
    return synchronize(reducescatter_async(tensor, name, op))


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
    "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "poll", "synchronize", "barrier", "join",
    "DistributedOptimizer", "Compression", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "SyncBatchNorm", "ProcessSet", "global_process_set",
]

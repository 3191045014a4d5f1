"""`import horovod.torch as hvd` on DDL: Horovod's documented PyTorch API.

Collectives go to ddl_core (libddl's progress thread queues and fuses the asynchronous
ones, as Horovod's background thread does); DistributedOptimizer, the broadcasts and
SyncBatchNorm are ddl_core.torch's.
"""

from __future__ import annotations

import itertools
import pickle
from typing import Any

import numpy as np
import torch
from ddl_core.torch._tensors import prepare
from ddl_core.torch.optimizer import (
    Compression,
    broadcast_optimizer_state,
    broadcast_parameters,
)
from ddl_core.torch.optimizer import DistributedOptimizer as _DistributedOptimizer
from ddl_core.torch.optimizer import allgather_object as _allgather_object
from ddl_core.torch.optimizer import broadcast_object as _broadcast_object
from ddl_core.torch.sync_bn import SyncBatchNorm

import ddl_core
from ddl_core import timeline

from ..common.basics import (  # noqa: F401 - re-exported Horovod API
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    add_process_set,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    ddl_op,
    get_process_sets,
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
    process_set_by_id,
    rank,
    remove_process_set,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)
from ..common.basics import join as _join
from ..common.engine import ALLGATHER, ALLREDUCE, ALLTOALL, BARRIER, BROADCAST
from ..common.matching import alltoall_parts, op_name, submit_alltoall
from ..common.process_sets import engine_of
from . import elastic  # noqa: F401 - hvd.elastic raises "not supported"

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


# -- process sets: numpy views the set's engine moves ---------------------------------------

def _bits(t: torch.Tensor) -> tuple[np.ndarray, Any]:
    """(numpy array holding t's bytes, array -> torch tensor of t's dtype): what a process
    set moves without arithmetic (gathers, broadcasts); 16-bit floats as int16."""
    if t.dtype in (torch.float16, torch.bfloat16):
        dt = t.dtype
        return t.view(torch.int16).numpy(), lambda a: torch.from_numpy(a).view(dt)
    return t.numpy(), torch.from_numpy


_NUMPY_NATIVE = {torch.float32, torch.float64, torch.int32, torch.int64, torch.int8,
                 torch.uint8}


def _plain(tensor: torch.Tensor, compression: Any, prescale: float, postscale: float,
           process_set: ProcessSet) -> bool:
    """The common case libddl takes as it is: the global set, no compression or scaling,
    a contiguous CPU tensor of a dtype numpy shares."""
    return (process_set is global_process_set and compression is Compression.none and
            prescale == 1.0 and postscale == 1.0 and tensor.dtype in _NUMPY_NATIVE and
            tensor.is_cpu and tensor.is_contiguous())


def _allreduce_async_new(tensor: torch.Tensor, op: str, compression: Any, prescale: float,
                         postscale: float, name: str | None,
                         process_set: ProcessSet) -> int:
    """An allreduce into a new tensor. In the common case libddl reads the input and
    writes the new tensor directly (its first step reads the input in place), so a
    64 MiB allreduce no longer starts with a 64 MiB copy; otherwise a copy reduced in
    place."""
    if _plain(tensor, compression, prescale, postscale, process_set):
        res = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        src, dst = tensor.detach().numpy(), res.numpy()
        h = _submitted(ddl_core.allreduce_async, src, op=op, out=dst,
                       name=None if name is None else f"allreduce.{name}", shape=src.shape)
        return _new_handle(h, lambda: res)
    out = tensor.detach().clone().contiguous()
    return _allreduce_async_inplace(out, op, compression, prescale, postscale, name,
                                    process_set=process_set)


def _set_label(prefix: str, name: str | None) -> str:
    return op_name(prefix, name) or f"{prefix}.noname"


# -- allreduce -------------------------------------------------------------------------------

def _allreduce_async_inplace(tensor: torch.Tensor, op: str, compression: Any,
                             prescale: float, postscale: float, name: str | None = None,
                             prefix: str = "allreduce",
                             process_set: ProcessSet = global_process_set) -> int:
    if _plain(tensor, compression, prescale, postscale, process_set):
        # The common case, kept short: numpy's view of the tensor's memory takes ddl_core's
        # quickest path. This layer's own cost is what a 1 MiB allreduce notices.
        buf = tensor.detach().numpy()
        h = _submitted(ddl_core.allreduce_async, buf, op=op, out=buf,
                       name=None if name is None else f"{prefix}.{name}", shape=buf.shape)
        return _new_handle(h, lambda: tensor)
    eng = engine_of(process_set, prefix)
    wire, ctx = compression.compress(tensor)
    if prescale != 1.0:
        wire.mul_(prescale)
    work, wop, post = prepare(wire, op)
    full = op_name(prefix, name)
    if eng is None:
        h = _submitted(ddl_core.allreduce_async, work, op=wop, out=work, name=full,
                       shape=tuple(work.shape))
        back = None
    else:
        arr = work.float().numpy() if work.dtype == torch.bfloat16 else work.numpy()
        back = (lambda: work.copy_(torch.from_numpy(arr))) if work.dtype == torch.bfloat16 \
            else None
        h = eng.submit(full, (ALLREDUCE, arr.dtype.str, arr.shape, wop), None, arr,
                       _set_label(prefix, name))

    def finish() -> torch.Tensor:
        if back is not None:
            back()
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
                     process_set: ProcessSet = global_process_set) -> int:
    """Start an in-place allreduce of `tensor`; returns a handle for synchronize().
    Matched across ranks by `name` (any submission order), unnamed ones by order."""
    return _allreduce_async_inplace(tensor, ddl_op(op, average), Compression.none,
                                    prescale_factor, postscale_factor, name,
                                    process_set=process_set)


def allreduce_async(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
                    op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allreduce into a new tensor; returns a handle for synchronize(). Leave
    `tensor` unchanged until then (as Horovod requires)."""
    return _allreduce_async_new(tensor, ddl_op(op, average), Compression.none,
                                prescale_factor, postscale_factor, name, process_set)


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, op: str, compression: Any, pre: float,
                post: float, name: str | None, process_set: ProcessSet) -> torch.Tensor:
        ctx.op, ctx.compression, ctx.pre, ctx.post = op, compression, pre, post
        ctx.process_set = process_set
        return synchronize(_allreduce_async_new(tensor, op, compression, pre, post, name,
                                                process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        g = grad.detach().clone().contiguous()
        out = synchronize(_allreduce_async_inplace(g, ctx.op, ctx.compression, ctx.pre,
                                                   ctx.post, process_set=ctx.process_set))
        return out, None, None, None, None, None, None


def allreduce(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
              compression: Any = Compression.none, op: Any = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """A new tensor: `tensor` reduced over the process set's ranks (all by default;
    differentiable for Sum/Average)."""
    dop = ddl_op(op, average)
    if tensor.requires_grad and dop in ("sum", "avg"):
        return _Allreduce.apply(tensor, dop, compression, prescale_factor, postscale_factor,
                                name, process_set)
    return synchronize(_allreduce_async_new(tensor, dop, compression, prescale_factor,
                                            postscale_factor, name, process_set))


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce `tensor` in place over the process set's ranks."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


def grouped_allreduce_async_(tensors: list[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: Any = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    dop = ddl_op(op, average)
    hs = [_allreduce_async_inplace(t, dop, Compression.none, prescale_factor,
                                   postscale_factor, None if name is None else f"{name}.{i}",
                                   "grouped_allreduce", process_set)
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

def _allgather_async(tensor: torch.Tensor, name: str | None, prefix: str = "allgather",
                     process_set: ProcessSet = global_process_set) -> int:
    """Every rank's tensor concatenated along dim 0 (first dimensions may differ; the
    others, and the dtype, must agree)."""
    eng = engine_of(process_set, prefix)
    wire, shape, back = _wire(tensor)
    full = op_name(prefix, name)
    if eng is None:
        h = _submitted(ddl_core.allgatherv_async, wire, name=full, shape=shape)
        return _new_handle(h, lambda: back(h.wait()))
    arr, unbits = _bits(wire)
    req = eng.submit(full, (ALLGATHER, arr.dtype.str, arr.shape[1:]), arr.shape[0], arr,
                     _set_label(prefix, name))
    return _new_handle(req, lambda: back(unbits(np.ascontiguousarray(req.result[0]))))


def allgather_async(tensor: torch.Tensor, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather; synchronize() returns every rank's tensor concatenated along
    the first dimension."""
    return _allgather_async(tensor, name, process_set=process_set)


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every rank's tensor concatenated along the first dimension (sizes may differ)."""
    return synchronize(_allgather_async(tensor, name, process_set=process_set))


def grouped_allgather_async(tensors: list[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    hs = [_allgather_async(t, None if name is None else f"{name}.{i}", "grouped_allgather",
                           process_set)
          for i, t in enumerate(tensors)]
    return _new_handle(None, lambda: [synchronize(h) for h in hs])


def grouped_allgather(tensors: list[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    return synchronize(grouped_allgather_async(tensors, name, process_set))


def _check_root(root_rank: int, process_set: ProcessSet, fn: str) -> None:
    ranks = process_set.ranks if process_set is not global_process_set else None
    if ranks is not None and root_rank not in ranks:
        raise ValueError(f"{fn}: root_rank {root_rank} is not in process set "
                         f"{process_set.process_set_id} (ranks {ranks}); root_rank is a "
                         "world rank (hvd.rank()) of one of its members")


def broadcast_async_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> int:
    eng = engine_of(process_set, "broadcast")
    wire, shape, _ = _wire(tensor)
    full = op_name("broadcast", name)
    if eng is None:
        h = _submitted(ddl_core.broadcast_async, wire, root_rank, name=full, shape=shape)
    else:
        _check_root(root_rank, process_set, "broadcast")
        arr, _ = _bits(wire)
        h = eng.submit(full, (BROADCAST, arr.dtype.str, arr.shape, int(root_rank)), None, arr,
                       _set_label("broadcast", name))

    def finish() -> torch.Tensor:
        if wire.data_ptr() != tensor.data_ptr() or not tensor.is_contiguous():
            tensor.copy_(wire.reshape(-1).view(tensor.dtype).reshape(tensor.shape))
        return tensor

    return _new_handle(h, finish)


def broadcast_async(tensor: torch.Tensor, root_rank: int, name: str | None = None,
                    process_set: ProcessSet = global_process_set) -> int:
    return broadcast_async_(tensor.detach().clone().contiguous(), root_rank, name, process_set)


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """A new tensor holding root_rank's `tensor` (root_rank: a world rank)."""
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite `tensor` with root_rank's, in place."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall; synchronize() returns (received rows, received splits)."""
    eng = engine_of(process_set, "alltoall")
    n = ddl_core.size() if eng is None else len(eng.members)
    me = ddl_core.rank() if eng is None else eng.comm.rank
    wire, _, back = _wire(tensor)
    rows = wire.shape[0]
    if splits is None:
        if rows % n:
            raise ValueError(f"alltoall: {rows} rows do not split evenly over {n} ranks; "
                             "pass splits")
        splits = [rows // n] * n
    splits = [int(s) for s in (splits.tolist() if hasattr(splits, "tolist") else splits)]
    if eng is not None:
        if len(splits) != n or any(s < 0 for s in splits) or sum(splits) != rows:
            raise ValueError(f"alltoall: splits {splits} must hold one entry >= 0 per rank "
                             f"of the process set ({n}) and add up to the tensor's {rows} rows")
        arr, unbits = _bits(wire)
        req = eng.submit(op_name("alltoall", name), (ALLTOALL, arr.dtype.str, arr.shape[1:]),
                         splits, arr, _set_label("alltoall", name))

        def finish_set() -> tuple[torch.Tensor, torch.Tensor]:
            out, received = req.result
            data = back(unbits(np.ascontiguousarray(out)))
            return data.reshape(-1, *tensor.shape[1:]), torch.tensor(received,
                                                                     dtype=torch.int32)

        return _new_handle(req, finish_set)
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
             process_set: ProcessSet = global_process_set) -> tuple[torch.Tensor, torch.Tensor]:
    """Send splits[j] rows of `tensor` (dim 0, in order) to the set's j-th rank; returns
    what was received, concatenated in rank order, and the received splits."""
    return synchronize(alltoall_async(tensor, splits, name, process_set))


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: Any = Average,
                        process_set: ProcessSet = global_process_set) -> int:
    """Start a reducescatter; synchronize() returns this rank's block of dim 0 of the
    reduction (the first blocks one row larger when rows do not divide, as Horovod)."""
    eng = engine_of(process_set, "reducescatter")
    n = ddl_core.size() if eng is None else len(eng.members)
    me = ddl_core.rank() if eng is None else eng.comm.rank
    t = tensor.detach().contiguous()
    reduced = t.clone()
    h = _allreduce_async_inplace(reduced, ddl_op(op), Compression.none, 1.0, 1.0, name,
                                 "reducescatter", process_set)
    rows = t.shape[0] if t.dim() else 1
    counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    start = sum(counts[:me])
    return _new_handle(None, lambda: synchronize(h)[start: start + counts[me]].clone())


def reducescatter(tensor: torch.Tensor, name: str | None = None, compression: Any = None,  # noqa: ARG001
                  op: Any = Average, process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce over the set's ranks and keep this rank's block of dim 0 (the first blocks
    one row larger when rows do not divide evenly, as Horovod does)."""
    return synchronize(reducescatter_async(tensor, name, op, process_set))


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set has called barrier()."""
    eng = engine_of(process_set, "barrier")
    if eng is None:
        with timeline.timed("barrier", "BARRIER"):
            ddl_core.barrier()
        return
    try:
        eng.submit(None, (BARRIER,), None, None, "barrier").wait()
    except ddl_core.DDLError as exc:
        raise HorovodInternalError(str(exc)) from exc


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """root_rank's picklable `obj` on every rank of the process set."""
    if engine_of(process_set, "broadcast_object") is None:
        with timeline.timed(name or "broadcast_object", "BROADCAST_OBJECT"):
            return _broadcast_object(obj, root_rank, name)
    _check_root(root_rank, process_set, "broadcast_object")
    mine = pickle.dumps(obj) if ddl_core.rank() == root_rank else b""
    data = allgather(torch.frombuffer(bytearray(mine), dtype=torch.uint8) if mine
                     else torch.empty(0, dtype=torch.uint8),
                     None if name is None else f"{name}.object", process_set)
    return pickle.loads(data.numpy().tobytes())


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every set member's picklable `obj`, in the set's rank order."""
    if engine_of(process_set, "allgather_object") is None:
        with timeline.timed(name or "allgather_object", "ALLGATHER_OBJECT"):
            return _allgather_object(obj, name)
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
    req = engine_of(process_set, "allgather_object").submit(  # type: ignore[union-attr]
        op_name("allgather_object", name), (ALLGATHER, data.dtype.str, ()), data.size, data,
        _set_label("allgather_object", name))
    try:
        flat, rows = req.wait()
    except ddl_core.DDLError as exc:
        raise HorovodInternalError(str(exc)) from exc
    out, off = [], 0
    for k in rows:
        out.append(pickle.loads(flat[off: off + k].tobytes()))
        off += k
    return out


def join(device: int = -1) -> int:  # noqa: ARG001
    """Horovod's join for uneven data: until every rank has joined, take part in the
    collectives the others still run (contributing zeros, no rows); returns the world
    rank that joined last."""
    return _join()


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,  # noqa: N802
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,  # noqa: ARG001
                         process_set: ProcessSet = global_process_set) -> Any:
    """Horovod's DistributedOptimizer: step() applies gradients averaged over the ranks
    of `process_set` (all by default)."""
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by horovod-ddl; use op=hvd.Average")
    if engine_of(process_set, "DistributedOptimizer") is not None:
        from ._set_optimizer import set_optimizer

        return set_optimizer(optimizer, named_parameters, compression, ddl_op(op),
                             gradient_predivide_factor, process_set,
                             _allreduce_async_inplace, synchronize, backward_passes_per_step)
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
    "add_process_set", "remove_process_set", "get_process_sets", "process_set_by_id",
    "start_timeline", "stop_timeline",
]

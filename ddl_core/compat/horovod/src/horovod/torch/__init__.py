"""`import horovod.torch as hvd` on DDL: Horovod's documented PyTorch API.

Collectives go to ddl_core (libddl's progress thread queues and fuses the asynchronous
ones, as Horovod's background thread does); DistributedOptimizer, the broadcasts and
SyncBatchNorm are ddl_core.torch's.
"""

from __future__ import annotations

import itertools
import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from ddl_core.torch._tensors import prepare
from ddl_core.torch.optimizer import (
    Compression,
    broadcast_parameters,
)
from ddl_core.torch.optimizer import DistributedOptimizer as _DistributedOptimizer
from ddl_core.torch.optimizer import allgather_object as _allgather_object
from ddl_core.torch.optimizer import broadcast_object as _broadcast_object
from ddl_core.torch.optimizer import broadcast_optimizer_state as _broadcast_optimizer_state
from ddl_core.torch.sync_bn import SyncBatchNorm

import ddl_core
from ddl_core import timeline

from ..common import basics as _basics

# Horovod's common API (init, rank, the ops, process sets, ...) is basics.__all__, listed
# once there for every front end; the names this module calls itself are imported by name.
from ..common.basics import *  # noqa: F403
from ..common.basics import (
    Adasum,
    Average,
    HorovodInternalError,
    ProcessSet,
    barrier_raising,
    ddl_op,
    global_process_set,
)
from ..common.basics import join as _join
from ..common.engine import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST
from ..common.matching import alltoall_parts, op_name, submit_alltoall
from ..common.process_sets import engine_of
from . import elastic  # noqa: F401 - hvd.elastic: Horovod's elastic API

_handles: dict[int, tuple[Any, Any]] = {}
_ids = itertools.count(1)


def _new_handle(ddl_handle: Any, finish: Any) -> int:
    h = next(_ids)
    _handles[h] = (ddl_handle, finish)
    return h


class _Group:
    """What poll() asks of a handle made of several requests (grouped collectives, an
    alltoall's two requests, a reducescatter's allreduce): done once all of them are."""

    __slots__ = ("parts",)

    def __init__(self, parts: list[Any]) -> None:
        self.parts = [p for p in parts if p is not None]

    def test(self) -> bool:
        return all(p.test() for p in self.parts)

    def wait(self) -> None:
        for p in self.parts:
            p.wait()


def _pending(handle: int) -> Any:
    """The pollable request behind one of this module's handles (None: nothing to wait)."""
    return _handles[handle][0]


def _combined(handles: list[int], finish: Any) -> int:
    """One handle over several of this module's handles; finish() gets their outputs."""
    group = _Group([_pending(h) for h in handles])
    return _new_handle(group, lambda: finish([synchronize(h) for h in handles]))


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
    set moves without arithmetic (gathers, broadcasts, alltoall); bfloat16, which numpy
    lacks, travels as float16 bits (libddl only copies them)."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.float16).numpy(), \
            lambda a: torch.from_numpy(a).view(torch.bfloat16)
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


def _host_view(tensor: torch.Tensor) -> np.ndarray:
    """numpy's view of a plain CPU tensor's memory (detached only when autograd tracks it:
    detach() alone costs about 1 us, a fifth of what this layer adds to a small call)."""
    return (tensor.detach() if tensor.requires_grad else tensor).numpy()


def _allreduce_async_new(tensor: torch.Tensor, op: str, compression: Any, prescale: float,
                         postscale: float, name: str | None,
                         process_set: ProcessSet) -> int:
    """An allreduce into a new tensor. In the common case libddl reads the input and
    writes the new tensor directly (its first step reads the input in place), so a
    64 MiB allreduce no longer starts with a 64 MiB copy; otherwise a copy reduced in
    place."""
    if _plain(tensor, compression, prescale, postscale, process_set):
        res = torch.empty_like(tensor, memory_format=torch.contiguous_format)
        src, dst = _host_view(tensor), res.numpy()
        h = _submitted(ddl_core.allreduce_async, src, op=op, out=dst,
                       name=None if name is None else f"allreduce.{name}", shape=src.shape)
        return _new_handle(h, lambda: res)
    out = tensor.detach().clone().contiguous()
    return _allreduce_async_inplace(out, op, compression, prescale, postscale, name,
                                    process_set=process_set)


def _scale(t: torch.Tensor, factor: float) -> None:
    """Multiply t by a pre/post-scale factor in place, in Horovod's arithmetic: integers
    in float64 (the product truncated back), 16-bit floats in float32 on the CPU."""
    if factor == 1.0:
        return
    if t.dtype.is_floating_point and t.dtype not in (torch.float16, torch.bfloat16):
        t.mul_(factor)
    elif t.dtype.is_floating_point:
        t.copy_(t.float().mul_(factor))
    elif t.dtype.is_complex:
        t.mul_(factor)
    else:
        t.copy_(t.double().mul_(factor))


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
        buf = _host_view(tensor)
        h = _submitted(ddl_core.allreduce_async, buf, op=op, out=buf,
                       name=None if name is None else f"{prefix}.{name}", shape=buf.shape)
        return _new_handle(h, lambda: tensor)
    eng = engine_of(process_set, prefix)
    wire, ctx = compression.compress(tensor)
    _scale(wire, prescale)
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
        _scale(tensor, postscale)
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
    """allreduce as an autograd function: the gradient of the input is the allreduce of
    the output's gradient, with the same op, scaling and process set (Horovod's)."""

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
    differentiable: the gradient is the allreduce of the output's gradient)."""
    dop = ddl_op(op, average)
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Allreduce.apply(tensor, dop, compression, prescale_factor, postscale_factor,
                                name, process_set)
    return synchronize(_allreduce_async_new(tensor, dop, compression, prescale_factor,
                                            postscale_factor, name, process_set))


def allreduce_(tensor: torch.Tensor, average: bool | None = None, name: str | None = None,
               op: Any = None, prescale_factor: float = 1.0, postscale_factor: float = 1.0,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Reduce `tensor` in place over the process set's ranks."""
    dop = ddl_op(op, average)
    if _plain(tensor, Compression.none, prescale_factor, postscale_factor, process_set):
        # The blocking common case skips the handle table (a handle, two closures and
        # their lookups: about a quarter of what this layer adds to a small allreduce).
        buf = _host_view(tensor)
        h = _submitted(ddl_core.allreduce_async, buf, op=dop, out=buf, shape=buf.shape,
                       name=None if name is None else f"allreduce.{name}")
        try:  # as synchronize(): any failure of the collective is Horovod's error
            h.wait()
        except ddl_core.DDLError as exc:
            raise HorovodInternalError(str(exc)) from exc
        return tensor
    return synchronize(_allreduce_async_inplace(tensor, dop, Compression.none,
                                                prescale_factor, postscale_factor, name,
                                                process_set=process_set))


def _grouped_name(name: str | None, i: int) -> str | None:
    return None if name is None else f"{name}.{i}"


def grouped_allreduce_async_(tensors: list[torch.Tensor], average: bool | None = None,
                             name: str | None = None, op: Any = None,
                             prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                             process_set: ProcessSet = global_process_set) -> int:
    """Start in-place allreduces of every tensor of the list (one request each, fused by
    libddl); synchronize() returns the list."""
    dop = ddl_op(op, average)
    hs = [_allreduce_async_inplace(t, dop, Compression.none, prescale_factor,
                                   postscale_factor, _grouped_name(name, i),
                                   "grouped_allreduce", process_set)
          for i, t in enumerate(tensors)]
    return _combined(hs, list)


def grouped_allreduce_async(tensors: list[torch.Tensor], average: bool | None = None,
                            name: str | None = None, op: Any = None,
                            prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                            process_set: ProcessSet = global_process_set) -> int:
    """grouped_allreduce_async_ on copies: the input tensors are left unchanged."""
    return grouped_allreduce_async_([t.detach().clone().contiguous() for t in tensors],
                                    average, name, op, prescale_factor, postscale_factor,
                                    process_set)


class _GroupedAllreduce(torch.autograd.Function):
    """grouped_allreduce as an autograd function: each input's gradient is the allreduce
    of its output's gradient (one grouped allreduce)."""

    @staticmethod
    def forward(ctx: Any, op: str, pre: float, post: float, name: str | None,
                process_set: ProcessSet, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.op, ctx.pre, ctx.post, ctx.process_set = op, pre, post, process_set
        return tuple(synchronize(grouped_allreduce_async(list(tensors), None, name, op, pre,
                                                         post, process_set)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        out = synchronize(grouped_allreduce_async(list(grads), None, None, ctx.op, ctx.pre,
                                                  ctx.post, ctx.process_set))
        return (None, None, None, None, None, *out)


def _grouped(tensors: list[torch.Tensor], compression: Any,
             differentiable: Callable[[list[torch.Tensor]], Any],
             asynchronous: Callable[[list[torch.Tensor]], int]) -> list[torch.Tensor]:
    """A grouped collective's blocking call: the tensors compressed, then its autograd
    Function when any wants a gradient (so the backward pass runs the collective's own
    gradient), else its asynchronous call waited for; the results decompressed."""
    wired = [compression.compress(t) for t in tensors]
    wires = [w for w, _ in wired]
    if torch.is_grad_enabled() and any(w.requires_grad for w in wires):
        outs = list(differentiable(wires))
    else:
        outs = synchronize(asynchronous(wires))
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, wired, strict=True)]


def grouped_allreduce(tensors: list[torch.Tensor], average: bool | None = None,
                      name: str | None = None, compression: Any = Compression.none,
                      op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """New tensors: each of `tensors` reduced over the process set's ranks (matched by
    list position; differentiable)."""
    dop = ddl_op(op, average)
    return _grouped(
        tensors, compression,
        lambda wires: _GroupedAllreduce.apply(dop, prescale_factor, postscale_factor, name,
                                              process_set, *wires),
        lambda wires: grouped_allreduce_async(wires, None, name, dop, prescale_factor,
                                              postscale_factor, process_set))


def grouped_allreduce_(tensors: list[torch.Tensor], average: bool | None = None,
                       name: str | None = None, op: Any = None, prescale_factor: float = 1.0,
                       postscale_factor: float = 1.0,
                       process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """Reduce every tensor of the list in place."""
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


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


def _my_rows(rows: list[int], process_set: ProcessSet) -> tuple[int, int]:
    """(offset, count) of this rank's rows in a concatenation of every set member's
    `rows` rows, in the set's rank order."""
    r = process_set.rank()
    return sum(rows[:r]), rows[r]


def _rows_of_all(counts: list[int], process_set: ProcessSet) -> list[list[int]]:
    """Every set member's row counts (one list per tensor): what the backward of an
    allgather needs to find this rank's rows in the gradient."""
    gathered = allgather(torch.tensor([counts], dtype=torch.int64), process_set=process_set)
    return gathered.t().tolist()


class _Allgather(torch.autograd.Function):
    """allgather as an autograd function: the input's gradient is this rank's rows of the
    average (over the set) of the output's gradients, as Horovod defines it."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return synchronize(_allgather_async(tensor, name, process_set=process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        avg = allreduce(grad.detach(), op=Average, process_set=ctx.process_set)
        off, k = _my_rows(_rows_of_all([ctx.rows], ctx.process_set)[0], ctx.process_set)
        return avg.narrow(0, off, k), None, None


def allgather(tensor: torch.Tensor, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Every rank's tensor concatenated along the first dimension (sizes may differ;
    differentiable)."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Allgather.apply(tensor, name, process_set)
    return synchronize(_allgather_async(tensor, name, process_set=process_set))


def grouped_allgather_async(tensors: list[torch.Tensor], name: str | None = None,
                            process_set: ProcessSet = global_process_set) -> int:
    """Start an allgather of every tensor of the list; synchronize() returns the list."""
    hs = [_allgather_async(t, _grouped_name(name, i), "grouped_allgather", process_set)
          for i, t in enumerate(tensors)]
    return _combined(hs, list)


class _GroupedAllgather(torch.autograd.Function):
    """grouped_allgather as an autograd function (each tensor as _Allgather)."""

    @staticmethod
    def forward(ctx: Any, name: str | None, process_set: ProcessSet,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.rows = [t.shape[0] if t.dim() else 1 for t in tensors]
        ctx.process_set = process_set
        return tuple(synchronize(grouped_allgather_async(list(tensors), name, process_set)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        ps = ctx.process_set
        avg = grouped_allreduce([g.detach() for g in grads], op=Average, process_set=ps)
        every = _rows_of_all(ctx.rows, ps)
        out = []
        for a, rows in zip(avg, every, strict=True):
            off, k = _my_rows(rows, ps)
            out.append(a.narrow(0, off, k))
        return (None, None, *out)


def grouped_allgather(tensors: list[torch.Tensor], name: str | None = None,
                      process_set: ProcessSet = global_process_set) -> list[torch.Tensor]:
    """allgather of every tensor of the list (matched by list position; differentiable)."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return list(_GroupedAllgather.apply(name, process_set, *tensors))
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


class _Broadcast(torch.autograd.Function):
    """broadcast as an autograd function: the root's input gets the average (over the
    set) of the output's gradients, the other ranks' inputs zero (Horovod's)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, root_rank: int, name: str | None,
                process_set: ProcessSet) -> torch.Tensor:
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        avg = allreduce(grad.detach(), op=Average, process_set=ctx.process_set)
        if ddl_core.rank() != ctx.root_rank:
            avg.zero_()
        return avg, None, None, None


def broadcast(tensor: torch.Tensor, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """A new tensor holding root_rank's `tensor` (root_rank: a world rank;
    differentiable)."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Broadcast.apply(tensor, root_rank, name, process_set)
    return synchronize(broadcast_async(tensor, root_rank, name, process_set))


def broadcast_(tensor: torch.Tensor, root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> torch.Tensor:
    """Overwrite `tensor` with root_rank's, in place."""
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


def _received(received: list[int], splits: Any) -> torch.Tensor:
    """The received splits as Horovod returns them: the dtype of a splits tensor, else
    int32."""
    dtype = splits.dtype if isinstance(splits, torch.Tensor) else torch.int32
    return torch.tensor(received, dtype=dtype)


def alltoall_async(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
                   process_set: ProcessSet = global_process_set) -> int:
    """Start an alltoall; synchronize() returns (received rows, received splits)."""
    eng = engine_of(process_set, "alltoall")
    n = ddl_core.size() if eng is None else len(eng.members)
    me = ddl_core.rank() if eng is None else eng.comm.rank
    wire, _, back = _wire(tensor)
    rows = wire.shape[0]
    given = splits
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
            return data.reshape(-1, *tensor.shape[1:]), _received(received, given)

        return _new_handle(req, finish_set)
    sh, dh = _submitted(submit_alltoall, wire, splits, name)

    def finish() -> tuple[torch.Tensor, torch.Tensor]:
        all_splits = sh.wait().reshape(n, n)
        data = dh.wait()
        parts, received = alltoall_parts(all_splits, me)
        out = torch.cat([data[a:b] for a, b in parts])
        return back(out).reshape(-1, *tensor.shape[1:]), _received(received, given)

    return _new_handle(_Group([sh, dh]), finish)


class _Alltoall(torch.autograd.Function):
    """alltoall as an autograd function: the gradient goes back the way the rows came
    (an alltoall of the output's gradient with the received splits)."""

    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, splits: Any, name: str | None,
                process_set: ProcessSet) -> Any:
        out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return out
        ctx.mark_non_differentiable(received)
        return out, received

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor, *_unused: Any) -> tuple[Any, ...]:
        back, _ = synchronize(alltoall_async(grad.detach().contiguous(), ctx.received,
                                             process_set=ctx.process_set))
        return back, None, None, None


def alltoall(tensor: torch.Tensor, splits: Any = None, name: str | None = None,
             process_set: ProcessSet = global_process_set) -> Any:
    """Send splits[j] rows of `tensor` (dim 0, in order) to the set's j-th rank; returns
    what was received, concatenated in rank order, and, when `splits` was given, the
    received splits (Horovod's return values; differentiable)."""
    if tensor.requires_grad and torch.is_grad_enabled():
        return _Alltoall.apply(tensor, splits, name, process_set)
    out, received = synchronize(alltoall_async(tensor, splits, name, process_set))
    return out if splits is None else (out, received)


def _check_scatterable(tensors: list[torch.Tensor], fn: str) -> None:
    """Horovod refuses to reducescatter a scalar (no first dimension to scatter): checked
    before anything is submitted, so no rank is left with a request the others lack."""
    for t in tensors:
        if t.dim() == 0:
            raise ValueError(f"{fn}: a scalar (0-dimensional tensor) cannot be scattered; "
                             "give it a first dimension (tensor.reshape(1, ...))")


def _reducescatter_async(tensor: torch.Tensor, name: str | None, op: Any,
                         process_set: ProcessSet, prescale: float, postscale: float,
                         prefix: str = "reducescatter") -> int:
    eng = engine_of(process_set, prefix)
    n = ddl_core.size() if eng is None else len(eng.members)
    me = ddl_core.rank() if eng is None else eng.comm.rank
    reduced = tensor.detach().contiguous().clone()
    h = _allreduce_async_inplace(reduced, ddl_op(op), Compression.none, prescale, postscale,
                                 name, prefix, process_set)
    rows = reduced.shape[0]
    counts = [rows // n + (1 if i < rows % n else 0) for i in range(n)]
    start = sum(counts[:me])
    return _combined([h], lambda outs: outs[0][start: start + counts[me]].clone())


def reducescatter_async(tensor: torch.Tensor, name: str | None = None, op: Any = Average,
                        process_set: ProcessSet = global_process_set,
                        prescale_factor: float = 1.0, postscale_factor: float = 1.0) -> int:
    """Start a reducescatter; synchronize() returns this rank's block of dim 0 of the
    reduction (the first blocks one row larger when rows do not divide, as Horovod)."""
    _check_scatterable([tensor], "reducescatter")
    return _reducescatter_async(tensor, name, op, process_set, prescale_factor,
                                postscale_factor)


def _scatter_grad(grad: torch.Tensor, op: Any, process_set: ProcessSet, pre: float,
                  post: float) -> torch.Tensor:
    """The gradient a reducescatter's output gradient gives its input in Horovod: every
    member's block gathered back, times the set's size for Sum and the scale factors."""
    g = grad.detach().clone()
    factor = (process_set.size() if ddl_op(op) == "sum" else 1) * pre * post
    if factor != 1:
        g.mul_(factor)
    return g


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, name: str | None, op: Any,
                process_set: ProcessSet, pre: float, post: float) -> torch.Tensor:
        ctx.op, ctx.process_set, ctx.pre, ctx.post = op, process_set, pre, post
        return synchronize(_reducescatter_async(tensor, name, op, process_set, pre, post))

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[Any, ...]:
        g = _scatter_grad(grad, ctx.op, ctx.process_set, ctx.pre, ctx.post)
        return allgather(g, process_set=ctx.process_set), None, None, None, None, None


def reducescatter(tensor: torch.Tensor, name: str | None = None,
                  compression: Any = Compression.none, op: Any = Average,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0) -> torch.Tensor:
    """Reduce over the set's ranks and keep this rank's block of dim 0 (the first blocks
    one row larger when rows do not divide evenly, as Horovod does; differentiable)."""
    _check_scatterable([tensor], "reducescatter")
    wire, cctx = compression.compress(tensor)
    if wire.requires_grad and torch.is_grad_enabled():
        out = _Reducescatter.apply(wire, name, op, process_set, prescale_factor,
                                   postscale_factor)
    else:
        out = synchronize(_reducescatter_async(wire, name, op, process_set, prescale_factor,
                                               postscale_factor))
    return compression.decompress(out, cctx)


def grouped_reducescatter_async(tensors: list[torch.Tensor], name: str | None = None,
                                op: Any = Average,
                                process_set: ProcessSet = global_process_set,
                                prescale_factor: float = 1.0,
                                postscale_factor: float = 1.0) -> int:
    """Start a reducescatter of every tensor of the list; synchronize() returns the list
    of this rank's blocks."""
    _check_scatterable(tensors, "grouped_reducescatter")
    hs = [_reducescatter_async(t, _grouped_name(name, i), op, process_set, prescale_factor,
                               postscale_factor, "grouped_reducescatter")
          for i, t in enumerate(tensors)]
    return _combined(hs, list)


class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, name: str | None, op: Any, process_set: ProcessSet, pre: float,
                post: float, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        ctx.op, ctx.process_set, ctx.pre, ctx.post = op, process_set, pre, post
        return tuple(synchronize(grouped_reducescatter_async(list(tensors), name, op,
                                                             process_set, pre, post)))

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[Any, ...]:
        gs = [_scatter_grad(g, ctx.op, ctx.process_set, ctx.pre, ctx.post) for g in grads]
        return (None, None, None, None, None,
                *grouped_allgather(gs, process_set=ctx.process_set))


def grouped_reducescatter(tensors: list[torch.Tensor], name: str | None = None,
                          compression: Any = Compression.none, op: Any = Average,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0,
                          postscale_factor: float = 1.0) -> list[torch.Tensor]:
    """reducescatter of every tensor of the list (matched by list position;
    differentiable)."""
    _check_scatterable(tensors, "grouped_reducescatter")
    return _grouped(
        tensors, compression,
        lambda wires: _GroupedReducescatter.apply(name, op, process_set, prescale_factor,
                                                  postscale_factor, *wires),
        lambda wires: grouped_reducescatter_async(wires, name, op, process_set,
                                                  prescale_factor, postscale_factor))


def sparse_allreduce_async(tensor: torch.Tensor, name: str, op: Any = Average,
                           process_set: ProcessSet = global_process_set) -> Any:
    """Horovod's allreduce of a sparse COO tensor: every member's indices and values are
    allgathered (so the result holds every member's entries; duplicates add up when it
    is coalesced or used), values divided by the set's size for Average. Returns a
    function; calling it waits and returns the reduced sparse tensor."""
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse COO tensor; use "
                         "allreduce_async for a dense one")
    dop = ddl_op(op)
    if dop not in ("sum", "avg"):
        raise ValueError(f"sparse_allreduce_async: op {op!r}: only Sum and Average are "
                         "defined for sparse tensors")
    hi = allgather_async(tensor._indices().t().contiguous(), name=f"{name}.indices",
                         process_set=process_set)
    hv = allgather_async(tensor._values().contiguous(), name=f"{name}.values",
                         process_set=process_set)

    def wait() -> torch.Tensor:
        values = synchronize(hv)
        indices = synchronize(hi)
        if dop == "avg":
            values = values / process_set.size()
        return torch.sparse_coo_tensor(indices.t(), values, tensor.shape, check_invariants=True)

    return wait


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set has called barrier()."""
    barrier_raising(process_set, lambda exc: HorovodInternalError(str(exc)))


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


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0,
                              model: torch.nn.Module | None = None) -> None:
    """Give every rank root_rank's optimizer state and hyper-parameters (the whole
    state_dict, pickled: any optimizer, L-BFGS included). A newly created optimizer's
    state is first initialized as Horovod does: every parameter that requires a gradient
    gets a zero gradient (except sparse embeddings of `model`) and the wrapped optimizer
    takes one step without averaging, so every rank ends with the state tensors."""
    if not optimizer.state_dict()["state"]:
        sparse = set()
        if model is not None:
            sparse = {id(p) for m in model.modules()
                      if isinstance(m, torch.nn.Embedding) and m.sparse
                      for p in m.parameters()}
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.requires_grad and id(p) not in sparse:
                    p.grad = torch.zeros_like(p)
        # The user's optimizer class's step: a DistributedOptimizer's would average, which
        # needs every rank to step; the class it wraps is the first base of its class.
        base = type(optimizer).__mro__[1] if hasattr(optimizer, "synchronize") \
            else type(optimizer)
        base.step(optimizer)
    _broadcast_optimizer_state(optimizer, root_rank)


def join(device: int = -1) -> int:  # noqa: ARG001
    """Horovod's join for uneven data: until every rank has joined, take part in the
    collectives the others still run (contributing zeros, no rows); returns the world
    rank that joined last."""
    return _join()


def _parameter_names(optimizer: torch.optim.Optimizer, named_parameters: Any) -> dict:
    """Horovod's `optimizer._parameter_names`: {parameter: name}, the name given in
    named_parameters, else `allreduce.noname.<group>.<index>` (the same on every rank)."""
    if named_parameters is not None:
        return {p: n for n, p in named_parameters}
    return {p: f"allreduce.noname.{i}.{j}" for i, group in enumerate(optimizer.param_groups)
            for j, p in enumerate(group["params"])}


def DistributedOptimizer(optimizer: torch.optim.Optimizer, named_parameters: Any = None,  # noqa: N802
                         compression: Any = Compression.none, backward_passes_per_step: int = 1,
                         op: Any = Average, gradient_predivide_factor: float = 1.0,
                         num_groups: int = 0, groups: Any = None, sparse_as_dense: bool = False,  # noqa: ARG001
                         process_set: ProcessSet = global_process_set) -> Any:
    """Horovod's DistributedOptimizer: step() applies gradients averaged over the ranks
    of `process_set` (all by default); on a rank outside the set it steps on the local
    gradients, as Horovod's. Sparse gradients stay sparse unless sparse_as_dense."""
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by horovod-ddl; use op=hvd.Average")
    if named_parameters is not None:
        named_parameters = list(named_parameters)
        if any(not isinstance(item, tuple) for item in named_parameters):
            raise ValueError("named_parameters should be a sequence of tuples (name, "
                             "parameter), usually produced by model.named_parameters().")
    names = _parameter_names(optimizer, named_parameters)
    if process_set is not global_process_set and process_set.process_set_id != 0:
        from ._set_optimizer import set_optimizer

        process_set._check_registered()
        opt = set_optimizer(optimizer, named_parameters, compression, ddl_op(op),
                            gradient_predivide_factor, process_set,
                            _allreduce_async_inplace, synchronize, backward_passes_per_step)
    else:
        opt = _DistributedOptimizer(optimizer, named_parameters=named_parameters,
                                    compression=compression,
                                    backward_passes_per_step=backward_passes_per_step, op=op,
                                    gradient_predivide_factor=gradient_predivide_factor,
                                    sparse_as_dense=sparse_as_dense)
        opt._ddl_warn_resync = True
    opt._parameter_names = names
    return opt


# horovod.torch's star: the common API (basics.__all__) and the torch collectives
__all__ = [
    *_basics.__all__,
    "allreduce", "allreduce_", "allreduce_async", "allreduce_async_", "grouped_allreduce",
    "grouped_allreduce_", "grouped_allreduce_async", "grouped_allreduce_async_", "allgather",
    "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast",
    "broadcast_", "broadcast_async", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "sparse_allreduce_async", "poll", "synchronize", "barrier",
    "join",
    "DistributedOptimizer", "Compression", "broadcast_parameters", "broadcast_optimizer_state",
    "broadcast_object", "allgather_object", "SyncBatchNorm",
]

"""The `ddl` backend for torch.distributed: `dist.init_process_group("ddl")`.

ProcessGroupDDL implements every operation on libddl. torch registers it through a C++
c10d Backend (ddl_torch._C, the ddl-torch distribution) that forwards each operation to
it, so the group is a real, named c10d group (FSDP2, DTensor, DeviceMesh and the
functional collectives look groups up by name); without ddl-torch it is registered as a
Python `dist.ProcessGroup` (DDP and the plain collectives only). On the world,
allreduce (DDP's gradient buckets) is queued on libddl's progress thread, which fuses
small buckets and overlaps the reduction with the rest of the backward pass; `Work`
objects complete through `torch.futures.Future`s (see _async.py), which is what DDP's
reducer waits on. A blocking allreduce (async_op=False) runs on the calling thread.

Covered: allreduce (+coalesced), broadcast, allgather (uneven sizes too) /
all_gather_into_tensor (+coalesced), reduce_scatter / reduce_scatter_tensor (+coalesced),
all_to_all(_single), gather, scatter, reduce, barrier, send/recv/isend/irecv (tags), and
`new_group(ranks)` of any ranks on a libddl communicator, whose collectives this backend
runs as blocking calls (their Work is complete on return; libddl 2.1 also queues
asynchronous collectives per communicator, Comm.allreduce_async and its siblings, which the
backend does not use yet); see _join_as_non_member for how non-members take part in its
creation.

CUDA tensors (registered for "cuda" through ddl-torch, so `init_process_group("ddl")` alone
serves a GPU job): allreduce, broadcast, allgather, reduce_scatter, reduce, gather and
scatter on the world run on libddl's device path (NCCL; staged through host memory when
ranks share a GPU), enqueued on the caller's current stream, as ProcessGroupNCCL orders
its work after the caller's; `Work.wait()` makes the current stream wait for it (the host
does not block) and `get_future()` is a CUDA-aware future. all_to_all, send/recv and any
collective of a subgroup move through host copies of the tensors (libddl takes device
buffers on the world communicator only), and the results are on the GPU when the call (or,
for recv, the Work) completes. One call's tensors are all on this rank's GPU or all in
host memory; in a blocking collective, a rank that passes host memory where the others pass
GPU memory gets the same MismatchError as they do.

Failures: a collective that fails in libddl (a mismatch, a rank that exited or died, a
timeout) fails its Work: `wait()` raises the ddl_core error (a RuntimeError), `exception()`
returns it, and the future fails in C++ too, so DDP's backward raises RuntimeError on every
rank instead of crashing. `timeout=` of `init_process_group`/`new_group` is the deadline of
that group's collectives (libddl's per-call deadline); left at torch's default (30 min), the
deadline is DDL_TIMEOUT. A rank that exits or dies is reported at once, whatever the timeout.

Rendezvous: under `ddlrun`/`mpirun` there is no MASTER_ADDR; `init_method="ddl://"`
(and the default `env://` in an MPI job when MASTER_ADDR is unset, or set without RANK and
WORLD_SIZE: then rank 0's store listens on MASTER_PORT and is reached at MASTER_ADDR)
starts a TCPStore on rank 0 and tells the other ranks where it is with a DDL broadcast, so
the store that torch (and NCCL, for `cpu:ddl,cuda:nccl`) needs exists without any
launcher settings. init returns on every rank only once every rank has its store, so a
group destroyed right after init cannot take the store from a rank still connecting.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import pickle
import socket
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

# the rules the entry point needs without ddl_core (it must import where libddl cannot)
from _ddl_core_torch_plugin import under_mpi, wants_ddl_rendezvous
from torch.distributed import ReduceOp
from torch.distributed.constants import default_pg_timeout

import ddl_core
from ddl_core import _ddl
from ddl_core.netaddr import local_addresses

from . import torchrun_join
from ._async import COMPLETER, DONE, Outcome, completed, completed_on, when_done
from ._tensors import chain, cuda_device, prepare

BACKEND_NAME = "ddl"
_SYNC = os.environ.get("DDL_TORCH_SYNC", "0") == "1"

_RED = {
    ReduceOp.RedOpType.SUM: "sum",
    ReduceOp.RedOpType.AVG: "avg",
    ReduceOp.RedOpType.PRODUCT: "prod",
    ReduceOp.RedOpType.MIN: "min",
    ReduceOp.RedOpType.MAX: "max",
    ReduceOp.RedOpType.BAND: "band",
    ReduceOp.RedOpType.BOR: "bor",
    ReduceOp.RedOpType.BXOR: "bxor",
}


def _op_name(op: Any) -> str:
    kind = getattr(op, "op", op)
    name = _RED.get(kind)
    if name is None:
        raise ValueError(f"the ddl backend does not implement {op}: use SUM, AVG, PRODUCT, "
                         "MIN, MAX, BAND, BOR or BXOR")
    return name


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A flat uint8 view of a contiguous tensor (data movement ignores the dtype)."""
    return t.reshape(-1).view(torch.uint8)


class DDLWork(dist.Work):
    """A collective in flight; `wait()` blocks until libddl has finished it and raises its
    error (a ddl_core.DDLError, which is a RuntimeError) if it failed."""

    def __init__(self, fut: torch.futures.Future[Any] | None, outcome: Outcome, value: Any,
                 on_stream: tuple[torch.cuda.Event, torch.cuda.Stream] | None = None) -> None:
        super().__init__()
        self._fut = fut  # (CUDA work: made by the first get_future())
        self._outcome = outcome
        self._value = value
        self._on_stream = on_stream  # CUDA work: (an event after it, the stream it is on)

    def wait(self, timeout: timedelta | None = None) -> bool:
        """Block until done (at most `timeout`, when one is given: then a RuntimeError if
        it has not finished, as torch documents). Raises the collective's error. Work on
        CUDA tensors (enqueued on a stream): the caller's current stream waits for it and
        the host does not, as with ProcessGroupNCCL."""
        if self._on_stream is not None:
            event, stream = self._on_stream
            current = torch.cuda.current_stream(stream.device)
            if current != stream:
                current.wait_event(event)
            return True
        seconds = timeout.total_seconds() if timeout else 0.0
        if not self._outcome.done.is_set():
            _ddl.hurry()  # (a blocking collective: no point waiting for more to fuse)
        if seconds > 0 and not self._outcome.done.wait(seconds):
            raise RuntimeError(f"ddl backend: the collective did not finish within "
                               f"{seconds:g} s (Work.wait timeout)")
        self._outcome.done.wait()
        if self._outcome.error is not None:
            raise self._outcome.error
        return True

    def exception(self) -> BaseException | None:
        return self._outcome.error

    def is_completed(self) -> bool:
        if self._on_stream is not None:
            return self._on_stream[0].query()
        return self._outcome.done.is_set()

    def is_success(self) -> bool:
        return self._outcome.done.is_set() and self._outcome.error is None

    def get_future(self) -> torch.futures.Future[Any]:
        if self._fut is None and self._on_stream is not None:
            self._fut = completed_on(self._on_stream[1], self._value)
        return self._fut

    def result(self) -> Any:
        return self._value

    def synchronize(self) -> None:
        self.wait()


def _work(handles: list[Any], value: Any, post: Any = None) -> DDLWork:
    fut, outcome = COMPLETER.submit(handles, value, post)
    return DDLWork(fut, outcome, value)


def _p2p_work(handle: Any, value: Any, post: Any = None) -> DDLWork:
    fut, outcome = when_done(handle, value, post)
    return DDLWork(fut, outcome, value)


def _done(value: Any, post: Any = None) -> DDLWork:
    if post is not None:
        post()
    fut, outcome = completed(value)
    return DDLWork(fut, outcome, value)


def _on_stream(value: Any, device: torch.device) -> DDLWork:
    """The Work of a call on CUDA tensors: libddl enqueued it on the current stream (NCCL)
    or finished it there (staged), so it is done once that stream gets past this point."""
    stream = torch.cuda.current_stream(device)
    event = torch.cuda.Event()
    event.record(stream)
    return DDLWork(None, DONE, value, (event, stream))


def _result(handles: list[Any], value: Any, post: Any, on: torch.Tensor | None) -> DDLWork:
    """The Work of a call on `on`'s device (None: a call without tensors) whose libddl
    requests are `handles`: CPU work completes through the completer thread (none queued:
    at once); CUDA work was done or enqueued inside the call, so `post` (the copy back of a
    non-contiguous output) runs here, on the caller's stream."""
    if on is None or not on.is_cuda:
        return _work(handles, value, post) if handles else _done(value, post)
    if post is not None:
        post()
    return _on_stream(value, on.device)


def _timeout_seconds(timeout: timedelta | None) -> float | None:
    """A process group's deadline in seconds; None (DDL_TIMEOUT) for torch's default."""
    if timeout is None or timeout == default_pg_timeout:
        return None
    seconds = timeout.total_seconds()
    if not seconds > 0:
        raise ValueError(f"timeout={timeout!r}: a process group's timeout must be positive")
    return seconds


def _deadline(method: Any) -> Any:
    """Run a collective under its group's timeout (libddl's per-thread deadline, which an
    asynchronous request keeps from the moment it is submitted)."""
    @functools.wraps(method)
    def wrapped(self: ProcessGroupDDL, *args: Any, **kwargs: Any) -> Any:
        seconds = self._timeout_s
        if seconds is None:
            return method(self, *args, **kwargs)
        prev = _ddl.set_thread_timeout(seconds)
        try:
            return method(self, *args, **kwargs)
        finally:
            _ddl.set_thread_timeout(prev)

    return wrapped


def _on_gpu(native: bool) -> Any:
    """Route a call on CUDA tensors. A `native` one on the world runs on libddl's device
    path (NCCL, or its staging through host memory when ranks share a GPU), ordered on the
    caller's current stream; the others, and every call on a sub-communicator (libddl 2.0
    takes device buffers on the world only), run on host copies of the tensors, and the
    outputs are copied back before the call returns. CPU tensors go straight through."""
    def deco(method: Any) -> Any:
        @functools.wraps(method)
        def wrapped(self: ProcessGroupDDL, *args: Any, **kwargs: Any) -> Any:
            device = cuda_device(args)
            if device is None:
                return method(self, *args, **kwargs)
            if native and self._comm is None:
                self._settle()
                if device.index == torch.cuda.current_device():
                    return method(self, *args, **kwargs)
                with torch.cuda.device(device):
                    return method(self, *args, **kwargs)
            return _staged(method, self, device, args, kwargs)

        return wrapped

    return deco


def _staged(method: Any, self: ProcessGroupDDL, device: torch.device, args: tuple[Any, ...],
            kwargs: dict[str, Any]) -> DDLWork:
    """`method` on host copies of the call's CUDA tensors; the first argument (the outputs,
    in every c10d operation's signature) is copied back once it has finished."""
    outputs: list[tuple[torch.Tensor, torch.Tensor]] = []

    def host(a: Any, first: bool) -> Any:
        if isinstance(a, torch.Tensor):
            h = a.detach().cpu()
            if first:
                outputs.append((a, h))
            return h
        if isinstance(a, (list, tuple)):
            return type(a)(host(x, first) for x in a)
        return a

    host_args = [host(a, i == 0) for i, a in enumerate(args)]
    method(self, *host_args, **kwargs).wait()
    with torch.cuda.device(device):
        for dev_t, host_t in outputs:
            dev_t.copy_(host_t)
    first = args[0]
    return _on_stream(first if isinstance(first, list) else [first], device)


class _Finished:
    """The handle of work that finished inside the call: this backend runs collectives on a
    communicator other than the world, and on CUDA tensors, as blocking calls."""

    def wait(self) -> None:
        return None


_FINISHED = _Finished()


class ProcessGroupDDL(dist.ProcessGroup):
    """torch.distributed process group on libddl: the whole MPI job (comm None: libddl's
    asynchronous, fused world collectives) or a libddl communicator of some ranks."""

    def __init__(self, rank: int, size: int, timeout: timedelta | None = None,
                 comm: ddl_core.Comm | None = None) -> None:
        super().__init__(rank, size)
        ddl_core.init()
        have = (comm.rank, comm.size) if comm is not None else (ddl_core.rank(), ddl_core.size())
        if (rank, size) != have and comm is None and not under_mpi():
            raise RuntimeError(
                f"init_process_group('ddl') as rank {rank} of {size} in a process that no MPI "
                f"launcher started, after libddl was initialised alone (libddl sees a job of "
                f"{have[1]}): under torchrun the ranks become one MPI job inside "
                "init_process_group, before MPI starts, so call it before ddl_core.init() "
                "or anything that initialises MPI (mpi4py, horovod.init), or launch with "
                f"ddlrun -n {size} python script.py. See docs/frameworks.md, 'torchrun', "
                "in DDL-CE.")
        if (rank, size) != have:
            raise ValueError(
                f"a ddl process group with rank {rank} of {size} on a communicator where "
                f"this process is rank {have[0]} of {have[1]}: create groups with "
                "dist.new_group(ranks) on every rank, in the same order")
        self._rank = rank
        self._size = size
        self._comm = comm
        self.set_timeout(timeout)

    def set_timeout(self, timeout: timedelta | None) -> None:
        """The deadline of this group's later collectives (torch's ProcessGroup API); on a
        communicator of its own also that communicator's (its isend/irecv run on threads
        of their own, which the per-thread deadline would not reach)."""
        self._timeout_s = _timeout_seconds(timeout)
        if self._comm is not None:
            self._comm.set_timeout(self._timeout_s)

    def shutdown(self) -> None:
        """destroy_process_group: release this group's libddl communicator."""
        if self._comm is not None and not self._comm.is_world:
            self._comm.free()

    def _inline(self, opts: Any) -> bool:
        """Whether to run a world collective on the calling thread (libddl's blocking
        call) rather than queue it: for a blocking torch call (async_op=False: torch sets
        opts.asyncOp False), which then skips the queue, the completer thread and their
        thread hand-offs (on a busy machine each costs scheduler latency), and always
        with DDL_TORCH_SYNC=1. Every rank decides alike (the same call, the same opts);
        work still queued here is waited for first, keeping the group's order."""
        if self._comm is not None:
            return False
        if not _SYNC and (opts is None or getattr(opts, "asyncOp", True)):
            return False
        self._settle()
        return True

    def _settle(self) -> None:
        """Finish the work queued on the world before a call that runs on this thread."""
        if COMPLETER.busy():
            _ddl.hurry()  # (negotiate the queued work now rather than after the cycle)
            COMPLETER.drain()

    # -- the libddl calls: asynchronous on the world, blocking on another communicator --
    # (and on CUDA tensors, which libddl's device path enqueues on the stream at once)
    def _allreduce_h(self, x: torch.Tensor, op: str) -> Any:
        if self._comm is None and not x.is_cuda:
            return ddl_core.allreduce_async(x, op=op, out=x)
        ddl_core.allreduce(x, op=op, out=x, comm=self._comm)
        return _FINISHED

    def _broadcast_h(self, x: torch.Tensor, root: int) -> Any:
        if self._comm is None and not x.is_cuda:
            return ddl_core.broadcast_async(x, root)
        ddl_core.broadcast(x, root, comm=self._comm)
        return _FINISHED

    def _allgather_h(self, x: torch.Tensor, out: torch.Tensor) -> Any:
        if self._comm is None and not x.is_cuda:
            return ddl_core.allgather_async(x, out=out)
        ddl_core.allgather(x, out=out, comm=self._comm)
        return _FINISHED

    def _reduce_scatter_h(self, x: torch.Tensor, op: str, out: torch.Tensor) -> Any:
        if self._comm is None and not x.is_cuda:
            return ddl_core.reduce_scatter_async(x, op=op, out=out)
        ddl_core.reduce_scatter(x, op=op, out=out, comm=self._comm)
        return _FINISHED

    def _alltoallv(self, src: torch.Tensor, counts: list[int],
                   out: torch.Tensor | None) -> tuple[list[int], torch.Tensor | None]:
        """(bytes each rank sent here, the flat result when it is not in `out`)."""
        if self._comm is None:
            recv = list(ddl_core.alltoall_counts(counts))
            if out is not None and out.numel() == sum(recv):
                ddl_core.alltoallv(src, counts, recv, out=out)
                return recv, None
            return recv, ddl_core.alltoallv(src, counts, recv)
        recv = [int(c) for c in ddl_core.alltoall(np.asarray(counts, dtype=np.int64),
                                                  comm=self._comm)]
        return recv, ddl_core.alltoallv(src, counts, comm=self._comm)

    # -- identity ------------------------------------------------------------------------
    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def size(self) -> int:
        return self._size

    def rank(self) -> int:
        return self._rank

    def __repr__(self) -> str:
        return f"ProcessGroupDDL(rank={self._rank}, size={self._size})"

    # -- reductions ----------------------------------------------------------------------
    @_deadline
    @_on_gpu(native=True)
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> DDLWork:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        handles, posts = [], []
        if (tensors and tensors[0].is_cuda) or self._inline(opts):
            for t in tensors:
                work, wop, post = prepare(t, op)
                ddl_core.allreduce(work, op=wop, out=work)
                if post is not None:
                    post()
            return _result([], tensors, None, _first(tensors))
        for t in tensors:
            work, wop, post = prepare(t, op)
            handles.append(self._allreduce_h(work, wop))
            posts.append(post)
        return _work(handles, tensors, chain(posts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> DDLWork:
        # libddl's progress thread fuses consecutive allreduces of one dtype and op.
        return self.allreduce(tensors, opts)

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> DDLWork:
        # An allreduce leaves the root's result where reduce puts it; other ranks' tensors
        # are unspecified after reduce in torch's contract.
        return self.allreduce(tensors, opts)

    @_deadline
    @_on_gpu(native=True)
    def _reduce_scatter_base(self, output: torch.Tensor, inp: torch.Tensor,
                             opts: Any = None) -> DDLWork:
        op = _op_name(opts.reduceOp) if opts is not None else "sum"
        if output.numel() * self._size != inp.numel():
            raise ValueError(f"reduce_scatter_tensor: input has {inp.numel()} elements, expected "
                             f"{self._size} x {output.numel()}")
        src, sop, _ = prepare(inp.contiguous(), op)
        dst, _, post = prepare(output, op)
        h = self._reduce_scatter_h(src.reshape(-1), sop, dst.reshape(-1))
        return _result([h], output, post, output)

    def reduce_scatter_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> DDLWork:
        works = [self._reduce_scatter_base(o, i, opts)
                 for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else _done(outputs)

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> DDLWork:
        works = []
        for out, ins in zip(outputs, input_lists, strict=True):
            if any(i.shape != out.shape for i in ins):
                raise ValueError("reduce_scatter needs equally shaped inputs (use "
                                 "reduce_scatter_tensor for a flat buffer)")
            works.append(self._reduce_scatter_base(out, torch.cat([i.reshape(-1) for i in ins]),
                                                   opts))
        return works[-1] if works else _done(outputs)

    # -- data movement ------------------------------------------------------------------
    @_deadline
    @_on_gpu(native=True)
    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> DDLWork:
        if isinstance(tensors, torch.Tensor):
            tensors = [tensors]
        root = opts.rootRank if opts is not None else 0
        handles, posts = [], []
        for t in tensors:
            work = t if t.is_contiguous() else t.contiguous()
            handles.append(self._broadcast_h(_bytes(work), root))
            posts.append(None if work is t else (lambda t=t, w=work: t.copy_(w)))
        return _result(handles, tensors, chain(posts), _first(tensors))

    @_deadline
    @_on_gpu(native=True)
    def _allgather_base(self, output: torch.Tensor, inp: torch.Tensor,
                        opts: Any = None) -> DDLWork:  # noqa: ARG002
        if output.numel() != inp.numel() * self._size:
            raise ValueError(f"all_gather_into_tensor: output has {output.numel()} elements, "
                             f"expected {self._size} x {inp.numel()}")
        if output.dtype != inp.dtype:
            raise TypeError(f"all_gather_into_tensor: output is {output.dtype}, input {inp.dtype}")
        src = inp.contiguous()
        dst = output if output.is_contiguous() else output.contiguous()
        h = self._allgather_h(_bytes(src), _bytes(dst))
        return _result([h], output, None if dst is output else (lambda: output.copy_(dst)),
                       output)

    def allgather_into_tensor_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any = None) -> DDLWork:
        works = [self._allgather_base(o, i, opts) for o, i in zip(outputs, inputs, strict=True)]
        return works[-1] if works else _done(outputs)

    @_deadline
    @_on_gpu(native=True)
    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> DDLWork:  # noqa: ARG002
        handles, posts = [], []
        for outs, inp in zip(output_lists, inputs, strict=True):
            if len(outs) != self._size:
                raise ValueError(f"all_gather: {len(outs)} output tensors for {self._size} ranks")
            if outs[self._rank].numel() != inp.numel():
                raise ValueError(f"all_gather: this rank's output tensor has "
                                 f"{outs[self._rank].numel()} elements, its input "
                                 f"{inp.numel()}")
            if any(o.numel() != inp.numel() for o in outs):
                # Uneven sizes (as gloo allows): libddl's allgatherv with the sizes the
                # output tensors give; sizes that disagree between ranks raise everywhere.
                # (Through host memory: libddl's allgatherv takes host buffers.)
                counts = [o.numel() * o.element_size() for o in outs]
                got = ddl_core.allgatherv(_bytes(inp.contiguous().cpu()), counts,
                                          comm=self._comm)
                offs = np.cumsum([0, *counts])
                for i, o in enumerate(outs):
                    o.copy_(got[offs[i]:offs[i + 1]].view(o.dtype).reshape(o.shape))
                handles.append(_FINISHED)
                continue
            flat = torch.empty((self._size, *inp.shape), dtype=inp.dtype, device=inp.device)
            handles.append(self._allgather_h(_bytes(inp.contiguous()), _bytes(flat)))
            posts.append(lambda outs=outs, flat=flat: [o.copy_(flat[i].view_as(o))
                                                       for i, o in enumerate(outs)])
        return _result(handles, output_lists, chain(posts), _first(inputs))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]],
                            inputs: list[torch.Tensor], opts: Any = None) -> DDLWork:
        works = [self.allgather([o], [i], opts) for o, i in zip(output_lists, inputs, strict=True)]
        return works[-1] if works else _done(output_lists)

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
               opts: Any = None) -> DDLWork:
        root = opts.rootRank if opts is not None else 0
        if self._rank == root:
            return self.allgather(output_lists, inputs)
        # Non-roots take part in the allgather into scratch space.
        scratch = [[torch.empty_like(inputs[0]) for _ in range(self._size)]]
        return self.allgather(scratch, inputs)

    @_deadline
    @_on_gpu(native=True)
    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                opts: Any = None) -> DDLWork:
        root = opts.rootRank if opts is not None else 0
        out = outputs[0]
        flat = (torch.stack([t.reshape(out.shape) for t in input_lists[0]])
                if self._rank == root else torch.empty((self._size, *out.shape), dtype=out.dtype,
                                                       device=out.device))
        h = self._broadcast_h(_bytes(flat), root)
        return _result([h], outputs, lambda: out.copy_(flat[self._rank]), out)

    @_deadline
    @_on_gpu(native=False)
    def alltoall_base(self, output: torch.Tensor, inp: torch.Tensor,
                      output_split_sizes: list[int], input_split_sizes: list[int],
                      opts: Any = None) -> DDLWork:  # noqa: ARG002
        """All-to-all of rows, on libddl's alltoallv (as bytes: any dtype; CUDA tensors
        through host memory: libddl's alltoallv takes host buffers)."""
        n = self._size
        rows = inp.shape[0] if inp.dim() else 0
        in_splits = list(input_split_sizes) or [rows // n] * n
        if len(in_splits) != n or sum(in_splits) != rows:
            raise ValueError(f"all_to_all_single: input_split_sizes {in_splits} must have {n} "
                             f"entries summing to {rows} rows")
        per_row = (inp[0].numel() if rows else 0) * inp.element_size()
        counts = [int(s) * per_row for s in in_splits]
        src = _bytes(inp.contiguous()) if inp.numel() else torch.empty(0, dtype=torch.uint8)
        dst = _bytes(output) if output.is_contiguous() else None  # (received in place)
        recv, flat = self._alltoallv(src, counts, dst)  # (recv: bytes each rank sent here)
        if output_split_sizes:
            want = [int(s) * per_row for s in output_split_sizes]
            if want != list(recv):
                raise ValueError(f"all_to_all_single: output_split_sizes "
                                 f"{list(output_split_sizes)} do not match what the ranks send "
                                 f"{[c // max(per_row, 1) for c in recv]}")
        if output.numel() * output.element_size() != sum(recv):
            raise ValueError(f"all_to_all_single: the output holds "
                             f"{output.numel() * output.element_size()} bytes, the ranks send "
                             f"{sum(recv)}")
        if flat is not None:
            output.copy_(flat.view(output.dtype).reshape(output.shape))
        return _done([output])

    @_deadline
    @_on_gpu(native=False)
    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                 opts: Any = None) -> DDLWork:
        flat = torch.cat([t.reshape(-1) for t in inputs])
        sizes = [t.numel() for t in inputs]
        if len(sizes) != self._size:
            raise ValueError(f"all_to_all: {len(sizes)} input tensors for {self._size} ranks")
        src = _bytes(flat) if flat.numel() else torch.empty(0, dtype=torch.uint8)
        recv, got = self._alltoallv(src, [n * flat.element_size() for n in sizes], None)
        off = 0
        for o, c in zip(outputs, recv, strict=True):
            if c != o.numel() * o.element_size():
                raise ValueError(f"all_to_all: an output tensor of {o.numel()} elements "
                                 f"for {c // max(flat.element_size(), 1)} sent")
            o.copy_(got[off:off + c].view(o.dtype).reshape(o.shape))
            off += c
        return _done(outputs)

    # torch 2.13 calls the "single" names from Python, older code the underscored ones.
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base

    @_deadline
    def barrier(self, opts: Any = None) -> DDLWork:  # noqa: ARG002
        # Through the queue, so a barrier also waits for collectives issued before it.
        z = torch.zeros(1, dtype=torch.int32)
        return _work([self._allreduce_h(z, "sum")], [])

    def monitored_barrier(self, timeout: timedelta | None = None,
                          wait_all_ranks: bool = False) -> None:  # noqa: ARG002
        """A barrier that fails after `timeout` (else the group's deadline) with an error
        naming the ranks that did not reach it (libddl asks every rank), as gloo's does."""
        seconds = timeout.total_seconds() if isinstance(timeout, timedelta) else None
        if seconds is None or seconds <= 0:
            self.barrier().wait()
            return
        prev = _ddl.set_thread_timeout(seconds)
        try:
            z = torch.zeros(1, dtype=torch.int32)
            ddl_core.allreduce(z, out=z, comm=self._comm)  # blocking, under this deadline
        finally:
            _ddl.set_thread_timeout(prev)

    # -- point to point: libddl's isend/irecv (tags as given; ranks of this group) ------
    # A CUDA tensor is sent from a host copy and received into one, copied to the GPU (a
    # synchronous copy) before the Work completes: libddl's send/recv take host buffers.
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> DDLWork:
        t = _one(tensors, "send")
        src = t.detach().cpu().contiguous()
        h = ddl_core.isend(_bytes(src), int(dst), int(tag), comm=self._comm)
        return _p2p_work(h, tensors)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> DDLWork:
        t = _one(tensors, "recv")
        if t.is_cuda:
            work = torch.empty(t.shape, dtype=t.dtype)
            post = functools.partial(_to_device, t, work)
        else:
            work = t if t.is_contiguous() else t.contiguous()
            post = None if work is t else functools.partial(t.copy_, work)
        h = ddl_core.irecv(_bytes(work), int(src), int(tag), comm=self._comm)
        return _p2p_work(h, tensors, post)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> DDLWork:
        raise NotImplementedError("the ddl backend receives from a named rank only (libddl's "
                                  "recv has no wildcard source): pass src= to dist.recv")


def _first(tensors: list[torch.Tensor]) -> torch.Tensor | None:
    return tensors[0] if tensors else None


def _one(tensors: list[torch.Tensor], what: str) -> torch.Tensor:
    if len(tensors) != 1:
        raise ValueError(f"{what}: one tensor per call on the ddl backend, got {len(tensors)}")
    cuda_device(tensors)  # (refuses a tensor on another kind of device)
    return tensors[0]


def _to_device(dst: torch.Tensor, host: torch.Tensor) -> None:
    """Copy a received host buffer into its CUDA tensor and wait for the copy (this runs
    on libddl's completion thread, whose stream no one else orders on)."""
    with torch.cuda.device(dst.device):
        dst.copy_(host)
        torch.cuda.current_stream().synchronize()


# -- rendezvous ---------------------------------------------------------------------------

def _bcast_object(obj: Any, root: int = 0) -> Any:
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if ddl_core.rank() == root else None
    n = np.array([0 if data is None else data.size], dtype=np.int64)
    ddl_core.broadcast(n, root)
    buf = data.copy() if data is not None else np.empty(int(n[0]), dtype=np.uint8)
    ddl_core.broadcast(buf, root)
    return pickle.loads(buf.tobytes())


def make_store(timeout: timedelta) -> tuple[dist.Store, int, int]:
    """A TCPStore on rank 0 that every rank reaches; found through DDL, not the environment."""
    ddl_core.init()
    rank, size = ddl_core.rank(), ddl_core.size()
    if rank == 0:
        store = dist.TCPStore("0.0.0.0", int(os.environ.get("MASTER_PORT", 0) or 0), size, True,
                              timeout, wait_for_workers=False)
        where = (os.environ.get("MASTER_ADDR") and [os.environ["MASTER_ADDR"]]
                 or local_addresses(), store.port)
        _bcast_object(where)
        _connected(None)
        return store, rank, size
    addrs, port = _bcast_object(None)
    errors = []
    for addr in addrs:
        try:
            socket.create_connection((addr, port), timeout=5).close()
        except OSError as exc:
            errors.append(f"{addr}: {exc}")
            continue
        store = dist.TCPStore(addr, port, size, False, timeout)
        _connected(None)
        return store, rank, size
    _connected(f"rank {rank} cannot reach rank 0's store on port {port}: " + "; ".join(errors))
    raise AssertionError("unreachable")  # (_connected raised)


def _connected(error: str | None) -> None:
    """Every rank has its store (or the first error, raised on every rank): rank 0 must
    not return, and perhaps destroy the group and its store at once, while a rank is
    still connecting to it."""
    errors = _allgather_object(error)
    bad = [e for e in errors if e]
    if bad:
        raise RuntimeError(bad[0])


def _allgather_object(obj: Any) -> list[Any]:
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = ddl_core.allgather(np.array([data.size], dtype=np.int64))
    buf = np.zeros(int(sizes.max()), dtype=np.uint8)
    buf[:data.size] = data
    rows = ddl_core.allgather(buf).reshape(len(sizes), -1)
    return [pickle.loads(rows[i, :int(n)].tobytes()) for i, n in enumerate(sizes)]


def _ddl_rendezvous(url: str, timeout: timedelta = timedelta(minutes=30),
                    **kwargs: Any) -> Iterator[tuple[dist.Store, int, int]]:  # noqa: ARG001
    yield make_store(timeout)
    raise RuntimeError("ddl:// rendezvous cannot re-rendezvous")


def _env_or_ddl(original: Any) -> Any:
    def handler(url: str, timeout: timedelta = timedelta(minutes=30), **kwargs: Any) -> Any:
        if wants_ddl_rendezvous(url):
            return _ddl_rendezvous(url, timeout, **kwargs)
        return original(url, timeout=timeout, **kwargs)

    handler._ddl_wrapped = True  # type: ignore[attr-defined]
    return handler


def cpp_backend() -> Any:
    """ddl_torch (the ddl-torch distribution: the C++ c10d Backend), or None without it
    or with DDL_TORCH_CPP=0 (the Python ProcessGroup alone: for comparison)."""
    if os.environ.get("DDL_TORCH_CPP", "1") == "0":
        return None
    return _import_ddl_torch()


@functools.cache
def _import_ddl_torch() -> Any:
    """ddl_torch, or None: absent, or present and broken (its _C built for another torch,
    say), which warns once with the cause: the Python ProcessGroup still serves."""
    try:
        import ddl_torch
    except ModuleNotFoundError as exc:
        if exc.name != "ddl_torch":
            _warn_broken_ddl_torch(exc)
        return None
    except Exception as exc:  # noqa: BLE001 - a broken C++ Backend leaves the Python one
        _warn_broken_ddl_torch(exc)
        return None
    return ddl_torch


def _warn_broken_ddl_torch(exc: BaseException) -> None:
    import warnings

    warnings.warn(f"ddl-torch (the ddl backend's C++ c10d Backend) is installed but cannot be "
                  f"imported: {type(exc).__name__}: {exc}. The ddl backend runs without it "
                  "(DDP and the plain collectives; no named groups for FSDP2/DTensor). Fix: "
                  "reinstall ddl-torch built for this torch", RuntimeWarning, stacklevel=3)


def group_comm(global_ranks: list[int], members_only: bool = False) -> ddl_core.Comm | None:
    """The libddl communicator of a group of these world ranks (None: the world itself,
    in rank order, which keeps libddl's asynchronous collectives). Collective over the
    world: every rank calls it for every new group, members or not, in the same order
    (torch's own rule for new_group); non-members get None back too. `members_only`
    (new_group(use_local_synchronization=True)): only the members call it, each with the
    same list (MPI_Comm_create_group)."""
    ddl_core.init()
    ranks = [int(r) for r in global_ranks]
    if not ranks or ranks == list(range(ddl_core.size())):
        return None
    if cpp_backend() is None:  # (every rank gets here, members or not: all raise alike)
        raise RuntimeError(
            f"new_group({ranks}) on the ddl backend needs ddl-torch, its C++ Backend (torch "
            "names groups through it): install it (pip install --no-build-isolation "
            "./ddl_core/compat/torch, or the ddl-torch conda package) and leave "
            "DDL_TORCH_CPP unset, or create this group with backend='gloo'")
    if members_only:
        return ddl_core.comm_world().create_group(ranks)
    return ddl_core.comm_world().create(ranks)


# Set while torch's _new_group_with_tag runs with use_local_synchronization=True, on the
# thread that runs it: torch then calls the backend on the members only, and the options it
# passes do not say so (see _local_synchronization).
_LOCAL_SYNC = threading.local()


def _create(opts: Any, backend_options: Any = None) -> Any:  # noqa: ARG001
    """What torch registers in the group: a c10d Backend (ddl_torch) forwarding to the
    Python implementation, so the group has a name (FSDP2, DTensor, DeviceMesh and the
    functional collectives need one); without ddl-torch, the Python ProcessGroup itself.
    torch calls this on the group's members only; the others take their part in the
    communicator's creation in _new_process_group_helper (see _join_as_non_member)."""
    rank, size = opts.group_rank, opts.group_size
    if torchrun_join.wanted(size):  # (torchrun: its processes become one MPI job first)
        torchrun_join.join(opts.store, rank, size, opts.timeout)
    comm = group_comm(list(opts.global_ranks_in_group),
                      members_only=getattr(_LOCAL_SYNC, "on", False))
    impl = ProcessGroupDDL(rank, size, opts.timeout, comm=comm)
    cpp = cpp_backend()
    if cpp is None:
        return impl
    return cpp.make_backend(impl, rank, size, BACKEND_NAME)


def _uses_ddl(backend: Any) -> bool:
    """Whether a new group's backend string ("ddl", "cpu:ddl,cuda:nccl", None for the
    default group's) puts ddl on some device."""
    text = str(backend if backend else dist.get_backend()).lower()
    return any(part.split(":")[-1].strip() == BACKEND_NAME for part in text.split(","))


def _join_as_non_member(original: Any) -> Any:
    """torch creates a subgroup's backend on its members only; a libddl communicator is
    made by every rank (MPI_Comm_split underneath). So a rank outside a new ddl group
    takes its part here, where torch returns NON_GROUP_MEMBER to it."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def helper(*args: Any, **kwargs: Any) -> Any:
        try:
            bound = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)
        ranks = bound.get("global_ranks_in_group") or []
        if (ranks and dist.is_initialized() and _uses_ddl(bound.get("backend"))
                and dist.get_rank() not in ranks):
            group_comm(list(ranks))  # (None here)
        return original(*args, **kwargs)

    helper._ddl_wrapped = True  # type: ignore[attr-defined]
    return helper


def _local_synchronization(original: Any) -> Any:
    """new_group(ranks, use_local_synchronization=True) is called by the group's members
    only, so its communicator must be made by them alone: mark the call for _create."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def with_tag(*args: Any, **kwargs: Any) -> Any:
        try:
            local = bool(signature.bind(*args, **kwargs).arguments.get(
                "use_local_synchronization", False))
        except TypeError:
            local = False
        prev = getattr(_LOCAL_SYNC, "on", False)
        _LOCAL_SYNC.on = local
        try:
            return original(*args, **kwargs)
        finally:
            _LOCAL_SYNC.on = prev

    with_tag._ddl_wrapped = True  # type: ignore[attr-defined]
    return with_tag


_registered = False


def _unavailable(fn: Any) -> bool:
    """Whether fn is one of the entry point's placeholders for a ddl that failed to load."""
    return getattr(fn, "_ddl_unavailable", False)


def register() -> None:
    """Make "ddl" a torch.distributed backend and "ddl://" a rendezvous; idempotent.

    The DDL-enabled pytorch package calls this when torch is imported (entry point in the
    `torch.backends` group), so scripts need no extra import.
    """
    global _registered
    if _registered:
        return
    _registered = True
    # (the entry point's placeholders, left when an earlier load failed, give way)
    plugin = dist.Backend._plugins.get(BACKEND_NAME.upper())
    if plugin is None or _unavailable(plugin.creator_fn):
        devices = ["cpu", "cuda"] if cpp_backend() is not None else ["cpu"]
        dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True,
                                      devices=devices)
    c10d = importlib.import_module("torch.distributed.distributed_c10d")
    helper = getattr(c10d, "_new_process_group_helper", None)
    if helper is not None and not getattr(helper, "_ddl_wrapped", False):
        c10d._new_process_group_helper = _join_as_non_member(helper)
    with_tag = getattr(c10d, "_new_group_with_tag", None)
    if with_tag is not None and not getattr(with_tag, "_ddl_wrapped", False):
        c10d._new_group_with_tag = _local_synchronization(with_tag)
    # torch.distributed.rendezvous is also the name of a function there: take the module.
    rdzv = importlib.import_module("torch.distributed.rendezvous")
    handlers = getattr(rdzv, "_rendezvous_handlers", None)
    if handlers is not None:
        if "ddl" not in handlers or _unavailable(handlers["ddl"]):
            handlers.pop("ddl", None)
            rdzv.register_rendezvous_handler("ddl", _ddl_rendezvous)
        env = handlers.get("env")
        if env is not None and _unavailable(env):
            env = env._ddl_original
        if env is not None and not getattr(env, "_ddl_wrapped", False):
            handlers["env"] = _env_or_ddl(env)

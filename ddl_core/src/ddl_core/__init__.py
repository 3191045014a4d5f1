"""DDL: topology-aware collectives over MPI for distributed deep learning.

    import ddl_core as ddl
    ddl.init()
    y = ddl.allreduce(x)              # sum over ranks, x unchanged
    ddl.allreduce(x, op="avg", out=x) # in place
    h = ddl.allreduce_async(g); ...; h.wait()

Inputs are numpy arrays (bfloat16 through ml_dtypes), torch CPU tensors, or any
C-contiguous buffer-protocol object; nothing is copied on the way to libddl.

GPU arrays (torch CUDA tensors, CuPy arrays, anything with __cuda_array_interface__ or
DLPack) take libddl's device path: NCCL where it can serve, else staging through host
memory over MPI (DDL_NCCL=0 forces it); see gpu_info(). Results are ordered on the
array's stream (torch's or CuPy's current stream).
"""

from __future__ import annotations

import atexit
import os
import sys
from typing import Any

import numpy as np

from . import _cuda, _ddl, timeline
from . import comm as _comm
from ._buffers import (
    _NP_CODE,
    BF16_CODE,
    DTYPE_CODE,
    DTYPES,
    OP_CODE,
    OPS,
    as_buffer,
    empty_like,
    op_code,
)
from ._ddl import (
    DDLError,
    DDLTimeoutError,
    InvalidArgumentError,
    MismatchError,
    NotInitializedError,
    PeerLostError,
)
from .comm import (
    Comm,
    allgatherv,
    comm_world,
    gather,
    irecv,
    isend,
    recv,
    reduce,
    scatter,
    send,
)

__version__ = "2.1.0"
__all__ = [
    "DTYPES", "OPS", "DDLError", "DDLTimeoutError", "InvalidArgumentError", "MismatchError",
    "NotInitializedError", "PeerLostError", "Handle", "init", "finalize", "is_initialized",
    "rank", "size",
    "local_rank", "local_size", "topology", "allreduce", "allreduce_async", "broadcast",
    "broadcast_async", "allgather", "allgather_async", "allgatherv_async", "reduce_scatter",
    "alltoall", "alltoallv", "alltoall_counts",
    "reduce_scatter_async", "barrier", "join", "plan", "set_algorithm", "set_fusion", "version",
    "async_stats", "gpu_info", "is_gpu_array", "set_thread_timeout",
    "Comm", "comm_world", "allgatherv", "gather", "scatter", "reduce",
    "send", "recv", "isend", "irecv",
]

_OP_CODE = dict(OP_CODE)
ALGORITHMS = ("auto", "ring", "rabenseifner", "recdoubling", "mpi")

rank = _ddl.rank
size = _ddl.size
local_rank = _ddl.local_rank
local_size = _ddl.local_size
is_initialized = _ddl.initialized


def barrier(comm: Comm | None = None) -> None:
    """Wait until every rank of `comm` (default: the world) has called barrier."""
    if comm is not None and _sub(comm):
        comm.barrier()
        return
    _ddl.barrier()


def join() -> int:
    """Horovod's join, for ranks with uneven amounts of data: this rank has finished.
    Until every rank has joined, it takes part in the asynchronous collectives (*_async)
    the others still run, contributing zeros (no rows to an allgatherv), so theirs
    complete; returns the rank that joined last, on every rank. Wait for this rank's own
    asynchronous requests first (InvalidArgumentError otherwise)."""
    return _ddl.join()


def _sub(comm: Comm | None) -> bool:
    """True for a communicator other than the world (the world keeps the 1.x paths)."""
    if comm is None:
        return False
    if not isinstance(comm, Comm):
        raise TypeError(f"comm must be a ddl_core.Comm or None, not {type(comm).__name__}")
    comm.handle  # noqa: B018 - raises for a freed communicator before anything moves
    return not comm.is_world


def _queue(comm: Comm | None) -> dict[str, int]:
    """The submit keyword of a request's queue: a communicator's own, or the world's."""
    return {"comm": comm.handle} if comm is not None and _sub(comm) else {}


def _gpu_on_world(comm: Comm | None, fn: str) -> None:
    if comm is not None and _sub(comm):
        raise InvalidArgumentError(
            f"{fn}: GPU arrays run on the world communicator only (libddl 2.0); give "
            "host memory for a communicator's queue")
version = _ddl.version


def init() -> None:
    """Initialise MPI (if nobody has) and DDL; harmless to call twice.

    libddl reads the cost model that `python -m ddl_core.bench tune` cached for this topology
    (or DDL_TUNE_FILE).
    """
    if _ddl.initialized():
        return
    launched = _launched_size(os.environ)
    _ddl.init()
    atexit.register(_finalize_at_exit)
    _watch_unhandled_exceptions()
    timeline.plan_fn = plan
    timeline.start_from_env("DDL_TIMELINE")
    if launched and launched > 1 and _ddl.size() == 1:
        raise DDLError(
            f"the launcher started {launched} processes but MPI sees a job of 1: no PMI "
            "reached MPI, so every process runs alone. Under Slurm start the ranks with "
            "`srun --mpi=pmix` (Open MPI; pmi2 for MPICH), set MpiDefault=pmix in "
            "slurm.conf, or use ddlrun, which adds it")


def _launched_size(environ: Any) -> int | None:
    """How many processes the launcher says it started, read before MPI_Init: mpirun's
    own count (Open MPI, MPICH), else the srun step's task count. Why: srun without a PMI
    plugin Open MPI understands starts N one-rank jobs, which would silently train N
    separate models."""
    for name in ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE"):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    if "SLURM_STEP_ID" in environ and environ.get("SLURM_STEP_NUM_TASKS", "").isdigit():
        return int(environ["SLURM_STEP_NUM_TASKS"])
    return None


_unhandled: BaseException | None = None


def _watch_unhandled_exceptions() -> None:
    """Remember an unhandled exception: finalizing is collective, so a rank that died of
    one must not wait in MPI_Finalize for peers that wait for it in a collective."""
    previous = sys.excepthook

    def hook(*exc_info: Any) -> None:
        global _unhandled
        _unhandled = exc_info[1] if exc_info[1] is not None else RuntimeError()
        previous(*exc_info)

    sys.excepthook = hook


def _note_peer_lost(exc: BaseException) -> None:
    """Tell ddlrun's rank wrapper (DDL_EXIT_NOTE_FD, see exitreport.py) that this rank
    fails only because a peer was lost, so the job's exit status is the peer's, not ours.
    torch's DDP re-raises our error as a RuntimeError that names it."""
    fd = os.environ.get("DDL_EXIT_NOTE_FD", "")
    if fd.isdigit() and (isinstance(exc, PeerLostError) or "PeerLostError" in str(exc)):
        try:
            os.write(int(fd), b"lost\n")
        except OSError:
            pass


def _finalize_at_exit() -> None:
    if _unhandled is not None:
        sys.stderr.flush()
        _note_peer_lost(_unhandled)
        os._exit(1)  # the launcher sees the failure and ends the job
    if _ddl.initialized():
        # The peers learn now that this rank is leaving; MPI_Finalize, which waits for
        # all of them, runs at exit() and only if the exit status is 0 (a failing rank
        # must not wait for the ranks it just made fail).
        try:
            _ddl._finalize_at_exit()
        except DDLError:
            pass


def finalize() -> None:
    """Finish queued asynchronous work and shut DDL (and MPI, if DDL started it) down."""
    _ddl.finalize()
    _comm._reset()


def set_thread_timeout(seconds: float | None) -> float | None:
    """The deadline of the collectives this thread calls or submits from now on (an
    asynchronous request keeps the one it was submitted with); None restores DDL_TIMEOUT.
    Returns the previous setting (None: DDL_TIMEOUT). torch's ddl backend sets it from a
    process group's timeout= around each of its calls."""
    prev = _ddl.set_thread_timeout(0.0 if seconds is None else float(seconds))
    return prev or None


def topology() -> tuple[int, ...]:
    """The rank grid, innermost level first, e.g. (4, 2) = 4 ranks per node x 2 nodes."""
    return _ddl.topology()


def _out(x: Any, out: Any,
         shape: tuple[int, ...] | None = None) -> tuple[Any, Any, Any, int]:
    """(result object, its buffer, the input's buffer, dtype code): the input is resolved
    once here and its buffer handed back so callers need not resolve it again."""
    buf, code = as_buffer(x)
    if out is None:
        res, rbuf = empty_like(x, buf, shape)
        return res, rbuf, buf, code
    if out is x:
        return out, buf, buf, code
    rbuf, rcode = as_buffer(out)
    if rcode != code:
        raise TypeError(f"out has dtype {DTYPES[rcode]} but the input {DTYPES[code]}")
    return out, rbuf, buf, code


def _dev_out(x: Any, d: _cuda.DeviceArray, out: Any,
             shape: tuple[int, ...] | None = None) -> tuple[Any, _cuda.DeviceArray]:
    """The result object and its DeviceArray for a GPU input: `out` (on the GPU, same
    dtype), x itself for out=x, or a new array like x."""
    if out is x:
        return x, d
    if out is None:
        out = _cuda.empty_like(x, d, shape)
    r = _cuda.device_array(out)
    if r is None:
        raise TypeError("the input is in GPU memory but out is not: pass a GPU array as out")
    if r.code != d.code:
        raise TypeError(f"out has dtype {r.dtype} but the input {d.dtype}")
    return out, r


def allreduce(x: Any, op: str = "sum", out: Any = None, comm: Comm | None = None) -> Any:
    """Reduce x over all ranks; the result goes to `out` (a new array if None; `out=x`
    works in place) and is returned. op: sum, avg, min, max, prod."""
    if comm is not None and _sub(comm):
        return _comm.comm_allreduce(comm, x, op, out)
    o = _OP_CODE.get(op)
    if o is None:
        o = op_code(op)
    # Fast path, numpy in and out: the C binding checks contiguity and sizes itself.
    if type(x) is np.ndarray and (out is None or type(out) is np.ndarray):
        code = _NP_CODE.get(x.dtype)
        if code is not None and code != BF16_CODE:
            if out is None:
                out = np.empty_like(x)
            elif out.dtype != x.dtype:
                raise TypeError(f"out has dtype {out.dtype} but the input {x.dtype}")
            _ddl.allreduce(None if out is x else x, out, code, o)
            return out
    d = _cuda.device_array(x)
    if d is not None:
        res, r = _dev_out(x, d, out)
        if r.count != d.count:
            raise ValueError(f"input has {d.count} elements but output {r.count}")
        _ddl.dev_allreduce(0 if r.ptr == d.ptr else d.ptr, r.ptr, d.count, d.code, o, d.stream)
        return res
    res, rbuf, buf, code = _out(x, out)
    _ddl.allreduce(None if res is x else buf, rbuf, code, o)
    return res


def broadcast(x: Any, root: int = 0, comm: Comm | None = None) -> Any:
    """Overwrite x on every rank with root's x (in place); returns x."""
    if comm is not None and _sub(comm):
        return _comm.comm_broadcast(comm, x, root)
    d = _cuda.device_array(x)
    if d is not None:
        _ddl.dev_broadcast(d.ptr, d.count, d.code, root, d.stream)
        return x
    buf, code = as_buffer(x)
    _ddl.broadcast(buf, code, root)
    return x


def _gather_shape(x: Any, n: int | None = None) -> tuple[int, ...]:
    shape = tuple(getattr(x, "shape", ()) or ())
    n = size() if n is None else n
    return (n * shape[0], *shape[1:]) if shape else (n,)


def allgather(x: Any, out: Any = None, comm: Comm | None = None) -> Any:
    """Concatenate every rank's x along the first axis, in rank order."""
    if comm is not None and _sub(comm):
        return _comm.comm_allgather(comm, x, out)
    d = _cuda.device_array(x)
    if d is not None:
        res, r = _dev_out(x, d, out, _gather_shape(x) if out is None else None)
        if r.count != d.count * size():
            raise ValueError(f"allgather: out must hold size ({size()}) x {d.count} elements, "
                             f"not {r.count}")
        _ddl.dev_allgather(d.ptr, r.ptr, d.count, d.code, d.stream)
        return res
    res, rbuf, buf, code = _out(x, out, _gather_shape(x) if out is None else None)
    _ddl.allgather(buf, rbuf, code)
    return res


def alltoall(x: Any, out: Any = None, comm: Any = None) -> Any:
    """Block i of x (split evenly along the first axis, or flat) goes to rank i; returns
    the blocks that arrived, block j from rank j, shaped like x. Host buffers. comm=: on
    that communicator (ddl_core.comm.alltoall)."""
    if comm is not None:
        return _comm.alltoall(x, out, comm=comm)
    if _cuda.device_array(x) is not None:
        raise NotImplementedError("alltoall of GPU buffers is not available yet: copy to "
                                  "the host (x.cpu()) first")
    if x is out:
        raise ValueError("alltoall cannot run in place: give another out, or none")
    res, rbuf, buf, code = _out(x, out)
    _ddl.alltoall(buf, rbuf, code)
    return res


def alltoallv(x: Any, send_counts: Any, recv_counts: Any = None, out: Any = None, *,
              comm: Any = None) -> Any:
    """send_counts[i] elements of a flat x (packed in rank order) go to rank i; returns,
    flat, what arrived from every rank, in rank order (its counts: alltoall_counts, which
    runs first unless recv_counts gives them). A rank sending nothing to some ranks is
    fine; recv_counts that disagree with the senders' raise MismatchError on every rank.
    out: where to receive (flat, at least sum(recv_counts) elements), else a new array.
    Host buffers. comm=: on that communicator (ddl_core.comm.alltoallv; without
    recv_counts and out there)."""
    if comm is not None:
        if recv_counts is not None or out is not None:
            raise TypeError("alltoallv: recv_counts and out are for the world communicator")
        return _comm.alltoallv(x, send_counts, comm=comm)
    if _cuda.device_array(x) is not None:
        raise NotImplementedError("alltoallv of GPU buffers is not available yet: copy to "
                                  "the host (x.cpu()) first")
    counts = [int(c) for c in send_counts]
    recv = ([int(c) for c in recv_counts] if recv_counts is not None
            else _ddl.alltoall_counts(counts))
    if out is not None and out is x:
        raise ValueError("alltoallv cannot run in place: give another out, or none")
    if out is None:
        buf, code = as_buffer(x)
        res, rbuf = empty_like(x, buf, (sum(recv),))
    else:
        res, rbuf, buf, code = _out(x, out)
    _ddl.alltoallv(buf, counts, rbuf, list(recv), code)
    return res


def alltoall_counts(send_counts: Any) -> tuple[int, ...]:
    """What each rank will send here in an alltoallv where this rank sends send_counts."""
    return _ddl.alltoall_counts([int(c) for c in send_counts])


def _scatter_shape(x: Any, n: int | None = None) -> tuple[int, ...]:
    shape = tuple(getattr(x, "shape", ()) or ())
    n = size() if n is None else n
    if shape and shape[0] % n == 0:
        return (shape[0] // n, *shape[1:])
    total = 1
    for d in shape:
        total *= d
    if total % n:
        raise ValueError(f"reduce_scatter: {total} elements do not split over {n} ranks")
    return (total // n,)


def reduce_scatter(x: Any, op: str = "sum", out: Any = None, comm: Comm | None = None) -> Any:
    """Reduce x over ranks and give rank i the i-th of `size()` equal blocks."""
    o = op_code(op)
    if comm is not None and _sub(comm):
        return _comm.comm_reduce_scatter(comm, x, op, out)
    d = _cuda.device_array(x)
    if d is not None:
        res, r = _dev_out(x, d, out, _scatter_shape(x) if out is None else None)
        if r.count * size() != d.count:
            raise ValueError(f"reduce_scatter: the input must hold size ({size()}) x "
                             f"{r.count} elements, not {d.count}")
        _ddl.dev_reduce_scatter(d.ptr, r.ptr, r.count, d.code, o, d.stream)
        return res
    res, rbuf, buf, code = _out(x, out, _scatter_shape(x) if out is None else None)
    _ddl.reduce_scatter(buf, rbuf, code, o)
    return res


class Handle:
    """An asynchronous collective: `wait()` returns its result, `test()` polls."""

    __slots__ = ("_req", "_result", "_keep", "_tl")

    def __init__(self, req: Any, result: Any, keep: Any) -> None:
        self._req = req
        self._result = result
        self._keep = keep  # the user's objects stay alive as long as the request
        self._tl: tuple[str, str, int] | None = None  # (row, kind, bytes) for the timeline

    def test(self) -> bool:
        done = self._req.test()
        if done and self._tl is not None:
            self._trace()
        return done

    def wait(self) -> Any:
        # (libddl's wait negotiates what is queued at once, on this thread when no other
        # is at it, rather than waiting out the cycle time for more to fuse: a 1 MiB
        # request waited 1 ms for nothing; requests submitted together still fuse.)
        self._req.wait()
        if self._tl is not None:
            self._trace()
        return self._result

    def _trace(self) -> None:
        tl, self._tl = self._tl, None  # (once, whichever of several waiters gets here)
        if tl is None:
            return
        row, kind, nbytes = tl
        timing = getattr(self._req, "timing", None)
        if timing is not None:
            timeline.request(row, kind, nbytes, timing())

    synchronize = wait
    poll = test


def _traced(h: Handle, kind: str, name: str | None, buf: Any) -> Handle:
    """Mark h for the timeline (DDL_TIMELINE, ddl_core.timeline) when one is open."""
    if timeline.active:
        h._tl = (name or kind, kind, memoryview(buf).nbytes if buf is not None else 0)
    return h


class _Done:
    """The request of a GPU collective: already enqueued on its stream (NCCL) or finished
    (staged) when the call returned, so test() and wait() have nothing left to wait for."""

    def test(self) -> bool:
        return True

    def wait(self) -> None:
        return None


_DONE = _Done()


def _named(on_gpu: bool, name: str | None, shape: Any) -> dict[str, Any]:
    """The matching keywords of a host request (see allreduce_async); GPU arrays run at
    once in call order, so a name (which promises any order) cannot apply to them."""
    if name is not None or shape is not None:
        if on_gpu:
            raise ValueError("named asynchronous requests take host memory; a GPU array "
                             "runs at once, in call order: drop name= (and shape=)")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        return {"name": name or None, "shape": None if shape is None else tuple(shape)}
    return {}


def allreduce_async(x: Any, op: str = "sum", out: Any = None, *, name: str | None = None,
                    shape: Any = None, comm: Comm | None = None) -> Handle:
    """Queue an allreduce for the progress thread; small ones are fused (see set_fusion).

    Unnamed requests are matched across ranks by submission order. With `name=`, the
    request is matched by name instead, whatever order the ranks submit it in (as Horovod
    does); a name may be in flight once per rank. `shape=` (e.g. x.shape) is compared
    across ranks as well as the count. A mismatch raises MismatchError from wait() on
    every rank. GPU arrays run at once, ordered on their stream; the handle is then done.
    comm=: on that communicator's own queue, matched and fused among its members only.
    """
    o = op_code(op)
    on_gpu = _cuda.device_array(x) is not None  # (resolved once: it costs ~0.3 us)
    kw = _named(on_gpu, name, shape) | _queue(comm)
    if on_gpu:
        _gpu_on_world(comm, "allreduce_async")
        return Handle(_DONE, allreduce(x, op, out), None)
    res, rbuf, buf, code = _out(x, out)
    sbuf = None if res is x else buf
    return _traced(Handle(_ddl.submit(0, sbuf, rbuf, code, o, 0, **kw), res, (x, res)),
                   "allreduce", name, buf)


def broadcast_async(x: Any, root: int = 0, *, name: str | None = None,
                    shape: Any = None, comm: Comm | None = None) -> Handle:
    """Queue a broadcast of root's x into x; name=, shape= and comm= as for
    allreduce_async (root: a rank of comm)."""
    on_gpu = _cuda.device_array(x) is not None
    kw = _named(on_gpu, name, shape) | _queue(comm)
    if on_gpu:
        _gpu_on_world(comm, "broadcast_async")
        return Handle(_DONE, broadcast(x, root), None)
    buf, code = as_buffer(x)
    return _traced(Handle(_ddl.submit(1, None, buf, code, 0, root, **kw), x, x), "broadcast",
                   name, buf)


def allgather_async(x: Any, out: Any = None, *, name: str | None = None,
                    shape: Any = None, comm: Comm | None = None) -> Handle:
    """Queue an allgather (every rank's x has the same count); name= and shape= as for
    allreduce_async (shapes: all dimensions but the first must agree); comm= likewise."""
    on_gpu = _cuda.device_array(x) is not None
    kw = _named(on_gpu, name, shape) | _queue(comm)
    if on_gpu:
        _gpu_on_world(comm, "allgather_async")
        return Handle(_DONE, allgather(x, out), None)
    n = comm.size if _sub(comm) else None
    res, rbuf, buf, code = _out(x, out, _gather_shape(x, n) if out is None else None)
    return _traced(Handle(_ddl.submit(2, buf, rbuf, code, 0, 0, **kw), res, (x, res)),
                   "allgather", name, buf)


def reduce_scatter_async(x: Any, op: str = "sum", out: Any = None, *, name: str | None = None,
                         shape: Any = None, comm: Comm | None = None) -> Handle:
    """Queue a reduce_scatter; name=, shape= (of x) and comm= as for allreduce_async."""
    o = op_code(op)
    on_gpu = _cuda.device_array(x) is not None
    kw = _named(on_gpu, name, shape) | _queue(comm)
    if on_gpu:
        _gpu_on_world(comm, "reduce_scatter_async")
        return Handle(_DONE, reduce_scatter(x, op, out), None)
    n = comm.size if _sub(comm) else None
    res, rbuf, buf, code = _out(x, out, _scatter_shape(x, n) if out is None else None)
    return _traced(Handle(_ddl.submit(3, buf, rbuf, code, o, 0, **kw), res, (x, res)),
                   "reduce_scatter", name, buf)


class _Gathered(Handle):
    """An allgatherv: the result is built from libddl's buffer once the request is done.
    rows_only: x's rows hold no elements, and one byte per row travelled instead (the
    element counts alone cannot say how many rows each rank had)."""

    __slots__ = ("_like", "_rows_only")

    def __init__(self, req: Any, x: Any, rows_only: bool = False) -> None:
        super().__init__(req, None, x)
        self._like = x
        self._rows_only = rows_only

    def wait(self) -> Any:
        self._req.wait()
        if self._tl is not None:
            self._trace()
        if self._result is None:
            data, counts = self._req.gathered()
            self._result = (_empty_rows(self._like, sum(counts)) if self._rows_only
                            else _from_bytes(self._like, data, sum(counts)))
        return self._result


def _empty_rows(like: Any, rows: int) -> Any:
    """`rows` rows shaped like like's, which hold no elements, of like's kind and dtype."""
    shape = (rows, *tuple(like.shape)[1:])
    if type(like).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=like.dtype)
    return np.empty(shape, dtype=like.dtype)


def _from_bytes(like: Any, data: bytearray, count: int) -> Any:
    """`count` elements of like's dtype from `data`, shaped (-1, *like.shape[1:])."""
    shape = tuple(getattr(like, "shape", ()) or ())
    rows = (-1, *shape[1:]) if shape else (-1,)
    if type(like).__module__.startswith("torch"):
        import torch

        t = torch.frombuffer(data, dtype=like.dtype) if count else torch.empty(0, dtype=like.dtype)
        return t.reshape(rows)
    buf, _ = as_buffer(like)
    dtype = like.dtype if isinstance(like, np.ndarray) else np.asarray(buf).dtype
    return np.frombuffer(data, dtype=dtype, count=count).reshape(rows)


def allgatherv_async(x: Any, *, name: str | None = None, shape: Any = None,
                     comm: Comm | None = None) -> Handle:
    """Queue an allgather whose first dimension may differ between ranks (Horovod's
    allgather): wait() returns every rank's x concatenated along the first axis, in rank
    order (numpy for numpy and buffers, torch for torch). name= and shape= as for
    allreduce_async; with shape=, all dimensions but the first must agree. comm= likewise."""
    on_gpu = _cuda.device_array(x) is not None
    kw = _named(on_gpu, name, shape) | _queue(comm)
    if on_gpu:
        raise ValueError("allgatherv_async takes host memory")
    buf, code = as_buffer(x)
    dims = tuple(getattr(x, "shape", ()) or ())
    if len(dims) > 1 and 0 in dims[1:]:
        # Rows of no elements: one byte per row travels, so every rank learns how many rows
        # each had (the result's first dimension). Ranks still disagree on the dtype or
        # on rows that hold elements as a MismatchError; trailing dimensions that are all
        # empty are not compared.
        buf = np.zeros(dims[0], np.uint8)
        if kw.get("shape") is not None:
            kw["shape"] = (dims[0], 1)
        return _traced(_Gathered(_ddl.submit(4, buf, None, DTYPE_CODE["uint8"], 0, 0, **kw), x,
                                 rows_only=True), "allgather", name, buf)
    return _traced(_Gathered(_ddl.submit(4, buf, None, code, 0, 0, **kw), x), "allgather",
                   name, buf)


def set_algorithm(name: str) -> None:
    """Force one allreduce algorithm (as DDL_ALGO does); 'auto' restores the cost model.
    Call it the same way on every rank: ranks that differ get MismatchError."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}: use one of {', '.join(ALGORITHMS)}")
    _ddl.set_algorithm(ALGORITHMS.index(name))


def plan(nbytes: int) -> tuple[tuple[str, ...], float]:
    """(algorithm per level, predicted seconds) the cost model picks for nbytes."""
    return _ddl.plan(int(nbytes))


def async_stats() -> dict[str, int]:
    """Progress-thread counters: negotiated batches, fusion buffers, fused requests, and
    of the negotiation: cycles, full_cycles (that exchanged names: a name new to the
    table, or a stalled request), names (in the table), pending (requests queued on
    this rank, not yet taken into a batch) and waiter_cycles (cycles a thread blocked in
    wait() ran itself, sparing the hand-off to the progress thread)."""
    return {**_ddl.async_stats(), **_ddl.negotiation_stats()}


def set_fusion(threshold_bytes: int, cycle_time_ms: float) -> None:
    """Tensor fusion: the fusion buffer's size and how long the progress thread lets
    requests gather before it negotiates a batch (DDL_FUSION_THRESHOLD, DDL_CYCLE_TIME_MS).
    The threshold must be the same on every rank (ranks that differ get MismatchError)."""
    _ddl.set_fusion(int(threshold_bytes), float(cycle_time_ms))


def gpu_info() -> dict[str, str]:
    """Where libddl found the CUDA runtime and NCCL (or why not, and what it tried), the
    device path in use (mode: undecided, nccl or staged, with staged_reason) and counters.
    Callable before init() and on machines without a GPU."""
    info: dict[str, str] = {}
    for line in _ddl.gpu_info().splitlines():
        key, _, value = line.partition("=")
        info[key] = value
    return info


def is_gpu_array(x: Any) -> bool:
    """True when x lives in GPU memory and takes libddl's device path (a torch CUDA tensor,
    a CuPy array, anything with __cuda_array_interface__ or a CUDA DLPack device)."""
    return _cuda.device_array(x) is not None

"""DDL: topology-aware collectives over MPI for distributed deep learning.

    import ddl_core as ddl
    ddl.init()
    y = ddl.allreduce(x)              # sum over ranks, x unchanged
    ddl.allreduce(x, op="avg", out=x) # in place
    h = ddl.allreduce_async(g); ...; h.wait()

Communicators in mpi4py's spirit: every collective is a method of ddl.Comm (comm.py), and
these module-level calls are calls on ddl.comm_world(), the world being one communicator
(comm= runs one on another: ddl.allreduce(x, comm=half) is half.allreduce(x)).

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

from . import _cuda, _ddl, jobshm, timeline
from . import comm as _comm
from ._buffers import DTYPES, OPS
from ._ddl import (
    DDLError,
    DDLTimeoutError,
    InvalidArgumentError,
    MismatchError,
    NotInitializedError,
    PeerLostError,
    ProcessFailedError,
)
from .comm import Comm, comm_world, replace_world, shrink_world
from .comm import on as _on
from .requests import Handle

__version__ = "2.2.0"
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
    "ProcessFailedError", "fault_tolerant", "shrink_world", "replace_world",
]

ALGORITHMS: tuple[str, ...] = _ddl.ALGORITHMS  # libddl's names, in its code order



def rank() -> int:
    """This rank's place in the world (after shrink_world/replace_world: the new one's)."""
    w = _comm._current
    return _ddl.rank() if w is None else w.rank


def size() -> int:
    """How many ranks the world has (after shrink_world/replace_world: the new one)."""
    w = _comm._current
    return _ddl.size() if w is None else w.size


def fault_tolerant() -> bool:
    """Whether this job runs with ULFM enabled (`ddlrun --elastic`, i.e. mpirun --with-ft
    ulfm): then a rank's death is a ProcessFailedError on the survivors, who may
    shrink_world() and go on; without it a death ends the job (PeerLostError)."""
    return bool(_ddl.fault_tolerant())


local_rank = _ddl.local_rank
local_size = _ddl.local_size
is_initialized = _ddl.initialized


def join() -> int:
    """Horovod's join, for ranks with uneven amounts of data: this rank has finished.
    Until every rank has joined, it takes part in the asynchronous collectives (*_async)
    the others still run, contributing zeros (no rows to an allgatherv), so theirs
    complete; returns the rank that joined last, on every rank. Wait for this rank's own
    asynchronous requests first (InvalidArgumentError otherwise)."""
    return _ddl.join()


version = _ddl.version


def init(comm: Any = None) -> None:
    """Initialise MPI (if nobody has) and DDL; harmless to call twice.

    comm: an mpi4py intracommunicator (or its C handle as an int) to run on instead of
    MPI_COMM_WORLD: the world is then a duplicate of it (e.g. processes a launcher other
    than mpirun joined). libddl reads the cost model that `python -m ddl_core.bench tune`
    cached for this topology (or DDL_TUNE_FILE).
    """
    if _ddl.initialized():
        return
    handle = None if comm is None else _comm.mpi_handle(comm)
    launched = _launched_size(os.environ) if handle is None else None
    with jobshm.Alone(os.environ):  # a singleton's shared memory: gone at its exit
        if handle is None:
            _ddl.init()
        else:
            _ddl.init(handle)
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
        _comm.free_replacement()
        try:
            _ddl._finalize_at_exit()
        except DDLError:
            pass


def finalize() -> None:
    """Finish queued asynchronous work and shut DDL (and MPI, if DDL started it) down."""
    _comm.free_replacement()
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


# ---- the collectives: calls on comm_world() (or comm=), as mpi4py's on COMM_WORLD --------
# Each is written once, as a method of Comm (comm.py), which says what it does.


def allreduce(x: Any, op: str = "sum", out: Any = None, comm: Comm | None = None) -> Any:
    """Reduce x over all ranks (Comm.allreduce); `out=x` works in place."""
    return _on(comm).allreduce(x, op, out)


def broadcast(x: Any, root: int = 0, comm: Comm | None = None) -> Any:
    """Overwrite x on every rank with root's x, in place (Comm.broadcast)."""
    return _on(comm).broadcast(x, root)


def allgather(x: Any, out: Any = None, comm: Comm | None = None) -> Any:
    """Concatenate every rank's x along the first axis, in rank order (Comm.allgather)."""
    return _on(comm).allgather(x, out)


def reduce_scatter(x: Any, op: str = "sum", out: Any = None, comm: Comm | None = None) -> Any:
    """Reduce x over ranks and give rank i the i-th of size() blocks (Comm.reduce_scatter)."""
    return _on(comm).reduce_scatter(x, op, out)


def barrier(comm: Comm | None = None) -> None:
    """Wait until every rank of `comm` (default: the world) has called barrier."""
    _on(comm).barrier()


def alltoall(x: Any, out: Any = None, comm: Comm | None = None) -> Any:
    """Block i of x goes to rank i; returns the blocks that arrived (Comm.alltoall)."""
    return _on(comm).alltoall(x, out)


def alltoallv(x: Any, send_counts: Any, recv_counts: Any = None, out: Any = None, *,
              comm: Comm | None = None) -> Any:
    """send_counts[i] elements of flat x go to rank i; returns, flat, what arrived
    (Comm.alltoallv)."""
    return _on(comm).alltoallv(x, send_counts, recv_counts, out)


def alltoall_counts(send_counts: Any, comm: Comm | None = None) -> tuple[int, ...]:
    """What each rank will send here in an alltoallv where this rank sends send_counts."""
    return _on(comm).alltoall_counts(send_counts)


def allgatherv(x: Any, counts: Any = None, out: Any = None, *,
               comm: Comm | None = None) -> Any:
    """Every rank's x (any number of elements each), flat, in rank order (Comm.allgatherv)."""
    return _on(comm).allgatherv(x, counts, out)


def gather(x: Any, root: int = 0, out: Any = None, *, comm: Comm | None = None) -> Any:
    """Every rank's x concatenated in rank order on `root`; None elsewhere (Comm.gather)."""
    return _on(comm).gather(x, root, out)


def scatter(x: Any, root: int = 0, out: Any = None, *, count: int | None = None,
            comm: Comm | None = None) -> Any:
    """Rank i receives block i of root's flat x (Comm.scatter)."""
    return _on(comm).scatter(x, root, out, count=count)


def reduce(x: Any, op: str = "sum", root: int = 0, out: Any = None, *,
           comm: Comm | None = None) -> Any:
    """The reduction of every rank's x on `root`; None elsewhere (Comm.reduce)."""
    return _on(comm).reduce(x, op, root, out)


def send(x: Any, dest: int, tag: int = 0, *, comm: Comm | None = None) -> None:
    """Send x to `dest`; returns once x may be reused (Comm.send)."""
    _on(comm).send(x, dest, tag)


def recv(out: Any, source: int, tag: int = 0, *, comm: Comm | None = None) -> Any:
    """Receive into `out` from `source`, which must send exactly out's size (Comm.recv)."""
    return _on(comm).recv(out, source, tag)


def isend(x: Any, dest: int, tag: int = 0, *, comm: Comm | None = None) -> Any:
    """send() without blocking; x stays untouched until wait() (Comm.isend)."""
    return _on(comm).isend(x, dest, tag)


def irecv(out: Any, source: int, tag: int = 0, *, comm: Comm | None = None) -> Any:
    """recv() without blocking; wait() returns out (Comm.irecv)."""
    return _on(comm).irecv(out, source, tag)


def allreduce_async(x: Any, op: str = "sum", out: Any = None, *, name: str | None = None,
                    shape: Any = None, comm: Comm | None = None) -> Handle:
    """Queue an allreduce; `name=` matches it by name, `shape=` compares shapes too
    (Comm.allreduce_async)."""
    return _on(comm).allreduce_async(x, op, out, name=name, shape=shape)


def broadcast_async(x: Any, root: int = 0, *, name: str | None = None,
                    shape: Any = None, comm: Comm | None = None) -> Handle:
    """Queue a broadcast of root's x into x (Comm.broadcast_async)."""
    return _on(comm).broadcast_async(x, root, name=name, shape=shape)


def allgather_async(x: Any, out: Any = None, *, name: str | None = None,
                    shape: Any = None, comm: Comm | None = None) -> Handle:
    """Queue an allgather (Comm.allgather_async)."""
    return _on(comm).allgather_async(x, out, name=name, shape=shape)


def reduce_scatter_async(x: Any, op: str = "sum", out: Any = None, *, name: str | None = None,
                         shape: Any = None, comm: Comm | None = None) -> Handle:
    """Queue a reduce_scatter (Comm.reduce_scatter_async)."""
    return _on(comm).reduce_scatter_async(x, op, out, name=name, shape=shape)


def allgatherv_async(x: Any, *, name: str | None = None, shape: Any = None,
                     comm: Comm | None = None) -> Handle:
    """Queue an allgather whose first dimension may differ between ranks, Horovod's
    allgather (Comm.allgatherv_async)."""
    return _on(comm).allgatherv_async(x, name=name, shape=shape)


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

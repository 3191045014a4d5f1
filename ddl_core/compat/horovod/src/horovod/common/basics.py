"""Horovod's process-level functions (init, rank, size, ...) on ddl_core, shared by the
torch, tensorflow and keras front ends."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

import numpy as np

import ddl_core
from ddl_core import timeline

from . import process_sets as _ps
from . import worker_env
from .engine import BARRIER
from .exceptions import HorovodInternalError, HostsUpdatedInterrupt  # noqa: F401
from .process_sets import (  # noqa: F401 - Horovod's API
    ProcessSet,
    add_process_set,
    get_process_sets,
    global_process_set,
    process_set_by_id,
    remove_process_set,
)

# Horovod's reduce ops; plain strings so they compare, print and pickle simply.
Average = "average"
Sum = "sum"
Adasum = "adasum"
Min = "min"
Max = "max"
Product = "product"

_DDL_OP = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}

_cross: tuple[int, int] | None = None


def ddl_op(op: Any = None, average: bool | None = None) -> str:
    """ddl_core's op name for Horovod's (op, deprecated average) arguments."""
    if op is not None and average is not None:
        raise ValueError("give op or average, not both")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by horovod-ddl; use op=hvd.Average")
    if op in _DDL_OP.values():  # already ddl_core's name (the layer passes it along)
        return str(op)
    name = _DDL_OP.get(str(op).lower())
    if name is None:
        raise ValueError(f"unknown op {op!r}: use hvd.Average, Sum, Min, Max or Product")
    return name


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Start DDL (MPI) and learn the node layout; collective, call it on every rank.
    process_sets: ProcessSets (or rank lists) to register, in order, or "dynamic"."""
    global _cross
    if comm is not None and not isinstance(comm, list):
        try:  # an mpi4py communicator: only the world is supported
            from mpi4py import MPI

            if comm.Get_size() != MPI.COMM_WORLD.Get_size():
                raise NotImplementedError("horovod-ddl runs on MPI_COMM_WORLD only")
        except ImportError:
            pass
    if ddl_core.is_initialized():
        ddl_core.init()
    else:
        from . import elastic_world

        # a rank spawned onto a host the discovery script added starts on the world it
        # was merged into (the survivors and the other new ranks), made the world by the
        # same call the survivors make (replace_world), so the two sides match
        joined = elastic_world.join_if_spawned()
        ddl_core.init()
        if joined is not None:
            ddl_core.replace_world(joined)
            # its launch variables were its spawn's (rank 0 of 1): the job's are these
            for name in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK",
                         "HOROVOD_LOCAL_SIZE"):
                os.environ.pop(name, None)
    _cross = _layout()
    worker_env.export_layout(ddl_core.rank(), ddl_core.size(), ddl_core.local_rank(),
                             ddl_core.local_size(), *_cross)
    timeline.start_from_env("HOROVOD_TIMELINE")
    timeline.start_from_env("DDL_TIMELINE")
    _ps.setup(process_sets)


def _layout() -> tuple[int, int]:
    """(cross_rank, cross_size) on the current world: my index among the ranks with my
    local_rank, and how many there are (Horovod's definition); collective."""
    from . import elastic_world

    # (each rank's reset count rides along: a rank spawned at the last reset takes the
    # job's count, so every rank stops at the same reset when the limit is reached)
    rows = ddl_core.allgather(np.array([[ddl_core.local_rank(), elastic_world.resets()]],
                                       dtype=np.int64))
    local = rows[:, 0]
    elastic_world.agree_resets(int(rows[:, 1].max()))
    me, lr = ddl_core.rank(), ddl_core.local_rank()
    return int(np.sum(local[:me] == lr)), int(np.sum(local == lr))


def elastic_reset() -> None:
    """What Horovod's shutdown() + init() do at an elastic reset, on DDL: the process
    sets are dropped (without a collective: the old world may have lost members), the
    world becomes the communicator of the ranks still alive (ddl_core.shrink_world() in a
    fault-tolerant job, i.e. under `ddlrun --elastic` / elastic `horovodrun`) with any
    ranks the launcher has added since merged in, and the node layout is learnt again.
    Collective over the survivors."""
    global _cross
    from . import elastic_world

    _need_init()
    _ps.forget_all()
    elastic_world.rebuild()
    _cross = _layout()


def _need_init() -> None:
    if _cross is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")


def shutdown() -> None:
    """Stop every process set's thread (collective over its members) and close the
    timeline; ddl_core itself stays up until exit, so init() may be called again."""
    global _cross
    if _cross is not None:
        _ps.shutdown_all()
        timeline.stop()
    _cross = None


def is_initialized() -> bool:
    return _cross is not None and ddl_core.is_initialized()


def rank() -> int:
    _need_init()
    return ddl_core.rank()


def size() -> int:
    _need_init()
    return ddl_core.size()


def local_rank() -> int:
    _need_init()
    return ddl_core.local_rank()


def local_size() -> int:
    _need_init()
    return ddl_core.local_size()


def cross_rank() -> int:
    _need_init()
    assert _cross is not None
    return _cross[0]


def cross_size() -> int:
    _need_init()
    assert _cross is not None
    return _cross[1]


def is_homogeneous() -> bool:
    _need_init()
    return size() % local_size() == 0 and cross_size() * local_size() == size()


def join() -> int:
    """Horovod's join for uneven data: until every rank has joined, this rank takes part
    in the collectives the others still run (zeros for allreduce, so a sum counts the
    ranks still running and an average still divides by size(), as Horovod's; no rows
    for allgather); returns the rank that joined last. Synchronize this rank's handles
    first."""
    _need_init()
    # The process sets this rank is in join too, each in its own thread (their members
    # take part with zeros in what the set's other members still run), while the world
    # joins in libddl; every rank calls join(), so all of them finish.
    errors: list[BaseException] = []

    def join_set(engine: Any) -> None:
        try:
            engine.join()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=join_set, args=(e,), daemon=True)
               for e in _ps.member_engines()]
    for t in threads:
        t.start()
    try:
        with timeline.timed("join", "JOIN"):
            last = ddl_core.join()
    except ddl_core.InvalidArgumentError as exc:
        raise ValueError(str(exc)) from exc
    except ddl_core.DDLError as exc:
        raise HorovodInternalError(str(exc)) from exc
    finally:
        for t in threads:
            t.join()
    if errors:
        raise HorovodInternalError(f"join on a process set failed: {errors[0]}")
    return last


def barrier_raising(process_set: ProcessSet, error: Callable[[ddl_core.DDLError], Exception]
                    ) -> None:
    """Horovod's barrier(process_set) for every front end: the world's is ddl_core's own
    barrier, a set's is a request on its engine; a failure there is raised as `error(exc)`,
    the front end's own exception type (HorovodInternalError, a TensorFlow OpError)."""
    eng = _ps.engine_of(process_set, "barrier")
    if eng is None:
        with timeline.timed("barrier", "BARRIER"):
            ddl_core.barrier()
        return
    try:
        eng.submit(None, (BARRIER,), None, None, "barrier").wait()
    except ddl_core.DDLError as exc:
        raise error(exc) from exc


def mpi_threads_supported() -> bool:
    return True


def mpi_enabled() -> bool:
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def _gpu(key: str) -> str:
    try:
        return ddl_core.gpu_info().get(key, "")
    except Exception:  # noqa: BLE001 - a library too old to say: nothing found
        return ""


def nccl_built() -> int:
    """1 when libddl found NCCL (loaded at run time: DDL_NCCL_LIB, nvidia-nccl-cu*, conda
    nccl) and uses it for GPU tensors, else 0 (Horovod returns NCCL's version or 0)."""
    return 1 if _gpu("nccl") else 0


def ddl_built() -> bool:
    return True


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    """True when libddl found a usable CUDA runtime and device (GPU tensors supported)."""
    return bool(_gpu("cuda_runtime")) and not _gpu("cuda_error")


def rocm_built() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Write a Chrome-trace timeline of every collective to file_path (rank 0's, or every
    rank's when the path holds "{rank}"): ddl_core.timeline."""
    _need_init()
    timeline.start(file_path, mark_cycles)


def stop_timeline() -> None:
    """Close the timeline file (a complete JSON array from then on)."""
    timeline.stop()


__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet", "global_process_set",
    "HorovodInternalError", "HostsUpdatedInterrupt", "init", "shutdown", "is_initialized",
    "rank", "size",
    "local_rank", "local_size", "cross_rank", "cross_size", "is_homogeneous",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "start_timeline",
    "stop_timeline", "add_process_set", "remove_process_set", "get_process_sets",
    "process_set_by_id",
]

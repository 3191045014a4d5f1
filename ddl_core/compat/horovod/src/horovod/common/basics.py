"""Horovod's process-level functions (init, rank, size, ...) on ddl_core, shared by the
torch, tensorflow and keras front ends."""

from __future__ import annotations

from typing import Any

import numpy as np

import ddl_core

# Horovod's reduce ops; plain strings so they compare, print and pickle simply.
Average = "average"
Sum = "sum"
Adasum = "adasum"
Min = "min"
Max = "max"
Product = "product"

_DDL_OP = {Average: "avg", Sum: "sum", Min: "min", Max: "max", Product: "prod"}

_cross: tuple[int, int] | None = None


class HorovodInternalError(RuntimeError):
    """Raised where upstream Horovod raises it (a collective failed)."""


def ddl_op(op: Any = None, average: bool | None = None) -> str:
    """ddl_core's op name for Horovod's (op, deprecated average) arguments."""
    if op is not None and average is not None:
        raise ValueError("give op or average, not both")
    if op is None:
        op = Sum if average is False else Average
    if op == Adasum:
        raise NotImplementedError("Adasum is not implemented by horovod-ddl; use op=hvd.Average")
    name = _DDL_OP.get(str(op).lower())
    if name is None:
        raise ValueError(f"unknown op {op!r}: use hvd.Average, Sum, Min, Max or Product")
    return name


class ProcessSet:
    """Only the global process set exists: DDL's collectives span the whole job."""

    def __init__(self, ranks: list[int] | None = None) -> None:
        if ranks is not None and sorted(ranks) != list(range(ddl_core.size())):
            raise NotImplementedError("horovod-ddl supports the global process set only")
        self.ranks = ranks
        self.process_set_id = 0

    def size(self) -> int:
        return ddl_core.size()

    def rank(self) -> int:
        return ddl_core.rank()

    def included(self) -> bool:
        return True


global_process_set = ProcessSet()


def init(comm: Any = None, process_sets: Any = None) -> None:  # noqa: ARG001
    """Start DDL (MPI) and learn the node layout; collective, call it on every rank."""
    global _cross
    if comm is not None and not isinstance(comm, list):
        try:  # an mpi4py communicator: only the world is supported
            from mpi4py import MPI

            if comm.Get_size() != MPI.COMM_WORLD.Get_size():
                raise NotImplementedError("horovod-ddl runs on MPI_COMM_WORLD only")
        except ImportError:
            pass
    ddl_core.init()
    # cross_rank: my index among the ranks with my local_rank (Horovod's definition).
    local = ddl_core.allgather(np.array([ddl_core.local_rank()], dtype=np.int64))
    me, lr = ddl_core.rank(), ddl_core.local_rank()
    _cross = (int(np.sum(local[:me] == lr)), int(np.sum(local == lr)))


def _need_init() -> None:
    if _cross is None:
        raise ValueError("Horovod has not been initialized; use hvd.init().")


def shutdown() -> None:
    global _cross
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


def nccl_built() -> int:
    return 0


def ddl_built() -> bool:
    return True


def ccl_built() -> bool:
    return False


def cuda_built() -> bool:
    return False


def rocm_built() -> bool:
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:  # noqa: ARG001
    """Accepted for compatibility; DDL has no timeline (use DDL_LOG)."""


def stop_timeline() -> None:
    """Accepted for compatibility."""


__all__ = [
    "Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet", "global_process_set",
    "HorovodInternalError", "init", "shutdown", "is_initialized", "rank", "size",
    "local_rank", "local_size", "cross_rank", "cross_size", "is_homogeneous",
    "mpi_threads_supported", "mpi_enabled", "mpi_built", "gloo_enabled", "gloo_built",
    "nccl_built", "ddl_built", "ccl_built", "cuda_built", "rocm_built", "start_timeline",
    "stop_timeline",
]

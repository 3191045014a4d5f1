"""Horovod's process sets on libddl communicators.

A ProcessSet is a sorted list of world ranks. Registering it (hvd.init(process_sets=...)
or hvd.add_process_set) is collective over every rank, as in Horovod: the ranks first
compare what they were given, so a set that differs between ranks raises ValueError on
every rank, then build the set's communicator (ddl_core's Comm.create) and, on its
members, the set's negotiation thread (engine.py). The global process set (id 0) is the
world: its collectives keep libddl's own asynchronous path.
"""

from __future__ import annotations

import atexit
import hashlib
from collections.abc import Iterable
from typing import Any

import numpy as np

import ddl_core

from .engine import Engine


class ProcessSet:
    """A set of Horovod processes (world ranks) that run collectives together.

    Pass it to hvd.init(process_sets=[...]) or hvd.add_process_set(); then give it as
    `process_set=` to collectives. root_rank arguments stay world ranks (as Horovod's)."""

    def __init__(self, ranks_or_comm: Any) -> None:
        if hasattr(ranks_or_comm, "Get_group"):  # an mpi4py communicator
            ranks_or_comm = _mpi4py_ranks(ranks_or_comm)
        if not isinstance(ranks_or_comm, Iterable):
            raise ValueError("ProcessSet takes a list of world ranks or an mpi4py "
                             f"communicator, not {type(ranks_or_comm).__name__}")
        ranks = list(ranks_or_comm)
        if any(not isinstance(r, (int, np.integer)) or isinstance(r, bool) for r in ranks):
            raise ValueError(f"ProcessSet ranks must be integers, not {ranks!r}")
        self.ranks: list[int] | None = sorted(int(r) for r in ranks)
        self.process_set_id: int | None = None
        self._comm: Any = None
        self._engine: Engine | None = None

    def __repr__(self) -> str:
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"

    def _check_registered(self) -> None:
        if self.process_set_id is None:
            raise ValueError(f"{self} is not registered: pass it to hvd.init(process_sets=...) "
                             "or hvd.add_process_set() on every rank first")

    def size(self) -> int:
        """How many ranks the set holds."""
        self._check_registered()
        assert self.ranks is not None
        return len(self.ranks)

    def rank(self) -> int:
        """This process's rank within the set (its index in `ranks`); -1 outside it."""
        self._check_registered()
        assert self.ranks is not None
        me = ddl_core.rank()
        return self.ranks.index(me) if me in self.ranks else -1

    def included(self) -> bool:
        """Whether this process is a member of the set."""
        self._check_registered()
        assert self.ranks is not None
        return ddl_core.rank() in self.ranks

    def invalidate(self) -> None:
        self.process_set_id = None
        self._comm = None
        self._engine = None


def _mpi4py_ranks(comm: Any) -> list[int]:
    from mpi4py import MPI

    return list(MPI.Group.Translate_ranks(comm.Get_group(), list(range(comm.Get_size())),
                                          MPI.COMM_WORLD.Get_group()))


class _GlobalProcessSet(ProcessSet):
    """Every rank: the world communicator and libddl's asynchronous path."""

    def __init__(self) -> None:
        self.ranks = None
        self.process_set_id = 0
        self._comm = None
        self._engine = None

    def _check_registered(self) -> None:
        if not ddl_core.is_initialized():
            raise ValueError("Horovod has not been initialized; use hvd.init().")
        if self.ranks is None:
            self.ranks = list(range(ddl_core.size()))

    def size(self) -> int:
        self._check_registered()
        return ddl_core.size()

    def rank(self) -> int:
        self._check_registered()
        return ddl_core.rank()

    def included(self) -> bool:
        self._check_registered()
        return True

    def invalidate(self) -> None:
        """The global set outlives shutdown (Horovod keeps the object too)."""
        self.ranks = None


global_process_set: ProcessSet = _GlobalProcessSet()
_sets: dict[int, ProcessSet] = {}
_next_id = 1


def _digest(ranks: list[int]) -> np.ndarray:
    h = hashlib.sha256(repr(ranks).encode()).digest()[:16]
    return np.frombuffer(h, dtype=np.uint8).copy()


def _agree(ranks: list[int], what: str) -> None:
    """Every rank must register the same ranks: compare digests (a blocking allgather on
    the world) and raise on every rank when they differ, naming what each rank gave."""
    n = ddl_core.size()
    bad = [r for r in ranks if not 0 <= r < n] or len(set(ranks)) != len(ranks)
    mine = _digest(ranks)
    flag = np.array([1 if bad else 0], dtype=np.uint8)
    both = np.concatenate([mine, flag])
    all_ = ddl_core.allgather(both).reshape(n, 17)
    if (all_[:, :16] == all_[0, :16]).all() and not all_[:, 16].any():
        return
    gave = ddl_core.allgatherv(np.array(ranks + [-1], dtype=np.int64))
    per_rank, cur = [], []
    for v in gave.tolist():
        if v == -1:
            per_rank.append(cur)
            cur = []
        else:
            cur.append(v)
    detail = "; ".join(f"rank {i}: {r}" for i, r in enumerate(per_rank))
    if (all_[:, :16] == all_[0, :16]).all():
        raise ValueError(f"{what}: ranks must lie in 0..{n - 1}, each named once ({detail})")
    raise ValueError(f"{what}: the ranks passed differ between processes ({detail}); every "
                     "process must register the same process sets in the same order")


def add_process_set(process_set: ProcessSet | Iterable[int]) -> ProcessSet:
    """Register a process set: collective over every rank (members or not), which must all
    pass the same ranks. Returns the registered ProcessSet (with its process_set_id)."""
    global _next_id
    if not ddl_core.is_initialized():
        raise ValueError("Horovod has not been initialized; use hvd.init().")
    ps = process_set if isinstance(process_set, ProcessSet) else ProcessSet(process_set)
    if ps is global_process_set or ps.process_set_id is not None:
        raise ValueError(f"{ps} is already registered")
    assert ps.ranks is not None
    if not ps.ranks:
        raise ValueError("a process set needs at least one rank")
    _agree(ps.ranks, "add_process_set")
    for other in _sets.values():
        if other.ranks == ps.ranks:
            raise ValueError(f"a process set with ranks {ps.ranks} is already registered "
                             f"(id {other.process_set_id}); use it, or remove it first")
    _stop_at_exit()
    comm = ddl_core.comm_world().create(ps.ranks)
    ps.process_set_id = _next_id
    _next_id += 1
    ps._comm = comm
    if comm is not None:
        ps._engine = Engine(comm, ps.process_set_id)
    _sets[ps.process_set_id] = ps
    return ps


def remove_process_set(process_set: ProcessSet) -> bool:
    """Unregister a process set: collective over every rank. False for the global set
    (which cannot be removed) and for a set that is not registered."""
    if process_set is global_process_set or process_set.process_set_id in (None, 0):
        return False
    ps = _sets.get(process_set.process_set_id)  # type: ignore[arg-type]
    if ps is None:
        return False
    _agree(ps.ranks or [], "remove_process_set")
    del _sets[ps.process_set_id]  # type: ignore[arg-type]
    _close(ps)
    process_set.invalidate()
    return True


_exit_hook = False


def _stop_at_exit() -> None:
    """Stop the sets' threads at exit before ddl_core finalizes (atexit runs last-in
    first-out, and ddl_core registered its finalizer in init(), before this)."""
    global _exit_hook
    if not _exit_hook:
        atexit.register(shutdown_all)
        _exit_hook = True


def _close(ps: ProcessSet) -> None:
    if ps._engine is not None:
        ps._engine.stop()
    if ps._comm is not None:
        ps._comm.free()
    ps.invalidate()


def setup(process_sets: Any) -> None:
    """hvd.init's process_sets argument: a list of ProcessSets or rank lists (registered
    in that order), "dynamic" or None (none yet; add_process_set works either way)."""
    if process_sets is None or process_sets == "dynamic":
        return
    if isinstance(process_sets, (ProcessSet, str)) or not isinstance(process_sets, Iterable):
        raise ValueError("init(process_sets=...) takes a list of ProcessSets (or rank lists) "
                         f"or 'dynamic', not {process_sets!r}")
    for ps in process_sets:
        add_process_set(ps)


def shutdown_all() -> None:
    """Stop every set's thread (collective over its members) and free its communicator."""
    for sid in sorted(_sets):
        _close(_sets.pop(sid))
    global_process_set.invalidate()


def forget_all() -> None:
    """Drop every set without a collective: at an elastic reset the old world may have
    lost members, so a set's close (collective over its members) could never finish. The
    sets' daemon threads end with the process; their communicators go with the old
    world. Horovod, too, keeps no process set across a reset."""
    for sid in sorted(_sets):
        _sets.pop(sid).invalidate()
    global _next_id
    _next_id = 1


def member_engines() -> list[Engine]:
    """The engines of the registered sets this rank is a member of."""
    return [ps._engine for ps in _sets.values() if ps._engine is not None]


def get_process_sets() -> dict[int, list[int]]:
    """{process_set_id: ranks} of every registered set, the global one (0) included."""
    out = {0: list(range(ddl_core.size()))}
    out.update({sid: list(ps.ranks or []) for sid, ps in sorted(_sets.items())})
    return out


def process_set_by_id(process_set_id: int) -> ProcessSet:
    if process_set_id == 0:
        return global_process_set
    if process_set_id not in _sets:
        raise ValueError(f"No known process set with id {process_set_id}")
    return _sets[process_set_id]


def engine_of(process_set: ProcessSet, fn: str) -> Engine | None:
    """The engine that runs `fn` on `process_set`: None for the global set (libddl's own
    path); ValueError (Horovod's error) when this rank is not in the set or the set is
    not registered."""
    if process_set is None or process_set is global_process_set or \
            process_set.process_set_id == 0:
        return None
    if not isinstance(process_set, ProcessSet):
        raise ValueError(f"{fn}: process_set must be a ProcessSet, not "
                         f"{type(process_set).__name__}")
    process_set._check_registered()
    if process_set._engine is None:
        raise ValueError(f"{fn}: rank {ddl_core.rank()} is not a part of process set "
                         f"{process_set.process_set_id} (ranks {process_set.ranks}); call "
                         "it on the set's members only")
    return process_set._engine

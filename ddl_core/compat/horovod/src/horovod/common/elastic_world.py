"""The world under elastic Horovod: how a reset rebuilds it on DDL, how many resets a job
may take, and where host updates come from. The one module that knows which ddl_core and
ddlrun pieces elastic Horovod stands on, so the State and run-loop code stays Horovod's.

- A fault-tolerant job (`ddlrun --elastic`, which elastic `horovodrun` runs; ULFM under
  it) keeps its survivors alive when a rank dies: their collectives raise
  ddl_core.ProcessFailedError (a PeerLostError), which elastic Horovod treats as
  HorovodInternalError, and `ddl_core.shrink_world()` makes the survivors the world.
- Without fault tolerance a death ends the job as before; a reset (after a
  HorovodInternalError that was not a death, e.g. ranks that disagreed on a shape) then
  goes on with the same world.
"""

from __future__ import annotations

import atexit
import os
from typing import Any

import ddl_core

#: how many resets a job may take (horovodrun --reset-limit); unset or empty: no limit
RESET_LIMIT_ENV = "HOROVOD_RESET_LIMIT"

_resets = 0


def fault_tolerant() -> bool:
    """Whether a rank's death leaves the others running (ddl_core.fault_tolerant(); a
    ddl_core without it predates fault tolerance)."""
    fn = getattr(ddl_core, "fault_tolerant", None)
    return bool(fn()) if fn is not None else False


def recoverable(exc: BaseException) -> bool:
    """Whether `exc` is a collective's failure that a reset can recover from: a lost peer
    (ddl_core.PeerLostError, ProcessFailedError among them) in a fault-tolerant job."""
    return isinstance(exc, ddl_core.PeerLostError) and fault_tolerant()


def reset_limit() -> int | None:
    raw = os.environ.get(RESET_LIMIT_ENV, "").strip()
    if not raw:
        return None
    if not raw.isdigit():
        raise ValueError(f"{RESET_LIMIT_ENV}={raw!r} is not a whole number of resets "
                         "(set it with horovodrun --reset-limit N, N >= 0)")
    return int(raw)


def count_reset() -> None:
    """Count one reset; past the limit the job ends here with a RuntimeError (Horovod's
    driver stops the job then), on every rank alike since every rank counts the same
    resets."""
    global _resets
    _resets += 1
    limit = reset_limit()
    if limit is not None and _resets > limit:
        raise RuntimeError(f"elastic Horovod: the job was reset {_resets} times, more than "
                           f"its reset limit of {limit} (horovodrun --reset-limit); "
                           "stopping. Raise the limit or find why ranks keep failing")


def resets() -> int:
    return _resets


def agree_resets(count: int) -> None:
    """The job's reset count, as the ranks agreed it when the world was last made."""
    global _resets
    _resets = count


def _free_merged() -> None:
    """Free the communicators spawns made before MPI finalizes (Open MPI 5 crashes in
    MPI_Finalize otherwise, see ddl_core.hostupdates)."""
    while _merged:
        try:
            _merged.pop().Free()
        except Exception:  # noqa: BLE001 - at exit: a communicator already gone
            pass


def _keep(comm: Any) -> None:
    if not _merged:
        atexit.register(_free_merged)  # after ddl_core's, so it runs before its finalize
    _merged.append(comm)


def rebuild() -> None:
    """Make the world the ranks still alive, plus the ranks the launcher asks for on
    hosts the discovery script added (ddlrun's host-update channel, rank 0's latest
    state, agreed by broadcast): collective over the survivors. In a job without fault
    tolerance the world stays as it is."""
    global _mpi_world
    if not fault_tolerant():
        return
    ddl_core.shrink_world()
    plan = _agreed_spawn()  # (on the survivors' world: the old one may have lost ranks)
    if not plan:
        return
    from ddl_core import hostupdates

    # MPI's view of the same survivors, for MPI_Comm_spawn (ddl_core's world is libddl's)
    survivors = _current_mpi_world().Shrink()
    merged = hostupdates.spawn(survivors, plan, known_hosts=_known_hosts)
    _known_hosts.update(h for h, _ in plan)
    survivors.Free()
    ddl_core.replace_world(merged)
    _mpi_world = merged
    _keep(merged)


#: the mpi4py communicator the world was last made of (None: MPI_COMM_WORLD, or the
#: survivors ddl_core.shrink_world() found, which MPI_COMM_WORLD's Shrink finds again)
_mpi_world: Any = None
_merged: list[Any] = []
_known_hosts: set[str] = set()
_watch: Any = None
_seen_generation: int | None = None


def _current_mpi_world() -> Any:
    from mpi4py import MPI

    return _mpi_world if _mpi_world is not None else MPI.COMM_WORLD


def join_if_spawned() -> Any:
    """In a rank the survivors spawned onto a new host: the communicator it was merged
    into (the world to start on), else None. Only under ddlrun --elastic with a discovery
    script (DDL_HOST_UPDATES set), so a plain job never imports mpi4py here."""
    global _mpi_world
    if not os.environ.get("DDL_HOST_UPDATES"):
        return None
    from ddl_core import hostupdates

    merged = hostupdates.join()
    if merged is not None:
        _mpi_world = merged
        _keep(merged)
    return merged


def _host_watch() -> Any:
    global _watch
    if _watch is None and os.environ.get("DDL_HOST_UPDATES"):
        from ddl_core import hostupdates

        _watch = hostupdates.HostWatch.from_env()
    return _watch


def _agreed_spawn() -> list[list[Any]]:
    """The [host, n] ranks to start now, as rank 0 sees ddlrun's latest state."""
    watch = _host_watch() if ddl_core.rank() == 0 else None
    state = watch.latest() if watch is not None else None
    from ddl_core.objects import broadcast_object

    state = broadcast_object(state, 0)
    if not state:
        return []
    if not _known_hosts:
        _known_hosts.update(state.get("running", {}))
    return [[str(h), int(n)] for h, n in state.get("spawn", []) if int(n) > 0]


def poll_host_updates() -> list[tuple[float, int]]:
    """Host updates ddlrun has announced since the last call, as (timestamp,
    HostUpdateResult flags); [] outside an elastic ddlrun job with a discovery script."""
    global _seen_generation
    from .exceptions import HostUpdateResult

    watch = _host_watch()
    state = watch.latest() if watch is not None else None
    if not state:
        return []
    gen = int(state["generation"])
    if _seen_generation is None:  # the state at start: no update yet
        _seen_generation = gen
        _known_hosts.update(state.get("running", {}) or state.get("hosts", {}))
        return []
    if gen <= _seen_generation:
        return []
    _seen_generation = gen
    flags = HostUpdateResult.no_update
    if state.get("added") or state.get("spawn"):
        flags |= HostUpdateResult.added
    if state.get("removed"):
        flags |= HostUpdateResult.removed
    return [(float(state.get("time", gen)), int(flags or HostUpdateResult.added))]

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


def rebuild() -> None:
    """Make the world the ranks still alive (plus any the launcher added): collective
    over them. In a job without fault tolerance the world stays as it is."""
    if fault_tolerant():
        ddl_core.shrink_world()
        grow = _grow_hook()
        if grow is not None:
            grow()


def _grow_hook() -> Any:
    """ddlrun's regrow step, when this ddl_core has one: merges ranks started on hosts
    the discovery script added into the world (ddl_core.replace_world)."""
    try:
        from ddl_core.runner import elastic as runner_elastic  # type: ignore[attr-defined]
    except ImportError:
        return None
    return getattr(runner_elastic, "grow_world", None)


def poll_host_updates() -> list[tuple[float, int]]:
    """Host updates the launcher has announced since the last call, as (timestamp,
    HostUpdateResult flags); [] when the launcher announces none."""
    try:
        from ddl_core.runner import elastic as runner_elastic  # type: ignore[attr-defined]
    except ImportError:
        return []
    fn = getattr(runner_elastic, "host_updates", None)
    return list(fn()) if fn is not None else []

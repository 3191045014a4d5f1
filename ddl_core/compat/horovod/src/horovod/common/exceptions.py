"""`horovod.common.exceptions` on horovod-ddl: the two events elastic training reacts to.

HorovodInternalError is what a failed collective raises (on DDL: libddl's error, above all
ddl_core.ProcessFailedError when a member died); HostsUpdatedInterrupt is raised on every
rank at once, from `State.commit()` / `check_host_updates()`, when the job's hosts changed.
"""

from __future__ import annotations

import enum


class HorovodInternalError(RuntimeError):
    """A collective failed (e.g. a peer died): elastic training restores the last commit,
    rebuilds the world over the ranks still alive and goes on."""


class HostsUpdatedInterrupt(RuntimeError):
    """The job's hosts changed (the discovery script added or removed some). Elastic
    training keeps its state (no restore), rebuilds the world and goes on; `skip_sync`
    is True when hosts were only removed, so no new rank needs the state."""

    def __init__(self, skip_sync: bool) -> None:
        super().__init__("the job's hosts changed" + (" (removed only)" if skip_sync else ""))
        self.skip_sync = skip_sync


class HostUpdateResult(enum.IntFlag):
    """What a host update did, as flags that combine over several updates."""

    no_update = 0
    removed = 1
    added = 2
    mixed = removed | added

"""Child processes that must not outlive envtools (unshare, mksquashfs).

A SIGKILL to envtools (the OOM killer, a job's time limit) runs no clean-up code, so a
child it started would go on: an ``unshare`` holding a job's namespace and mount, or an
``mksquashfs`` writing into a temporary directory the next run reclaims. Each gets the
kernel's parent-death signal instead: SIGKILL the moment envtools' thread that started
it dies.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None]:
    """A ``preexec_fn`` for :class:`subprocess.Popen`: the child gets SIGKILL when this
    process dies (if it died already, between fork and prctl, the child exits at once)."""
    parent = os.getpid()
    prctl = ctypes.CDLL(None, use_errno=True).prctl

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(137)

    return preexec

"""Which process is which: identities that outlive pid reuse, and workers that die with us.

A pid alone cannot say whether the process that made a temporary directory still runs:
pids are reused, and they restart at every boot. A process is named here by
``(host, boot id, pid, start time)``: the start time is field 22 of ``/proc/PID/stat``
(clock ticks after boot), so a reused pid has another one, and the boot id
(``/proc/sys/kernel/random/boot_id``) changes at every boot. That is what
:mod:`envtools.prefix.tempdirs` writes into each temporary directory and what
``envtools gc`` compares against.

Forked placement processes must not outlive the clone that started them: a clone killed
with SIGKILL runs no clean-up code, and a worker left running keeps filling a temporary
directory nobody will rename. Linux can send a signal to a process when its parent dies
(``prctl(PR_SET_PDEATHSIG)``); :func:`die_with_parent` asks for SIGKILL, then checks the
parent is still the one that forked us (it may have died before the request was made).
"""

from __future__ import annotations

import os
import signal
import socket
from functools import cache

PR_SET_PDEATHSIG = 1  # from linux/prctl.h


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks after boot, or None if there is no such pid.

    The command name (field 2) may hold spaces and parentheses, so fields are counted
    after its last ``)``.
    """
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return None
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return int(rest[19])  # field 22 overall: fields 3.. start at rest[0]
    except (IndexError, ValueError):
        return None


@cache
def boot_id() -> str:
    """This boot's random id ("" where /proc does not have it)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as fh:
            return fh.read().strip()
    except OSError:
        return ""


@cache
def host() -> str:
    return socket.gethostname()


def identity(pid: int | None = None) -> dict:
    """What names a running process beyond its pid (see the module docstring)."""
    pid = os.getpid() if pid is None else pid
    return {"host": host(), "boot_id": boot_id(), "pid": pid, "start_time": start_time(pid)}


def is_running(ident: dict) -> bool | None:
    """True/False when this host can tell whether the process ``ident`` names still runs;
    None when it cannot (another host)."""
    if ident.get("host") != host():
        return None
    if ident.get("boot_id") and boot_id() and ident["boot_id"] != boot_id():
        return False  # rebooted since: every process of that boot is gone
    pid = ident.get("pid")
    if not isinstance(pid, int) or pid <= 0:
        return False
    now = start_time(pid)
    if now is None:
        return False
    return now == ident.get("start_time")


def die_with_parent(parent: int) -> None:
    """In a forked child: be killed (SIGKILL) when ``parent`` dies, or exit now if it
    already has. Without ``prctl`` (not Linux) the child exits if its parent changes."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died between fork() and prctl()
        os._exit(1)

"""Running a launcher (or a cluster's command) as a child that Ctrl-C reaches.

ddlrun and the emulated cluster both start one long-lived child whose status is only part
of their answer, and both must pass SIGINT/SIGTERM on to it. A child that does not wind
down within a grace period after the signal is killed: the caller's clean-up (removing a
cluster, collecting the ranks' reports) must not wait on it, and prterun was seen to take
minutes to exit under load.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass

#: how long a child may take to exit after SIGINT/SIGTERM was passed on to it
GRACE_S = 10.0


@dataclass(frozen=True)
class ChildExit:
    """How the child ended: ``returncode`` as Popen gives it (negative: the signal that
    killed it), and whether it was killed here for outliving a forwarded signal."""

    returncode: int
    killed_after_signal: bool

    @property
    def status(self) -> int:
        """The shell's view of it: the exit code, or 128 + the signal."""
        return 128 - self.returncode if self.returncode < 0 else self.returncode


def run_forwarding(argv: list[str], env: dict[str, str], grace_s: float = GRACE_S,
                   stop: Callable[[], bool] | None = None) -> ChildExit:
    """Run ``argv`` and wait for it, passing SIGINT and SIGTERM on; kill it when it
    outlives the first of them by ``grace_s``. ``stop``, asked about twice a second, ends
    the child the same way (SIGTERM, then the grace period) when it says so: ddlrun's
    elastic jobs end once too few ranks are left. Raises OSError when it cannot start."""
    proc = subprocess.Popen(argv, env=env)
    signalled: list[float] = []

    def forward(signum: int, frame: object) -> None:
        signalled.append(time.monotonic())
        proc.send_signal(signum)

    old = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        while True:
            try:
                return ChildExit(proc.wait(timeout=0.5 if stop is None else 0.2), False)
            except subprocess.TimeoutExpired:
                if not signalled and stop is not None and stop():
                    forward(signal.SIGTERM, None)
                if signalled and time.monotonic() - signalled[0] > grace_s:
                    proc.kill()
                    return ChildExit(proc.wait(), True)
    finally:
        for s, h in old.items():
            signal.signal(s, h)

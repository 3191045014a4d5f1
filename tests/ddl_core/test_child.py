"""runner/child.py: the one child ddlrun and the emulated cluster wait on, and Ctrl-C."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from ddl_core.runner.child import ChildExit, run_forwarding

# a parent that runs `child` through run_forwarding and prints how it ended
PARENT = """
import os, sys
from ddl_core.runner.child import run_forwarding
end = run_forwarding([sys.executable, "-c", sys.argv[2]], dict(os.environ), float(sys.argv[1]))
print(end.returncode, end.killed_after_signal, end.status, flush=True)
"""


def _parent(setup: str, grace_s: float) -> subprocess.Popen[str]:
    """A parent whose child runs ``setup``, says it is ready, and sleeps."""
    child = f"{setup}; import sys, time; print('ready', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", PARENT, str(grace_s), child],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
    return proc


def test_exit_codes_pass_through() -> None:
    env = dict(os.environ)
    assert run_forwarding([sys.executable, "-c", "raise SystemExit(3)"], env) == ChildExit(3, False)
    end = run_forwarding([sys.executable, "-c", "import os; os.kill(os.getpid(), 9)"], env)
    assert (end.returncode, end.status, end.killed_after_signal) == (-9, 137, False)


def test_a_signal_reaches_the_child_and_its_status_comes_back() -> None:
    proc = _parent("pass", grace_s=30)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert out.split() == ["-15", "False", "143"]  # the child died of it; the parent did not


def test_a_child_that_ignores_the_signal_is_killed_after_the_grace_period() -> None:
    proc = _parent("import signal; signal.signal(signal.SIGINT, signal.SIG_IGN)", grace_s=1.0)
    t0 = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert out.split() == ["-9", "True", "137"]
    assert 0.9 < time.monotonic() - t0 < 20

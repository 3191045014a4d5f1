"""Helpers to run real MPI jobs from pytest.

Each test launches `mpirun` (the one in the venv beside this Python) on a worker script in
workers/, oversubscribed with yield-when-idle so 5 ranks run on 2 cores, and reads the
workers' output. Workers check results against numpy on every rank and print one
'OK <name>' line per rank, or raise.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"
BIN = Path(sys.executable).parent


def mpirun_cmd(n: int, *mpi_args: str) -> list[str]:
    return [str(BIN / "mpirun"), "-n", str(n), "--map-by", ":OVERSUBSCRIBE",
            "--mca", "mpi_yield_when_idle", "1", *mpi_args]


#: what mpirun prints when its own PMIx server could not start, before any rank ran: seen
#: once in ~650 launches here (the interfaces it enumerates changing under it while the
#: cluster tests' network namespaces are torn down), as elsewhere (lfortran/lfortran#8610)
LAUNCHER_FAILED = "The PMIx server's listener thread failed to start"


def launcher_failed(proc: subprocess.CompletedProcess[str]) -> bool:
    """Did mpirun fail to start its own server, so that nothing of the test ran?"""
    return proc.returncode != 0 and LAUNCHER_FAILED in proc.stdout + proc.stderr


def run_mpi(n: int, worker: str, *args: str, env: dict[str, str] | None = None,
            timeout: float = 300, mpi_args: tuple[str, ...] = (),
            check: bool = True) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                     "PYTHONUNBUFFERED": "1", "DDL_TIMEOUT": "60"})
    full_env.update(env or {})
    # "-m pkg.mod" runs a module (python -m) instead of a worker script
    target = worker.split() if worker.startswith("-m ") else [str(WORKERS / worker)]
    cmd = [*mpirun_cmd(n, *mpi_args), sys.executable, *target, *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env)
    if launcher_failed(proc):  # (no rank ran: launch once more)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=full_env)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
                    f"\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def ok_lines(proc: subprocess.CompletedProcess[str], name: str) -> int:
    return sum(1 for line in proc.stdout.splitlines() if line.strip() == f"OK {name}")


@pytest.fixture(scope="session")
def have_torch() -> bool:
    try:
        import torch  # noqa: F401

        return True
    except ImportError:
        return False

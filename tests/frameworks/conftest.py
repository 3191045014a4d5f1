"""Run real MPI jobs (mpirun or ddlrun from the venv) on the worker scripts in workers/.

Copied from tests/ddl_core/conftest.py's pattern rather than imported, so each suite stands
alone. Workers check their results on every rank and print one 'OK <name>' line per rank.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).parent
WORKERS = HERE / "workers"
ROOT = HERE.parent.parent
EXAMPLES = ROOT / "ddl_core" / "examples"
BIN = Path(sys.executable).parent


#: mpirun's message when its own PMIx server could not start, before any rank ran (seen
#: once in ~650 launches here; see tests/ddl_core/conftest.py)
LAUNCHER_FAILED = "The PMIx server's listener thread failed to start"


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                "PYTHONUNBUFFERED": "1", "DDL_TIMEOUT": "120", "OMP_NUM_THREADS": "1",
                "TF_CPP_MIN_LOG_LEVEL": "2", "KERAS_BACKEND": "tensorflow"})
    env.pop("MASTER_ADDR", None)
    env.update(extra or {})
    return env


def run_job(cmd: list[str], env: dict[str, str] | None = None, timeout: float = 300,
            check: bool = True) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                          env=job_env(env))
    if proc.returncode != 0 and LAUNCHER_FAILED in proc.stdout + proc.stderr:
        # (mpirun's own server did not start, no rank ran: launch once more)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=job_env(env))
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n{proc.stdout[-6000:]}"
                    f"\n--- stderr\n{proc.stderr[-6000:]}")
    return proc


def mpirun(n: int, script: Path | str, *args: str,
           **kw: object) -> subprocess.CompletedProcess[str]:
    """`mpirun -n N python script args` (oversubscribed, yielding when idle)."""
    cmd = [str(BIN / "mpirun"), "-n", str(n), "--map-by", ":OVERSUBSCRIBE",
           "--mca", "mpi_yield_when_idle", "1", sys.executable, str(script), *args]
    return run_job(cmd, **kw)  # type: ignore[arg-type]


def ddlrun(n: int, *cmd: str, **kw: object) -> subprocess.CompletedProcess[str]:
    """`ddlrun -n N cmd...`: the launcher users run."""
    return run_job([str(BIN / "ddlrun"), "-n", str(n),
                    "--mpi-args=--mca mpi_yield_when_idle 1", *cmd], **kw)  # type: ignore[arg-type]


def ok_lines(proc: subprocess.CompletedProcess[str], name: str) -> int:
    return sum(1 for line in proc.stdout.splitlines() if line.strip() == f"OK {name}")


def need(module: str) -> None:
    try:
        __import__(module)
    except ImportError:
        pytest.skip(f"{module} is not installed")

"""Shared by the GPU tests: the skip reason where there is no CUDA device, and real
mpirun jobs of several ranks on the one GPU (the staging path)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

WORKERS = Path(__file__).parent / "workers"


def _no_cuda_reason() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch is not installed: the gpu tests need torch with CUDA"
    if not torch.cuda.is_available():
        return "no CUDA device here (torch.cuda.is_available() is False)"
    return None


NO_CUDA = _no_cuda_reason()
gpu = [pytest.mark.gpu, pytest.mark.skipif(NO_CUDA is not None, reason=NO_CUDA or "")]


def mpirun() -> str:
    beside = Path(sys.executable).parent / "mpirun"
    found = str(beside) if beside.exists() else shutil.which("mpirun")
    if not found:
        pytest.skip("no mpirun beside this Python or on PATH")
    return found


def run_mpi(n: int, worker: str, *args: str, env: dict[str, str] | None = None,
            timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ)
    full.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                 "PYTHONUNBUFFERED": "1", "DDL_TIMEOUT": "120"})
    full.update(env or {})
    cmd = [mpirun(), "-n", str(n), "--map-by", ":OVERSUBSCRIBE", "--mca",
           "mpi_yield_when_idle", "1", sys.executable, str(WORKERS / worker), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)
    if check and proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n"
                    f"{proc.stdout[-6000:]}\n--- stderr\n{proc.stderr[-6000:]}")
    sys.stdout.write(proc.stdout)
    return proc


def ok_lines(proc: subprocess.CompletedProcess[str], name: str) -> int:
    return sum(1 for line in proc.stdout.splitlines() if line.strip() == f"OK {name}")

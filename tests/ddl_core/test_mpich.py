"""libddl builds and runs against MPICH too (the PyPI mpich wheel, launched by Hydra)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WORKERS = Path(__file__).parent / "workers"


@pytest.fixture(scope="module")
def mpich_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("mpich") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "-q", "--disable-pip-version-check"]
    proc = subprocess.run([*pip, "install", "mpich", "numpy", "ml-dtypes", "scikit-build-core",
                           "cmake", "ninja"], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot install the mpich wheel here: {proc.stderr[-500:]}")
    env = dict(os.environ, MPICC=str(venv / "bin" / "mpicc"))
    build = subprocess.run([*pip, "install", "--no-build-isolation", "--no-deps",
                            str(ROOT / "ddl_core")], capture_output=True, text=True, env=env)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    return venv


def run(venv: Path, n: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_", "PRTE_"))}
    env.update(DDL_TIMEOUT="60", PYTHONUNBUFFERED="1")
    return subprocess.run([str(venv / "bin" / "mpiexec"), "-n", str(n),
                           str(venv / "bin" / "python"), *args],
                          capture_output=True, text=True, timeout=600, env=env)


def test_mpich_collectives_and_mismatch(mpich_venv: Path) -> None:
    version = run(mpich_venv, 1, "-c", "import ddl_core as d; d.init(); print(d.version())")
    assert "MPICH" in version.stdout, version.stdout + version.stderr
    proc = run(mpich_venv, 3, str(WORKERS / "collectives.py"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("OK collectives") == 3
    proc = run(mpich_venv, 3, str(WORKERS / "failures.py"), "mismatch")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("OK mismatch") == 3

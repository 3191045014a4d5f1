"""The Python cost model agrees with libddl's, and the projection prints and plots."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ddl_core import model

WORKERS = Path(__file__).parent / "workers"
BIN = Path(sys.executable).parent


@pytest.mark.parametrize("grid,levels", [
    ("2x2", ["level 0 2.0e-06 1.6e-10", "level 1 5.0e-05 4.0e-08"]),
    ("4", ["level 0 3.0e-06 2.0e-10"]),
    ("1x2x2", ["level 0 2.0e-06 1.6e-10", "level 1 5.0e-05 4.0e-08"]),
])
def test_python_model_matches_libddl(tmp_path: Path, grid: str, levels: list[str]) -> None:
    shown = "x".join(d for d in grid.split("x") if d != "1") or "1"
    tune = tmp_path / "tune.txt"
    tune.write_text(f"topology {shown}\ngamma 2.5e-10\n" + "\n".join(levels) + "\n")
    env = dict(os.environ, DDL_TUNE_FILE=str(tune), DDL_TOPOLOGY=grid,
               OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = subprocess.run([str(BIN / "mpirun"), "-n", "4", "--map-by", ":OVERSUBSCRIBE",
                           "--mca", "mpi_yield_when_idle", "1", sys.executable,
                           str(WORKERS / "plan_vs_model.py")], capture_output=True, text=True,
                          timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK plan_vs_model") == 4


def test_link_bound_and_flat_ring() -> None:
    # 2 hosts, 16 MiB, 200 Mbit/s: each host must send the whole buffer once
    assert model.link_bound(16 << 20, 2, 200e6) == pytest.approx((16 << 20) * 8 / 200e6)
    fab = model.Fabric([model.Level("shm", 2, 1e-6, 1e-10),
                        model.Level("link", 0, 1e-4, 8 / 200e6)], gamma=1e-10)
    n = 16 << 20
    hier = model.hierarchical(fab, [2, 2], n)[0]
    flat = model.flat_ring_on(fab, [2, 2], n)
    # the flat ring sends 1.5x the bytes through each host's link
    assert 1.4 < flat / hier < 1.55
    assert model.fit(4096, model.PRESETS["summit"]) == [4, 16, 64]


def test_projection_prints_and_plots(tmp_path: Path) -> None:
    png = tmp_path / "p.png"
    proc = subprocess.run([sys.executable, "-m", "ddl_core.model", "project", "--preset",
                           "summit", "--plot", str(png)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    rows = [ln for ln in lines if ln.strip() and ln.split()[0].isdigit()]
    assert [int(r.split()[0]) for r in rows] == [2 ** k for k in range(13)]
    assert "flat ring" in proc.stdout and "three-level" in proc.stdout
    assert "95%" in proc.stdout and "90%" in proc.stdout
    assert png.stat().st_size > 10_000
    tune = tmp_path / "tune.txt"
    tune.write_text("topology 2x2\ngamma 2.5e-10\nlevel 0 2e-06 1.6e-10\n"
                    "level 1 5e-05 4e-08\n")
    proc = subprocess.run([sys.executable, "-m", "ddl_core.model", "project", "--tune-file",
                           str(tune), "--nodes-per-rack", "4", "--max-gpus", "64"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "three-level" in proc.stdout, proc.stderr

"""The cost model's choices, and the tuning cache that later runs read."""

from __future__ import annotations

from pathlib import Path

from conftest import run_mpi


def test_plan_small_is_latency_path_large_is_bandwidth_path() -> None:
    proc = run_mpi(4, "plan.py", env={"DDL_TOPOLOGY": "2x2"})
    lines = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    assert lines["8"].startswith("('recdoubling', 'recdoubling')")
    big = lines[str(64 << 20)]
    assert "recdoubling" not in big and ("ring" in big or "rabenseifner" in big)


def test_tune_writes_cache_and_next_run_reads_it(tmp_path: Path) -> None:
    env = {"DDL_CACHE_DIR": str(tmp_path), "DDL_TOPOLOGY": "2"}
    proc = run_mpi(2, "-m ddl_core.bench tune", env=env)
    cache = tmp_path / "tune-2.txt"
    assert cache.is_file(), proc.stdout
    text = cache.read_text()
    assert "topology 2" in text
    level0 = next(line for line in text.splitlines() if line.startswith("level 0"))
    alpha, beta = (float(v) for v in level0.split()[2:])
    assert 0 < alpha < 1e-2 and 0 < beta < 1e-6
    proc = run_mpi(2, "plan.py", env=env)
    got = next(line for line in proc.stdout.splitlines() if line.startswith("cost0 "))
    a2, b2 = (float(v) for v in got.split()[1:])
    assert abs(a2 - alpha) / alpha < 1e-5 and abs(b2 - beta) / beta < 1e-5

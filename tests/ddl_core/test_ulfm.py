"""libddl on ULFM: real `mpirun --with-ft ulfm -n 4` jobs in which a rank SIGKILLs itself
mid-loop (workers/ulfm.py). Every survivor must raise ProcessFailedError naming the dead
rank, in its pending call and in its next one, shrink, and compute right on the shrunk
communicator; shrink_world() makes the module-level calls go on. Every case is bounded by
a timeout: a hang fails the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import BIN, WORKERS, launcher_failed

ULFM_TIMEOUT = 120


def _ft_supported() -> bool:
    try:
        out = subprocess.run([str(BIN / "ompi_info")], capture_output=True, text=True,
                             timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "FT MPI support: yes" in out


pytestmark = pytest.mark.skipif(not _ft_supported(),
                                reason="this Open MPI is built without ULFM (FT MPI support)")


def run_ulfm(case: str, victims: str, stamps: Path, *, env: dict[str, str] | None = None,
             n: int = 4) -> tuple[subprocess.CompletedProcess[str], list[dict]]:
    full = dict(os.environ, ULFM_STAMP_DIR=str(stamps))
    full.update({"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
                 "PYTHONUNBUFFERED": "1", "DDL_TIMEOUT": "20", "DDL_ELASTIC": "1",
                 "ULFM_TAG": f"{os.getpid()}-{case}"})
    full.update(env or {})
    cmd = [str(BIN / "mpirun"), "--with-ft", "ulfm", "-n", str(n), "--map-by", ":OVERSUBSCRIBE",
           "--mca", "mpi_yield_when_idle", "1", sys.executable, str(WORKERS / "ulfm.py"),
           case, victims, "5"]
    for _ in range(2):
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=ULFM_TIMEOUT,
                                  env=full)
        except subprocess.TimeoutExpired as e:
            pytest.fail(f"{' '.join(cmd)} hung (>{ULFM_TIMEOUT} s)\n{e.stdout!r}\n{e.stderr!r}")
        if not launcher_failed(proc):
            break
    rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return proc, rows


def check(proc: subprocess.CompletedProcess[str], rows: list[dict], dead: list[int],
          n: int = 4) -> None:
    survivors = sorted(set(range(n)) - set(dead))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(r["rank"] for r in rows) == survivors, proc.stdout + proc.stderr
    for r in rows:
        assert r["ok"], r
        assert r["new_size"] == n - len(dead), r
        # The error named dead ranks only (a rank released by a revoke may know one of two
        # simultaneous deaths); the communicator knows all of them by the time it shrank.
        assert r["ranks"] and set(r["ranks"]) <= set(dead), r
        assert r["failed_ranks"] == sorted(dead), r
        assert "failed" in r["msg"] and "shrink" in r["msg"], r


@pytest.mark.parametrize("liveness", ["1", "0"])
def test_world_survives_a_killed_rank(liveness: str, tmp_path: Path) -> None:
    """Either detector (the watcher, or ULFM alone with DDL_LIVENESS=0) gives the error."""
    proc, rows = run_ulfm("loop", "2", tmp_path, env={"DDL_LIVENESS": liveness})
    check(proc, rows, [2])


def test_death_inside_a_large_allreduce_is_a_process_failure(tmp_path: Path) -> None:
    """Rank 2 dies while the others' pre-posted receives (within a node) and streamed pieces
    (between the two nodes of DDL_TOPOLOGY=2x2) wait for data, and only MPI reports it
    (DDL_LIVENESS=0). A receive that MPI fails for a dead peer or a revoked communicator is
    a process failure, never a MismatchError naming a live rank as having sent too much
    (what the benchmark's one failed trial in 100 was)."""
    proc, rows = run_ulfm("midway", "2", tmp_path,
                          env={"DDL_LIVENESS": "0", "DDL_TOPOLOGY": "2x2"})
    assert "MismatchError" not in proc.stderr, proc.stderr[-3000:]
    check(proc, rows, [2])


def test_death_of_rank_0_the_watchers_hub(tmp_path: Path) -> None:
    proc, rows = run_ulfm("rank0", "0", tmp_path)
    check(proc, rows, [0])


def test_split_communicator_survives(tmp_path: Path) -> None:
    proc, rows = run_ulfm("comm", "1", tmp_path)
    check(proc, rows, [1])


def test_two_deaths_at_once(tmp_path: Path) -> None:
    proc, rows = run_ulfm("two", "1,2", tmp_path)
    check(proc, rows, [1, 2])


def test_death_during_a_named_async_batch(tmp_path: Path) -> None:
    proc, rows = run_ulfm("async", "3", tmp_path)
    check(proc, rows, [3])


def test_death_during_the_shrink(tmp_path: Path) -> None:
    """Rank 2 dies in the loop, rank 1 a few ms into its shrink. The survivors shrink again
    to 2, or (Open MPI 5.0.11's agreement not recovering, see ft.c) every survivor exits
    with the shrink's bounded error: never a hang, never a survivor going on alone."""
    proc, rows = run_ulfm("during_shrink", "2,1", tmp_path, env={"DDL_TIMEOUT": "10"})
    if proc.returncode != 0 and not rows:
        assert proc.stderr.count("ddl_comm_shrink: no result within") >= 1, proc.stderr[-3000:]
        return
    check(proc, rows, [1, 2])


@pytest.mark.parametrize("ft", ["", "ulfm-only", "elastic-only"])
def test_without_fault_tolerance_shrink_is_refused(ft: str) -> None:
    """Plain mpirun, ULFM without DDL_ELASTIC=1 (ddlrun's recoverable mode) or
    DDL_ELASTIC=1 without ULFM: fault_tolerant() is False and shrink() says how."""
    code = ("import ddl_core as d; d.init(); assert not d.fault_tolerant()\n"
            "try:\n    d.comm_world().shrink()\nexcept d.DDLError as e:\n"
            "    assert 'ddlrun --elastic' in str(e), e; print('OK refused')\n")
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    env.pop("DDL_ELASTIC", None)
    if ft == "elastic-only":
        env["DDL_ELASTIC"] = "1"
    with_ft = ["--with-ft", "ulfm"] if ft == "ulfm-only" else []
    proc = subprocess.run([str(BIN / "mpirun"), *with_ft, "-n", "2", "--map-by", ":OVERSUBSCRIBE",
                           "--mca", "mpi_yield_when_idle", "1", sys.executable, "-c", code],
                          capture_output=True, text=True, timeout=ULFM_TIMEOUT, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("OK refused") == 2

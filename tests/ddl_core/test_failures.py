"""What goes wrong is reported clearly on every rank, and nothing hangs."""

import re
import time

import pytest
from conftest import ok_lines, run_mpi


def test_misuse_raises_before_any_communication() -> None:
    proc = run_mpi(2, "failures.py", "misuse")
    assert ok_lines(proc, "misuse") == 2


@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_mismatch_raises_on_every_rank_and_recovers(ranks: int) -> None:
    proc = run_mpi(ranks, "failures.py", "mismatch", env={"DDL_TIMEOUT": "60"})
    assert ok_lines(proc, "mismatch") == ranks


def test_mismatch_raises_on_every_rank_with_pieces_between_nodes() -> None:
    # a 2x2 grid whose outer level streams its exchanges in small pieces
    proc = run_mpi(4, "failures.py", "mismatch", env={"DDL_TIMEOUT": "60",
                                                      "DDL_TOPOLOGY": "2x2",
                                                      "DDL_PIECE": "1000"})
    assert ok_lines(proc, "mismatch") == 4


@pytest.mark.parametrize("mode", ["dies", "hangs"])
def test_dead_or_hung_rank_times_out_with_a_clear_error(mode: str) -> None:
    # `recoverable`: the launcher keeps the survivors running (as srun or jsrun may), so
    # it is DDL's own deadline that has to notice the missing peer.
    t0 = time.monotonic()
    proc = run_mpi(2, "failures.py", mode, env={"DDL_TIMEOUT": "3"},
                   mpi_args=("--runtime-options", "recoverable"), check=False, timeout=60)
    took = time.monotonic() - t0
    m = re.search(rf"OK {mode} after ([\d.]+)s: (.*)", proc.stdout)
    assert m, proc.stdout + proc.stderr
    assert 2.5 <= float(m.group(1)) <= 8, m.group(0)
    assert "no answer from rank 1" in m.group(2)
    assert took < 40

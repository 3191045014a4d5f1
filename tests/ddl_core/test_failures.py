"""What goes wrong is reported clearly on every rank, and nothing hangs."""

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


# A dead, exited or hung rank: test_faults.py.

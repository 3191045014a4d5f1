"""Asynchronous requests: named ones matched by name in any submission order, unnamed ones
by order; every mismatch raises on every rank and leaves nothing queued (real MPI jobs)."""

import pytest
from conftest import ok_lines, run_mpi


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_named_requests_in_random_orders_give_the_right_results(ranks: int) -> None:
    proc = run_mpi(ranks, "matching.py", "order", env={"DDL_TIMEOUT": "10"})
    assert ok_lines(proc, "order") == ranks


@pytest.mark.parametrize("ranks", [2, 3])
def test_every_mismatch_raises_everywhere_and_leaves_nothing_queued(ranks: int) -> None:
    proc = run_mpi(ranks, "matching.py", "mismatch", env={"DDL_TIMEOUT": "10"})
    assert ok_lines(proc, "mismatch") == ranks


def test_mismatches_without_fusion() -> None:
    proc = run_mpi(2, "matching.py", "mismatch", env={"DDL_TIMEOUT": "10",
                                                      "DDL_FUSION_THRESHOLD": "0"})
    assert ok_lines(proc, "mismatch") == 2


def test_a_duplicate_name_in_flight_is_refused() -> None:
    proc = run_mpi(2, "matching.py", "duplicate", env={"DDL_TIMEOUT": "10"})
    assert ok_lines(proc, "duplicate") == 2


@pytest.mark.parametrize("ranks", [2, 3])
def test_names_not_submitted_everywhere_fail_after_the_timeout(ranks: int) -> None:
    # 3 ranks: the negotiation folds a rank in, whose partner has to wake it
    proc = run_mpi(ranks, "matching.py", "stall", env={"DDL_TIMEOUT": "2"}, timeout=120)
    assert ok_lines(proc, "stall") == ranks

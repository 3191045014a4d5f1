"""Asynchronous collectives, the progress thread and tensor fusion."""

import pytest
from conftest import ok_lines, run_mpi


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_async_fused_matches_blocking(ranks: int) -> None:
    proc = run_mpi(ranks, "async_fusion.py", env={"DDL_CYCLE_TIME_MS": "2"})
    assert ok_lines(proc, "async") == ranks


def test_async_without_fusion() -> None:
    proc = run_mpi(2, "async_fusion.py", env={"DDL_FUSION_THRESHOLD": "0"})
    assert ok_lines(proc, "async") == 2


def test_small_fusion_buffer_splits_batches() -> None:
    proc = run_mpi(3, "async_fusion.py", env={"DDL_FUSION_THRESHOLD": "65536",
                                              "DDL_CYCLE_TIME_MS": "0.2"})
    assert ok_lines(proc, "async") == 3

"""PyTorch on DDL: the ddl backend under DDP, comm hooks, SyncBatchNorm, collectives,
DistributedOptimizer; every test is a real 2-rank MPI job on CPU."""

from __future__ import annotations

import pytest
from conftest import WORKERS, mpirun, ok_lines, need

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def _torch() -> None:
    need("torch")


@pytest.mark.parametrize("mode", ["ddl", "hook", "syncbn"])
def test_ddp_matches_single_process(mode: str) -> None:
    proc = mpirun(2, WORKERS / "torch_ddp.py", mode)
    assert ok_lines(proc, mode) == 2, proc.stdout

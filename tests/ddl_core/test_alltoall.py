"""alltoall / alltoallv on 1 to 5 real MPI ranks: every dtype, odd and zero counts,
uneven splits, a mismatched receive count raised on every rank."""

import pytest
from conftest import ok_lines, run_mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_alltoall_and_alltoallv(ranks: int) -> None:
    proc = run_mpi(ranks, "alltoall.py", timeout=300)
    assert ok_lines(proc, "alltoall") == ranks, proc.stdout + proc.stderr

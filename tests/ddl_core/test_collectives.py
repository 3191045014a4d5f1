"""Every collective x dtype x op x a spread of counts on 1 to 5 real MPI ranks."""

import pytest
from conftest import ok_lines, run_mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5])
def test_every_collective_dtype_op_count(ranks: int) -> None:
    proc = run_mpi(ranks, "collectives.py", timeout=600)
    assert ok_lines(proc, "collectives") == ranks

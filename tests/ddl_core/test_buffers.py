"""numpy, torch CPU tensors and buffer-protocol objects go through without copies."""

import pytest
from conftest import ok_lines, run_mpi


@pytest.mark.parametrize("ranks", [1, 3])
def test_buffers(ranks: int, have_torch: bool) -> None:
    if not have_torch:
        pytest.skip("torch is not installed")
    proc = run_mpi(ranks, "buffers.py")
    assert ok_lines(proc, "buffers") == ranks

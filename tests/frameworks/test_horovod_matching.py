"""horovod-ddl keeps Horovod's matching contract: named tensors meet by name in any
submission order, unnamed ones by order, mismatches raise on every rank (real jobs)."""

from __future__ import annotations

import pytest
from conftest import WORKERS, mpirun, need, ok_lines

pytestmark = pytest.mark.timeout(600)


@pytest.mark.parametrize("ranks", [2, 3])
def test_horovod_torch_matches_by_name_and_reports_mismatches(ranks: int) -> None:
    need("torch")
    proc = mpirun(ranks, WORKERS / "hvd_matching.py", env={"DDL_TIMEOUT": "60"})
    assert ok_lines(proc, "hvd_matching") == ranks, proc.stdout


def test_horovod_tensorflow_matches_by_name_and_reports_mismatches() -> None:
    need("tensorflow")
    proc = mpirun(2, WORKERS / "hvd_matching_tf.py", env={"DDL_TIMEOUT": "60"})
    assert ok_lines(proc, "hvd_matching_tf") == 2, proc.stdout

"""horovod-ddl: Horovod's process sets (on libddl communicators) and join (uneven data),
checked against Horovod's documented semantics in real 3-rank jobs."""

from __future__ import annotations

import pytest
from conftest import WORKERS, mpirun, need, ok_lines

pytestmark = pytest.mark.timeout(600)


def test_process_sets_torch() -> None:
    need("torch")
    proc = mpirun(3, WORKERS / "hvd_process_sets.py", env={"DDL_TIMEOUT": "30"})
    assert ok_lines(proc, "hvd_process_sets") == 3, proc.stdout


def test_join_torch_uneven_steps() -> None:
    need("torch")
    proc = mpirun(3, WORKERS / "hvd_join.py", env={"DDL_TIMEOUT": "30"})
    assert ok_lines(proc, "hvd_join") == 3, proc.stdout


def test_process_sets_and_join_tensorflow_keras() -> None:
    need("tensorflow")
    proc = mpirun(3, WORKERS / "hvd_sets_tf.py", env={"DDL_TIMEOUT": "30"})
    assert ok_lines(proc, "hvd_sets_tf") == 3, proc.stdout

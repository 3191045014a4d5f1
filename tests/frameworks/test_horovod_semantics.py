"""horovod-ddl against Horovod's documented torch semantics that Horovod's own test suite
(test/parallel/test_torch.py) checks: differentiable collectives, reducescatter's scale
factors and grouped form, poll() on asynchronous handles, sparse allreduce, process sets
removed and added again, shutdown(), and the DistributedOptimizer's behaviour (forced
allreduce, sparse gradients, parameter names, the synchronize() warning, process sets);
and tensorflow collectives in a TF1-style graph (test_tensorflow.py's graph-mode runs) and
with Horovod's gradients (eager, tf.function, TF1 graph; global set and a process set).
Real 3-rank jobs."""

from __future__ import annotations

import pytest
from conftest import WORKERS, mpirun, need, ok_lines

pytestmark = pytest.mark.timeout(600)


def test_collectives_autograd_and_reducescatter() -> None:
    need("torch")
    proc = mpirun(3, WORKERS / "hvd_autograd.py", env={"DDL_TIMEOUT": "30"})
    assert ok_lines(proc, "hvd_autograd") == 3, proc.stdout


def test_distributed_optimizer_semantics() -> None:
    need("torch")
    proc = mpirun(3, WORKERS / "hvd_optimizer_semantics.py", env={"DDL_TIMEOUT": "30"})
    assert ok_lines(proc, "hvd_optimizer_semantics") == 3, proc.stdout


def test_tensorflow_graph_mode_collectives_run_in_program_order() -> None:
    need("tensorflow")
    proc = mpirun(3, WORKERS / "hvd_tf_graph.py", env={"DDL_TIMEOUT": "30"})
    assert ok_lines(proc, "hvd_tf_graph") == 3, proc.stdout


def test_tensorflow_dtypes_indexed_slices_grouped_and_inplace() -> None:
    need("tensorflow")
    proc = mpirun(3, WORKERS / "hvd_tf_semantics.py", env={"DDL_TIMEOUT": "30"})
    assert ok_lines(proc, "hvd_tf_semantics") == 3, proc.stdout


def test_tensorflow_collectives_have_horovods_gradients() -> None:
    need("tensorflow")
    proc = mpirun(3, WORKERS / "hvd_tf_grads.py", env={"DDL_TIMEOUT": "30"})
    assert ok_lines(proc, "hvd_tf_grads") == 3, proc.stdout

"""DDL on communicators that come from MPI itself (mpi4py beside ddl_core, plain mpirun -n 4):
init(comm=) on each half of the job, create_group called by its members only, and
replace_world. The worker (workers/ulfm_comms.py) checks every result on every rank."""

from __future__ import annotations

import importlib.util

import pytest
from conftest import ok_lines, run_mpi

pytestmark = pytest.mark.skipif(importlib.util.find_spec("mpi4py") is None,
                                reason="mpi4py is not installed")


@pytest.mark.parametrize("case", ["init_comm", "create_group", "replace_world"])
def test_communicators_from_mpi(case: str) -> None:
    proc = run_mpi(4, "ulfm_comms.py", case, timeout=180)
    assert ok_lines(proc, case) == 4, proc.stdout + proc.stderr

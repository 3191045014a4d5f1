"""Communicators and the libddl 2 collectives under real mpirun (workers/comms.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import BIN, launcher_failed, mpirun_cmd, ok_lines, run_mpi


@pytest.mark.parametrize("ranks", [1, 2, 3, 5])
def test_comm_collectives_every_dtype_op(ranks: int) -> None:
    """Split (odd sizes at 3 and 5 ranks, reversed key) and created communicators: every
    dtype x op (bitwise on integers) x odd counts, the new collectives, point-to-point,
    and two communicators of each rank driven from two threads at once."""
    proc = run_mpi(ranks, "comms.py", "collectives", timeout=240)
    assert ok_lines(proc, "comms-collectives") == ranks


def test_comm_collectives_without_shared_memory() -> None:
    """DDL_SHM=0: two-rank reduce takes the pipeline over MPI messages instead of the
    shared segment (the path of a pair on two nodes), with the same results."""
    proc = run_mpi(3, "comms.py", "collectives", env={"DDL_SHM": "0"}, timeout=240)
    assert ok_lines(proc, "comms-collectives") == 3


@pytest.mark.parametrize("cma", ["1", "0"])
def test_comm_pair_direct_copies(cma: str) -> None:
    """A node-local pair copies its large alltoall, gather and scatter straight between
    the two processes (process_vm_readv/writev); DDL_CMA=0 on either rank keeps them on
    the segment and MPI, with the same results."""
    env = {"DDL_LOG": "1"} | ({"DDL_CMA": "0"} if cma == "0" else {})
    proc = run_mpi(2, "comms.py", "collectives", env=env, timeout=240)
    assert ok_lines(proc, "comms-collectives") == 2
    said = [ln for ln in proc.stderr.splitlines() if "direct copies" in ln]
    assert said, proc.stderr[-3000:]
    if cma == "1" and "not permitted" in said[0]:
        pytest.skip("process_vm_readv between two ranks is not permitted on this machine")
    want = "direct copies on" if cma == "1" else "direct copies off"
    assert all(want in ln for ln in said), said


@pytest.fixture(scope="module")
def rooted_in_place_c(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/ddl_core/c/rooted_in_place.c built against the installed libddl and ddl.h."""
    import ddl_core

    pkg = Path(ddl_core.__file__).parent
    exe = tmp_path_factory.mktemp("c") / "rooted_in_place"
    subprocess.run([str(BIN / "mpicc"), "-std=c11", "-Wall", "-Wextra", "-Werror",
                    f"-I{pkg / 'include'}", str(Path(__file__).parent / "c" / "rooted_in_place.c"),
                    f"-L{pkg}", "-lddl", f"-Wl,-rpath,{pkg}", "-o", str(exe)], check=True)
    return exe


@pytest.mark.parametrize("ranks,shm", [(2, "1"), (2, "0"), (3, "1")])
def test_c_gather_scatter_in_place(rooted_in_place_c: Path, ranks: int, shm: str) -> None:
    """C API: DDL_IN_PLACE at gather's and scatter's root (MPI_IN_PLACE's meaning) on every
    path: a pair's segment (700 doubles a block) and direct copies (524291), MPI's routine
    (3 ranks, or DDL_SHM=0); off the root it is an error."""
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "DDL_TIMEOUT": "60", "DDL_SHM": shm}
    cmd = [*mpirun_cmd(ranks), str(rooted_in_place_c), "1", "700", "524291"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    if launcher_failed(proc):
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert ok_lines(proc, "rooted-in-place") == ranks


@pytest.mark.parametrize("grid,ranks", [("2x2", 4), ("2x2x2", 8)])
def test_comm_collectives_on_grids(grid: str, ranks: int) -> None:
    """Sub-communicators of a DDL_TOPOLOGY grid get the grid restricted to their members."""
    proc = run_mpi(ranks, "comms.py", "collectives", env={"DDL_TOPOLOGY": grid}, timeout=300)
    assert ok_lines(proc, "comms-collectives") == ranks


@pytest.mark.parametrize("ranks", [2, 5])
def test_comm_errors(ranks: int) -> None:
    """Mismatch on a sub-communicator fails its members only and the next call works;
    wrong-size recv names both sizes; freed communicator, bad root/peer, bitwise op on
    floats are clear errors."""
    proc = run_mpi(ranks, "comms.py", "errors", timeout=120)
    assert ok_lines(proc, "comms-errors") == ranks


def test_comm_timeout_on_sub_communicator() -> None:
    """A member that never arrives: the others of its communicator raise DDLTimeoutError
    after the communicator's 2 s; the other communicator is unaffected."""
    proc = run_mpi(5, "comms.py", "timeout", timeout=120, check=False)
    assert ok_lines(proc, "comms-timeout") == 5, proc.stdout + proc.stderr[-3000:]
    assert proc.stdout.count("DDLTimeout") == 0  # messages are the library's own
    assert proc.stdout.count("no answer from rank 2 for 2 s") == 2, proc.stdout


@pytest.mark.parametrize("ranks", [2, 3, 5])
def test_comm_async_queues(ranks: int) -> None:
    """Each communicator's own asynchronous queue: named requests matched by name among its
    members whatever their order (the same names in flight on the world's queue), unnamed
    ones by order for every kind, fusion, two communicators' queues flooded from two
    threads, a dtype mismatch failing that communicator's members only (the next request
    works), a member that never submits named with its world rank at the communicator's
    timeout, and a freed communicator refused; isend/irecv requests matched in posting
    order whatever order they are waited in, test() polling, a wrong-size irecv and an
    irecv that times out."""
    proc = run_mpi(ranks, "comms.py", "async", timeout=180)
    assert ok_lines(proc, "comms-async") == ranks


def test_point_to_point_needs_only_the_pair() -> None:
    """Two ranks of three exchange send/recv and isend/irecv on the world while the third
    never calls point-to-point: the pair completes (no hidden collective)."""
    proc = run_mpi(3, "p2p_pairs.py", env={"DDL_TIMEOUT": "20"}, timeout=90)
    assert ok_lines(proc, "p2p-pairs") == 3

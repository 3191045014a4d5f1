"""PyTorch on DDL: the ddl backend under DDP, comm hooks, SyncBatchNorm, collectives,
DistributedOptimizer; every test is a real 2-rank MPI job on CPU."""

from __future__ import annotations

import pytest
from conftest import WORKERS, mpirun, need, ok_lines

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(autouse=True)
def _torch() -> None:
    need("torch")


@pytest.mark.parametrize("mode", ["ddl", "hook", "syncbn"])
def test_ddp_matches_single_process(mode: str) -> None:
    proc = mpirun(2, WORKERS / "torch_ddp.py", mode)
    assert ok_lines(proc, mode) == 2, proc.stdout


def test_collectives_on_ddl_backend() -> None:
    proc = mpirun(2, WORKERS / "torch_collectives.py")
    assert ok_lines(proc, "collectives") == 2, proc.stdout


def test_blocking_collectives_skip_the_fusion_cycle() -> None:
    """Work.wait() hurries libddl's progress thread (a blocking all_reduce paid the whole
    DDL_CYCLE_TIME_MS); requests submitted together before any wait still fuse."""
    proc = mpirun(2, WORKERS / "torch_blocking.py", env={"DDL_CYCLE_TIME_MS": "200"})
    assert sum(line.startswith("OK blocking") for line in proc.stdout.splitlines()) == 2, \
        proc.stdout
    assert sum(line.startswith("OK fused") for line in proc.stdout.splitlines()) == 2, \
        proc.stdout
    assert ok_lines(proc, "ordered") == 2, proc.stdout


@pytest.mark.parametrize("mode", ["initdestroy", "masteraddr"])
def test_rendezvous_under_mpi(mode: str) -> None:
    """init then destroy at once; env:// with MASTER_ADDR but no RANK/WORLD_SIZE."""
    import socket

    with socket.socket() as s:  # (a free port for MASTER_PORT)
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    for _ in range(3 if mode == "initdestroy" else 1):  # (it was a race)
        proc = mpirun(3, WORKERS / "torch_rendezvous.py", mode, port)
        assert ok_lines(proc, mode) == 3, proc.stdout


def test_distributed_optimizer_matches_single_process() -> None:
    modes = ["plain", "accumulate", "fp16"]  # one job: torch starts once
    proc = mpirun(2, WORKERS / "torch_optimizer.py", *modes)
    for mode in modes:
        assert ok_lines(proc, mode) == 2, proc.stdout


def test_backend_autoloads_without_import() -> None:
    """The torch.backends entry point registers "ddl" when torch is imported."""
    import subprocess
    import sys

    # (the real creator: a ddl that failed to load registers the entry point's placeholder)
    code = ("import torch.distributed as d, sys; p = d.Backend._plugins.get('DDL'); "
            "sys.exit(0 if p and p.creator_fn.__module__ == 'ddl_core.torch.backend' "
            "and 'ddl' in d.Backend.backend_list else 1)")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0
    env_off = {"TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    import os

    assert subprocess.run([sys.executable, "-c", code],
                          env={**os.environ, **env_off}).returncode == 1, \
        "with autoloading off the backend must be absent (the check above would be vacuous)"


def test_bench_ddp_runs_and_reports_both_backends() -> None:
    """The benchmark itself (tiny): both backends measured in one job, table printed."""
    import json
    import sys

    from conftest import ddlrun

    proc = ddlrun(2, sys.executable, "-m", "ddl_core.bench", "ddp", "--steps", "2", "--rounds",
                  "1", "--json", "/dev/stdout")
    assert "ddl/gloo throughput (cnn)" in proc.stdout, proc.stdout
    assert "ddl/gloo throughput (mlp)" in proc.stdout, proc.stdout
    data = json.loads(proc.stdout[proc.stdout.index("{"):proc.stdout.rindex("}") + 1])
    assert sorted(data["ddp"]) == ["cnn", "mlp"], data["ddp"]
    for name in ("ddl", "gloo"):
        for model in ("cnn", "mlp"):
            row = data["ddp"][model][name]
            assert row["samples_per_s"] > 0 and row["allreduce_ms"] > 0, (model, row)
        assert data[name]["allreduce_4k_us"] > 0 and data[name]["alltoall_16m_ms"] > 0
    try:
        import ddl_torch  # noqa: F401
    except ImportError:
        assert "FSDP2 step: not measured" in proc.stdout, proc.stdout
    else:  # the FSDP2 row needs the C++ Backend
        assert "FSDP2 step (small transformer" in proc.stdout, proc.stdout
        assert data["ddl"]["fsdp2_step_ms"] > 0 and data["gloo"]["fsdp2_step_ms"] > 0


@pytest.mark.parametrize("n,modes", [(2, ["functional", "dtensor", "fsdp2"]),
                                     (4, ["functional", "hsdp"])])
def test_sharding_stack_on_ddl(n: int, modes: list[str]) -> None:
    """The group is a named c10d Backend of ddl-torch's (not the Python fallback);
    functional collectives, DTensor on a DeviceMesh, FSDP2 (fully_shard) against the
    single-process result, and HSDP on a 2-D replicate x shard mesh (4 ranks)."""
    need("ddl_torch")
    proc = mpirun(n, WORKERS / "torch_sharding.py", *modes)
    for mode in modes:
        assert ok_lines(proc, mode) == n, proc.stdout


@pytest.mark.parametrize("n", [2, 3])
def test_subgroups_p2p_uneven_all_gather_and_group_timeout(n: int) -> None:
    """new_group of any ranks (libddl communicators; non-members get NON_GROUP_MEMBER),
    send/recv, isend/irecv with tags, batch_isend_irecv, all_gather of uneven sizes; last,
    new_group([0, 1], timeout=3 s) where rank 1 never joins an all_reduce: rank 0 raises a
    timeout error well before DDL_TIMEOUT (120 s here). At 2 ranks that group is the world
    (libddl's asynchronous path), at 3 a communicator (blocking path). The job may end
    untidily after the timeout (the group is unusable), so only the OK lines count."""
    modes = ["groups", "p2p", "uneven", "timeout"]
    proc = mpirun(n, WORKERS / "torch_groups.py", *modes, check=False, timeout=180)
    for mode in modes:
        assert ok_lines(proc, mode) == n, proc.stdout + proc.stderr[-3000:]


def test_python_fallback_refuses_subgroups_clearly() -> None:
    """Without the C++ Backend (DDL_TORCH_CPP=0) the Python ProcessGroup still reduces;
    new_group of some ranks fails on every rank with an error naming ddl-torch."""
    proc = mpirun(2, WORKERS / "torch_groups.py", "fallback", env={"DDL_TORCH_CPP": "0"})
    assert ok_lines(proc, "fallback") == 2, proc.stdout


def test_new_group_with_local_synchronization() -> None:
    """new_group(ranks, use_local_synchronization=True) called by the members only, each
    rank in its own order of groups ([0, 1], [2], [1, 2]): MPI_Comm_create_group; tensor
    and object collectives on each group are right (torch's own test_subpg_* tests of
    test_c10d_object_collectives.py failed on this with a MismatchError)."""
    proc = mpirun(3, WORKERS / "torch_local_groups.py", env={"DDL_TIMEOUT": "60"})
    assert ok_lines(proc, "localsync") == 3, proc.stdout

"""The device path on a real GPU: NCCL on one rank, staging when ranks share the GPU,
DDP with ddl against NCCL and gloo. Skipped with the reason where there is no GPU."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from gpu_util import gpu, ok_lines, run_mpi

pytestmark = gpu


def test_one_rank_nccl_every_dtype() -> None:
    proc = run_mpi(1, "collectives.py", "nccl", "-")
    assert ok_lines(proc, "gpu-collectives") == 1


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_ranks_sharing_the_gpu_are_staged(ranks: int) -> None:
    proc = run_mpi(ranks, "collectives.py", "staged", "share one GPU")
    assert ok_lines(proc, "gpu-collectives") == ranks
    said = [ln for ln in proc.stderr.splitlines() if "staged through host memory" in ln]
    assert len(said) == 1, proc.stderr  # said once, by rank 0


def test_ddl_nccl_0_forces_staging() -> None:
    proc = run_mpi(1, "collectives.py", "staged", "DDL_NCCL=0", env={"DDL_NCCL": "0"})
    assert ok_lines(proc, "gpu-collectives") == 1


def test_ddl_nccl_1_refuses_a_shared_gpu() -> None:
    proc = run_mpi(2, "collectives.py", "nccl", "-", env={"DDL_NCCL": "1"}, timeout=120,
                   check=False)
    assert proc.returncode != 0
    assert "DDL_NCCL=1 but NCCL cannot serve: several ranks share one GPU" in proc.stderr


def _params(path: Path) -> dict:
    import torch

    return torch.load(path)


def _ddp(how: str, ranks: int, tmp: Path) -> dict:
    out = tmp / f"{how}-{ranks}.pt"
    env = {"DDP_PORT": str(random.randint(20000, 40000))}
    proc = run_mpi(ranks, "ddp.py", how, str(out), env=env)
    assert ok_lines(proc, f"ddp-{how}") == ranks
    return _params(out)


def _same(a: dict, b: dict, exact: bool) -> None:
    import torch

    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], rtol=1e-5, atol=1e-6)


def test_ddp_one_rank_ddl_equals_nccl(tmp_path: Path) -> None:
    _same(_ddp("nccl", 1, tmp_path), _ddp("ddl", 1, tmp_path), exact=True)


@pytest.mark.parametrize("ranks", [2, 4])
def test_ddp_shared_gpu_ddl_equals_gloo(ranks: int, tmp_path: Path) -> None:
    _same(_ddp("gloo", ranks, tmp_path), _ddp("ddl", ranks, tmp_path), exact=False)

"""The `ddl` torch.distributed backend on CUDA tensors (issue 14's CUDA half): every c10d
operation, FSDP2, DTensor and DDP with init_process_group("ddl") alone, on one rank (NCCL
path) and on ranks sharing the GPU (libddl's staging). Skipped with the reason where there
is no GPU or no ddl-torch (the C++ Backend that registers ddl for CUDA)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from gpu_util import gpu, ok_lines, run_mpi
from test_gpu_collectives import _ddp, _same

pytestmark = [*gpu, pytest.mark.skipif(
    importlib.util.find_spec("ddl_torch") is None,
    reason="ddl-torch is not installed (pip install --no-build-isolation ./ddl_core/compat/torch)")]

MODES = ("collectives", "sharding", "ddp")


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_every_operation_fsdp2_dtensor_ddp_on_cuda(ranks: int) -> None:
    proc = run_mpi(ranks, "torch_backend.py", *MODES)
    for mode in MODES:
        assert ok_lines(proc, mode) == ranks, mode


def test_cpu_and_cuda_mixed_across_ranks_raise_on_every_rank() -> None:
    proc = run_mpi(2, "torch_backend.py", "mixed", env={"DDL_TIMEOUT": "60"}, timeout=200)
    assert ok_lines(proc, "mixed") == 2
    said = [ln for ln in proc.stdout.splitlines() if "mixed CPU/CUDA all_reduce raised" in ln]
    assert len(said) == 2 and not any("Timeout" in ln for ln in said), proc.stdout


def test_ddp_one_rank_ddl_backend_equals_nccl(tmp_path: Path) -> None:
    _same(_ddp("nccl", 1, tmp_path), _ddp("backend", 1, tmp_path), exact=True)


@pytest.mark.parametrize("ranks", [2, 4])
def test_ddp_shared_gpu_ddl_backend_equals_gloo(ranks: int, tmp_path: Path) -> None:
    _same(_ddp("gloo", ranks, tmp_path), _ddp("backend", ranks, tmp_path), exact=False)

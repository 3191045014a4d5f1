"""The device path where there is no GPU (what CI and login nodes have): the CPU-only
build imports and runs, a GPU array gets a clear error on every rank without a hang,
DDL_NCCL / DDL_NCCL_OUTER are checked at init, and the libraries are searched in the
documented order. The GPU itself is exercised by tests/gpu (marked gpu)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ok_lines, run_mpi

import ddl_core


def _info(env: dict[str, str]) -> dict[str, str]:
    code = "import ddl_core, json; print(json.dumps(ddl_core.gpu_info()))"
    full = {**os.environ, **env}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=full, check=True, timeout=60)
    import json

    return json.loads(out.stdout)


@pytest.fixture(scope="module")
def no_gpu() -> None:
    info = ddl_core.gpu_info()
    if "cuda_error" not in info:
        pytest.skip("this machine has a usable CUDA device; tests/gpu covers it")


@pytest.mark.parametrize("ranks", [1, 2, 3])
@pytest.mark.parametrize("cuda_lib", ["default", "nowhere"])
def test_gpu_array_without_gpu_fails_clearly(ranks: int, cuda_lib: str, no_gpu: None) -> None:
    env = {}
    if cuda_lib == "nowhere":
        env = {"DDL_CUDA_LIB": "/nonexistent/libcudart.so.13", "WANT": "CUDA runtime not found"}
    proc = run_mpi(ranks, "gpu_cpu.py", "no-device", env=env, timeout=120)
    assert ok_lines(proc, "gpu-no-device") == ranks
    if cuda_lib == "nowhere":
        assert "DDL_CUDA_LIB=/nonexistent/libcudart.so.13" in proc.stderr


def test_mixed_device_and_host_fails_on_every_rank(no_gpu: None) -> None:
    proc = run_mpi(3, "gpu_cpu.py", "mixed", timeout=120)
    assert ok_lines(proc, "gpu-mixed") == 3


def test_host_collectives_work_after_a_device_error(no_gpu: None) -> None:
    proc = run_mpi(2, "gpu_cpu.py", "host-ok", timeout=120)
    assert ok_lines(proc, "gpu-host-ok") == 2


@pytest.mark.parametrize("var,value", [("DDL_NCCL", "maybe"), ("DDL_NCCL_OUTER", "gloo")])
def test_bad_nccl_settings_fail_at_init(var: str, value: str) -> None:
    code = "import ddl_core as d\ntry:\n    d.init()\nexcept d.InvalidArgumentError as e:\n" \
           "    print('REJECTED', e)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, var: value}, timeout=60)
    assert "REJECTED" in out.stdout and f"{var}={value}" in out.stdout, out.stdout + out.stderr


@pytest.mark.parametrize("value,shown", [("0", "0"), ("off", "0"), ("auto", "auto"),
                                         ("1", "1"), ("", "auto")])
def test_ddl_nccl_parsing(value: str, shown: str) -> None:
    code = "import ddl_core as d\nd.init()\nprint('SETTING', d.gpu_info()['ddl_nccl'])\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env={**os.environ, "DDL_NCCL": value}, timeout=60)
    assert f"SETTING {shown}" in out.stdout, out.stdout + out.stderr


def test_search_order_when_nothing_is_pinned(tmp_path: Path) -> None:
    env = {"CONDA_PREFIX": str(tmp_path / "conda"), "DDL_NCCL_LIB": "",
           "LD_LIBRARY_PATH": os.environ.get("LD_LIBRARY_PATH", "")}
    info = _info(env)
    if info.get("nccl"):
        pytest.skip(f"NCCL is installed here ({info['nccl']}): the failure text is not shown")
    tried = info["nccl_error"]
    site = Path(ddl_core.__file__).parent
    steps = ["already loaded in this process", f"{site}/../nvidia/nccl/lib",
             f"{site}/libnccl.so.2", f"{tmp_path}/conda/lib/libnccl.so.2",
             "; libnccl.so.2: "]
    pos = [tried.find(s) for s in steps]
    assert all(p >= 0 for p in pos), (steps, tried)
    assert pos == sorted(pos), tried


def test_pinned_library_is_the_only_candidate(tmp_path: Path) -> None:
    info = _info({"DDL_NCCL_LIB": str(tmp_path)})
    assert info["nccl"] == ""
    assert f"DDL_NCCL_LIB={tmp_path}" in info["nccl_error"]
    assert "already loaded" not in info["nccl_error"]  # nothing else was tried


def test_dlpack_capsule_reader() -> None:
    torch = pytest.importorskip("torch")
    from ddl_core import _ddl

    for dt, code, bits in [(torch.float32, 2, 32), (torch.bfloat16, 4, 16),
                           (torch.int64, 0, 64), (torch.uint8, 1, 8)]:
        t = torch.zeros((3, 5), dtype=dt)
        cap = torch.utils.dlpack.to_dlpack(t)
        ptr, dev_type, dev_id, c, b, lanes, n, contiguous = _ddl.dlpack_info(cap)
        assert (ptr, dev_type, c, b, lanes, n, contiguous) == (t.data_ptr(), 1, code, bits, 1,
                                                              15, 1)
    cap = torch.utils.dlpack.to_dlpack(torch.zeros((4, 6))[:, ::2])
    assert _ddl.dlpack_info(cap)[-1] == 0  # a strided view is not contiguous


def test_host_objects_are_not_device_arrays() -> None:
    import numpy as np

    from ddl_core import _cuda

    assert _cuda.device_array(np.zeros(3)) is None
    assert _cuda.device_array(bytearray(8)) is None
    torch = pytest.importorskip("torch")
    assert _cuda.device_array(torch.zeros(3)) is None


def test_bench_gpu_says_it_needs_a_gpu(no_gpu: None) -> None:
    pytest.importorskip("torch")
    out = subprocess.run([sys.executable, "-m", "ddl_core.bench", "gpu"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "needs a CUDA device" in out.stderr, out.stdout + out.stderr

"""horovod-ddl: Horovod's documented API runs unchanged on DDL (real 2-rank jobs)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest
from conftest import BIN, WORKERS, job_env, mpirun, need, ok_lines

pytestmark = pytest.mark.timeout(600)


def test_horovod_torch_api_and_training() -> None:
    need("torch")
    proc = mpirun(2, WORKERS / "hvd_torch.py")
    assert ok_lines(proc, "hvd_torch") == 2, proc.stdout


def test_horovodrun_translates_common_options() -> None:
    out = subprocess.run([str(BIN / "horovodrun"), "-np", "4", "-H", "a:2,b:2",
                          "--fusion-threshold-mb", "32", "--network-interface", "eth0",
                          "--dry-run", "python", "train.py"],
                         capture_output=True, text=True, check=True).stderr
    assert "-n 4" in out or "-np 4" in out, out
    assert "a:2,b:2" in out, out
    assert "DDL_FUSION_THRESHOLD=33554432" in out, out
    assert "btl_tcp_if_include eth0" in out, out
    assert out.rstrip().endswith("python train.py"), out


def test_horovodrun_runs_a_job() -> None:
    need("torch")
    proc = subprocess.run([str(BIN / "horovodrun"), "-np", "2", "--mpi-args",
                           "--mca mpi_yield_when_idle 1", sys.executable, "-c",
                           "import horovod.torch as hvd, torch; hvd.init(); "
                           "t = hvd.allreduce(torch.ones(1), op=hvd.Sum); "
                           "print('OK run', int(t.item()))"],
                          capture_output=True, text=True, timeout=300,
                          env=job_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("OK run 2") == 2, proc.stdout


def test_package_is_marked_as_ddl_implementation() -> None:
    from importlib.metadata import metadata

    md = metadata("horovod-ddl")
    assert "DDL" in md["Summary"] and "not upstream" in md["Summary"]


def test_horovodrun_check_build_lists_what_is_available() -> None:
    out = subprocess.run([str(BIN / "horovodrun"), "--check-build"], capture_output=True,
                         text=True, check=True).stdout
    assert "Available Frameworks:" in out and "[X] MPI" in out and "[X] DDL" in out, out
    assert "[ ] Gloo" in out and "[ ] MXNet" in out, out
    torch_box = "[X] PyTorch" if importlib.util.find_spec("torch") else "[ ] PyTorch"
    assert torch_box in out, out


def test_horovodrun_forwards_the_timeline() -> None:
    """(horovodrun's elastic options: test_horovod_elastic.py)"""
    out = subprocess.run([str(BIN / "horovodrun"), "-np", "2", "--timeline-filename",
                          "/tmp/tl.json", "--dry-run", "python", "train.py"],
                         capture_output=True, text=True, check=True).stderr
    assert "HOROVOD_TIMELINE=/tmp/tl.json" in out, out


def test_elastic_api_is_there_and_build_queries_answer() -> None:
    need("torch")
    import horovod.torch as hvd

    for name in ("run", "State", "ObjectState", "TorchState", "ElasticSampler"):
        assert callable(getattr(hvd.elastic, name)), name
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    assert not hvd.is_initialized()
    assert hvd.mpi_built() and hvd.ddl_built() and not hvd.gloo_built()
    assert hvd.nccl_built() in (0, 1) and isinstance(hvd.cuda_built(), bool)

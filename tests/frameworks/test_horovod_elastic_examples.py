"""Horovod's own elastic PyTorch examples, unedited, under horovodrun's elastic options:
one rank SIGKILLed mid-training (the survivor goes on, and a new rank is started in the
lost one's slot), then, for the synthetic benchmark, the discovery script reports one
more slot (the job grows past its start), and the job ends with status 0.

Needs a Horovod checkout (HOROVOD_SRC: github.com/horovod/horovod, for
examples/elastic/pytorch/) and torchvision. torchvision from PyPI runs on PyPI's torch
(the CUDA build, which runs on a CPU too), not on the CPU-only torch of `make test`'s venv,
so these run in a venv of PyPI's torch and torchvision with ddl_core and horovod-ddl
installed (docs/frameworks.md, "Elastic Horovod"); elsewhere they skip, saying so.
pytorch_mnist_elastic.py reads MNIST-shaped data made here (workers/mnist_idx.py): nothing
is downloaded.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import BIN, WORKERS, job_env

pytestmark = pytest.mark.timeout(900)

SRC = os.environ.get("HOROVOD_SRC", "")
EXAMPLES = Path(SRC) / "examples" / "elastic" / "pytorch"


def _need() -> None:
    if not SRC or not EXAMPLES.is_dir():
        pytest.skip("set HOROVOD_SRC to a checkout of github.com/horovod/horovod "
                    "(its examples/elastic/pytorch are run unedited)")
    try:
        import torchvision  # noqa: F401
    except Exception as e:  # noqa: BLE001 - a CPU torch makes its import fail, not skip
        pytest.skip(f"torchvision is not usable here ({type(e).__name__}: {e}); torchvision "
                    "from PyPI needs PyPI's torch: run in a venv of both with ddl_core and "
                    "horovod-ddl installed")
    import ddl_core

    if not hasattr(ddl_core, "shrink_world"):
        pytest.skip("this ddl_core has no fault tolerance (libddl without ULFM)")


class Job:
    """A running horovodrun job whose output is collected as it comes."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        self.proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True, env=env, start_new_session=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    @property
    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, count: int = 1, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if len(re.findall(pattern, self.text, re.M)) >= count:
                return
            if self.proc.poll() is not None:
                time.sleep(0.5)  # (the reader's last lines)
                break
            time.sleep(0.2)
        self.kill()
        pytest.fail(f"no {count} x {pattern!r} in the job's output:\n{self.text[-5000:]}")

    def finish(self, timeout: float = 300) -> int:
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"the job did not end in {timeout} s:\n{self.text[-5000:]}")
        self._reader.join(10)
        return rc

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()


def _rank_pids(script: Path) -> dict[int, int]:
    """{rank at start: pid} of the job's Python ranks running `script` (not ddlrun's
    wrappers around them, whose command lines name it too)."""
    found = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            env = (d / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if len(argv) < 2 or argv[1] != str(script).encode():
            continue
        # (the rank mpirun gave it: HOROVOD_RANK is set inside the process, by hvd.init)
        rank = next((e.split(b"=", 1)[1] for e in env
                     if e.startswith(b"OMPI_COMM_WORLD_RANK=")), None)
        if rank is not None:
            found[int(rank)] = int(d.name)
    return found


def _kill_then_grow(tmp_path: Path, script: Path, args: list[str], progress: str,
                    grow_to: int = 3) -> tuple[Job, int]:
    """Start 2 ranks (max 3), SIGKILL rank 1 once `progress` was printed twice (ddlrun
    refills the lost slot the script still reports: a new rank is spawned), then make
    the discovery script report `grow_to` slots once the survivor printed more progress."""
    hosts = tmp_path / "hosts"
    hosts.write_text("localhost:2\n")
    discover = tmp_path / "discover.sh"
    discover.write_text(f"#!/bin/sh\ncat {hosts}\n")
    discover.chmod(0o755)
    env = job_env({"DDL_TIMEOUT": "120", "HOME": str(tmp_path)})
    job = Job([str(BIN / "horovodrun"), "-np", "2", "--min-np", "1", "--max-np", "3",
               "--host-discovery-script", str(discover), "--mpi-args",
               "--mca mpi_yield_when_idle 1", sys.executable, str(script), *args], env)
    job.wait_for(progress, 2)
    pids = _rank_pids(script)
    if 1 not in pids:
        job.kill()
        pytest.fail(f"no rank 1 of {script.name} found (ranks: {pids}):\n{job.text[-3000:]}")
    os.kill(pids[1], signal.SIGKILL)
    before = len(re.findall(progress, job.text, re.M))
    job.wait_for(progress, before + 2)  # the survivor trains on
    hosts.write_text(f"localhost:{grow_to}\n")
    return job, before


def test_pytorch_synthetic_benchmark_elastic_through_a_kill_and_a_regrow(tmp_path: Path
                                                                         ) -> None:
    _need()
    script = EXAMPLES / "pytorch_synthetic_benchmark_elastic.py"
    job, _ = _kill_then_grow(tmp_path, script, [
        "--no-cuda", "--model", "resnet18", "--batch-size", "2", "--num-warmup-batches", "1",
        "--num-batches-per-iter", "2", "--num-iters", "40"], r"^Iter #\d+:")
    rc = job.finish()
    out = job.text
    assert rc == 0, out[-5000:]
    assert "rank 1 " in out and "1 rank lost" in out, out[-5000:]
    assert re.search(r"^Total img/sec on 3 CPU\(s\):", out, re.M), out[-5000:]


def test_pytorch_mnist_elastic_through_a_kill_and_a_regrow(tmp_path: Path) -> None:
    _need()
    data = tmp_path / "data"
    subprocess.run([sys.executable, str(WORKERS / "mnist_idx.py"), str(data), "--train",
                    "3000", "--test", "500"], check=True)
    script = EXAMPLES / "pytorch_mnist_elastic.py"
    # Back to its 2 slots, not beyond: the example builds torch's DistributedSampler once,
    # with the world size it started with, so ranks started into a larger world would cut
    # each epoch into other batches than the first rank (Horovod's ElasticSampler, as its
    # imagenet example uses, is what follows a resize; here such a job ends with a
    # DDLTimeoutError naming the ranks that did not submit, instead of running on).
    job, _ = _kill_then_grow(tmp_path, script, [
        "--no-cuda", "--epochs", "4", "--batch-size", "32", "--log-interval", "5",
        "--data-dir", str(data)], r"^Train Epoch:", grow_to=2)
    rc = job.finish()
    out = job.text
    assert rc == 0, out[-5000:]
    assert "rank 1 " in out and "1 rank lost" in out, out[-5000:]
    assert "spawn [['localhost', 1]]" in out, out[-5000:]  # the lost slot refilled
    assert re.search(r"^Train Epoch: 4 ", out, re.M), out[-5000:]
    assert re.search(r"^Test set: Average loss: [0-9.]+, Accuracy: [0-9.]+%", out, re.M), \
        out[-5000:]

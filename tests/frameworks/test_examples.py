"""ddl_core/examples run unchanged under ddlrun (and horovodrun) on 2 ranks, synthetic
data, and print tf_cnn_benchmarks' 'total images/sec' line once (rank 0)."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from conftest import BIN, EXAMPLES, ddlrun, need, run_job

pytestmark = pytest.mark.timeout(600)


def _images_per_sec(out: str) -> float:
    found = re.findall(r"^total images/sec: ([0-9.]+)$", out, re.M)
    assert len(found) == 1, out[-3000:]
    return float(found[0])


@pytest.mark.parametrize("script,args,module", [
    ("pytorch_ddp_ddl.py", ["--samples", "256", "--sync-bn"], "torch"),
    ("horovod_pytorch.py", ["--samples", "256"], "torch"),
    ("keras_mnist_ddl.py", ["--samples", "256", "--epochs", "1"], "tensorflow"),
    ("horovod_keras.py", ["--samples", "256", "--epochs", "1"], "tensorflow"),
])
def test_example_runs_under_ddlrun(script: str, args: list[str], module: str) -> None:
    need(module)
    proc = ddlrun(2, sys.executable, str(EXAMPLES / script), *args)
    assert _images_per_sec(proc.stdout) > 0


def test_horovod_example_runs_under_horovodrun() -> None:
    need("torch")
    proc = run_job([str(BIN / "horovodrun"), "-np", "2", "--mpi-args",
                    "--mca mpi_yield_when_idle 1", sys.executable,
                    str(EXAMPLES / "horovod_pytorch.py"), "--samples", "128"])
    assert _images_per_sec(proc.stdout) > 0


def test_fsdp2_example_matches_ddp_on_a_2d_mesh() -> None:
    """ddl_core/examples/fsdp2_ddl.py on 4 ranks (mesh 2 x 2, replicate x shard): its loss
    curve equals DDP's on the same batches (the example checks it and says OK) and falls."""
    need("torch")
    need("ddl_torch")
    proc = ddlrun(4, sys.executable, str(EXAMPLES / "fsdp2_ddl.py"), "--check-ddp",
                  "--steps", "6")
    assert "OK same loss curve as DDP" in proc.stdout, proc.stdout[-3000:]
    assert "mesh (2, 2)" in proc.stdout, proc.stdout[-3000:]
    losses = [float(m) for m in re.findall(r"^step +\d+ +loss ([0-9.]+)", proc.stdout, re.M)]
    assert len(losses) == 6 and losses[-1] < losses[0], losses


def _need_fault_tolerance() -> None:
    import ddl_core

    if not hasattr(ddl_core, "shrink_world"):
        pytest.skip("this ddl_core has no fault tolerance (libddl without ULFM)")


def _fsdp2_elastic(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """ddl_core/examples/fsdp2_elastic_ddl.py, 8 steps, under ddlrun --elastic on 4 ranks."""
    need("torch")
    need("ddl_torch")
    _need_fault_tolerance()
    return run_job([str(BIN / "ddlrun"), "--elastic", "-n", "4",
                    "--mpi-args=--mca mpi_yield_when_idle 1", sys.executable,
                    str(EXAMPLES / "fsdp2_elastic_ddl.py"), "--steps", "8", *args],
                   check=check)


@pytest.mark.parametrize("cpp", ["1", "0"], ids=["cpp-backend", "python-backend"])
def test_elastic_example_survives_a_lost_rank(cpp: str) -> None:
    """ddl_core/examples/pytorch_elastic_ddl.py under ddlrun --elastic on 3 ranks, rank 1
    SIGKILLed before step 10: the two survivors shrink the world, make a new process group,
    go back to the commit of step 10 (no committed step lost), finish with bit-identical
    parameters, and the job exits 0 naming the lost rank."""
    need("torch")
    _need_fault_tolerance()
    if cpp == "1":
        need("ddl_torch")
    proc = run_job([str(BIN / "ddlrun"), "--elastic", "-n", "3",
                    "--mpi-args=--mca mpi_yield_when_idle 1", sys.executable,
                    str(EXAMPLES / "pytorch_elastic_ddl.py"), "--steps", "20",
                    "--kill-rank", "1", "--kill-step", "10"], env={"DDL_TORCH_CPP": cpp})
    out = proc.stdout
    assert re.search(r"^reset 1: 2 ranks left, back to step 10 ", out, re.M), out[-3000:]
    assert re.search(r"^done: 20 steps on 2 ranks after 1 reset\(s\); parameters identical",
                     out, re.M), out[-3000:]
    assert "1 rank lost, 2 finished" in proc.stderr and "rank 1 " in proc.stderr, \
        proc.stderr[-3000:]


@pytest.mark.parametrize("kill,at,back_to", [("1", "step", 5), ("3", "commit", 4),
                                             ("0,2", "step", 5)],
                         ids=["rank-1-before-a-step", "last-rank-inside-a-commit",
                              "two-apart"])
def test_fsdp2_elastic_example_reshards_after_a_loss(kill: str, at: str, back_to: int) -> None:
    """ddl_core/examples/fsdp2_elastic_ddl.py under ddlrun --elastic on 4 ranks: the
    survivors put the state of the newest commit whose every shard one of them holds
    back together (a death inside a commit: the one before), shard it over the shrunk
    world, and the state they go on from is the one committed (its digest then and now);
    the job exits 0 naming the lost ranks."""
    proc = _fsdp2_elastic("--kill-rank", kill, "--kill-step", "5", "--kill-at", at)
    out, left = proc.stdout, 4 - len(kill.split(","))
    assert re.search(rf"^reset 1: {left} of 4 ranks left, back to step {back_to} .*; state "
                     r"identical to the commit \(", out, re.M), out[-3000:]
    assert re.search(rf"^done: 8 steps on {left} ranks after 1 reset\(s\)", out, re.M), \
        out[-3000:]
    losses = [float(m) for m in re.findall(r"^step +\d+ +loss ([0-9.]+)", out, re.M)]
    assert losses and losses[-1] < losses[0], losses
    lost = f"{4 - left} rank{'s' if left < 3 else ''} lost, {left} finished"
    assert lost in proc.stderr, proc.stderr[-3000:]


def test_fsdp2_elastic_example_ends_when_two_neighbours_die() -> None:
    """Ranks 1 and 2 lost together: nobody holds rank 1's shard any more; every survivor
    says so (restart from a checkpoint on disk) and the job ends non-zero, nobody hangs."""
    proc = _fsdp2_elastic("--kill-rank", "1,2", "--kill-step", "5", check=False)
    assert proc.returncode != 0, proc.stdout[-2000:]
    said = re.findall(r"^rank \d: ranks \[1, 2\] of 4 died and no survivor holds every shard "
                      r"\(two neighbours were lost\): restart from a checkpoint on disk$",
                      proc.stdout + proc.stderr, re.M)
    assert len(said) == 2, (proc.stdout + proc.stderr)[-3000:]

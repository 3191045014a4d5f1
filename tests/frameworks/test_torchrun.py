"""init_process_group("ddl") under torchrun: the processes torchrun starts become one MPI
job inside init (ddl_core/torch/torchrun_join.py: rank 0's mpirun runs a stand-in per rank
whose PMIx identity the rank takes over). Real torchrun, real mpirun, real DDP.

Each job gets its own TMPDIR, so what the join leaves (its directory, the stand-ins and
mpirun, whose command lines name that directory) is seen, and no other job's is; and
Open MPI's shared-memory segments made during the test must be gone or reclaimable."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest
from conftest import BIN, EXAMPLES, WORKERS, job_env

TORCHRUN = BIN / "torchrun"
JOB = WORKERS / "torchrun_job.py"


def _env(tmp: Path) -> dict[str, str]:
    """A job environment without any MPI launcher's variables (as torchrun is started from
    a login shell) and with a TMPDIR of its own."""
    env = {k: v for k, v in job_env().items()
           if not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_", "PRTE_"))}
    env["TMPDIR"] = str(tmp)
    return env


def _torchrun(tmp: Path, launch: list[str], script: Path, *args: str,
              timeout: float = 240) -> subprocess.CompletedProcess[str]:
    cmd = [str(TORCHRUN), *launch, str(script), *args]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=_env(tmp),
                          cwd=WORKERS)
    if proc.returncode != 0:
        pytest.fail(f"{' '.join(cmd)} exited {proc.returncode}\n--- stdout\n"
                    f"{proc.stdout[-5000:]}\n--- stderr\n{proc.stderr[-5000:]}")
    return proc


def _mentioning(text: str) -> list[str]:
    """Command lines of live processes that contain `text` (this job's TMPDIR)."""
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if text in cmdline:
            found.append(f"{pid}: {cmdline}")
    return found


SHM = Path("/dev/shm")
_shm_before: set[str] = set()


@pytest.fixture(autouse=True)
def _shm_snapshot() -> None:
    """What /dev/shm held before the test: Open MPI's segments made since are the job's."""
    _shm_before.clear()
    if SHM.is_dir():
        _shm_before.update(os.listdir(SHM))


def _shm_left() -> list[str]:
    """The job's shared memory nobody will remove: segments loose in /dev/shm, and job
    directories that the next run's reclaim (ddl_core.jobshm) does not take away."""
    from ddl_core import jobshm

    if not SHM.is_dir():
        return []
    jobshm.reclaim()
    return sorted(n for n in os.listdir(SHM) if n not in _shm_before
                  and n.startswith(("sm_segment.", jobshm.PREFIX)))


def _assert_nothing_left(tmp: Path, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while True:
        procs = _mentioning(str(tmp))
        dirs = sorted(p.name for p in tmp.glob("ddl-torchrun-*"))
        shm = [] if procs else _shm_left()
        if not procs and not dirs and not shm:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"left behind {within_s:g} s after the job: {procs} {dirs} "
                                 f"{shm}")
        time.sleep(0.1)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


STANDALONE = ["--standalone", "--nproc-per-node", "2"]


def test_ddp_example_runs_under_torchrun(tmp_path: Path) -> None:
    """The project's DDP example, unchanged, under `torchrun --nproc-per-node 2`."""
    proc = _torchrun(tmp_path, STANDALONE, EXAMPLES / "pytorch_ddp_ddl.py", "--samples", "256")
    assert "total images/sec" in proc.stdout, proc.stdout + proc.stderr[-3000:]
    _assert_nothing_left(tmp_path)


def test_ddp_under_torchrun_matches_one_process(tmp_path: Path) -> None:
    """DDP on ddl under torchrun: identical parameters on both ranks, equal to one process
    trained on the concatenated batches (the same worker as under mpirun)."""
    proc = _torchrun(tmp_path, STANDALONE, WORKERS / "torch_ddp.py", "ddl")
    assert proc.stdout.count("OK ddl") == 2, proc.stdout


def test_ddl_equals_gloo_under_torchrun(tmp_path: Path) -> None:
    """DDP on the ddl world and on a gloo group of the same torchrun job: same parameters."""
    proc = _torchrun(tmp_path, STANDALONE, JOB, "gloo")
    assert proc.stdout.count("OK gloo attempt 0") == 2, proc.stdout
    _assert_nothing_left(tmp_path)


def test_elastic_restart_makes_a_new_job(tmp_path: Path) -> None:
    """torchrun --nnodes=1:2 --max-restarts 1: a worker of attempt 0 dies, torchrun restarts
    the group, and attempt 1's ranks make a new MPI job (attempt 0's is gone) and finish."""
    launch = ["--nnodes", "1:2", "--nproc-per-node", "2", "--max-restarts", "1",
              "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
              "--rdzv-id", f"ddl-{os.getpid()}", "--rdzv-conf", "last_call_timeout=1"]
    proc = _torchrun(tmp_path, launch, JOB, "elastic")
    assert proc.stdout.count("OK elastic attempt 1") == 2, proc.stdout + proc.stderr[-3000:]
    assert "OK elastic attempt 0" not in proc.stdout, proc.stdout
    _assert_nothing_left(tmp_path)


@pytest.mark.parametrize("what", ["workers", "groups"])
def test_sigkill_leaves_nothing(tmp_path: Path, what: str) -> None:
    """SIGKILL of torchrun and its workers while the job runs (`workers`: each process;
    `groups`: each worker's whole process group, rank 0's mpirun with it): within 5 s no
    stand-in, no mpirun and no directory of the job is left."""
    cmd = [str(TORCHRUN), *STANDALONE, str(JOB), "hold"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=_env(tmp_path), cwd=WORKERS, start_new_session=True)
    pids: list[int] = []
    out = []
    deadline = time.monotonic() + 180
    assert proc.stdout is not None
    while len(pids) < 2 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        # (the two ranks share the pipe: their lines may run together)
        pids = [int(p) for p in re.findall(r"READY (\d+)", "".join(out))]
    assert len(pids) == 2, "".join(out)
    assert _mentioning(str(tmp_path)), "no stand-in was running"
    os.kill(proc.pid, signal.SIGKILL)
    for pid in pids:
        if what == "groups":
            os.killpg(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGKILL)
    proc.wait(timeout=30)
    _assert_nothing_left(tmp_path)


def test_refused_after_ddl_core_init(tmp_path: Path) -> None:
    """ddl_core.init() before init_process_group under torchrun made each process a job
    of one: init_process_group says so and what to do, on every rank."""
    cmd = [str(TORCHRUN), *STANDALONE, str(WORKERS / "torch_rendezvous.py"), "torchrun"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                          env=_env(tmp_path), cwd=WORKERS)
    assert proc.returncode != 0, proc.stdout
    assert "after libddl was initialised alone" in proc.stderr, proc.stderr[-4000:]
    assert "call it before ddl_core.init()" in proc.stderr, proc.stderr[-4000:]


def test_host_spec_keeps_rank_order() -> None:
    """mpirun's --host for the ranks' hosts in RANK order; a host in two runs is refused."""
    from ddl_core.torch.torchrun_join import JoinError, host_spec

    assert host_spec(["a", "a", "b", "b"]) == "a:2,b:2"
    assert host_spec(["a"]) == "a:1"
    with pytest.raises(JoinError, match="not contiguous"):
        host_spec(["a", "b", "a"])

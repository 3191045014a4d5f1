"""Real Slurm (Debian's slurm-wlm: munged, slurmctld, one slurmd per emulated host) on
the emulated cluster, brought up once for the module: srun, salloc and sbatch running
ddlrun jobs, failures, scancel, a node dying under a job, and TensorFlow's own
MultiWorkerMirroredStrategy across hosts with the TF_CONFIG ddlrun gives each rank.
Skipped, with the reason, without root / ip netns or without Slurm installed."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from clusterkit import BIN, REASON, WORKERS, places, unique
from ddl_tools import cluster, slurmcluster

try:
    slurmcluster.check_installed()
    NO_SLURM = None
except slurmcluster.SlurmError as e:
    NO_SLURM = str(e)

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(REASON is not None, reason=f"emulated cluster: {REASON}"),
              pytest.mark.skipif(NO_SLURM is not None, reason=f"Slurm: {NO_SLURM}")]

DDLRUN = str(BIN / "ddlrun")
PY = sys.executable


@pytest.fixture(scope="module")
def slurm2() -> Iterator[cluster.Cluster]:
    with cluster.running(unique("s"), hosts=2, slurm=True) as c:
        yield c
    # what the jobs left in the filesystem the namespaces share (Open MPI session dirs of
    # directly launched ranks, shared memory of killed ones) went with the cluster
    left = [p for d in ("/tmp", "/dev/shm") for p in Path(d).glob(f"*ddlc-{c.name}-*")]
    assert not left, left


def on(c: cluster.Cluster, *argv: str, env: dict[str, str] | None = None,
       timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """Run argv on the cluster's first host, as `cluster run --name` does."""
    cmd, full = cluster.run_argv(c, list(argv))
    full.update({"PYTHONUNBUFFERED": "1", "DDL_TIMEOUT": "60", **(env or {})})
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)


def cluster_procs(c: cluster.Cluster, needle: str) -> list[str]:
    """Processes in any of the cluster's namespaces whose command line holds needle."""
    out = []
    for ns in cluster._resources(c.name)["namespaces"]:
        for pid in cluster._pids_in(ns):
            try:
                args = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if needle in args:
                out.append(f"{ns} {pid} {args}")
    return out


def job_field(c: cluster.Cluster, job: str, field: str) -> str:
    p = on(c, "scontrol", "show", "job", job)
    m = re.search(rf"\b{field}=(\S+)", p.stdout)
    return m.group(1) if m else ""


def wait_for(pred: object, timeout: float, step: float = 0.2) -> float:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():  # type: ignore[operator]
            return time.monotonic() - t0
        time.sleep(step)
    raise AssertionError(f"not within {timeout} s")


def batch(tmp_path: Path, name: str, body: str) -> Path:
    script = tmp_path / name
    script.write_text("#!/bin/sh\n" + body + "\n")
    script.chmod(0o755)
    return script


def test_srun_runs_on_both_hosts(slurm2: cluster.Cluster) -> None:
    p = on(slurm2, "sinfo", "-h", "-o", "%D %T")
    assert p.stdout.split() == ["2", "idle"], p.stdout
    p = on(slurm2, "srun", "-N", "2", "-n", "4", "hostname")
    assert p.returncode == 0, p.stderr
    assert sorted(p.stdout.split()) == sorted(slurm2.hosts * 2)


def test_salloc_ddlrun_takes_the_allocation(slurm2: cluster.Cluster) -> None:
    p = on(slurm2, "salloc", "-N", "2", "-n", "4", DDLRUN, "-v", PY,
           str(WORKERS / "collectives.py"))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    h0, h1 = slurm2.hosts
    assert f"# placement: {h0}:2, {h1}:2; grid 2x2" in p.stderr
    assert "srun --mpi=pmix --kill-on-bad-exit=1 --nodes 2 --ntasks 4 --ntasks-per-node 2" \
        in p.stderr
    rows = places(p)
    assert [r["rank"] for r in rows] == [0, 1, 2, 3]
    assert [r["host"] for r in rows] == [h0, h0, h1, h1]  # consecutive ranks share a host
    assert all(r["topology"] == [2, 2] and r["local_size"] == 2 for r in rows)
    assert p.stdout.count("OK collectives") == 4
    # an uneven placement inside the allocation: Slurm's arbitrary distribution
    p = on(slurm2, "salloc", "-N", "2", "-n", "4", DDLRUN, "-v", "-n", "3", PY,
           str(WORKERS / "collectives.py"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert "--distribution arbitrary" in p.stderr
    assert [r["host"] for r in places(p)] == [h0, h0, h1]
    assert p.stdout.count("OK collectives") == 3


def test_srun_direct_launch_and_its_missing_pmi(slurm2: cluster.Cluster) -> None:
    p = on(slurm2, "srun", "--mpi=pmix", "-N", "2", "-n", "4", PY,
           str(WORKERS / "collectives.py"))
    assert p.returncode == 0, p.stderr[-3000:]
    assert [r["topology"] for r in places(p)] == [[2, 2]] * 4
    # Slurm's default MpiDefault=none: each task would be a one-rank job; ddl says so
    p = on(slurm2, "srun", "-N", "2", "-n", "2", PY, "-c", "import ddl_core; ddl_core.init()")
    assert p.returncode != 0
    assert p.stderr.count("the launcher started 2 processes but MPI sees a job of 1") == 2
    assert "srun --mpi=pmix" in p.stderr


def test_sbatch_wait_runs_ddlrun(slurm2: cluster.Cluster, tmp_path: Path) -> None:
    script = batch(tmp_path, "job.sh", f"#SBATCH -N 2\n#SBATCH --ntasks-per-node=2\n"
                   f"exec {DDLRUN} {PY} {WORKERS / 'collectives.py'}")
    out = tmp_path / "job.out"
    p = on(slurm2, "sbatch", "--wait", "-o", str(out), str(script))
    assert p.returncode == 0, p.stderr + out.read_text()[-3000:]
    text = out.read_text()
    assert text.count("OK collectives") == 4, text[-3000:]
    assert sorted(json.loads(ln[6:])["host"] for ln in text.splitlines()
                  if ln.startswith("PLACE ")) == sorted(slurm2.hosts * 2)


def test_a_failed_job_fails(slurm2: cluster.Cluster, tmp_path: Path) -> None:
    # rank 1 dies with status 3 (no MPI_Finalize, as a crash would), the others wait
    fail = [PY, "-c", "import os, time, ddl_core as d; d.init(); "
            "os._exit(3) if d.rank() == 1 else time.sleep(60)"]
    t0 = time.monotonic()
    p = on(slurm2, "salloc", "-N", "2", "-n", "4", DDLRUN, *fail)
    # srun ends the step when a rank fails (--kill-on-bad-exit); its exit status is the
    # highest of the tasks', here 128+SIGTERM of the ranks it stopped
    assert p.returncode != 0 and time.monotonic() - t0 < 40
    # srun names the failed task; on a loaded host slurmstepd may report the whole step as
    # killed (by --kill-on-bad-exit) before task 1's status reaches srun
    assert "task 1: Exited with exit code 3" in p.stderr or re.search(
        r"tasks? [\d,-]+: Killed", p.stderr), p.stderr
    script = batch(tmp_path, "fail.sh", f"exec {DDLRUN} {' '.join(fail[:2])} '{fail[2]}'")
    p = on(slurm2, "sbatch", "--wait", "-N", "2", "-n", "4", "-o", str(tmp_path / "f.out"),
           str(script))
    assert p.returncode != 0, p.stdout
    job = re.search(r"Submitted batch job (\d+)", p.stdout).group(1)  # type: ignore[union-attr]
    assert job_field(slurm2, job, "JobState") == "FAILED"
    assert job_field(slurm2, job, "ExitCode") != "0:0"


def test_allocation_smaller_than_n_gets_slurms_error(slurm2: cluster.Cluster) -> None:
    p = on(slurm2, "salloc", "-N", "2", "-n", "4", DDLRUN, "-n", "8", PY, "-c", "pass")
    assert p.returncode != 0
    assert "More processors requested than permitted" in p.stderr, p.stderr


def test_srun_launcher_outside_an_allocation(slurm2: cluster.Cluster) -> None:
    p = on(slurm2, DDLRUN, "--launcher", "srun", "-n", "2", PY, "-c", "pass")
    assert p.returncode == 2
    assert "ddlrun: error: not inside a Slurm allocation" in p.stderr and "Traceback" \
        not in p.stderr


def _start_loop_job(c: cluster.Cluster, tmp_path: Path, marker: str,
                    env: dict[str, str] | None = None) -> tuple[str, Path]:
    out = tmp_path / f"{marker}.out"
    script = batch(tmp_path, f"{marker}.sh",
                   f"exec {DDLRUN} {PY} {WORKERS / 'allreduce_loop.py'} {marker}")
    p = on(c, "sbatch", "-N", "2", "-n", "4", "-o", str(out), str(script), env=env)
    assert p.returncode == 0, p.stderr
    job = p.stdout.split()[-1]
    wait_for(lambda: out.is_file() and out.read_text().count("READY ") == 4, 60)
    assert len(cluster_procs(c, marker)) >= 4
    return job, out


def test_scancel_stops_every_rank(slurm2: cluster.Cluster, tmp_path: Path) -> None:
    marker = f"scancel-{slurm2.name}"
    job, _ = _start_loop_job(slurm2, tmp_path, marker)
    p = on(slurm2, "scancel", job)
    assert p.returncode == 0, p.stderr
    took = wait_for(lambda: not cluster_procs(slurm2, marker)
                    and not cluster_procs(slurm2, "slurmstepd")  # no step left on any host
                    and not on(slurm2, "squeue", "-h", "-j", job).stdout.strip(), 30)
    assert took < slurmcluster.KILL_WAIT_S + 10
    assert job_field(slurm2, job, "JobState") == "CANCELLED"


def test_a_node_dying_fails_the_job_within_ddl_timeout(slurm2: cluster.Cluster,
                                                       tmp_path: Path) -> None:
    timeout_s = 20
    marker = f"nodedeath-{slurm2.name}"
    job, out = _start_loop_job(slurm2, tmp_path, marker, env={"DDL_TIMEOUT": str(timeout_s)})
    dead = slurm2.hosts[1]
    try:
        for pid in cluster._pids_in(dead):  # the node's slurmd, its step and its ranks
            os.kill(pid, signal.SIGKILL)
        took = wait_for(lambda: not cluster_procs(slurm2, marker)
                        and not cluster_procs(slurm2, "slurmstepd")
                        and job_field(slurm2, job, "JobState") not in ("RUNNING", "PENDING"),
                        timeout_s + 10)
        assert took <= timeout_s, f"the job took {took:.1f} s to fail"
    finally:
        slurmcluster.start_node(slurm2, dead)  # the node comes back for what follows
        slurmcluster.wait_idle(slurm2, 90)
    assert job_field(slurm2, job, "JobState") in ("FAILED", "NODE_FAIL"), out.read_text()


def test_multiworker_mirrored_strategy_across_hosts(slurm2: cluster.Cluster) -> None:
    # Keras 3's fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585);
    # TensorFlow's documented way to the Keras 2 API, tf-keras, runs it.
    pytest.importorskip("tf_keras")
    p = on(slurm2, "salloc", "-N", "2", "-n", "2", DDLRUN, PY,
           str(WORKERS / "tf_mwms.py"), env={"TF_USE_LEGACY_KERAS": "1"}, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    rows = sorted((json.loads(ln[4:]) for ln in p.stdout.splitlines()
                   if ln.startswith("TFW ")), key=lambda r: r["index"])
    assert [r["index"] for r in rows] == [0, 1]
    assert [r["host"] for r in rows] == slurm2.hosts
    assert all(r["replicas"] == 2 for r in rows)  # one strategy spanning both hosts
    # different seeds and data per worker: equal only because gradients were averaged
    assert rows[0]["weights"] == rows[1]["weights"]


def test_cli_slurm_up_run_down(tmp_path: Path) -> None:
    name = unique("u")
    py = [PY, "-m", "ddl_tools.cluster"]
    up = subprocess.run([*py, "up", "--name", name, "--hosts", "2", "--slurm"],
                        capture_output=True, text=True, timeout=120)
    try:
        assert up.returncode == 0, up.stderr
        m = re.search(r"slurm: 2 nodes idle [\d.]+ s after the first daemon started; up took "
                      r"([\d.]+) s", up.stdout)
        assert m and float(m.group(1)) <= 30, up.stdout
        run = subprocess.run([*py, "run", "--name", name, "--", "sh", "-c",
                              "hostname; sinfo -h -o '%D %T'"],
                             capture_output=True, text=True, timeout=60)
        assert run.stdout.split() == [f"ddlc-{name}-h0", "2", "idle"], run.stderr
        st = subprocess.run([*py, "status"], capture_output=True, text=True).stdout
        assert re.search(rf"^{name}: 2 hosts .* processes, slurm$", st, re.M), st
        again = subprocess.run([*py, "run", "--name", name, "--hosts", "3", "--", "true"],
                               capture_output=True, text=True)
        assert again.returncode == 2 and "is up already" in again.stderr
    finally:
        down = subprocess.run([*py, "down", "--name", name], capture_output=True, text=True,
                              timeout=60)
    assert down.returncode == 0 and re.search(r"removed \d+ resources in ([\d.]+) s",
                                              down.stdout), down.stdout
    assert cluster._resources(name) == {"namespaces": [], "links": []}
    assert not (cluster.STATE_DIR / name).exists()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"/{name}/slurm/" not in ps


def test_up_failing_half_way_leaves_nothing(tmp_path: Path) -> None:
    # munged and slurmctld start, then slurmd refuses: everything made so far must go
    sbin = tmp_path / "sbin"
    sbin.mkdir()
    for d in ("munged", "slurmctld"):
        (sbin / d).symlink_to(slurmcluster.sbin(d))
    (sbin / "slurmd").write_text("#!/bin/sh\necho 'slurmd: fatal: refused by the test' >&2\n"
                                 "exit 1\n")
    (sbin / "slurmd").chmod(0o755)
    name = unique("f")
    up = [PY, "-m", "ddl_tools.cluster", "up", "--name", name, "--hosts", "2", "--slurm"]
    # no daemons at all: refused before anything is made
    p = subprocess.run(up, capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, DDL_SLURM_SBIN=str(tmp_path)))
    assert p.returncode == 2 and p.stderr.strip() == (
        f"ddl_tools.cluster: error: DDL_SLURM_SBIN={tmp_path} holds no executable munged")
    assert cluster._resources(name) == {"namespaces": [], "links": []}
    p = subprocess.run([*up[:-1], "--cpus", "4"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "--cpus is the CPU count of each Slurm node: it needs " \
        "--slurm" in p.stderr
    p = subprocess.run(up, capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, DDL_SLURM_SBIN=str(sbin)))
    assert p.returncode == 2, p.stdout + p.stderr
    assert f"slurmd on ddlc-{name}-h0 did not start (exit 1): slurmd: fatal: refused by the " \
        "test" in p.stderr and "(the cluster was removed)" in p.stderr
    assert "Traceback" not in p.stderr
    assert cluster._resources(name) == {"namespaces": [], "links": []}
    assert not (cluster.STATE_DIR / name).exists()
    assert not (cluster.STATE_DIR / f"{name}.json").exists()
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert f"/{name}/slurm/" not in ps  # munged and slurmctld were stopped
    assert not list(Path("/etc/netns").glob(f"ddlc-{name}-*"))

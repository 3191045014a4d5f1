"""`down` leaves nothing running, so a failure test can take a host (or the whole cluster)
down and bring it up again at once: every process it ended is gone by its pid when it
returns (reaped, not a zombie: pgrep and a new slurmd's pid-file check still see a
zombie), with no namespace, link, netns mount or pid file left; `down --host` takes one
host away while the others keep running, and `up --host` brings it back.

Skipped, with the reason, without root / ip netns; the Slurm cases also without Slurm."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from clusterkit import BIN, REASON, unique
from ddl_tools import cluster, slurmcluster

try:
    slurmcluster.check_installed()
    NO_SLURM = None
except slurmcluster.SlurmError as e:
    NO_SLURM = str(e)

pytestmark = [pytest.mark.cluster,
              pytest.mark.skipif(REASON is not None, reason=f"emulated cluster: {REASON}")]
needs_slurm = pytest.mark.skipif(NO_SLURM is not None, reason=f"Slurm: {NO_SLURM}")
CLI = [sys.executable, "-m", "ddl_tools.cluster"]


def start_time(pid: int) -> int | None:
    st = cluster._proc_state(pid)
    return st[1] if st else None


def processes(namespaces: list[str]) -> dict[int, int]:
    """pid -> start time of every process now in the namespaces."""
    found = {p: start_time(p) for ns in namespaces for p in cluster._pids_in(ns)}
    return {p: t for p, t in found.items() if t is not None}


def still_there(procs: dict[int, int]) -> list[str]:
    """Those of `procs` that a /proc scan still finds (zombies included), with state."""
    out = []
    for pid, t in procs.items():
        if start_time(pid) == t:
            stat = Path(f"/proc/{pid}/stat").read_text()
            out.append(f"{pid} {stat[stat.find('(') + 1:stat.rfind(')')]} "
                       f"{stat[stat.rfind(')') + 2]}")
    return out


def detach_sleeper(host: str) -> None:
    """A process that is a child of pid 1 in `host` (as a daemon is after it detached)."""
    subprocess.run(["ip", "netns", "exec", host, "sh", "-c", "sleep 300 >/dev/null 2>&1 &"],
                   check=True, timeout=10)


def cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout)


def test_down_returns_once_every_process_is_reaped_and_up_works_at_once() -> None:
    name = unique("d")
    c = cluster.up(name, hosts=2)
    try:
        for h in c.hosts:
            detach_sleeper(h)
        procs = processes(c.hosts)
        assert len(procs) >= 2, procs
    finally:
        down = cli("down", "--name", name)
    assert down.returncode == 0, down.stderr
    assert still_there(procs) == []  # before: each sleeper a zombie of pid 1 for ~1 s
    assert cluster._resources(name) == {"namespaces": [], "links": []}
    assert cluster._netns_mounts(f"ddlc-{name}-") == []
    c = cluster.up(name, hosts=2)  # at once, same name
    try:
        p = subprocess.run(c.exec_argv(c.hosts[1], ["hostname"]), capture_output=True,
                           text=True, timeout=30)
        assert p.stdout.strip() == c.hosts[1]
    finally:
        cluster.down(name)


def test_down_host_leaves_the_others_and_up_host_brings_it_back() -> None:
    name = unique("o")
    c = cluster.up(name, hosts=2, link="1gbit")
    try:
        dead, alive = c.hosts[1], c.hosts[0]
        for h in c.hosts:
            detach_sleeper(h)
        dead_procs, alive_procs = processes([dead]), processes([alive])
        p = cli("down", "--name", name, "--host", dead)
        assert p.returncode == 0 and f"host {dead} down in" in p.stdout, p.stderr
        assert still_there(dead_procs) == []
        assert sorted(still_there(alive_procs)) and len(still_there(alive_procs)) == \
            len(alive_procs)  # the other host's processes run on, same pids
        assert dead not in cluster._resources(name)["namespaces"]
        assert not Path(f"/etc/netns/{dead}").exists()
        # a job on what is left runs; one naming the dead host fails by name, fast
        run = [str(BIN / "ddlrun"), *c.ddlrun_args()]
        ok = subprocess.run([*run, "-H", alive, "hostname"], capture_output=True, text=True,
                            timeout=120)
        assert ok.returncode == 0 and ok.stdout.split() == [alive], ok.stderr
        t0 = time.monotonic()
        bad = subprocess.run([*run, "-H", dead, "hostname"], capture_output=True, text=True,
                             timeout=120)
        assert bad.returncode != 0 and dead in bad.stderr and time.monotonic() - t0 < 30
        again = cli("down", "--name", name, "--host", dead)  # idempotent
        assert again.returncode == 0, again.stderr
        p = cli("up", "--name", name, "--host", dead)
        assert p.returncode == 0 and f"host {dead} up in" in p.stdout, p.stderr
        twice = cli("up", "--name", name, "--host", dead)
        assert twice.returncode == 2 and "is up already" in twice.stderr
        both = subprocess.run([*run, "hostname"], capture_output=True, text=True,
                              timeout=120)
        assert both.returncode == 0 and sorted(both.stdout.split()) == c.hosts, both.stderr
        tc = subprocess.run(["ip", "netns", "exec", dead, "tc", "qdisc", "show", "dev",
                             "eth0"], capture_output=True, text=True).stdout
        assert "tbf" in tc  # its link is shaped again
        nope = cli("down", "--name", name, "--host", "ddlc-nosuch-h0")
        assert nope.returncode == 2 and "is not in cluster" in nope.stderr
    finally:
        cluster.down(name)


@needs_slurm
def test_slurm_daemons_are_gone_when_down_returns_and_a_node_comes_back() -> None:
    name = unique("sd")
    c = cluster.up(name, hosts=2, slurm=True)
    try:
        env = dict(os.environ, **c.job_env())
        daemons = processes([c.ctl, *c.hosts])
        assert len(daemons) >= 4  # munged, slurmctld, a slurmd per host
        # one node dies and comes back at once; the controller and the other node stay
        dead = c.hosts[1]
        node_procs, others = processes([dead]), processes([c.ctl, c.hosts[0]])
        took = cluster.host_down(name, dead)
        assert still_there(node_procs) == [], took
        assert len(still_there(others)) == len(others)
        assert not (slurmcluster.node_dir(c, dead) / "slurmd.pid").exists()
        cluster.host_up(name, dead)
        p = subprocess.run(cluster.run_argv(c, ["srun", "-N", "2", "-n", "2", "hostname"])[0],
                           capture_output=True, text=True, timeout=60, env=env)
        assert p.returncode == 0 and sorted(p.stdout.split()) == c.hosts, p.stderr
        daemons = processes([c.ctl, *c.hosts])
    finally:
        down = cli("down", "--name", name)
    assert down.returncode == 0, down.stderr
    # before this was fixed, slurmctld, slurmd and munged were zombies here for ~1.1 s
    assert still_there(daemons) == []
    assert not (cluster.STATE_DIR / name).exists()  # pid files, logs, spool
    assert cluster._netns_mounts(f"ddlc-{name}-") == []
    c = cluster.up(name, hosts=2, slurm=True)  # at once: no old pid file or port in the way
    cluster.down(name)


@needs_slurm
def test_a_killed_rank_leaves_no_segment_on_any_host() -> None:
    # ddlrun's job directory (ddl_core/jobshm.py) on the emulated hosts: ranks through the
    # launch agent (mpirun) and through Slurm (salloc + ddlrun -> srun), the rank killed
    # being on the second host
    worker = Path(__file__).parents[1] / "ddl_core" / "workers" / "leftovers.py"
    name = unique("m")
    c = cluster.up(name, hosts=2, slurm=True)
    try:
        env = {"LEFTOVERS_VICTIM": "3", "PYTHONUNBUFFERED": "1", "DDL_TIMEOUT": "30"}
        ddlrun = str(BIN / "ddlrun")
        agent = subprocess.run([ddlrun, *c.ddlrun_args(), "--accelerators", "2", sys.executable,
                                str(worker), "kill"], capture_output=True, text=True,
                               timeout=180, env=dict(os.environ, **env))
        argv, full = cluster.run_argv(c, ["salloc", "-N", "2", "-n", "4", ddlrun,
                                          sys.executable, str(worker), "kill"])
        slurm = subprocess.run(argv, capture_output=True, text=True, timeout=180,
                               env=dict(full, **env))
        # under srun (--kill-on-bad-exit) the killed rank's report to ddlrun races the
        # step's SIGKILL of every wrapper and is sometimes lost (about half the runs here),
        # so only the launch-agent job is held to naming it; both must fail and leave nothing
        assert "rank 3 was killed by signal 9" in agent.stderr, agent.stderr[-2000:]
        for p in (agent, slurm):
            assert p.returncode != 0, p.stdout[-2000:] + p.stderr[-2000:]
            segs = {ln.split()[1] for ln in p.stdout.splitlines() if ln.startswith("SEG ")}
            dirs = {ln.split()[2] for ln in p.stdout.splitlines() if ln.startswith("DIR ")}
            assert len(dirs) == 1 and {Path(s).name.split(".")[1] for s in segs} == \
                set(c.hosts), (segs, dirs)  # both hosts' segments, in the job's directory
            assert [s for s in segs | dirs if os.path.lexists(s)] == []
    finally:
        cluster.down(name)

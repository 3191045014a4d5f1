"""ddlrun across emulated hosts: placement, detected topology, collectives, overrides,
clear errors, and clean teardown (network namespaces, veths, bridge, processes)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time

import pytest
from clusterkit import BIN, WORKERS, ddlrun, needs_netns, places, unique
from ddl_tools import cluster

pytestmark = [pytest.mark.cluster, needs_netns]


@pytest.mark.parametrize("hosts,per_host", [(2, 1), (2, 2), (3, 1), (3, 2)])
def test_placement_topology_and_collectives(cluster3: cluster.Cluster, hosts: int,
                                            per_host: int) -> None:
    names = cluster3.hosts[:hosts]
    proc = ddlrun(*cluster3.ddlrun_args(), "-H", ",".join(names), "--accelerators",
                  str(per_host), sys.executable, str(WORKERS / "collectives.py"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = places(proc)
    assert [r["rank"] for r in rows] == list(range(hosts * per_host))
    for r in rows:
        # consecutive ranks share a host, and each rank sees its host's own hostname
        assert r["host"] == names[r["rank"] // per_host]  # type: ignore[operator]
        assert r["local_rank"] == r["rank"] % per_host  # type: ignore[operator]
        assert r["local_size"] == per_host
        # detected across hosts: ranks per host x hosts (one level when a host has one)
        assert r["topology"] == ([per_host, hosts] if per_host > 1 else [hosts])
    assert proc.stdout.count("OK collectives") == hosts * per_host


@pytest.mark.parametrize("grid,expect", [("4", [4]), ("2x2", [2, 2])])
def test_ddl_topology_overrides_detection(cluster3: cluster.Cluster, grid: str,
                                          expect: list[int]) -> None:
    proc = ddlrun(*cluster3.ddlrun_args(), "-H", ",".join(cluster3.hosts[:2]),
                  "--accelerators", "2", "-x", f"DDL_TOPOLOGY={grid}", sys.executable,
                  str(WORKERS / "collectives.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all(r["topology"] == expect for r in places(proc))
    assert proc.stdout.count("OK collectives") == 4


def test_racks_make_a_third_level(cluster3: cluster.Cluster) -> None:
    # 3 hosts x 2 ranks as 3 racks of one host: grid 2x1x3 -> levels (2, 3) after the
    # extent-1 level is dropped; what matters is that ddlrun set it, not detection.
    proc = ddlrun("-v", *cluster3.ddlrun_args(), "--accelerators", "2", "--racks", "3",
                  sys.executable, str(WORKERS / "collectives.py"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "DDL_TOPOLOGY=2x1x3" in proc.stderr
    assert all(r["topology"] == [2, 3] for r in places(proc))


def test_unknown_hosts_fail_fast_and_by_name(cluster3: cluster.Cluster) -> None:
    t0 = time.time()
    proc = ddlrun(*cluster3.ddlrun_args(), "-H", f"{cluster3.hosts[0]},nosuchhost", "true")
    assert proc.returncode == 2 and "host 'nosuchhost' is not in cluster" in proc.stderr
    proc = ddlrun("-H", "nosuchhost.invalid:2", "true")
    assert proc.returncode == 2
    assert "host nosuchhost.invalid: unknown host" in proc.stderr
    assert time.time() - t0 < 20
    proc = subprocess.run([sys.executable, "-m", "ddl_tools.cluster", "ddlrun", "--name", "nosuch",
                           "--", "true"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "no emulated cluster named 'nosuch'" in proc.stderr


def _leftovers(name: str) -> tuple[list[str], list[str], list[str]]:
    res = cluster._resources(name)
    token = f"ddlc-{name}-"
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    procs = [line for line in ps.splitlines() if token in line and "ps -eo" not in line]
    return res["namespaces"], res["links"], procs


def test_killed_run_then_down_leaves_nothing() -> None:
    name = unique("k")
    c = cluster.up(name, hosts=2, link="100mbit")
    try:
        marker = f"sleep-{name}"
        proc = subprocess.Popen(
            [str(BIN / "ddlrun"), *c.ddlrun_args(), "--accelerators", "2", sys.executable,
             "-c", f"import time, sys; sys.argv.append('{marker}'); time.sleep(300)",
             marker], env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 60
        while time.time() < deadline and sum(len(cluster._pids_in(h)) for h in c.hosts) < 4:
            time.sleep(0.2)
        assert sum(len(cluster._pids_in(h)) for h in c.hosts) >= 4, "ranks never started"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        gone = cluster.down(name)
    assert gone  # it found and removed things
    ns, links, procs = _leftovers(name)
    assert (ns, links) == ([], [])
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
    assert marker not in ps
    assert not procs
    assert cluster.down(name) == []  # idempotent
    assert not (cluster.STATE_DIR / f"{name}.json").exists()


def test_interrupted_cluster_run_removes_its_cluster() -> None:
    name = unique("i")
    proc = subprocess.Popen(
        [sys.executable, "-m", "ddl_tools.cluster", "run", "--name", name, "--hosts", "2",
         "--",
         "--accelerators", "1", sys.executable, "-c", "import time; time.sleep(300)"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and not any(
            cluster._pids_in(h) for h in cluster._resources(name)["namespaces"]):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    ns, links, procs = _leftovers(name)
    assert (ns, links, procs) == ([], [], []), err


def test_cluster_cli_up_status_down() -> None:
    name = unique("c")
    py = [sys.executable, "-m", "ddl_tools.cluster"]
    up = subprocess.run([*py, "up", "--name", name, "--hosts", "2", "--link", "300mbit"],
                        capture_output=True, text=True, timeout=60)
    try:
        assert up.returncode == 0, up.stderr
        again = subprocess.run([*py, "up", "--name", name], capture_output=True, text=True)
        assert again.returncode == 2 and "already up" in again.stderr
        st = subprocess.run([*py, "status"], capture_output=True, text=True).stdout
        assert re.search(rf"^{name}: 2 hosts .* link 300mbit", st, re.M), st
        for i, h in enumerate((f"ddlc-{name}-h0", f"ddlc-{name}-h1")):
            tc = subprocess.run(["ip", "netns", "exec", h, "tc", "qdisc", "show", "dev", "eth0"],
                                capture_output=True, text=True).stdout
            assert "tbf" in tc and "300Mbit" in tc
            v = subprocess.run(["tc", "qdisc", "show", "dev", f"dc{name}h{i}"],
                               capture_output=True, text=True).stdout
            assert "300Mbit" in v  # both directions are shaped
    finally:
        down = subprocess.run([*py, "down", "--name", name], capture_output=True, text=True)
    assert down.returncode == 0 and "removed" in down.stdout
    down2 = subprocess.run([*py, "down", "--name", name], capture_output=True, text=True)
    assert down2.returncode == 0 and "nothing to remove" in down2.stdout
    assert _leftovers(name) == ([], [], [])


def test_refuses_clearly_without_root() -> None:
    # A user namespace makes the process non-root (euid 65534) while files are still read
    # with the caller's credentials, so this works wherever the checkout is (setpriv to
    # nobody cannot read a clone under a root-only directory such as mktemp -d makes).
    if not shutil_which("unshare"):
        pytest.skip("unshare (util-linux) is not installed")
    proc = subprocess.run(["unshare", "--map-user=65534", "--map-group=65534",
                           sys.executable, "-m", "ddl_tools.cluster", "up", "--name", "x"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert "needs root" in proc.stderr


def shutil_which(name: str) -> str | None:
    import shutil

    return shutil.which(name)

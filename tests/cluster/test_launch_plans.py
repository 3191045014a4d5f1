"""ddlrun's launch plans without launching: placement, rankfile, racks, srun/jsrun
commands, launcher choice, host checks. No root needed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ddl_core.runner.launcher import (
    LaunchError,
    Plan,
    build_command,
    build_jsrun,
    build_srun,
    check_hosts,
    choose_launcher,
    grid_for,
    parse_hosts,
    place,
    rankfile_text,
)
from ddl_core.runner.slurmalloc import Allocation

BIN = Path(sys.executable).parent
# What Slurm puts in a job's environment (salloc -N 3 -n 6 on nodes node[1-3]).
ALLOC = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-3]", "SLURM_TASKS_PER_NODE":
         "2(x3)", "SLURM_NTASKS": "6", "SLURM_JOB_NUM_NODES": "3"}


def dry(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "ddlrun"), "--dry-run", *args], capture_output=True,
                          text=True, timeout=60, env=dict(os.environ, **(env or {})))


def test_consecutive_ranks_share_a_host() -> None:
    plan = Plan(command=["x"], hosts=parse_hosts("a,b,c:4"), accelerators=2)
    assert place(plan) == [("a", 2), ("b", 2), ("c", 2)]
    plan = Plan(command=["x"], hosts=parse_hosts("a:3,b:3"))  # slots when no GPUs
    assert place(plan) == [("a", 3), ("b", 3)]
    assert place(plan, gpus={"a": 4, "b": 4}) == [("a", 4), ("b", 4)]  # GPUs win over slots
    plan = Plan(command=["x"], np=5, hosts=parse_hosts("a:4,b:4"))
    assert place(plan) == [("a", 4), ("b", 1)]
    plan = Plan(command=["x"], np=6, hosts=parse_hosts("a,b,c"))  # -n spread in blocks
    assert place(plan) == [("a", 2), ("b", 2), ("c", 2)]
    with pytest.raises(LaunchError, match="hold 4"):
        place(Plan(command=["x"], np=9, hosts=parse_hosts("a:2,b:2")))
    assert rankfile_text([("a", 2), ("b", 2)]) == (
        "rank 0=a slot=0\nrank 1=a slot=1\nrank 2=b slot=0\nrank 3=b slot=1\n")


def test_grid_and_racks() -> None:
    assert grid_for([("a", 4), ("b", 4)], None) == "4x2"
    assert grid_for([(h, 4) for h in "abcd"], 2) == "4x2x2"
    assert grid_for([("a", 4), ("b", 2)], None) is None
    with pytest.raises(LaunchError, match="cannot be split"):
        grid_for([(h, 4) for h in "abc"], 2)


def test_openmpi_command_uses_a_rankfile() -> None:
    plan = Plan(command=["python", "t.py"], hosts=parse_hosts("n1,n2"), accelerators=2)
    plan.placement = place(plan)
    cmd = build_command(plan, "mpirun", "openmpi", {}, cores=8)
    assert cmd[:5] == ["mpirun", "-n", "4", "--host", "n1:2,n2:2"]
    rf = cmd[cmd.index("--map-by") + 1]
    assert rf.startswith("rankfile:file=")
    assert Path(rf.split("=", 1)[1]).read_text().splitlines()[2] == "rank 2=n2 slot=0"


def test_dry_run_prints_each_launcher(tmp_path: Path) -> None:
    p = dry("-H", "node1,node2,node3,node4", "--accelerators", "4", "--racks", "2", "python",
            "t.py")
    assert p.returncode == 0, p.stderr
    assert "placement: node1:4, node2:4, node3:4, node4:4; grid 4x2x2" in p.stderr
    assert "-n 16 --host node1:4,node2:4,node3:4,node4:4 --map-by rankfile:file=" in p.stderr
    assert "-x DDL_TOPOLOGY=4x2x2" in p.stderr
    # uneven hosts in an allocation: Slurm's arbitrary distribution, one line per rank
    p = dry("--launcher", "srun", "--no-tf-config", "-H", "node1:2,node2:1", "-x", "A=1,2",
            "python", "t.py", env=ALLOC)
    assert p.returncode == 0, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert last.startswith("SLURM_HOSTFILE=") and " A=1,2 srun --mpi=pmix --kill-on-bad-exit=1" \
        " --nodes 2 --ntasks 3 --distribution arbitrary --export=ALL,A," in last, last
    assert last.endswith("python t.py")
    hostfile = last.split()[0].split("=", 1)[1]
    assert Path(hostfile).read_text().split() == ["node1", "node1", "node2"]
    p = dry("--launcher", "jsrun", "--accelerators", "6", "-n", "12", "python", "t.py")
    assert p.returncode == 0, p.stderr
    assert "jsrun --rs_per_host 1 --tasks_per_rs 6 " in p.stderr and "--nrs 2" in p.stderr
    p = dry("--launcher", "jsrun", "-H", "a,b", "python", "t.py")
    assert p.returncode == 2 and "LSF allocation" in p.stderr


def test_launcher_choice_follows_the_allocation(tmp_path: Path) -> None:
    for tool in ("srun", "jsrun"):
        (tmp_path / tool).write_text("#!/bin/sh\n")
        (tmp_path / tool).chmod(0o755)
    path = f"{tmp_path}:{os.environ['PATH']}"
    old = os.environ["PATH"]
    os.environ["PATH"] = path
    try:
        assert choose_launcher("auto", {"SLURM_JOB_ID": "7"}) == "srun"
        assert choose_launcher("auto", {"LSB_JOBID": "7"}) == "jsrun"
        assert choose_launcher("auto", {}) == "mpirun"
        assert choose_launcher("mpirun", {"SLURM_JOB_ID": "7"}) == "mpirun"
    finally:
        os.environ["PATH"] = old
    p = dry("-n", "2", "true", env=dict(ALLOC, PATH=path))
    assert " srun --mpi=pmix --kill-on-bad-exit=1 --nodes 1 --ntasks 2" in \
        p.stderr.strip().splitlines()[-1], p.stderr


def test_srun_and_jsrun_builders() -> None:
    plan = Plan(command=["t"], np=8, accelerators=4)  # no placement: Slurm places
    cmd, env = build_srun(plan, {"DDL_ALGO": "ring"}, mpi="pmix")
    assert cmd == ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "--ntasks", "8",
                   "--ntasks-per-node", "4", "--distribution", "block",
                   "--export=ALL,DDL_ALGO", "t"] and env == {}
    alloc = Allocation("7", [("a", 2), ("b", 2), ("c", 2)])
    plan = Plan(command=["t"], extra=["--mpi=pmi2"], placement=[("a", 2), ("b", 2)],
                allocation=alloc)
    cmd, env = build_srun(plan, {}, mpi="pmix")  # the user's --mpi wins
    assert cmd == ["srun", "--kill-on-bad-exit=1", "--nodes", "2", "--ntasks", "4",
                   "--ntasks-per-node", "2", "--distribution", "block", "--nodelist", "a,b",
                   "--export=ALL", "--mpi=pmi2", "t"]
    # hosts out of the allocation's order: block would number them otherwise
    plan = Plan(command=["t"], placement=[("b", 2), ("a", 2)], allocation=alloc)
    cmd, env = build_srun(plan, {})
    assert "--distribution" in cmd and cmd[cmd.index("--distribution") + 1] == "arbitrary"
    assert Path(env["SLURM_HOSTFILE"]).read_text().split() == ["b", "b", "a", "a"]
    assert build_jsrun(Plan(command=["t"], accelerators=2), {})[:5] == [
        "jsrun", "--rs_per_host", "1", "--tasks_per_rs", "2"]


def test_host_checks_name_the_host_quickly() -> None:
    t0 = time.time()
    with pytest.raises(LaunchError, match="host no-such-host.invalid: unknown host"):
        check_hosts(["localhost", "no-such-host.invalid"])
    assert time.time() - t0 < 15
    assert check_hosts(["localhost"]) == {"localhost": 0}
    p = subprocess.run([str(BIN / "ddlrun"), "-H", "localhost,no-such-host.invalid", "true"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "host no-such-host.invalid" in p.stderr


@pytest.mark.parametrize("hosts", ["a;rm -rf /", "$(id)", "-oProxyCommand=x", "a b", "`x`"])
def test_host_names_never_reach_a_shell(hosts: str) -> None:
    p = dry(f"--hosts={hosts}", "true")
    assert p.returncode == 2 and "not a valid host name" in p.stderr


def test_named_local_host_with_more_ranks_than_cores_runs() -> None:
    # the rankfile's slots wrap around this machine's cores, and ranks yield
    n = (os.cpu_count() or 1) * 2
    p = subprocess.run([str(BIN / "ddlrun"), "-H", f"localhost:{n}", sys.executable, "-c",
                        "import ddl_core as d; d.init(); print('R', d.rank(), d.topology())"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert sorted(ln for ln in p.stdout.splitlines() if ln.startswith("R ")) == sorted(
        f"R {r} ({n},)" for r in range(n))

"""ddlrun's launch plans without launching: placement, rankfile, racks, srun/jsrun
commands, launcher choice, host checks. No root needed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ddl_core.runner.hosts import LaunchError, parse_hosts
from ddl_core.runner.launcher import (
    build_command,
    build_jsrun,
    build_srun,
    choose_launcher,
    rankfile_text,
)
from ddl_core.runner.plan import Plan, grid_for, place
from ddl_core.runner.probe import check_hosts, local_gpus, probe_host
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
    here = check_hosts(["localhost"])["localhost"]
    assert (here.gpus, here.cpus) == (local_gpus(), os.cpu_count())
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


def _agent(tmp_path: Path, hosts: tuple[str, ...] = ("fake1", "fake2")) -> Path:
    """A launch agent as a site might write one: called as ssh is (`AGENT [-opts] HOST
    COMMAND`), it runs COMMAND for the hosts it knows (here: on this machine) and refuses
    the others, as the emulated cluster's agent does."""
    agent = tmp_path / "agent"
    agent.write_text(f"""#!/bin/sh
while [ $# -gt 0 ]; do case "$1" in -*) shift;; *) break;; esac; done
h="$1"; shift
echo "$h" >> {tmp_path}/calls
case "$h" in
  {'|'.join(hosts)}) ;;
  *) echo "host '$h' is not one of ours" >&2; exit 255;;
esac
exec sh -c "$*"
""")
    agent.chmod(0o755)
    return agent


def test_host_check_goes_through_the_launch_agent(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    # fake1 resolves nowhere: with an agent the name is the agent's to reach, not DNS's
    info = probe_host("fake1", agent=str(agent))
    assert (info.gpus, info.cpus) == (local_gpus(), os.cpu_count())
    t0 = time.time()
    with pytest.raises(LaunchError, match=r"host other: not reachable through the launch agent "
                       rf"{agent} \(host 'other' is not one of ours\)"):
        check_hosts(["fake1", "other"], lambda h: probe_host(h, agent=str(agent)))
    assert time.time() - t0 < 15
    assert sorted((tmp_path / "calls").read_text().split()) == ["fake1", "fake1", "other"]
    p = subprocess.run([str(BIN / "ddlrun"), "--launch-agent", str(agent), "-H", "fake1,other",
                        "true"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "host other: not reachable through the launch agent" in \
        p.stderr, p.stderr


def test_launch_agent_in_the_commands(tmp_path: Path) -> None:
    agent = _agent(tmp_path)
    p = dry("--launch-agent", str(agent), "-H", "fake1,fake2", "--accelerators", "2",
            "--mpi-args", "--mca btl_tcp_if_include 10.0.0.0/24", "--mpi-args=--bind-to none",
            "python", "t.py")
    assert p.returncode == 0, p.stderr
    cmd = p.stderr.strip().splitlines()[-1]
    assert f"--prtemca plm_ssh_agent {agent}" in cmd
    # every --mpi-args, in order, after ddlrun's own options
    assert "--mca btl_tcp_if_include 10.0.0.0/24 --bind-to none" in cmd
    assert not (tmp_path / "calls").exists()  # a dry run reaches no host
    for bad, msg in [(["--launch-agent", str(tmp_path / "nosuch")], "no such program"),
                     (["--launch-agent", str(agent), "--launcher", "srun"],
                      "--launch-agent is how mpirun reaches the hosts")]:
        p = dry(*bad, "-H", "fake1", "true", env=ALLOC)
        assert p.returncode == 2 and msg in p.stderr, p.stderr
    plan = Plan(command=["t"], hosts=parse_hosts("fake1,fake2"), launch_agent=str(agent),
                placement=[("fake1", 1), ("fake2", 1)])
    cmd = build_command(plan, "mpiexec", "mpich", {})
    assert cmd[1:5] == ["-launcher", "ssh", "-launcher-exec", str(agent)]


def test_rankfile_slots_wrap_around_the_cores_a_host_check_found() -> None:
    plan = Plan(command=["t"], hosts=parse_hosts("n1,n2"), placement=[("n1", 3), ("n2", 2)],
                host_cpus={"n1": 2, "n2": 8})
    cmd = build_command(plan, "mpirun", "openmpi", {}, cores=8)
    rf = cmd[cmd.index("--map-by") + 1]
    assert rf.endswith(":OVERSUBSCRIBE")  # n1 holds more ranks than cores
    slots = Path(rf.split("=", 1)[1].removesuffix(":OVERSUBSCRIBE")).read_text().split("\n")
    assert slots[:5] == ["rank 0=n1 slot=0", "rank 1=n1 slot=1", "rank 2=n1 slot=0",
                         "rank 3=n2 slot=0", "rank 4=n2 slot=1"]
    assert " ".join(cmd).count("--bind-to none") == 1 and "mpi_yield_when_idle 1" in " ".join(cmd)
    plan.extra = ["--bind-to", "core"]  # the user's own binding wins
    cmd = build_command(plan, "mpirun", "openmpi", {}, cores=8)
    assert "--bind-to none" not in " ".join(cmd) and cmd[-3:] == ["--bind-to", "core", "t"]
    plan.host_cpus = {}  # nothing known about the hosts: slots as placed, no oversubscribing
    cmd = build_command(plan, "mpirun", "openmpi", {}, cores=8)
    assert not cmd[cmd.index("--map-by") + 1].endswith(":OVERSUBSCRIBE")

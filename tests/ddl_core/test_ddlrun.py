"""ddlrun: the command it builds, its checks, and real launches."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ddl_core.runner.exitreport import Collector, Report, job_status
from ddl_core.runner.hosts import LaunchError, parse_hostfile, parse_hosts
from ddl_core.runner.launcher import build_command, recoverable_extra
from ddl_core.runner.plan import Plan

BIN = Path(sys.executable).parent


def ddlrun(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, **(env or {}))
    return subprocess.run([str(BIN / "ddlrun"), *args], capture_output=True, text=True,
                          timeout=120, env=full)


def test_runs_ranks_and_sets_topology() -> None:
    proc = ddlrun("-n", "4", "--topology", "2x2", sys.executable, "-c",
                  "import ddl_core as d; d.init(); print('R', d.rank(), d.size(), d.topology())")
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("R "))
    assert lines == [f"R {r} 4 (2, 2)" for r in range(4)]


def test_verbose_prints_the_exact_command() -> None:
    proc = ddlrun("-v", "-n", "3", "-x", "FOO=bar", sys.executable, "-c",
                  "import os; print('FOO', os.environ['FOO'])")
    assert proc.returncode == 0, proc.stderr
    cmd = proc.stderr.splitlines()[0]
    assert cmd.startswith(str(BIN / "mpirun") + " -n 3")
    assert "-x FOO=bar" in cmd and "mpi_yield_when_idle 1" in cmd
    assert proc.stdout.count("FOO bar") == 3


def test_ddl_variables_are_forwarded_and_dry_run_runs_nothing() -> None:
    proc = ddlrun("--dry-run", "-n", "2", "true", env={"DDL_ALGO": "ring"})
    assert proc.returncode == 0
    assert "-x DDL_ALGO" in proc.stderr and proc.stdout == ""


def test_rest_is_passed_through_after_double_dash() -> None:
    proc = ddlrun("--dry-run", "-n", "2", "--", sys.executable, "-v", "--flag")
    assert proc.stderr.rstrip().endswith(f"{sys.executable} -v --flag")


@pytest.mark.parametrize("args,message", [
    (["-H", "bad host;rm", "true"], "not a valid host name"),
    (["-H", "a:0", "true"], "slots must be a positive number"),
    (["--topology", "2y2", "true"], "write levels innermost first"),
    (["-n", "2"], "no program given"),
    (["--hostfile", "/nonexistent/hosts", "true"], "does not exist"),
])
def test_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    proc = ddlrun(*args)
    assert proc.returncode == 2
    assert message in proc.stderr


def test_hosts_and_hostfile_parse(tmp_path: Path) -> None:
    assert [(h.name, h.slots) for h in parse_hosts("a:2,b,c.example.org:4")] == [
        ("a", 2), ("b", None), ("c.example.org", 4)]
    hf = tmp_path / "hosts"
    hf.write_text("# two nodes\nnode1 slots=4\nnode2:2\n")
    assert [(h.name, h.slots) for h in parse_hostfile(str(hf))] == [("node1", 4), ("node2", 2)]
    with pytest.raises(LaunchError):
        parse_hosts("-oProxyCommand=x")


def test_openmpi_and_mpich_commands() -> None:
    plan = Plan(command=["python", "t.py"], hosts=parse_hosts("a:2,b:2"), topology="2x2",
                forward=["X=1"])
    ompi = build_command(plan, "mpirun", "openmpi", {"DDL_LOG": "1"}, cores=2)
    assert ompi[:5] == ["mpirun", "-n", "4", "--host", "a:2,b:2"]
    assert "DDL_TOPOLOGY=2x2" in ompi and "DDL_LOG" in ompi and ompi[-2:] == ["python", "t.py"]
    assert "OVERSUBSCRIBE" not in " ".join(ompi)  # hosts were named: no local oversubscription
    mpich = build_command(plan, "mpiexec", "mpich", {"DDL_LOG": "1"}, cores=2)
    assert mpich[:5] == ["mpiexec", "-n", "4", "-hosts", "a:2,b:2"]
    assert ["-genv", "DDL_TOPOLOGY", "2x2"] == mpich[mpich.index("DDL_TOPOLOGY") - 1:][:3]
    assert "-genvlist" in mpich


# -- the job's exit status: every rank's, not the launcher's --------------------------------

RANK_ENDS = {  # what rank 1 does -> ddlrun's exit status
    "sys.exit(3)": 3,
    "os.kill(os.getpid(), signal.SIGKILL)": 137,
    "os.kill(os.getpid(), signal.SIGSEGV)": 139,
}


@pytest.mark.parametrize("recoverable", [False, True], ids=["plain", "recoverable"])
@pytest.mark.parametrize("end", RANK_ENDS)
def test_exit_status_is_the_failing_ranks(end: str, recoverable: bool) -> None:
    # `--runtime-options recoverable` made mpirun exit 0 for ranks killed by signals
    mpi = "--mca mpi_yield_when_idle 1" + (" --runtime-options recoverable" if recoverable
                                           else "")
    script = ("import os, signal, sys, time\n"
              f"if os.environ['OMPI_COMM_WORLD_RANK'] == '1': {end}\n"
              "time.sleep(0.5)\n")
    proc = ddlrun("-n", "2", f"--mpi-args={mpi}", sys.executable, "-c", script)
    assert proc.returncode == RANK_ENDS[end], proc.stderr
    assert "ddlrun: rank 1 " in proc.stderr and f"exit status {RANK_ENDS[end]}" in proc.stderr


def test_a_clean_job_exits_0_and_says_nothing() -> None:
    proc = ddlrun("-n", "2", "--mpi-args=--runtime-options recoverable", sys.executable, "-c",
                  "print('hi')")
    assert proc.returncode == 0 and "ddlrun:" not in proc.stderr, proc.stderr
    assert proc.stdout.count("hi") == 2


def test_job_status_prefers_a_rank_that_failed_on_its_own() -> None:
    lost = Report(0, "exit", 1, lost=True)
    own = Report(1, "exit", 3)
    sig = Report(2, "signal", 9)
    assert job_status([], 5) == (5, None)
    assert job_status([Report(0, "exit", 0)], 0) == (0, None)
    status, line = job_status([lost, own, sig], 1)
    assert status == 3 and line is not None and line.startswith("ddlrun: rank 1 exited with "
                                                                  "status 3")
    assert "rank 0 exited with status 1 (a peer was lost)" in line
    assert "rank 2 was killed by signal 9 (SIGKILL)" in line
    assert job_status([lost, sig], 0)[0] == 137
    assert job_status([lost], 0)[0] == 1


def test_collector_takes_only_reports_with_its_token() -> None:
    c = Collector(["127.0.0.1"])
    for line in (f"{c.token} 3 signal 11\n", "wrong 1 exit 4\n", f"{c.token} x exit 1\n",
                 f"{c.token} 2 exit 0 lost\n", f"{c.token} 1 exit 2 bogus\n"):
        with socket.create_connection(("127.0.0.1", c.port)) as s:
            s.sendall(line.encode())
    assert c.close() == [Report(3, "signal", 11), Report(2, "exit", 0, lost=True)]


def test_recoverable_turns_on_open_mpis_fault_tolerance() -> None:
    assert recoverable_extra(["--runtime-options", "recoverable"]) == [
        "--mca", "mpi_ft_enable", "1"]
    assert recoverable_extra(["--runtime-options", "recoverable", "--mca", "mpi_ft_enable",
                              "0"]) == []
    assert recoverable_extra(["--mca", "btl", "tcp,self"]) == []

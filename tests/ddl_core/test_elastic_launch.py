"""ddlrun --elastic on one host: survivors of a lost rank go on, the job's status is
theirs, the lost ranks are named; --min-np; the host-discovery script and its channel to
the ranks; growing onto new slots (MPI_Comm_spawn). Real processes throughout."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ddl_core.hostupdates import HostWatch
from ddl_core.runner.discovery import (
    DiscoveryError,
    HostUpdates,
    Poller,
    parse_discovery,
    run_discovery,
)
from ddl_core.runner.launcher import build_srun
from ddl_core.runner.plan import Plan

BIN = Path(sys.executable).parent
WORKERS = Path(__file__).parent / "workers"
HOST = socket.gethostname()


def ddlrun(*args: str, env: dict[str, str] | None = None,
           timeout: float = 90) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([str(BIN / "ddlrun"), *args], capture_output=True, text=True,
                          timeout=timeout, env=full)


def script(tmp_path: Path, name: str, body: str) -> str:
    p = tmp_path / name
    p.write_text("#!/bin/sh\n" + body + "\n")
    p.chmod(0o755)
    return str(p)


# -- before launch ---------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--min-np", "5", "-n", "4"], "--min-np 5 is above -n 4"),
    (["--max-np", "2", "-n", "4"], "--max-np 2 is below -n 4"),
    (["--min-np", "3", "--max-np", "2"], "--max-np 2 is below --min-np 3"),
    (["--min-np", "0", "-n", "2"], "--min-np"),
])
def test_impossible_bounds_are_refused_before_launch(args: list[str], message: str) -> None:
    proc = ddlrun(*args, "true")
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_elastic_command_turns_on_ulfm_and_tells_the_ranks() -> None:
    proc = ddlrun("--dry-run", "--elastic", "-n", "2", "true")
    assert proc.returncode == 0, proc.stderr
    assert "--with-ft ulfm" in proc.stderr and "-x DDL_ELASTIC " in proc.stderr
    assert "-x DDL_MIN_NP" in proc.stderr and "-x DDL_ELASTIC_COMMAND" in proc.stderr
    plain = ddlrun("--dry-run", "-n", "2", "true")
    assert "--with-ft" not in plain.stderr and "DDL_ELASTIC" not in plain.stderr


def test_elastic_under_srun_is_refused_with_the_way_round() -> None:
    proc = ddlrun("--elastic", "--launcher", "srun", "-n", "2", "true",
                  env={"SLURM_JOB_ID": "1"})
    assert proc.returncode == 2, proc.stderr
    assert "Slurm's PMIx plugin ends the whole step" in proc.stderr
    assert "--launcher mpirun" in proc.stderr


def test_srun_keeps_the_step_alive() -> None:
    plan = Plan(command=["python", "t.py"], np=4, elastic=True)
    cmd, env = build_srun(plan, {})
    assert "--no-kill" in cmd and "--kill-on-bad-exit=0" in cmd
    assert "--kill-on-bad-exit=1" not in cmd and env["OMPI_MCA_mpi_ft_enable"] == "1"
    cmd, _ = build_srun(Plan(command=["python", "t.py"], np=4), {})
    assert "--kill-on-bad-exit=1" in cmd and "--no-kill" not in cmd


# -- losing ranks --------------------------------------------------------------------

def survivors(proc: subprocess.CompletedProcess[str]) -> list[tuple[int, float]]:
    return [(int(m[1]), float(m[2])) for m in re.finditer(r"^OK (\d+) (\S+)$", proc.stdout,
                                                            re.M)]


@pytest.mark.parametrize("how,ended", [("kill", "was killed by signal 9 (SIGKILL)"),
                                       ("exit3", "exited with status 3")])
def test_survivors_finish_and_the_status_is_theirs(how: str, ended: str,
                                                   tmp_path: Path) -> None:
    proc = ddlrun("--elastic", "-n", "4", "-x", f"STAMP_DIR={tmp_path}", sys.executable,
                  str(WORKERS / "elastic_kill.py"), "mpi4py", "1", how)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ok = survivors(proc)
    assert len(ok) == 3 and all(size == 3 for size, _ in ok), proc.stdout
    assert f"1 rank lost, 3 finished (--min-np 1): rank 1 on {HOST} {ended}" in proc.stderr


def test_below_min_np_the_job_ends_with_the_lost_ranks_status(tmp_path: Path) -> None:
    proc = ddlrun("--min-np", "4", "-n", "4", "-x", f"STAMP_DIR={tmp_path}", sys.executable,
                  str(WORKERS / "elastic_kill.py"), "mpi4py", "2", "kill")
    assert proc.returncode == 137, proc.stderr
    assert "fewer than --min-np 4 ranks left" in proc.stderr
    assert f"rank 2 on {HOST} was killed by signal 9 (SIGKILL)" in proc.stderr


@pytest.mark.parametrize("api", ["ddl", "ddl-p2p"])
def test_ddl_core_survivors_shrink_the_world(tmp_path: Path, api: str) -> None:
    """ddl_core's survivors see ProcessFailedError naming the victim (from allreduces, or
    from the isend/irecv of a ring), shrink the world and go on."""
    import ddl_core

    if not hasattr(ddl_core, "shrink_world"):
        pytest.skip("this ddl_core has no shrink_world (libddl without ULFM support)")
    proc = ddlrun("--elastic", "--min-np", "2", "-n", "3", "-x", f"STAMP_DIR={tmp_path}",
                  sys.executable,
                  str(WORKERS / "elastic_kill.py"), api, "2", "kill")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [s for s, _ in survivors(proc)] == [2, 2], proc.stdout
    assert f"rank 2 on {HOST} was killed by signal 9" in proc.stderr


# -- the discovery script ------------------------------------------------------------

def test_discovery_output_is_read_strictly() -> None:
    assert parse_discovery("a:2\nb\n\n# c\nb:1\n", 4) == {"a": 2, "b": 5}
    for bad in ("a:x", "a:0", "a b", "bad;host:1", "a:2:3"):
        with pytest.raises(DiscoveryError, match="is not host"):
            parse_discovery(f"ok:1\n{bad}\n", 1)


def test_a_script_that_fails_hangs_or_prints_garbage_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DiscoveryError, match="exited with status 4: no cloud"):
        run_discovery(script(tmp_path, "f", "echo no cloud >&2; exit 4"), 5, 1)
    t0 = time.monotonic()
    with pytest.raises(DiscoveryError, match="did not finish within 0.5 s"):
        run_discovery(script(tmp_path, "h", "sleep 30 & sleep 30; echo a:1"), 0.5, 1)
    assert time.monotonic() - t0 < 5
    with pytest.raises(DiscoveryError, match="not UTF-8"):
        run_discovery(script(tmp_path, "u", r"printf 'a:1\377\n'"), 5, 1)
    with pytest.raises(DiscoveryError, match="printed no host"):
        run_discovery(script(tmp_path, "e", "true"), 5, 1)
    with pytest.raises(DiscoveryError, match="cannot run"):
        run_discovery(str(tmp_path / "missing"), 5, 1)


@pytest.mark.parametrize("body,message", [
    ("exit 1", "exited with status 1"),
    ("sleep 20", "did not finish within 1 s"),
    ("echo 'host one'", "is not host[:slots]"),
])
def test_ddlrun_refuses_a_first_discovery_that_fails(tmp_path: Path, body: str,
                                                     message: str) -> None:
    proc = ddlrun("--host-discovery-script", script(tmp_path, "d", body),
                  "--discovery-timeout", "1", "true", timeout=30)
    assert proc.returncode == 2, proc.stderr
    assert "the host-discovery script's first run" in proc.stderr and message in proc.stderr


def test_updates_reach_the_ranks_and_bad_runs_are_skipped(tmp_path: Path,
                                                          capfd: pytest.CaptureFixture[str]
                                                          ) -> None:
    answer = tmp_path / "hosts"
    answer.write_text("localhost:2\n")
    disc = script(tmp_path, "d", f"cat {answer}")
    updates = HostUpdates(["127.0.0.1"], {"localhost": 2}, 4, {"localhost": 2})
    watch = HostWatch(updates.env_value)
    try:
        first = watch.latest()
        assert first is not None and first["generation"] == 1 and first["spawn"] == []
        poller = Poller(disc, 0.2, 2, 1, updates, lambda: {"localhost": 2})
        try:
            answer.write_text("localhost:2\nnot a host\n")  # garbage: skipped, said once
            time.sleep(1.0)
            assert watch.latest() == first
            answer.write_text("localhost:2\nother:4\n")
            deadline = time.monotonic() + 10
            while (watch.latest() or {}).get("generation") == 1 and time.monotonic() < deadline:
                time.sleep(0.05)
            got = watch.latest()
            assert got is not None and got["generation"] == 2, got
            # --max-np 4 with 2 running: 2 new ranks, not the 4 slots the script reports
            assert got["added"] == ["other"] and got["spawn"] == [["other", 2]]
            answer.write_text("other:4\n")
            while (watch.latest() or {}).get("generation") == 2 and time.monotonic() < deadline:
                time.sleep(0.05)
            got = watch.latest()
            assert got is not None and got["removed"] == ["localhost"], got
        finally:
            poller.close()
    finally:
        watch.close()
        updates.close()
    err = capfd.readouterr().err
    assert err.count("host discovery skipped: line 2 'not a host' is not host") == 1, err


def test_a_wrong_token_gets_no_updates() -> None:
    updates = HostUpdates(["127.0.0.1"], {"a": 1}, None, {"a": 1})
    try:
        with pytest.raises(OSError):
            HostWatch(updates.env_value.rsplit(":", 1)[0] + ":" + "0" * 32)
    finally:
        updates.close()


# -- growing ---------------------------------------------------------------------------

def test_new_slots_get_spawned_ranks_merged_into_the_world(tmp_path: Path) -> None:
    answer = tmp_path / "hosts"
    answer.write_text("localhost:2\n")
    disc = script(tmp_path, "d", f"cat {answer}")
    proc = ddlrun("--host-discovery-script", disc, "--discovery-interval", "0.3",
                  "-x", f"HOSTS_FILE={answer}", "-x", "WIDER=localhost:3", "-x", "STEPS=150",
                  sys.executable, str(WORKERS / "elastic_grow.py"), timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.count("OK grow 3") == 3, proc.stdout
    assert "spawn [['localhost', 1]]" in proc.stderr
    assert re.search(r"^GROW \d", proc.stdout, re.M)

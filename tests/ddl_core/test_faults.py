"""Fault injection: a rank killed, crashed, exiting early or hung while the others wait in a
collective, under plain mpirun and under `--runtime-options recoverable` (where the launcher
leaves the survivors waiting, as srun may). Every survivor must raise within 2 s of the
death (a hang: right after the short DDL_TIMEOUT), with a message that names the lost rank
and the collective, and ddlrun must exit with the failing rank's status.

The jobs run `python -m ddl_core.bench faults worker` (the same worker the latency figure
in the README comes from): the victim writes the time of its death, each survivor prints
`FAULT rank=R error=E waited=S after_death=S msg=...`. The 2 s bound here is a correctness
bound, not the figure (the figure: python -m ddl_core.bench faults).
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from conftest import WORKERS, run_mpi
from ddl_core.bench.faults import run_job

pytestmark = pytest.mark.timeout(300)
MODES = {"plain": False, "recoverable": True}
EXPECT = {  # fault -> (what survivors read, ddlrun's exit status or None for "non-zero")
    "kill": ("rank 1 exited or died without finalizing DDL", 137),
    "segv": ("rank 1 exited or died without finalizing DDL", 139),
    "forkkill": ("rank 1 exited or died without finalizing DDL", 137),
    "exit3": ("rank 1 exited with status 3 after 1 blocking collective", 3),
    "exit0": ("rank 1 exited with status 0 after 1 blocking collective", None),
    "_exit0": ("rank 1 exited or died without finalizing DDL", None),
}


def ended_by_launcher(out: str, ranks: set[int]) -> set[int]:
    """Those of `ranks` that the launcher ended itself, by ddlrun's summary line: SIGTERM
    (plain mpirun's abort), a silent exit status 1 (Open MPI ending a process whose job
    the runtime terminated: PRRTE treats a non-zero exit status as a job error even under
    `recoverable`, which only forgives processes that die), or no report at all (the
    runtime killed the rank's wrapper too)."""
    line = next((x for x in out.splitlines() if x.startswith("ddlrun: rank")), "")
    ended, named = set(), set()
    for part in re.split(r"; ", line):
        m = re.match(r"(?:ddlrun: )?ranks? ([\d,]+) (.*)$", part)
        if not m:
            continue
        these = {int(r) for r in m.group(1).split(",")}
        named |= these
        if re.match(r"(was|were) killed by signal 15|exited with status 1$", m.group(2)):
            ended |= these
    return (ended | (ranks - named)) & ranks


def check_survivors(found: list[dict[str, str]], survivors: list[int], error: str,
                    out: str, bound: float = 2.0, launcher_may_kill: bool = False) -> None:
    """Every survivor raised `error` within `bound` s of the death. Under plain mpirun
    the launcher also ends the job (0.3-0.7 s after a death): a survivor it killed before
    its error was printed has been told too, by the launcher."""
    reported = sorted(int(f["rank"]) for f in found)
    silent = set(survivors) - set(reported)
    if launcher_may_kill and reported:
        assert silent <= ended_by_launcher(out, silent), out[-4000:]
    else:
        assert reported == survivors, out[-4000:]
    for f in found:
        assert f["error"] == error, f
        assert float(f["after_death"]) <= bound, f


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault", EXPECT)
def test_lost_rank_is_reported_on_every_survivor_within_2s(mode: str, fault: str) -> None:
    status, found, out = run_job(3, MODES[mode], fault, 1, "allreduce", {"DDL_TIMEOUT": "60"})
    ends_job = mode == "plain" or fault == "exit3"  # see ended_by_launcher
    check_survivors(found, [0, 2], "PeerLostError", out, launcher_may_kill=ends_job)
    text, expected_status = EXPECT[fault]
    for f in found:
        assert f["msg"].startswith(f"rank {f['rank']}: allreduce #2: {text}"), f["msg"]
        assert "while ranks 0,2 waited for it" in f["msg"], f["msg"]
    if expected_status is None:
        assert status != 0, out[-3000:]
    else:
        assert status == expected_status, out[-3000:]


@pytest.mark.parametrize("coll,ranks,topology", [
    ("async", 3, ""), ("large", 4, "2x2"), ("broadcast", 3, ""), ("allgather", 3, ""),
    ("barrier", 3, ""), ("irecv", 3, "")])
def test_every_kind_of_wait_gets_the_error(coll: str, ranks: int, topology: str) -> None:
    env = {"DDL_TIMEOUT": "60", "DDL_TOPOLOGY": topology}
    status, found, out = run_job(ranks, True, "kill", 1, coll, env)
    check_survivors(found, [r for r in range(ranks) if r != 1], "PeerLostError", out)
    name = {"async": "allreduce", "large": "allreduce"}.get(coll, coll)
    for f in found:
        # the asynchronous one may die in its negotiation, before collective #1
        if coll == "irecv":  # a request, not a collective: it names its peer
            assert "irecv: from rank 1 (tag 0) cannot complete: that rank exited or died" \
                in f["msg"], f["msg"]
            continue
        assert (f"{name} #2" in f["msg"] or "asynchronous" in f["msg"]), f["msg"]
        assert "rank 1 exited or died" in f["msg"], f["msg"]
    assert status == 137, out[-3000:]


def test_death_of_rank_0_which_runs_the_watcher() -> None:
    status, found, out = run_job(3, True, "kill", 0, "allreduce", {"DDL_TIMEOUT": "60"})
    check_survivors(found, [1, 2], "PeerLostError", out)
    assert all("rank 0 exited or died" in f["msg"] for f in found), out[-3000:]
    assert status == 137


@pytest.mark.parametrize("mode", MODES)
def test_hung_rank_times_out_naming_it(mode: str) -> None:
    status, found, out = run_job(3, MODES[mode], "hang", 2, "allreduce", {"DDL_TIMEOUT": "2"})
    assert found and set(int(f["rank"]) for f in found) <= {0, 1}, out[-4000:]
    timeouts = [f for f in found if f["error"] == "DDLTimeoutError"]
    assert timeouts, found
    diagnosed = "allreduce #2: no progress for 2 s (DDL_TIMEOUT): rank 2 has not reached it " \
                "(blocking collective #1 is the last it reached"
    for f in timeouts:
        assert 1.9 <= float(f["waited"]) <= 4.5, f
        # rank 0 hosts the liveness watcher: a survivor that times out after rank 0 has
        # already raised and exited cannot ask it, and names the peer it waited for instead
        assert diagnosed in f["msg"] or re.search(
            r"allreduce #2: no answer from rank [02] for 2 s \(DDL_TIMEOUT\)", f["msg"]), f
    assert any(diagnosed in f["msg"] for f in timeouts), timeouts
    for f in found:
        # A survivor whose deadline came later (a loaded machine) may first learn that the
        # other one, which timed out, has exited: that is a lost peer.
        assert f in timeouts or (f["error"] == "PeerLostError" and "rank 2" not in
                                 f["msg"].split(" while ")[0]), f
    # the first survivor to time out exits 1, and the runtime may end the other first
    silent = {0, 1} - {int(f["rank"]) for f in found}
    assert silent <= ended_by_launcher(out, silent), out[-4000:]
    assert status != 0


def test_without_the_liveness_check_the_deadline_still_holds() -> None:
    status, found, out = run_job(3, True, "kill", 1, "allreduce",
                                 {"DDL_TIMEOUT": "2", "DDL_LIVENESS": "0"})
    # the first survivor to time out exits 1, and the runtime may end the other first
    check_survivors(found, [0, 2], "DDLTimeoutError", out, bound=4.5, launcher_may_kill=True)
    assert all(float(f["waited"]) >= 1.9 for f in found)
    assert status == 137


def _ddlrun(n: int, *args: str, env: dict[str, str] | None = None):  # noqa: ANN202
    import os
    import subprocess
    from pathlib import Path

    full = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
                PYTHONUNBUFFERED="1", **(env or {}))
    return subprocess.run([str(Path(sys.executable).with_name("ddlrun")), "-n", str(n),
                           "--mpi-args=--mca mpi_yield_when_idle 1", *args],
                          capture_output=True, text=True, timeout=120, env=full)


def test_ranks_that_finish_at_different_times_are_not_failures() -> None:
    proc = _ddlrun(4, sys.executable, str(WORKERS / "liveness.py"), "staggered",
                   env={"DDL_TOPOLOGY": "2x2", "DDL_SEGMENT": "65536", "DDL_TIMEOUT": "60"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert sorted(proc.stdout.split("\n")[:-1]) == [f"OK staggered {r}" for r in range(4)]
    assert "PeerLost" not in proc.stderr


def test_bad_ddl_liveness_value_is_refused() -> None:
    """ddlrun refuses it before starting anything; under a bare mpirun every rank's init
    raises, naming the variable."""
    proc = _ddlrun(2, sys.executable, str(WORKERS / "liveness.py"), "badenv",
                   env={"DDL_LIVENESS": "maybe"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "DDL_LIVENESS=maybe" in proc.stderr and "OK badenv" not in proc.stdout
    proc = run_mpi(2, "liveness.py", "badenv", env={"DDL_LIVENESS": "maybe"})
    assert proc.stdout.count("OK badenv") == 2, proc.stdout + proc.stderr


@pytest.mark.parametrize("mode,ranks,oks", [
    ("ddp_mismatch", 2, ["OK ddp_mismatch 0", "OK ddp_mismatch 1"]),
    ("ddp_dead", 3, ["OK ddp_dead 0", "OK ddp_dead 2"]),
    ("pg_timeout", 2, ["OK init_process_group timeout", "OK monitored_barrier timeout",
                       "OK new_group timeout"]),
])
def test_torch_collective_errors_are_exceptions(have_torch: bool, mode: str, ranks: int,
                                                 oks: list[str], tmp_path: Path) -> None:
    if not have_torch:
        pytest.skip("torch is not installed")
    proc = run_mpi(ranks, "torch_faults.py", mode, str(tmp_path / "death"),
                   env={"DDL_TIMEOUT": "60"}, check=False,
                   mpi_args=("--runtime-options", "recoverable"), timeout=120)
    got = sorted(line.rsplit(" ", 1)[0] if "timeout" in line else line
                 for line in proc.stdout.splitlines() if line.startswith("OK "))
    assert got == oks, proc.stdout + proc.stderr[-4000:]
    assert "Segmentation fault" not in proc.stderr

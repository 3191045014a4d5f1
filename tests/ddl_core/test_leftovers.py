"""Nothing of a job is left in /dev/shm, however it ends (ddl_core/jobshm.py).

Open MPI's shared-memory transport backs each rank's 16 MiB segment with a file; a rank
killed, a job aborted, a launcher killed left them in /dev/shm until a reboot. ddlrun puts
them in a directory of the job's own, removed when the job ends; what a SIGKILL of the
whole job left is reclaimed by the next run, never another live job's. The jobs here are
real ddlrun launches (2 ranks, one node); each rank prints the segment files it has
mapped, and the test checks that each of them and the job's directory are gone."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ddl_core import jobshm

BIN = Path(sys.executable).parent
WORKER = Path(__file__).parent / "workers" / "leftovers.py"
SHM = Path(jobshm.BASE)
pytestmark = pytest.mark.skipif(not SHM.is_dir(), reason="no /dev/shm here")


def ddlrun_argv(*args: str) -> list[str]:
    return [str(BIN / "ddlrun"), "-n", "2", *args, sys.executable, str(WORKER)]


def shm_of(out: str) -> tuple[set[str], set[str]]:
    """The segment files and backing directories the ranks reported."""
    segs = {ln.split()[1] for ln in out.splitlines() if ln.startswith("SEG ")}
    dirs = {ln.split()[2] for ln in out.splitlines() if ln.startswith("DIR ")
            and len(ln.split()) == 3}
    return segs, dirs


def left(segs: set[str], dirs: set[str]) -> list[str]:
    return sorted(p for p in segs | dirs if os.path.lexists(p))


def run_job(mode: str, *args: str, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*ddlrun_argv(*args), mode], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ, **(env or {})))


ENDS = {  # mode, ddlrun options, environment, expected exit status
    "normal": ("ok", (), {}, 0),
    "error-exit": ("exit", (), {}, 3),
    "timeout": ("hang", (), {"DDL_TIMEOUT": "3"}, None),
    "rank-sigkill": ("kill", (), {}, 137),
    "rank-sigkill-recoverable": ("kill", ("--mpi-args=--runtime-options recoverable",), {},
                                 137),
}


@pytest.mark.parametrize("end", ENDS)
def test_the_jobs_segments_are_gone_however_it_ends(end: str) -> None:
    mode, args, env, status = ENDS[end]
    p = run_job(mode, *args, env=env)
    if status is None:
        assert p.returncode != 0, p.stdout + p.stderr
    else:
        assert p.returncode == status, p.stdout + p.stderr
    segs, dirs = shm_of(p.stdout)
    assert len(dirs) == 1, p.stdout  # both ranks: one directory of this job's own
    d = next(iter(dirs))
    assert Path(d).parent == SHM and Path(d).name.startswith(f"ddl-job-{os.geteuid()}-")
    assert segs and all(Path(s).parent == Path(d) for s in segs), (segs, d)
    assert left(segs, dirs) == [], p.stderr


def descendants(pid: int) -> list[int]:
    kids: dict[int, list[int]] = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            try:
                stat = Path(f"/proc/{e}/stat").read_text()
            except OSError:
                continue
            kids.setdefault(int(stat[stat.rfind(")") + 2:].split()[1]), []).append(int(e))
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def start_waiting(flag: Path) -> tuple[subprocess.Popen[str], list[str]]:
    """A job whose ranks wait for `flag`; returns once both are ready, with its lines."""
    proc = subprocess.Popen([*ddlrun_argv(), "wait", str(flag)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    deadline = time.monotonic() + 120
    assert proc.stdout is not None
    while sum(ln.startswith("READY ") for ln in lines) < 2:
        line = proc.stdout.readline()
        assert line and time.monotonic() < deadline, (lines, proc.poll())
        lines.append(line.strip())
    return proc, lines


def test_what_a_sigkill_of_the_whole_job_left_the_next_run_reclaims(tmp_path: Path) -> None:
    # ddlrun, its mpirun, every rank and wrapper killed at once: nothing could clean up
    dead, lines = start_waiting(tmp_path / "never")
    dead_segs, dead_dirs = shm_of("\n".join(lines))
    tree = descendants(dead.pid)
    for pid in tree:
        os.kill(pid, signal.SIGKILL)
    dead.wait(30)
    deadline = time.monotonic() + 30
    while any(Path(f"/proc/{p}").exists() and "Z" not in
              Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[-1][:3] for p in tree):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert left(dead_segs, dead_dirs) == sorted(dead_segs | dead_dirs)  # all left, so far
    for pid in tree:  # what else the kill left: mpirun's session directory (not /dev/shm)
        session = Path(os.environ.get("TMPDIR") or "/tmp") / f"ompi.{pid}"
        if session.is_dir() and session.stat().st_uid == os.geteuid():
            shutil.rmtree(session, ignore_errors=True)
    # another job of the same user is running meanwhile: its segments must stay
    flag = tmp_path / "go"
    live, live_lines = start_waiting(flag)
    live_segs, live_dirs = shm_of("\n".join(live_lines))
    try:
        nxt = run_job("ok")
        assert nxt.returncode == 0, nxt.stderr
        assert left(dead_segs, dead_dirs) == []  # the dead job's: reclaimed
        assert left(live_segs, live_dirs) == sorted(live_segs | live_dirs)  # the live: kept
        flag.touch()  # it goes on through its segments, and its own end removes them
        out, err = live.communicate(timeout=120)
        assert live.returncode == 0 and out.count("DONE") == 2, err
    finally:
        if live.poll() is None:
            live.kill()
    assert left(live_segs, live_dirs) == []


def test_ddlrun_killed_alone_its_ranks_remove_the_directory_when_they_end(
        tmp_path: Path) -> None:
    flag = tmp_path / "go"
    job, lines = start_waiting(flag)
    segs, dirs = shm_of("\n".join(lines))
    tree = descendants(job.pid)
    job.send_signal(signal.SIGKILL)  # ddlrun only: its mpirun and the ranks run on
    job.wait(30)
    assert left(segs, dirs) == sorted(segs | dirs)
    flag.touch()
    deadline = time.monotonic() + 60
    while any(Path(f"/proc/{p}").exists() for p in tree[1:]):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert left(segs, dirs) == []


def test_a_backing_directory_the_user_chose_is_kept(tmp_path: Path) -> None:
    mine = tmp_path / "shm"
    mine.mkdir()
    p = run_job("ok", env={jobshm.MCA: str(mine)})
    assert p.returncode == 0, p.stderr
    segs, dirs = shm_of(p.stdout)
    assert dirs == {str(mine)} and all(Path(s).parent == mine for s in segs)
    assert mine.is_dir()  # theirs: not removed


# -- the directory's rules, with real processes and locks, in a private base directory --

HOLD = """import sys, time
sys.path.insert(0, sys.argv[1])
import jobshm
fd = jobshm.join(sys.argv[2])
print("HELD", flush=True)
time.sleep(300)
"""


def hold(path: Path) -> subprocess.Popen[str]:
    """Another process that uses the job directory `path` (as a rank's wrapper does)."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(Path(jobshm.__file__).parent),
                             str(path)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stdout.readline().strip() == "HELD"
    return proc


def test_a_directory_is_reclaimed_only_once_no_process_holds_it(tmp_path: Path) -> None:
    d = Path(jobshm.job_dir("0123456789abcdef", str(tmp_path)))
    holder = hold(d)
    try:
        (d / "sm_segment.h.0.1.0").write_bytes(b"x")
        assert jobshm.reclaim(str(tmp_path)) == [] and d.is_dir()
        assert jobshm.remove(str(d), wait_s=0.2) is False
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert jobshm.reclaim(str(tmp_path)) == [str(d)] and not d.exists()


def test_another_users_directory_and_a_symlink_are_never_touched(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory another user owns needs root")
    theirs = Path(jobshm.job_dir("00000000000000aa", str(tmp_path)))
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    target = tmp_path / "target"
    target.mkdir()
    (target / "keep").write_text("x")
    link = Path(jobshm.job_dir("00000000000000bb", str(tmp_path)))
    link.symlink_to(target)
    assert jobshm.reclaim(str(tmp_path)) == []
    assert theirs.is_dir() and (target / "keep").exists() and link.is_symlink()
    env = {jobshm.ENV: "00000000000000aa"}  # a rank of a job whose name is taken: refused
    assert jobshm.for_rank(env, str(tmp_path)) is None and jobshm.MCA not in env


@pytest.mark.parametrize("token", ["", "../../etc", "0123456789ABCDEF", "12345"])
def test_a_token_ddlrun_did_not_make_does_nothing(tmp_path: Path, token: str) -> None:
    env = {jobshm.ENV: token}
    assert jobshm.for_rank(env, str(tmp_path)) is None
    assert env == {jobshm.ENV: token} and list(tmp_path.iterdir()) == []


def test_ddlruns_side_makes_locks_and_removes_its_directory(tmp_path: Path) -> None:
    env: dict[str, str] = {}
    job = jobshm.JobShm.open(env, str(tmp_path))
    assert job is not None and env[jobshm.ENV] == job.token
    d = Path(job.path)
    assert d.is_dir() and (d.stat().st_mode & 0o777) == 0o700 and (d / "owner").is_file()
    rank_env = dict(env)
    joined = jobshm.for_rank(rank_env, str(tmp_path))
    assert joined is not None and rank_env[jobshm.MCA] == str(d)
    jobshm.rank_done(joined)
    assert d.is_dir()  # ddlrun still holds it
    assert job.close() and not d.exists()
    assert jobshm.JobShm.open({jobshm.MCA: "/somewhere"}, str(tmp_path)) is None


def test_a_rank_on_a_node_ddlrun_is_not_on_makes_the_directory(tmp_path: Path) -> None:
    env = {jobshm.ENV: "fedcba9876543210"}
    joined = jobshm.for_rank(env, str(tmp_path))
    assert joined is not None and Path(joined[0]).is_dir() and env[jobshm.MCA] == joined[0]
    assert (Path(joined[0]) / "owner").is_file()
    jobshm.rank_done(joined)  # the last one on its node
    assert list(tmp_path.iterdir()) == []


def test_a_remover_stuck_half_way_does_not_hang_a_starting_rank(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = Path(jobshm.job_dir("0123456789abcdef", str(tmp_path)))
    d.mkdir(mode=0o700)
    stuck = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        "fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECTORY)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX)\nprint('HELD', flush=True)\ntime.sleep(300)"),
        str(d)], stdout=subprocess.PIPE, text=True)
    try:
        assert stuck.stdout is not None and stuck.stdout.readline().strip() == "HELD"
        monkeypatch.setattr(jobshm, "JOIN_WAIT_S", 0.5)
        env = {jobshm.ENV: "0123456789abcdef"}
        t0 = time.monotonic()
        assert jobshm.for_rank(env, str(tmp_path)) is None  # Open MPI's default, then
        assert time.monotonic() - t0 < 5 and jobshm.MCA not in env
    finally:
        stuck.kill()
        stuck.wait()


SINGLETON = """import os, signal, sys
import ddl_core as ddl
ddl.init()
with open("/proc/self/maps") as f:
    print("SEGS", *sorted({ln.split()[-1] for ln in f if "sm_segment." in ln}))
print("ENV", os.environ.get("OMPI_MCA_btl_sm_backing_directory", "-"), flush=True)
if sys.argv[1] == "kill":
    os.kill(os.getpid(), signal.SIGKILL)
"""


def singleton(end: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """A process that initialises ddl_core with no launcher (MPI starts it alone)."""
    env = {k: v for k, v in os.environ.items()
           if k not in jobshm.LAUNCHED and k != jobshm.MCA and k != jobshm.ENV}
    p = subprocess.run([sys.executable, "-c", SINGLETON, end], capture_output=True,
                       text=True, timeout=120, env=env)
    segs = next((ln.split()[1:] for ln in p.stdout.splitlines() if ln.startswith("SEGS")), [])
    return p, segs


def test_a_singleton_leaves_no_segment_and_a_killed_ones_is_reclaimed() -> None:
    # Open MPI leaves a singleton's segment in /dev/shm even when it ends well (no launcher
    # daemon removes it): ddl_core.init() puts it in a directory of its own
    p, segs = singleton("ok")
    assert p.returncode == 0, p.stderr
    assert len(segs) == 1 and Path(segs[0]).parent.name.startswith(
        f"ddl-job-{os.geteuid()}-"), segs
    assert "ENV -" in p.stdout  # taken out of the environment once MPI has read it
    assert left(set(segs), {str(Path(segs[0]).parent)}) == []
    killed, ksegs = singleton("kill")
    assert killed.returncode == -signal.SIGKILL and len(ksegs) == 1
    assert os.path.exists(ksegs[0])  # nothing ran at its end
    p, _ = singleton("ok")  # the next one reclaims it
    assert p.returncode == 0 and left(set(ksegs), {str(Path(ksegs[0]).parent)}) == []

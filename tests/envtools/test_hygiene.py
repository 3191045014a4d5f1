"""Crash hygiene: what a killed, interrupted, racing or failing envtools leaves behind.

Each case runs the real CLI on the fixture channel. SIGKILL and the race between two
clones are made deterministic with ENVTOOLS_HOLD_FIFO: the clone's placement blocks in
open() on that FIFO until the test opens it for writing or kills the clone. (A package
cache whose files are FIFOs did this before; clones now refuse such a cache.) The full-filesystem
case mounts a small tmpfs (root only).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from conftest import ENVTOOLS, run_envtools

TRACEBACK_IN_ENVTOOLS = re.compile(r'File "[^"]*/envtools/[^"]*", line')


def leftovers(d: Path) -> list[str]:
    return sorted(x.name for x in d.iterdir() if ".envtools-tmp-" in x.name)


def tree_digest(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_symlink():
            h.update(os.readlink(p).encode())
        elif p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


def one_error(stderr: str) -> None:
    """One error line and its hint, no traceback, no panic."""
    assert stderr.count("error:") == 1, stderr
    assert "hint:" in stderr and "Traceback" not in stderr and "panicked" not in stderr, stderr


def fifo_env(channel: Path, base: Path) -> tuple[Path, list[Path]]:
    """A fresh env, and the FIFO (``hold.fifo`` beside it) that clones started by
    start_blocked_clone wait on before they place anything."""
    src = base / "src"
    run_envtools("install", "--channel", channel, "--prefix", src, "demo-meta")
    hold = base / "hold.fifo"
    os.mkfifo(hold, 0o600)
    return src, [hold]


def children_of(pid: int) -> list[int]:
    out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True)
    return [int(x) for x in out.stdout.split()]


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def blocked_clones():
    """Start clones that block on the hold FIFO; whatever a failing test leaves running
    (the clone and its placement workers) is killed at the end."""
    started: list[subprocess.Popen] = []

    def start(src: Path, dest: Path, workers: int) -> subprocess.Popen:
        proc = start_blocked_clone(src, dest, workers)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        pids = [proc.pid, *children_of(proc.pid)]
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.communicate()


def start_blocked_clone(src: Path, dest: Path, workers: int) -> subprocess.Popen:
    proc = subprocess.Popen([*ENVTOOLS, "clone", str(src), str(dest)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "ENVTOOLS_WORKERS": str(workers),
                                 "ENVTOOLS_HOLD_FIFO": str(src.parent / "hold.fifo")})
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            len(children_of(proc.pid)) < workers - 1 or not leftovers(dest.parent)):
        time.sleep(0.02)
    time.sleep(0.2)
    assert proc.poll() is None, proc.communicate()
    return proc


def test_sigkill_clone_workers_die_and_leftover_is_reclaimed(channel, tmp_path,
                                                            blocked_clones):
    src, _ = fifo_env(channel, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    proc = blocked_clones(src, out / "c", workers=3)
    workers = children_of(proc.pid)
    assert len(workers) == 2
    (tmp_dir,) = leftovers(out)
    # while its owner lives, gc keeps it
    p = run_envtools("gc", out)
    assert f"kept {out / tmp_dir}: in use" in p.stdout, p.stdout
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(alive(w) for w in workers):
        time.sleep(0.02)
    survivors = [w for w in workers if alive(w)]
    for w in survivors:
        os.kill(w, signal.SIGKILL)
    assert not survivors, "placement workers outlived a SIGKILLed clone"
    assert leftovers(out) == [tmp_dir]  # SIGKILL runs no clean-up: the record says whose
    owner = json.loads((out / tmp_dir / "conda-meta/envtools/tmp-owner.json").read_text())
    assert owner["pid"] == proc.pid and owner["host"] == socket.gethostname()
    p = run_envtools("gc", "--dry-run", out)
    assert f"would remove {out / tmp_dir}" in p.stdout and leftovers(out) == [tmp_dir]
    # the next run in that directory reclaims it
    dest = tmp_path / "out" / "d"
    p = run_envtools("clone", _plain_env(channel, tmp_path), dest)
    assert f"removed {out / tmp_dir}" in p.stderr
    assert leftovers(out) == [] and (dest / "conda-meta").is_dir()


def _plain_env(channel: Path, base: Path) -> Path:
    env = base / "plain" / "env"
    if not env.exists():
        run_envtools("install", "--channel", channel, "--prefix", env, "demo-meta")
    return env


def test_gc_removes_only_what_is_certainly_dead(tmp_path):
    me = os.getpid()
    with open(f"/proc/{me}/stat") as fh:
        my_start = int(fh.read().rsplit(")", 1)[1].split()[19])
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()

    def make(name: str, record: dict | None, files: bool = True, age: float = 0) -> Path:
        d = tmp_path / name
        (d / "conda-meta" / "envtools").mkdir(parents=True)
        if files:
            (d / "bin").mkdir()
            (d / "bin" / "python").write_text("x")
        if record is not None:
            (d / "conda-meta/envtools/tmp-owner.json").write_text(json.dumps(record))
        if age:
            t = time.time() - age
            os.utime(d, (t, t))
        return d

    host = socket.gethostname()
    dead = make(".a.envtools-tmp-dead", {"host": host, "boot_id": boot, "pid": me,
                                         "start_time": my_start - 1})
    rebooted = make(".b.envtools-tmp-boot", {"host": host, "boot_id": "another-boot",
                                             "pid": me, "start_time": my_start})
    running = make(".c.envtools-tmp-live", {"host": host, "boot_id": boot, "pid": me,
                                            "start_time": my_start})
    remote = make(".d.envtools-tmp-remote", {"host": host + "-elsewhere", "boot_id": boot,
                                             "pid": 1, "start_time": 1})
    foreign = make(".e.envtools-tmp-foreign", None)
    empty_old = make(".f.envtools-tmp-empty", None, files=False, age=3600)
    empty_new = make(".g.envtools-tmp-new", None, files=False)
    garbage = make(".h.envtools-tmp-garbage", None)
    (garbage / "conda-meta/envtools/tmp-owner.json").write_text("not json")
    target = tmp_path / "precious"
    target.mkdir()
    (target / "keep").write_text("x")
    link = tmp_path / ".i.envtools-tmp-link"
    link.symlink_to(target)
    inner_link = make(".j.envtools-tmp-inner", None, files=False, age=3600)
    (inner_link / "conda-meta/envtools/tmp-owner.json").symlink_to(target / "keep")

    p = run_envtools("gc", tmp_path)
    gone = {d for d in (dead, rebooted, running, remote, foreign, empty_old, empty_new,
                        garbage, inner_link) if not d.exists()}
    assert gone == {dead, rebooted, empty_old}, p.stdout
    assert "still running" in p.stdout and "on another host" in p.stdout
    assert "has no owner record" in p.stdout and "not envtools'" in p.stdout
    assert (target / "keep").read_text() == "x" and link.is_symlink()
    p = run_envtools("gc", tmp_path / "nonexistent", check=False)
    assert p.returncode == 2 and "not a directory" in p.stderr


def test_two_clones_to_one_target_loser_fails_and_winner_is_intact(channel, tmp_path,
                                                                  blocked_clones):
    src, fifos = fifo_env(channel, tmp_path)
    target = tmp_path / "out" / "target"
    target.parent.mkdir()
    loser = blocked_clones(src, target, workers=1)
    run_envtools("clone", _plain_env(channel, tmp_path), target)  # the winner
    before = tree_digest(target)
    deadline = time.monotonic() + 30
    while loser.poll() is None and time.monotonic() < deadline:  # let the loser go on
        for f in fifos:
            try:
                os.close(os.open(f, os.O_WRONLY | os.O_NONBLOCK))
            except OSError:
                pass
        time.sleep(0.005)
    _out, err = loser.communicate(timeout=30)
    assert loser.returncode == 1, err
    one_error(err)
    assert "was created by someone else" in err and str(target) in err
    assert tree_digest(target) == before
    assert leftovers(target.parent) == []


def test_corrupt_archive_is_one_error_and_leaves_nothing(channel, tmp_path):
    bad = tmp_path / "channel"
    shutil.copytree(channel, bad)
    for name in ("libdemo-1.0.0", "demo-extra-0.5.0"):
        pkg = next(bad.glob(f"*/{name}-*.conda"))
        data = bytearray(pkg.read_bytes())
        data[len(data) // 2: len(data) // 2 + 64] = bytes(64)
        pkg.write_bytes(bytes(data))
    prefix = tmp_path / "envs" / "p"
    p = run_envtools("install", "--channel", bad, "--prefix", prefix, "demo-meta",
                     check=False)
    assert p.returncode == 1, p.stderr
    one_error(p.stderr)
    assert "libdemo" in p.stderr
    assert sorted(os.listdir(prefix.parent)) == []  # no env, no temp dir, no cache
    # the same through clone --add (with an empty user package cache: the archive is read)
    dest = tmp_path / "c"
    p = run_envtools("clone", _plain_env(channel, tmp_path), dest, "--add", "demo-extra",
                     "--channel", bad, check=False,
                     env={**os.environ, "RATTLER_CACHE_DIR": str(tmp_path / "rattler")})
    assert p.returncode == 1, p.stderr
    one_error(p.stderr)
    assert not dest.exists() and leftovers(tmp_path) == []


def test_damaged_record_is_one_error_naming_it(channel, tmp_path):
    src = tmp_path / "src"
    run_envtools("clone", _plain_env(channel, tmp_path), src)
    rec = next((src / "conda-meta").glob("libdemo-*.json"))
    data = json.loads(rec.read_text())
    del data["version"]
    rec.write_text(json.dumps(data))
    for cmd in (["clone", src, tmp_path / "dest"], ["module", src, "--name", "x/1", "--out",
                                                     tmp_path / "m"]):
        p = run_envtools(*cmd, check=False)
        assert p.returncode == 1, p.stderr
        one_error(p.stderr)
        assert str(rec) in p.stderr and "'version'" in p.stderr
    assert not (tmp_path / "dest").exists() and leftovers(tmp_path) == []
    rec.write_text("{not json")
    p = run_envtools("clone", src, tmp_path / "dest", check=False)
    assert p.returncode == 1 and str(rec) in p.stderr
    one_error(p.stderr)


@pytest.fixture
def small_fs(tmp_path):
    """A 64 KiB tmpfs (root only)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=64k,mode=0755", "tmpfs", str(mnt)],
            capture_output=True).returncode != 0:
        pytest.skip("mounting a tmpfs needs root")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_full_filesystem_is_one_error_and_leaves_nothing(channel, small_fs, tmp_path):
    env = _plain_env(channel, tmp_path)
    for workers in ("1", "2"):
        p = run_envtools("clone", env, small_fs / "c", check=False,
                         env={**os.environ, "ENVTOOLS_WORKERS": workers})
        assert p.returncode == 1, p.stderr
        one_error(p.stderr)
        assert "No space left on device" in p.stderr and str(small_fs / "c") in p.stderr
        assert os.listdir(small_fs) == []
    p = run_envtools("install", "--channel", channel, "--prefix", small_fs / "p", "demo-meta",
                     check=False)
    assert p.returncode == 1, p.stderr
    one_error(p.stderr)
    assert "No space left on device" in p.stderr and "full" in p.stderr
    assert os.listdir(small_fs) == []


def test_ctrl_c_while_starting_is_one_line(channel, tmp_path):
    """SIGINT at many points of start-up: never a traceback through envtools' code (the
    interpreter's own start-up, before any envtools code runs, is outside its reach) and
    never a half-made env or temp dir."""
    env = _plain_env(channel, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    codes = set()
    for i, delay in enumerate([0.005 * k for k in range(1, 16)]):
        dest = out / f"c{i}"
        proc = subprocess.Popen([*ENVTOOLS, "clone", str(env), str(dest)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        _o, err = proc.communicate(timeout=30)
        codes.add(proc.returncode)
        assert not TRACEBACK_IN_ENVTOOLS.search(err), err
        if proc.returncode == 130:
            assert err.strip().splitlines()[-1] == "interrupted; nothing was left behind", err
            assert not dest.exists()
        assert leftovers(out) == []
    assert 130 in codes


def test_cache_tag_is_on_the_package_cache_not_on_envs(channel, tmp_path):
    env = _plain_env(channel, tmp_path)
    tag = "CACHEDIR.TAG"
    assert not (env / tag).exists()
    assert (env.parent / "env.pkgs" / tag).read_text().startswith(
        "Signature: 8a477f597d28d172789f06886806bc55")
    # tar --exclude-caches keeps the env, skips the cache
    archive = tmp_path / "backup.tar"
    subprocess.run(["tar", "-cf", str(archive), "--exclude-caches", "-C", str(env.parent),
                    "env", "env.pkgs"], check=True)
    with tarfile.open(archive) as t:
        names = t.getnames()
    assert "env/conda-meta" in names and not [n for n in names if "/libdemo-1.0.0" in n
                                              and n.startswith("env.pkgs/")]
    # an env made before this fix carries the tag at its root: a clone does not copy it
    old = tmp_path / "old"
    run_envtools("clone", env, old)
    shutil.copy(env.parent / "env.pkgs" / tag, old / tag)
    new = tmp_path / "new"
    run_envtools("clone", old, new)
    assert not (new / tag).exists()
    added = tmp_path / "added"
    run_envtools("clone", env, added, "--add", "demo-extra")  # rattler's installer runs
    assert not (added / tag).exists()


# A reclaim SIGKILLed after it removed the owner record but before the rest: the tree is
# removed in no particular order, so this is what a kill mid-removal can leave. The
# subprocess runs envtools' own remove_leftover; only its remove_tree is replaced, by one
# that deletes the owner record (as the real one may, first) and then dies.
_KILLED_RECLAIM = """
import os, signal, sys
from pathlib import Path
from envtools.prefix import tempdirs

def dies_half_way(path, settle=False):
    os.unlink(Path(path) / tempdirs.OWNER)
    os.kill(os.getpid(), signal.SIGKILL)

tempdirs.remove_tree = dies_half_way
tempdirs.remove_leftover(Path(sys.argv[1]))
"""


def test_a_reclaim_killed_half_way_leaves_what_gc_removes(channel, tmp_path, blocked_clones):
    src, _ = fifo_env(channel, tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    proc = blocked_clones(src, out / "c", workers=1)
    (tmp_dir,) = leftovers(out)
    proc.kill()
    proc.wait()
    killed = subprocess.run([ENVTOOLS[0], "-c", _KILLED_RECLAIM,
                             str(out / tmp_dir)], capture_output=True, text=True)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    (left,) = [x for x in out.iterdir() if x.name.startswith(".")]
    assert ".envtools-trash-" in left.name and left.name.startswith(".c.")
    assert not (left / "conda-meta/envtools/tmp-owner.json").exists()
    assert any(left.rglob("*")), "the killed reclaim left files behind (the case under test)"
    p = run_envtools("gc", out)
    assert f"removed {left}" in p.stdout, p.stdout
    assert list(out.iterdir()) == []

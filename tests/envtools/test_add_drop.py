"""``envtools add`` / ``drop`` on a clone of a fixture env: the change, its refusals, and
the transaction under a failed solve, Ctrl-C, SIGKILL and a full filesystem.

Each case runs the real CLI (real solves and rattler installs from the fixture channel).
Interrupts are placed with ENVTOOLS_TXN_HOLD=POINT:FIFO: the command blocks on the FIFO
at that step (``staged``: before the commit; ``commit``: half-way through it) until the
test opens it or kills the command.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
from conftest import ENVTOOLS, run_envtools
from test_hygiene import one_error, small_fs, tree_digest  # noqa: F401 - small_fs: fixture

TXN = Path("conda-meta") / "envtools" / "txn"


@pytest.fixture
def mine(env, tmp_path) -> Path:
    """A user's writable clone of the fixture's read-only env."""
    dest = tmp_path / "mine"
    run_envtools("clone", env, dest)
    return dest


def validate_status(prefix: Path) -> int:
    return json.loads(run_envtools("validate", prefix, "--json", check=False).stdout)[
        "exit_status"]


def test_add_then_drop(mine):
    before = _digest_without_history(mine)
    p = run_envtools("add", mine, "demo-extra")
    assert "demo-extra=0.5.0" in p.stderr, p.stderr
    info = (mine / "share" / "demo-extra" / "info.txt").read_text()
    assert info == f"extra at {mine}\n"  # linked at the env's path, not the stage's
    assert not (mine / TXN).exists()
    assert "+demo-extra-0.5.0" in (mine / "conda-meta" / "history").read_text()
    assert validate_status(mine) == 0
    # already there: nothing to do, nothing changed
    p = run_envtools("add", mine, "demo-extra")
    assert "nothing to change" in p.stderr, p.stderr

    # libdemo is needed by what stays: refused, saying who needs it, nothing changed
    mid = tree_digest(mine)
    p = run_envtools("drop", mine, "libdemo", check=False)
    assert p.returncode == 2, p.stderr
    one_error(p.stderr)
    assert "demo-extra needs libdemo >=1.0" in p.stderr and "--force" in p.stderr
    assert tree_digest(mine) == mid
    p = run_envtools("drop", mine, "no-such-pkg", check=False)
    assert p.returncode == 2 and "not installed" in p.stderr, p.stderr

    run_envtools("drop", mine, "demo-extra")
    assert not (mine / "share" / "demo-extra").exists()
    assert "-demo-extra-0.5.0" in (mine / "conda-meta" / "history").read_text()
    assert validate_status(mine) == 0
    assert _digest_without_history(mine) == before  # exactly the clone before the add

    # --force drops what others need; validate then names the broken requirement
    p = run_envtools("drop", mine, "libdemo", "--force")
    assert "--force" in p.stderr
    out = json.loads(run_envtools("validate", mine, "--json", check=False).stdout)
    assert out["exit_status"] == 1
    assert "libdemo" in json.dumps(out["findings"])


def _digest_without_history(prefix: Path) -> str:
    hist = prefix / "conda-meta" / "history"
    saved = hist.read_bytes()
    try:
        hist.write_bytes(b"")
        return tree_digest(prefix)
    finally:
        hist.write_bytes(saved)


def test_add_a_noarch_python_package_with_an_entry_point(mine):
    """rattler places it under the env's python (the kept python tells it where) and
    writes its entry point for the env's path, not the stage's."""
    run_envtools("add", mine, "demo-noarch")
    script = mine / "bin" / "demo-noarch"
    assert script.read_text().splitlines()[0].startswith(f"#!{mine}/bin/python")
    out = subprocess.run([script], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["demo-noarch",
                           str(next(mine.glob("lib/python3.*/site-packages/demo_noarch"))
                               / "__init__.py")]
    assert validate_status(mine) == 0


def test_unsatisfiable_spec_names_the_conflict_and_changes_nothing(mine):
    before = tree_digest(mine)
    p = run_envtools("add", mine, "libdemo>=2", check=False)
    assert p.returncode == 2, p.stderr
    one_error(p.stderr)
    assert "libdemo" in p.stderr and "--update-deps" in p.stderr
    p = run_envtools("add", mine, "no-such-package", check=False)
    assert p.returncode == 2 and "no-such-package" in p.stderr, p.stderr
    p = run_envtools("add", mine, "demo-extra", "--channel", mine / "nowhere", check=False)
    assert p.returncode == 2 and str(mine / "nowhere") in p.stderr, p.stderr
    assert tree_digest(mine) == before


def test_read_only_env_is_refused_and_untouched(env):
    before = tree_digest(env)
    for args in (("add", env, "demo-extra"), ("drop", env, "demo-extra")):
        p = run_envtools(*args, check=False)
        assert p.returncode == 2, p.stderr
        one_error(p.stderr)
        assert "read-only" in p.stderr and "clone it first" in p.stderr
    assert tree_digest(env) == before


def _start(args: list, hold: str, fifo: Path) -> subprocess.Popen:
    proc = subprocess.Popen([*ENVTOOLS, *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "ENVTOOLS_TXN_HOLD": f"{hold}:{fifo}"})
    return proc


def _wait_for_stage(prefix: Path, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if what == "staged" and (prefix / TXN / "stage" / "conda-meta" / "history").exists():
            break
        if what == "commit" and (prefix / TXN / "journal.json").exists():
            break
        time.sleep(0.05)
    time.sleep(0.3)
    assert proc.poll() is None, proc.communicate()


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_add_leaves_the_env_as_it_was(mine, tmp_path, sig):
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    before = tree_digest(mine)
    proc = _start(["add", mine, "demo-extra"], "staged", fifo)
    _wait_for_stage(mine, proc, "staged")
    proc.send_signal(sig)
    _out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert tree_digest(mine) == before
    assert not (mine / TXN).exists()


def test_sigkill_mid_commit_is_rolled_back_by_the_next_command(mine, tmp_path):
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    before = tree_digest(mine)
    proc = _start(["add", mine, "demo-extra"], "commit", fifo)
    _wait_for_stage(mine, proc, "commit")
    # half-way: the old history is moved out, the new directories made, nothing moved in
    assert not (mine / "conda-meta" / "history").exists()
    proc.kill()
    proc.communicate(timeout=60)
    out = json.loads(run_envtools("validate", mine, "--json", check=False).stdout)
    (f,) = [f for f in out["findings"] if f["check"] == "interrupted-change"]
    assert "stopped while committing" in f["message"] and f"envtools drop {mine}" in f["hint"]
    # the next command (here one that then fails) rolls it back and says so
    p = run_envtools("drop", mine, "no-such-pkg", check=False)
    assert "rolled back `envtools add" in p.stderr, p.stderr
    assert p.returncode == 2
    assert tree_digest(mine) == before
    assert not (mine / TXN).exists()
    run_envtools("add", mine, "demo-extra")
    assert (mine / "share" / "demo-extra" / "info.txt").exists()


def test_sigkill_while_staging_leaves_the_env_and_next_run_works(mine, tmp_path):
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    before = tree_digest(mine)
    proc = _start(["drop", mine, "demo-py", "--force"], "staged", fifo)
    _wait_for_stage(mine, proc, "staged")
    proc.kill()
    proc.communicate(timeout=60)
    assert _digest_without_txn(mine) == before
    p = run_envtools("drop", mine)  # (no package: only the roll-back)
    assert "rolled back `envtools drop" in p.stderr, p.stderr
    assert tree_digest(mine) == before
    p = run_envtools("add", mine, "demo-extra")
    assert "rolled back" not in p.stderr
    assert validate_status(mine) == 0


def _digest_without_txn(prefix: Path) -> str:
    import shutil

    moved = prefix.parent / "txn-aside"
    os.rename(prefix / TXN, moved)
    try:
        return tree_digest(prefix)
    finally:
        os.rename(moved, prefix / TXN)
        shutil.rmtree(moved, ignore_errors=True)


def test_concurrent_change_is_refused(mine, tmp_path):
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    proc = _start(["add", mine, "demo-extra"], "staged", fifo)
    try:
        _wait_for_stage(mine, proc, "staged")
        p = run_envtools("drop", mine, "demo-py", "--force", check=False)
        assert p.returncode == 2 and "another envtools command is changing" in p.stderr
        assert "envtools add" in p.stderr
        with open(fifo, "wb"):
            pass
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert (mine / "share" / "demo-extra" / "info.txt").exists()


def test_full_filesystem_leaves_the_env_as_it_was(env, small_fs):  # noqa: F811
    subprocess.run(["mount", "-o", "remount,size=4m", str(small_fs)], check=True)
    mine = small_fs / "mine"
    run_envtools("clone", env, mine, "--link-mode", "copy")
    before = tree_digest(mine)
    filler = small_fs / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:  # take every free block
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:
        pass
    finally:
        os.close(fd)
    p = run_envtools("add", mine, "demo-extra", check=False)
    assert p.returncode == 1, p.stderr
    one_error(p.stderr)
    assert "No space left on device" in p.stderr or "full" in p.stderr, p.stderr
    assert tree_digest(mine) == before
    assert not (mine / TXN).exists()
    filler.unlink()
    run_envtools("add", mine, "demo-extra")
    assert validate_status(mine) == 0


def test_ctrl_c_during_the_commit_is_held_off_and_the_change_made_whole(mine, tmp_path):
    fifo = tmp_path / "hold.fifo"
    os.mkfifo(fifo)
    proc = _start(["add", mine, "demo-extra"], "commit", fifo)
    try:
        _wait_for_stage(mine, proc, "commit")
        proc.send_signal(signal.SIGINT)  # (blocked: the commit is under way)
        time.sleep(0.3)
        assert proc.poll() is None
        with open(fifo, "wb"):
            pass
        _out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, err
    assert "an interrupt came during the commit" in err
    assert (mine / "share" / "demo-extra" / "info.txt").read_text() == f"extra at {mine}\n"
    assert not (mine / TXN).exists()
    assert validate_status(mine) == 0

"""Sealed images of the real site env, ``envs/powerai`` as ``make channel`` made it: seal
(twice: the same sha256), run ``import torch, ddl_core`` in it as root and as another uid,
validate it, and clone an ordinary env from it. Skipped, with the reason, where make
channel has not made the env. Slow (minutes on 2 cores): the env has ~60,000 files.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
from conftest import ENVTOOLS, other_user, run_envtools
from test_image import _fuse_usable, _rmtree, assert_nothing_left, procs_with

REPO = Path(__file__).resolve().parents[2]
POWERAI = REPO / "envs" / "powerai"
IMPORT = ("import sys, torch, ddl_core; print(sys.prefix); print(torch.__file__); "
          "print(ddl_core.__file__)")

pytestmark = [
    pytest.mark.skipif(not (POWERAI / "conda-meta").is_dir(),
                       reason=f"no {POWERAI.relative_to(REPO)}: make channel makes it"),
    pytest.mark.skipif(not (shutil.which("mksquashfs") and shutil.which("squashfuse")),
                       reason="needs squashfs-tools and squashfuse (apt-get install "
                       "squashfs-tools squashfuse fuse3)"),
]


@pytest.fixture(scope="module")
def sealed():
    top = Path(tempfile.mkdtemp(prefix="envtools-image-powerai-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        img = top / "powerai.sqfs"
        run_envtools("seal", POWERAI, "--out", img)
        yield top, img
    finally:
        _rmtree(top)


def test_sealed_twice_gives_the_same_image(sealed):
    top, img = sealed
    again = top / "again.sqfs"
    run_envtools("seal", POWERAI, "--out", again)
    assert (Path(f"{again}.sha256").read_text().split()[0]
            == Path(f"{img}.sha256").read_text().split()[0])
    m = json.loads(Path(f"{img}.json").read_text())
    assert m["prefix"] == str(POWERAI)
    assert m["image_bytes"] <= 0.45 * m["env_bytes"]
    again.unlink()


def _check_import(p: subprocess.CompletedProcess, kind: str) -> None:
    assert p.returncode == 0, p.stdout + p.stderr
    lines = p.stdout.splitlines()
    assert f" - {kind}" in lines[0]
    assert lines[1] == str(POWERAI)
    assert lines[2].startswith(f"{POWERAI}/") and lines[3].startswith(f"{POWERAI}/")


def test_import_torch_and_ddl_core_in_the_image(sealed):
    _, img = sealed
    p = run_envtools("run", img, "--", "sh", "-c",
                     f"grep ' {POWERAI} ' /proc/self/mountinfo; "
                     f"exec {POWERAI}/bin/python -c '{IMPORT}'", check=False)
    _check_import(p, "squashfs " if os.geteuid() == 0 else "fuse.squashfuse")
    assert_nothing_left(POWERAI)


def test_import_as_another_uid(sealed):
    why = _fuse_usable()
    if why:
        pytest.skip(why)
    top, img = sealed
    user = other_user(top / "home")
    reach = subprocess.run(user.cmd("test", "-x", str(POWERAI / "bin" / "python")))
    if reach.returncode != 0:
        pytest.skip(f"uid {user.uid} cannot reach {POWERAI} (a private checkout)")
    p = user.run(user.envtools("run", img, "--", "sh", "-c",
                               f"grep ' {POWERAI} ' /proc/self/mountinfo; "
                               f"exec {POWERAI}/bin/python -c '{IMPORT}'"))
    _check_import(p, "fuse.squashfuse")
    assert_nothing_left(POWERAI)


def test_validate_the_image(sealed):
    _, img = sealed
    p = run_envtools("validate", img, "--json", "--no-imports", check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    doc = json.loads(p.stdout)
    assert doc["prefix"] == str(POWERAI) and doc["summary"]["error"] == 0
    assert_nothing_left(POWERAI)


def test_clone_from_the_image(sealed):
    top, img = sealed
    dest = top / "clone"
    p = run_envtools("clone", img, dest, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    assert_nothing_left(POWERAI)
    out = subprocess.run([str(dest / "bin" / "python"), "-c", IMPORT], capture_output=True,
                         text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.splitlines()[0] == str(dest)
    v = run_envtools("validate", dest, "--no-imports", check=False)
    assert v.returncode == 0, v.stderr[-3000:]
    _rmtree(dest)


def test_a_killed_seal_leaves_nothing_gc_does_not_remove(sealed):
    """SIGKILL half-way through mksquashfs: mksquashfs dies too (its parent-death signal),
    no image appears, and the temporary directory is gc's to remove."""
    top, _ = sealed
    out_dir = top / "killed"
    out_dir.mkdir()
    proc = subprocess.Popen([*ENVTOOLS, "seal", POWERAI, "--out", out_dir / "k.sqfs"],
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        started = []
        while not started and proc.poll() is None and time.monotonic() < deadline:
            started = [d / "image" for d in out_dir.iterdir()
                       if (d / "image").is_file() and (d / "image").stat().st_size > 1 << 20]
            time.sleep(0.2)
        assert started, "mksquashfs never started writing"
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + 10
        while procs_with(str(started[0])) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not procs_with(str(started[0])), "mksquashfs outlived envtools"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert not (out_dir / "k.sqfs").exists()
    p = run_envtools("gc", out_dir)
    assert "removed" in p.stdout
    assert os.listdir(out_dir) == []

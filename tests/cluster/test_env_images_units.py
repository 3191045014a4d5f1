"""The node side of `ddlrun --env` (stagenode.py) on this machine, without a cluster:
a stage process keeps its copy while its stream is open and removes it when it ends,
refuses a bad stream, a foreign or open stage directory, and shared filesystems."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from ddl_core.runner import stagenode
from ddl_core.runner.stage import NODE
from envtools.image.manifest import Manifest

DATA = os.urandom(3 << 20) + b"tail"
SHA = hashlib.sha256(DATA).hexdigest()
MIB = 1 << 20


def _manifest(data: bytes = DATA, chunk: int | None = MIB) -> bytes:
    """IMAGE.json for ``data`` as seal writes it: with a sha256 per ``chunk`` bytes (four
    here), or none (an image sealed before chunks)."""
    parts = tuple(hashlib.sha256(data[i:i + chunk]).hexdigest()
                  for i in range(0, len(data), chunk)) if chunk else ()
    return Manifest(prefix="/opt/test-env", platform="linux-64", envtools_version="0",
                    records_sha256="0" * 64, packages=1, files=1, env_bytes=len(data),
                    image_sha256=hashlib.sha256(data).hexdigest(), image_bytes=len(data),
                    chunk_bytes=chunk or 0, chunk_sha256=parts).beside_bytes()


MANIFEST = _manifest()


def _keep(root: Path, sha: str = SHA, manifest: bytes = MANIFEST) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-I", str(NODE), "keep", str(root), "jt-1",
                             str(len(DATA)), sha, str(len(manifest))], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_a_copy_lives_as_long_as_its_stream(tmp_path: Path) -> None:
    p = _keep(tmp_path)
    assert p.stdin and p.stdout
    p.stdin.write(MANIFEST + DATA)
    p.stdin.flush()
    line = p.stdout.readline().decode().strip()
    assert line.startswith("READY "), line + p.stderr.read().decode()
    staged = Path(line[6:])
    assert staged.read_bytes() == DATA
    assert staged.with_name(staged.name + ".json").read_bytes() == MANIFEST
    assert staged.with_name(staged.name + ".sha256").read_text().split()[0] == \
        hashlib.sha256(DATA).hexdigest()
    user = tmp_path / f"ddl-stage-{os.geteuid()}"
    assert staged.parent.parent == user and (user.stat().st_mode & 0o777) == 0o700
    assert (staged.parent / "conda-meta" / "envtools" / "tmp-owner.json").exists()
    # the node mounts it without hashing it again while it is the file it hashed...
    assert stagenode.run_flags(staged) == ["--hashed-by-caller"]
    staged.chmod(0o600)  # ...and after any change (a write bumps the ctime too) it does
    assert stagenode.run_flags(staged) == []
    p.stdin.close()  # the job is over (or ddlrun died)
    assert p.wait(30) == 0
    assert list(user.iterdir()) == []


@pytest.mark.parametrize("chunked", [True, False], ids=["chunk-sha256s", "whole-sha256"])
def test_an_image_without_chunk_digests_is_checked_whole(tmp_path: Path,
                                                         chunked: bool) -> None:
    """Both kinds of IMAGE.json stage the same copy (an image sealed before chunks is
    hashed whole, on one thread)."""
    manifest = _manifest(chunk=MIB if chunked else None)
    p = _keep(tmp_path, manifest=manifest)
    out, err = p.communicate(manifest + DATA, timeout=60)
    assert p.returncode == 0, out + err
    line = out.decode().splitlines()[0]
    assert line.startswith("READY ")
    assert not Path(line[6:]).exists()  # removed when its stream ended


@pytest.mark.parametrize("how", ["altered", "altered-last-chunk", "altered-unchunked",
                                 "short", "another-image"])
def test_a_bad_stream_leaves_nothing(tmp_path: Path, how: str) -> None:
    manifest = _manifest(chunk=None) if how == "altered-unchunked" else MANIFEST
    if how == "another-image":  # IMAGE.json of another image of the same size
        manifest = _manifest(os.urandom(len(DATA)))
    p = _keep(tmp_path, manifest=manifest)
    at = len(DATA) - 2 if how == "altered-last-chunk" else 0
    body = (DATA[:at] + bytes([DATA[at] ^ 1]) + DATA[at + 1:] if how.startswith("altered")
            else DATA[:1000] if how == "short" else DATA)
    try:
        out, _ = p.communicate(manifest + body, timeout=60)
    except BrokenPipeError:  # (the keeper refused the manifest before reading the image)
        out = p.stdout.read() if p.stdout else b""
        p.wait(60)
    assert p.returncode == 1
    line = out.decode().strip()
    assert line.startswith("ERROR "), line
    assert {"short": "stream ended", "another-image": "describes another image"}.get(
        how, "altered or truncated") in line
    if how == "altered-last-chunk":  # names where: the fourth MiB
        assert f"offset {3 * MIB}" in line
    assert list((tmp_path / f"ddl-stage-{os.geteuid()}").iterdir()) == []


def test_a_stage_dir_of_someone_else_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("making a directory owned by another uid needs root")
    d = tmp_path / f"ddl-stage-{os.geteuid()}"
    d.mkdir(mode=0o700)
    os.chown(d, 54321, 54321)
    with pytest.raises(stagenode.StageError, match="not a directory private to uid"):
        stagenode.check_root(tmp_path, 1)
    os.chown(d, 0, 0)
    d.chmod(0o755)  # ours, but open to others
    with pytest.raises(stagenode.StageError, match="someone else made it"):
        stagenode.check_root(tmp_path, 1)


def test_free_space_is_checked_before_copying(tmp_path: Path) -> None:
    vfs = os.statvfs(tmp_path)
    with pytest.raises(stagenode.StageError, match="MiB free, the image needs"):
        stagenode.check_root(tmp_path, vfs.f_blocks * vfs.f_frsize * 2)


def test_filesystem_types() -> None:
    assert stagenode.fs_type(Path("/proc")) == "proc"
    for shared in ("nfs", "nfs4", "lustre", "gpfs", "fuse.sshfs", "fuse", "cifs", "beegfs"):
        assert stagenode.is_shared(shared), shared
    for local in ("ext4", "xfs", "tmpfs", "btrfs", "overlay"):
        assert not stagenode.is_shared(local), local


def test_bare_gc_reclaims_a_killed_jobs_copy(tmp_path: Path) -> None:
    """A keeper killed with SIGKILL (no clean-up runs) leaves its copy in the default stage
    dir; a plain `envtools gc`, run from anywhere, looks there and removes it."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    p = _keep(tmp)
    assert p.stdin and p.stdout
    p.stdin.write(MANIFEST + DATA)
    p.stdin.flush()
    assert p.stdout.readline().startswith(b"READY ")
    p.kill()
    p.wait(30)
    user = tmp / f"ddl-stage-{os.geteuid()}"
    assert len(list(user.iterdir())) == 1  # what the kill left
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    envtools = Path(sys.executable).with_name("envtools")
    proc = subprocess.run([str(envtools), "gc"], cwd=elsewhere, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, TMPDIR=str(tmp)))
    assert proc.returncode == 0, proc.stderr
    assert "removed" in proc.stdout, proc.stdout + proc.stderr
    assert list(user.iterdir()) == []

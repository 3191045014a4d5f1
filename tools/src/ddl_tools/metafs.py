"""The emulated shared filesystem: tools/metafs/metafs.c, built on demand, mounted here.

metafs is a read-only FUSE passthrough whose metadata requests are served by one server
at a fixed latency and counted (the C file's header says what it emulates and why). It is
compiled with libfuse3 (`-Wall -Wextra -Werror`) the first time it is needed, into a
cache named by the source's sha256, so a test or benchmark never runs a stale binary.

    with mounted(src, mountpoint, latency_us=500) as fs:
        ... run things under mountpoint ...
        print(fs.counts()["metadata"])
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SOURCE = Path(__file__).resolve().parents[2] / "metafs" / "metafs.c"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddl-ce" / "metafs"
STATS = ".metafs-stats"


class MetafsError(RuntimeError):
    pass


def skip_reason() -> str | None:
    """Why metafs cannot run here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse"
    if not shutil.which("fusermount3") and os.geteuid() != 0:
        return "no fusermount3 (Debian: fuse3)"
    if not shutil.which("gcc") or not shutil.which("pkg-config"):
        return "no gcc or pkg-config"
    ok = subprocess.run(["pkg-config", "--exists", "fuse3"], capture_output=True).returncode
    if ok != 0:
        return "libfuse3's headers are missing (Debian: libfuse3-dev)"
    return None


def build() -> Path:
    """The metafs binary for the current source (compiled once per change of it)."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:16]
    out = CACHE / digest / "metafs"
    if out.exists():
        return out
    why = skip_reason()
    if why:
        raise MetafsError(f"cannot build metafs: {why}")
    flags = subprocess.run(["pkg-config", "--cflags", "--libs", "fuse3"], capture_output=True,
                           text=True, check=True).stdout.split()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f"metafs.{os.getpid()}")
    proc = subprocess.run(["gcc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o",
                           str(tmp), str(SOURCE), *flags], capture_output=True, text=True)
    if proc.returncode != 0:
        raise MetafsError(f"compiling {SOURCE.name} failed:\n{proc.stderr}")
    tmp.replace(out)
    return out


@dataclass
class Mount:
    """A running metafs: where it is mounted and what it has served."""

    source: Path
    mountpoint: Path
    latency_us: int

    def counts(self) -> dict[str, int]:
        text = (self.mountpoint / STATS).read_text()
        return {k: int(v) for k, v in (line.split() for line in text.splitlines())}


def is_mounted(path: Path) -> bool:
    want = str(Path(os.path.abspath(path)))
    with open("/proc/self/mountinfo") as fh:
        return any(line.split()[4] == want for line in fh)


@contextlib.contextmanager
def mounted(source: Path, mountpoint: Path, latency_us: int = 500,
            dir_timeout_s: float = 60.0) -> Iterator[Mount]:
    """Mount ``source`` read-only at ``mountpoint`` through metafs; unmount at the end
    (also on errors and Ctrl-C)."""
    binary = build()
    mountpoint.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([str(binary), "--latency-us", str(latency_us), "--dir-timeout-s",
                             str(dir_timeout_s), str(source), str(mountpoint), "-f"],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 20
        while not (mountpoint / STATS).exists():
            if proc.poll() is not None:
                raise MetafsError(f"metafs exited ({proc.returncode}): "
                                  f"{(proc.stderr.read() if proc.stderr else '').strip()}")
            if time.monotonic() > deadline:
                raise MetafsError("metafs did not come up within 20 s")
            time.sleep(0.05)
        yield Mount(source, mountpoint, latency_us)
    finally:
        unmount(mountpoint)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def unmount(mountpoint: Path) -> None:
    if not is_mounted(mountpoint):
        return
    cmd = ["umount", "-l", str(mountpoint)] if os.geteuid() == 0 else \
        ["fusermount3", "-u", "-z", str(mountpoint)]
    subprocess.run(cmd, capture_output=True)

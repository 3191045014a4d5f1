"""``envtools mount IMAGE`` (root): the image at its prefix for the whole node.

For a site that publishes a sealed env as a module (``envtools module IMAGE``): the
job prolog mounts the image once per node, every user's ``module load`` then finds the
env at its prefix, and the epilog runs ``envtools mount --umount IMAGE``. The image is
verified first, as for ``run``; the kernel's squashfs mounts it read-only, ``nodev``
and ``nosuid`` (squashfuse with ``allow_other`` where loop devices are missing). A prefix
that already has this image mounted is left as it is (prologs run again); one with
anything else mounted is refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from envtools.base.progress import info
from envtools.errors import EnvtoolsError
from envtools.image.manifest import INNER, parse
from envtools.image.namespace import check_fuse, make_mountpoint, remove_made
from envtools.image.verify import open_image, verify_fd


def mounted_at(path: str) -> str | None:
    """The filesystem type mounted at ``path`` in this mount namespace, or None."""
    want = os.path.realpath(path)
    found = None
    with open("/proc/self/mountinfo", encoding="utf-8", errors="replace") as fh:
        for line in fh:
            f = line.split()
            mp = f[4].replace("\\040", " ").replace("\\011", "\t").replace("\\134", "\\")
            if mp == want:
                found = f[f.index("-") + 1]  # (the last mount there is what is seen)
    return found


def _root_only(what: str) -> None:
    if os.geteuid() != 0:
        raise EnvtoolsError(f"{what} is for root (it changes what every user of the node "
                            "sees)", "as a user, run in the image instead: envtools run IMAGE "
                            "-- CMD", exit_code=2)


def mount(image: str | os.PathLike[str], mount_with: str = "auto") -> str:
    """Mount ``image`` at its prefix for the node; returns the prefix."""
    _root_only("envtools mount")
    path, fd = open_image(image)
    try:
        m = verify_fd(path, fd)
        have = mounted_at(m.prefix)
        if have is not None:
            inner = Path(m.prefix) / INNER
            try:
                same = parse(inner.read_bytes(), str(inner), beside=False).inner() == m.inner()
            except (OSError, EnvtoolsError):
                same = False
            if same:
                info(f"{path} is already mounted at ", m.prefix)
                return m.prefix
            raise EnvtoolsError(f"{m.prefix} already has a {have} filesystem mounted",
                                f"unmount it first (umount {m.prefix}), or mount elsewhere",
                                exit_code=2)
        made = make_mountpoint(m.prefix)  # (refuses a prefix linked to a system directory)
        src = f"/proc/self/fd/{fd}"
        loop = Path("/dev/loop-control").exists() and shutil.which("mount")
        if mount_with != "fuse" and loop:
            argv = ["mount", "-t", "squashfs", "-o", "loop,ro,nodev,nosuid", src, m.prefix]
        else:
            check_fuse()
            fuse = shutil.which("squashfuse_ll") or "squashfuse"
            argv = [fuse, "-o", "ro,allow_other,nodev,nosuid", src, m.prefix]
        p = subprocess.run(argv, pass_fds=(fd,), capture_output=True, text=True)
        if p.returncode != 0:
            remove_made(made)
            raise EnvtoolsError(
                f"cannot mount {path} at {m.prefix}: "
                f"{p.stderr.strip().splitlines()[-1:] or [f'{argv[0]} exit {p.returncode}']}",
                "check that loop devices (modprobe loop) or FUSE (apt-get install squashfuse "
                "fuse3) work here", exit_code=2)
        info(f"mounted {path} at ", m.prefix)
        return m.prefix
    finally:
        os.close(fd)


def umount(image: str | os.PathLike[str]) -> None:
    """Unmount the image from its prefix (read from IMAGE.json: no need to hash it)."""
    from envtools.image.manifest import sidecars

    _root_only("envtools mount --umount")
    json_file = sidecars(Path(os.path.abspath(image)))[1]
    try:
        m = parse(json_file.read_bytes(), str(json_file), beside=True)
    except OSError as e:
        raise EnvtoolsError(f"cannot read {json_file}: {e.strerror}",
                            "give the image (its .json must be beside it)") from e
    have = mounted_at(m.prefix)
    if have not in ("squashfs", "fuse.squashfuse", "fuse.squashfuse_ll"):
        info(f"nothing of an image is mounted at {m.prefix}")
        return
    p = subprocess.run(["umount", m.prefix], capture_output=True, text=True)
    if p.returncode != 0:
        raise EnvtoolsError(f"cannot unmount {m.prefix}: {p.stderr.strip()}",
                            f"a process still uses it (fuser -vm {m.prefix} names them); "
                            "end it and run again", exit_code=1)
    info("unmounted ", m.prefix)

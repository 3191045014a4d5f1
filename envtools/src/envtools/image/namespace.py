r"""Mount an image at its prefix inside a private mount namespace of one command.

Why the baked prefix and a namespace (rather than relocating at seal time to a neutral
mount path): every RPATH, shebang, ``conda-meta`` record and pip RECORD of the env names
its prefix, so mounted there the env is byte for byte what was validated, with nothing
rewritten. The mount is private to the command's namespace: two users running images
with the same prefix on one node never see each other's, the host's own copy of the
prefix (if any) is untouched, and nothing outlives the command, because a mount
namespace dies with its last process.

How, as a user (no root, no setuid helper): ``unshare --user --map-root-user --mount
--pid --fork --kill-child`` gives a namespace where we are root and may mount FUSE;
``squashfuse`` mounts the image there (directly: as namespace root it needs no
``fusermount3``, which would refuse a mountpoint the user does not own), and the
command runs in a second user namespace mapping the user's real uid and gid back
(``unshare --user --map-user=UID --map-group=GID``), so files it writes outside the
image are the user's and ``id`` shows them. As root: ``unshare --mount --propagation
private --pid --fork --kill-child`` and the kernel's squashfs (``mount -t squashfs -o
loop,ro``), falling back to squashfuse where loop devices are missing.

What dies when: the namespace's first process (the ``sh`` below, pid 1 there) waits
for the command and exits with its status; when pid 1 exits, the kernel kills every
other process of the pid namespace (squashfuse), and the mount goes with the mount
namespace. If the command is killed, sh reports 128+signal. If envtools is killed
(even SIGKILL), ``unshare`` gets SIGKILL (parent-death signal set before it starts),
and its ``--kill-child`` kills sh, and with it the namespace. SIGTERM to envtools is
passed to the command (sh traps it); Ctrl-C reaches the command from the terminal.

The image is handed to the mounter as ``/proc/self/fd/N``: the descriptor envtools
verified, so the bytes mounted are the bytes checked even if the path is replaced.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from envtools.errors import EnvtoolsError
from envtools.image.manifest import check_prefix

#: the namespace's pid 1: mount, say "ok" on stderr (the status pipe envtools reads),
#: give the command the user's stderr back, run it, pass SIGTERM/SIGHUP on, exit with its
#: status. Arguments: image-fd stderr-fd mountpoint manifest how(kernel|fuse) uid gid
#: (uid "-": run as we are) fuse-program, then the command.
INIT = r"""
imgfd=$1 errfd=$2 mp=$3 man=$4 how=$5 uid=$6 gid=$7 fuse=$8; shift 8
img=/proc/self/fd/$imgfd
if [ "$how" = kernel ]; then
  mount -t squashfs -o loop,ro,nodev "$img" "$mp" || how=fuse
fi
if [ "$how" = fuse ]; then
  eval '"$fuse" -o ro "$img" "$mp" '"$errfd>&-" || { echo "$fuse failed" >&2; exit 125; }
fi
i=0
until [ -f "$mp/$man" ]; do
  i=$((i + 1))
  [ "$i" -gt 1000 ] && { echo "the mount did not come up within 10 s" >&2; exit 125; }
  sleep 0.01
done
echo ok >&2
eval "exec 2>&$errfd $errfd>&- $imgfd<&-"
exec 5<&0
trap 'kill -TERM "$c" 2>/dev/null' TERM
trap 'kill -HUP "$c" 2>/dev/null' HUP
if [ "$uid" = - ]; then
  "$@" 0<&5 5<&- &
else
  unshare --user --map-user="$uid" --map-group="$gid" -- "$@" 0<&5 5<&- &
fi
c=$!
exec 5<&-
while :; do
  wait "$c"; rc=$?
  kill -0 "$c" 2>/dev/null || break
done
exit "$rc"
"""


@dataclass(frozen=True)
class Plan:
    """How this process will mount: ``kernel`` (root, loop devices), else ``fuse``."""

    how: str
    as_root: bool
    #: squashfuse_ll where there is one (the same Debian package ships both): its
    #: low-level FUSE API looks entries up by inode, not by whole path, and started
    #: ``import torch, ddl_core`` in about 0.8x squashfuse's time here
    fuse: str = "squashfuse"

    def argv(self, image_fd: int, stderr_fd: int, mountpoint: str, manifest: str,
             command: list[str]) -> list[str]:
        """The whole command line: unshare, sh running :data:`INIT`, its arguments."""
        if self.as_root:
            ns = ["unshare", "--mount", "--propagation", "private", "--pid", "--fork",
                  "--kill-child"]
            ids = ["-", "-"]
        else:
            ns = ["unshare", "--user", "--map-root-user", "--mount", "--propagation",
                  "private", "--pid", "--fork", "--kill-child"]
            ids = [str(os.getuid()), str(os.getgid())]
        return [*ns, "--", "/bin/sh", "-c", INIT, "envtools-image", str(image_fd),
                str(stderr_fd), mountpoint, manifest, self.how, *ids, self.fuse, *command]


def plan(mount_with: str = "auto") -> Plan:
    """Choose the mounter, and check that what it needs is here (one clear error if not).

    ``mount_with``: auto (kernel as root where loop devices exist, else squashfuse),
    kernel, or fuse.
    """
    if mount_with not in ("auto", "kernel", "fuse"):
        raise EnvtoolsError(f"unknown mount method {mount_with!r}", "use auto, kernel or fuse")
    if shutil.which("unshare") is None:
        raise EnvtoolsError("unshare is not installed (it makes the job's private mount)",
                            "apt-get install util-linux", exit_code=2)
    root = os.geteuid() == 0
    if mount_with == "kernel" and not root:
        raise EnvtoolsError("the kernel's squashfs needs root",
                            "run as root, or use --mount-with fuse (squashfuse)", exit_code=2)
    loop = Path("/dev/loop-control").exists()
    fuse = shutil.which("squashfuse_ll") or shutil.which("squashfuse") or "squashfuse"
    if root and mount_with != "fuse" and loop and shutil.which("mount"):
        return Plan("kernel", True, fuse)
    if mount_with == "kernel":
        raise EnvtoolsError("no loop devices here (/dev/loop-control is missing)",
                            "modprobe loop, or use --mount-with fuse (squashfuse)", exit_code=2)
    check_fuse()
    if not root:
        check_userns()
    return Plan("fuse", root, fuse)


def check_fuse() -> None:
    """squashfuse and a usable /dev/fuse, or the Debian package / command that fixes it."""
    if shutil.which("squashfuse") is None and shutil.which("squashfuse_ll") is None:
        raise EnvtoolsError("squashfuse is not installed (it mounts images without root)",
                            "apt-get install squashfuse", exit_code=2)
    if not os.path.exists("/dev/fuse"):
        raise EnvtoolsError("/dev/fuse does not exist: FUSE is not available on this node",
                            "apt-get install fuse3 (and modprobe fuse), or ask the admin "
                            "to mount the image for you (envtools mount IMAGE)", exit_code=2)
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        raise EnvtoolsError(
            "/dev/fuse is not readable and writable by you, so squashfuse cannot mount",
            "ask the admin to make it so (chmod 0666 /dev/fuse, Debian fuse3's default), "
            "or to mount the image for you (envtools mount IMAGE)", exit_code=2)


def check_userns() -> None:
    """Unprivileged user namespaces allowed (some sites switch them off)."""
    for knob in ("/proc/sys/kernel/unprivileged_userns_clone",
                 "/proc/sys/user/max_user_namespaces"):
        try:
            with open(knob) as fh:
                v = fh.read().strip()
        except OSError:
            continue
        if v == "0":
            raise EnvtoolsError(
                f"user namespaces are switched off on this node ({knob} is 0), so images "
                "cannot be mounted without root",
                "ask the admin to enable them, or to mount the image on the node "
                "(envtools mount IMAGE)", exit_code=2)


def make_mountpoint(prefix: str) -> list[str]:
    """Make the prefix (and missing parents) if it does not exist; returns what was made,
    deepest last, for :func:`remove_made`. Raises when it cannot be made."""
    real = os.path.realpath(prefix)
    if real != prefix:  # (a link on the way: what is mounted over is where it leads)
        try:
            check_prefix(real, f"the image's prefix {prefix}")
        except EnvtoolsError:
            raise EnvtoolsError(
                f"the image's prefix {prefix} leads to {real}, a system directory, through "
                "a symbolic link", "mount only images whose prefix is an env's directory",
                exit_code=2) from None
    if os.path.isdir(prefix):
        return []
    if os.path.lexists(prefix):
        raise EnvtoolsError(
            f"the image's prefix {prefix} exists here but is not a directory, so the image "
            "cannot be mounted there", f"move {prefix} away, or run where it is free",
            exit_code=2)
    made: list[str] = []
    missing = []
    p = prefix
    while not os.path.lexists(p):
        missing.append(p)
        p = os.path.dirname(p)
    try:
        for d in reversed(missing):
            os.mkdir(d, 0o755)
            made.append(d)
    except OSError as e:
        remove_made(made)
        raise EnvtoolsError(
            f"the image's prefix {prefix} does not exist here and cannot be made "
            f"({e.strerror}: {e.filename or d}), so the image cannot be mounted there",
            f"ask the admin to create it (mkdir -p {prefix}) or to mount the image on "
            "the node (envtools mount IMAGE)", exit_code=2) from e
    return made


def remove_made(made: list[str]) -> None:
    """Remove the mountpoint directories :func:`make_mountpoint` made (if still empty)."""
    for d in reversed(made):
        try:
            os.rmdir(d)
        except OSError:
            return

"""``envtools run IMAGE -- CMD``: run a command with the image mounted at its prefix.

The image is verified first (:func:`envtools.image.verify.verify_fd`: size, sha256,
manifest, platform), then mounted in the command's own namespace
(:mod:`envtools.image.namespace`), and the command's exit status is returned (128+N
when a signal N killed it). A mountpoint directory that had to be made is removed
afterwards. Setup failures (no namespace, the mount refused) are one EnvtoolsError
with the mounter's own words; nothing is left mounted, since the mount only ever
existed inside the namespace that died with the failure.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from collections.abc import Callable, Sequence

from envtools.errors import EnvtoolsError
from envtools.image.children import die_with_parent
from envtools.image.manifest import INNER, Manifest
from envtools.image.namespace import make_mountpoint, plan, remove_made
from envtools.image.verify import open_image, verify_fd

#: how long the namespace may take to mount before envtools gives up (s)
MOUNT_TIMEOUT_S = float(os.environ.get("ENVTOOLS_MOUNT_TIMEOUT", "60"))


def _pid1_of(unshare_pid: int) -> int | None:
    """The namespace's sh (unshare's child) as seen from here, to pass signals on."""
    try:
        with open(f"/proc/{unshare_pid}/task/{unshare_pid}/children") as fh:
            kids = fh.read().split()
    except OSError:
        return None
    return int(kids[0]) if kids else None


def _await_mount(proc: subprocess.Popen, status: int) -> list[str]:
    """Read the namespace's setup messages until "ok" (returns []), or its failure
    (returns what it said)."""
    said: list[str] = []
    buf = b""
    deadline = time.monotonic() + MOUNT_TIMEOUT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            said.append(f"no mount after {MOUNT_TIMEOUT_S:.0f} s")
            return said
        ready, _, _ = select.select([status], [], [], left)
        if not ready:
            continue
        chunk = os.read(status, 4096)
        if not chunk:
            return said or [f"the namespace ended (exit {proc.wait()}) before mounting"]
        buf += chunk
        *lines, buf = buf.split(b"\n")
        for ln in lines:
            text = ln.decode(errors="replace").strip()
            if text == "ok":
                return []
            if text:
                said.append(text)


def _why(said: list[str], prefix: str) -> tuple[str, str]:
    """The setup failure as (message, hint)."""
    text = " / ".join(said[-3:])
    low = text.lower()
    if "unshare" in low and ("permitted" in low or "denied" in low):
        return (f"cannot make the command's private namespace: {text}",
                "user namespaces may be restricted here (sysctl kernel.unprivileged_userns_"
                "clone, user.max_user_namespaces, or an AppArmor policy); ask the admin to "
                "allow them or to mount the image on the node (envtools mount IMAGE)")
    if "fuse" in low and ("device" in low or "/dev/fuse" in low):
        return (f"FUSE is not usable: {text}",
                "apt-get install fuse3 and make /dev/fuse readable and writable "
                "(chmod 0666 /dev/fuse, Debian's default)")
    return (f"cannot mount the image at {prefix}: {text}",
            "check that the image is intact (envtools validate IMAGE) and that squashfuse "
            "(apt-get install squashfuse) or, as root, loop devices work here")


def run(image: str | os.PathLike[str], command: Sequence[str], mount_with: str = "auto",
        env: dict[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
        expected_sha256: str | None = None, hash_it: bool = True) -> int:
    """Run ``command`` with ``image`` mounted at its prefix; returns its exit status.

    ``mount_with``: auto, kernel (root) or fuse. ``expected_sha256``: verify against this
    instead of the ``IMAGE.sha256`` beside it. ``hash_it=False``: the caller hashed this
    file itself just now (see :func:`envtools.image.verify.verify_fd`). Raises
    EnvtoolsError (exit 2) if the image is bad or cannot be mounted here; the command
    has not started then.
    """
    if not command:
        raise EnvtoolsError("no command to run", "give one after --: envtools run IMAGE -- CMD")
    plan(mount_with)  # (what is missing to mount is said before the image is read)
    path, fd = open_image(image)
    try:
        m = verify_fd(path, fd, expected_sha256, hash_it)
        return run_verified(fd, m, list(command), mount_with, env, cwd)
    finally:
        os.close(fd)


def run_verified(image_fd: int, m: Manifest, command: list[str], mount_with: str = "auto",
                 env: dict[str, str] | None = None,
                 cwd: str | os.PathLike[str] | None = None) -> int:
    """:func:`run` for an image already open and verified (``image_fd``, ``m``)."""
    how = plan(mount_with)
    made = make_mountpoint(m.prefix)
    err = os.dup(2)
    r, w = os.pipe()
    proc: subprocess.Popen | None = None
    old: dict[int, object] = {}
    try:
        argv = how.argv(image_fd, err, m.prefix, INNER, command)
        try:
            proc = subprocess.Popen(argv, stderr=w, pass_fds=(image_fd, err), env=env,
                                    cwd=cwd, preexec_fn=die_with_parent())
        except OSError as e:
            raise EnvtoolsError(f"cannot start unshare: {e.strerror}",
                                "apt-get install util-linux", exit_code=2) from e
        os.close(w)
        w = -1
        said = _await_mount(proc, r)
        if said:
            proc.kill()
            proc.wait()
            msg, hint = _why(said, m.prefix)
            raise EnvtoolsError(msg, hint, exit_code=2)

        def forward(signum, frame):  # SIGTERM/SIGHUP: to the namespace's sh, which
            pid1 = _pid1_of(proc.pid)  # passes it to the command
            if pid1:
                try:
                    os.kill(pid1, signum)
                except ProcessLookupError:
                    pass

        old[signal.SIGINT] = signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the terminal
        for s in (signal.SIGTERM, signal.SIGHUP):                          # sends it to CMD)
            old[s] = signal.signal(s, forward)
        rc = proc.wait()
        return 128 - rc if rc < 0 else rc
    except BaseException:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        raise
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for f in (r, w, err):
            if f >= 0:
                os.close(f)
        remove_made(made)


def run_python(image: str | os.PathLike[str], make_args: Callable[[Manifest], list[str]],
               mount_with: str = "auto") -> int:
    """Run this interpreter with ``make_args(manifest)`` inside the mounted image (how
    ``validate``, ``clone`` and ``module`` of an image work: ``-m envtools validate
    PREFIX`` ...). The arguments name the prefix, known once the image is verified;
    ``make_args`` may refuse by raising EnvtoolsError before anything is mounted."""
    import sys

    plan(mount_with)
    path, fd = open_image(image)
    try:
        m = verify_fd(path, fd)
        return run_verified(fd, m, [sys.executable, *make_args(m)], mount_with)
    finally:
        os.close(fd)

"""The image subcommands (seal, run, mount) and the IMAGE forms of validate, clone and
module, registered into ``envtools``' parser by :func:`register` (kept here so the main
CLI only calls in). Nothing heavy is imported until a command runs."""

from __future__ import annotations

import argparse
import json
import os
import stat
from pathlib import Path

from envtools.base.progress import info
from envtools.errors import EnvtoolsError


def is_image(path: Path) -> bool:
    """An IMAGE argument is a file (an env is a directory)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except OSError:
        return False


def _cmd_seal(a: argparse.Namespace) -> int:
    """Seal an env into one read-only, reproducible image file (SquashFS, zstd).

    Writes IMAGE, IMAGE.sha256 and IMAGE.json (the manifest: prefix, platform, envtools
    version, the records' digest, sizes). Nothing is written into PREFIX, so any user
    who can read a site env can seal it. An env that validate finds broken is refused
    (naming the findings) unless --force. The same env sealed twice gives the same bytes.
    Use the image with envtools run IMAGE -- CMD, validate IMAGE, clone IMAGE DEST,
    module IMAGE, or ddlrun --env IMAGE.
    """
    from envtools.image.seal import seal

    seal(a.prefix, a.out, force=a.force)
    return 0


def _cmd_run(a: argparse.Namespace) -> int:
    """Run CMD with the image mounted at its prefix, privately, without root.

    The image is checked first (size, sha256 against IMAGE.sha256, manifest, platform),
    then mounted where its files expect it, in a mount namespace only CMD sees
    (squashfuse in a user namespace; as root the kernel's squashfs). The exit status is
    CMD's (128+N if signal N killed it); nothing stays mounted afterwards, also when
    CMD or envtools is killed.
    """
    from envtools.image.run import run

    cmd = a.command[1:] if a.command[:1] == ["--"] else a.command
    return run(a.image, cmd, mount_with=a.mount_with, hash_it=not a.hashed_by_caller)


def _cmd_mount(a: argparse.Namespace) -> int:
    """(root) Mount an image at its prefix for the whole node, e.g. in a job prolog.

    Checks the image first, as run does. Every user of the node then sees the env at
    its prefix and can `module load` it (envtools module IMAGE). --umount undoes it
    (the epilog). A user needs none of this: envtools run IMAGE -- CMD.
    """
    from envtools.image.mount import mount, umount

    if a.umount:
        umount(a.image)
    else:
        mount(a.image, mount_with=a.mount_with)
    return 0


def validate_image(a: argparse.Namespace) -> int:
    """validate IMAGE: verify it, then validate the mounted prefix as a prefix."""
    from envtools.image.run import run_python

    flags = [*(["--json"] if a.json else []), *(["--full"] if a.full else []),
             *(["--no-imports"] if a.no_imports else []),
             "--import-timeout", str(a.import_timeout),
             *(f"--virtual={v}" for v in a.virtual or [])]

    def args(m) -> list[str]:  # noqa: ANN001
        info(f"{a.prefix}: sha256 ok, {m.platform}, {m.packages} packages; validating it "
             f"mounted at {m.prefix}")
        return ["-m", "envtools", "validate", m.prefix, *flags]

    try:
        return run_python(a.prefix, args)
    except EnvtoolsError as e:
        if a.json:
            from envtools.validate.findings import SCHEMA

            print(json.dumps({"schema": SCHEMA, "prefix": str(a.prefix), "exit_status": 2,
                              "error": e.message, "hint": e.hint}, indent=2))
        raise EnvtoolsError(e.message, e.hint, exit_code=2) from e


def clone_image(a: argparse.Namespace) -> int:
    """clone IMAGE DEST: an ordinary env again, copied from the mounted image."""
    from envtools.image.run import run_python

    if a.link_mode not in ("auto", "copy"):
        raise EnvtoolsError(
            f"--link-mode {a.link_mode} cannot link to an image: its files exist only "
            "while it is mounted", "leave --link-mode out: a clone of an image copies")
    dest = os.path.abspath(a.dest)

    def args(m) -> list[str]:  # noqa: ANN001
        if dest == m.prefix or dest.startswith(m.prefix.rstrip("/") + "/"):
            raise EnvtoolsError(f"{dest} is inside the image's prefix {m.prefix}",
                                "clone it to a directory outside that prefix")
        out = ["-m", "envtools", "clone", m.prefix, dest, "--no-cache", "--link-mode", "copy"]
        for s in a.add or []:
            out += ["--add", s]
        for c in a.channel or []:
            out += ["--channel", c]
        for v in a.virtual or []:
            out.append(f"--virtual={v}")
        return out + (["--allow-update"] if a.allow_update else [])

    return run_python(a.src, args)


def module_image(a: argparse.Namespace) -> int:
    """module IMAGE: modulefiles for the image mounted at its prefix on each node."""
    from envtools.image.run import run_python

    out = os.path.abspath(a.out)

    def args(m) -> list[str]:  # noqa: ANN001
        return ["-m", "envtools.image.modulefile", m.prefix, str(os.path.abspath(a.prefix)),
                "--out", out, "--format", a.format, *(["--name", a.name] if a.name else [])]

    return run_python(a.prefix, args)


def _mount_with(p: argparse.ArgumentParser) -> None:
    p.add_argument("--mount-with", choices=("auto", "kernel", "fuse"), default="auto",
                   help="auto: the kernel's squashfs as root (loop devices), else squashfuse")


def register(sub, subcommand) -> None:  # noqa: ANN001 - argparse's private types
    """Add seal, run and mount to ``envtools``' subparsers (``subcommand`` makes one)."""
    p = subcommand(sub, "seal", _cmd_seal)
    p.add_argument("prefix", type=Path, help="the environment to seal (read, never written)")
    p.add_argument("--out", type=Path, required=True,
                   help="the image file to write, outside the env (must not exist)")
    p.add_argument("--force", action="store_true",
                   help="seal even though validate finds errors in the env")

    p = subcommand(sub, "run", _cmd_run)
    p.add_argument("image", type=Path, help="an image made by envtools seal")
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- CMD ...",
                   help="the command and its arguments")
    _mount_with(p)
    p.add_argument("--hashed-by-caller", action="store_true",
                   help="skip only the check of the image's contents against its sha256s "
                   "(size, manifests and platform are still checked): for a launcher "
                   "that checked this very file just before, as ddlrun --env does after "
                   "staging it")

    p = subcommand(sub, "mount", _cmd_mount)
    p.add_argument("image", type=Path, help="an image made by envtools seal")
    p.add_argument("--umount", action="store_true",
                   help="unmount it from its prefix instead (a job epilog)")
    _mount_with(p)

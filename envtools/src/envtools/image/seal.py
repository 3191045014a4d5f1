"""``envtools seal PREFIX --out IMAGE``: one read-only, reproducible SquashFS of an env.

The image is what ``mksquashfs`` (Debian's squashfs-tools) makes of the prefix, zstd
compressed, with the manifest (:mod:`envtools.image.manifest`) added as a pseudo file, so
nothing is ever written into the prefix: a site env is sealed by any user who can read
it, and its bytes, timestamps and directories stay as they were (no lock file, no
``__pycache__``; validate's import test is not run here, see below).

Reproducible: mksquashfs sorts directory entries and is reproducible by default (also
with several threads); owners are all root (``-all-root``), extended attributes are left
out (``-no-xattrs``: an SELinux label or a user.* attribute would make one machine's seal
differ from another's), and the filesystem time is fixed (``SOURCE_DATE_EPOCH``, else 0).
File times are the env's own: they are part of the env (a timestamp-checked ``.pyc``,
such as ddl_torch's, is valid only with its source's mtime; make and the stat cache
read them too) and do not change while the env does not, so an unchanged env seals to
the same bytes. Two installs of the same packages at different times differ in their
mtimes and therefore in their image.

An env that ``validate`` finds broken is refused unless ``force``: its file, dependency,
pip and binary checks run (not the import smoke test, which starts the env's python on
every package: ``envtools validate IMAGE`` runs it on the result).

The image and its sidecars are built in ``.IMAGE.envtools-tmp-*`` beside IMAGE (owner
record and lock as for clones, so a killed seal is reclaimed by the next one and by
``envtools gc``); the sidecars are renamed into place first and the image last, with
``link(2)``, which never replaces a file someone else made meanwhile.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import envtools
from envtools.base.progress import info
from envtools.errors import EnvtoolsError
from envtools.image.children import die_with_parent
from envtools.image.chunks import chunk_for, digest_file
from envtools.image.manifest import (
    COMPRESSION,
    INNER,
    Manifest,
    check_prefix,
    host_platform,
    records_digest,
    sidecars,
    tree_size,
)
from envtools.prefix import tempdirs

#: zstd level. Measured on envs/powerai (2.8 GiB, 60,800 entries), 1 MiB blocks, 2
#: threads: level 3 took 13 s of CPU for 651 MiB (24% of the env), level 9 54 s for
#: 600 MiB, level 15 (mksquashfs's default) over 4x level 9's time. The image is
#: read back at the same speed whatever the level, and sealed again after every change
#: of an env, so the fast level wins: 8% more bytes to stage against 4x the CPU.
ZSTD_LEVEL = int(os.environ.get("ENVTOOLS_SEAL_ZSTD_LEVEL", "3"))
#: squashfs block size: the default 128 KiB, not 1 MiB (a little smaller image): small
#: files are packed into fragment blocks of this size, and reading one file decompresses
#: its whole block; an import storm reads thousands of small files, in any order, through
#: a cache of a few blocks (the kernel's default is 3 fragments). Smaller blocks did not
#: start faster: `import torch, ddl_core` in a freshly mounted powerai image took 4.3-6.1 s
#: at 128K, 4.6-5.9 s at 64K and 4.7-4.8 s at 32K (images 723, 758, 805 MiB), with the
#: image's sha256 checked by envtools run each time; 1M blocks doubled a full read
BLOCK_SIZE = os.environ.get("ENVTOOLS_SEAL_BLOCK", "128K")
#: how many validate findings an error message lists
_SHOW = 5


def baked_prefix(prefix: Path) -> str:
    """The path the env's files name (its records, RPATHs, shebangs): where it must be
    mounted. Recorded by install and clone; an env moved since cannot be sealed."""
    from envtools.prefix.readonly import read_prefix_info

    recorded = read_prefix_info(prefix).get("prefix")
    if isinstance(recorded, str) and recorded:
        try:
            same = os.path.samefile(recorded, prefix)
        except OSError:
            same = False
        if not same:
            raise EnvtoolsError(
                f"{prefix} was made at {recorded}, and its files name that path",
                f"seal it at {recorded}, or clone it to where it is now "
                f"(envtools clone {recorded} DEST) and seal the clone", exit_code=2)
        return check_prefix(os.path.normpath(recorded), str(prefix))
    return check_prefix(os.path.normpath(str(prefix)), str(prefix))


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def check_out(prefix: Path, out: Path) -> None:
    """Refuse an --out in the prefix (sealing writes nothing there) or one that exists."""
    real_prefix = os.path.realpath(prefix)
    real_parent = os.path.realpath(out.parent)
    if _inside(real_parent, real_prefix) or _inside(str(out), str(prefix)):
        raise EnvtoolsError(
            f"{out} is inside the env being sealed ({prefix})",
            "write the image outside the env, e.g. --out ~/images/NAME.sqfs", exit_code=2)
    if os.path.lexists(out):
        raise EnvtoolsError(f"{out} already exists",
                            "remove it first, or choose another --out; it was left as it is",
                            exit_code=2)


def _refuse_broken(prefix: Path) -> None:
    from envtools.validate.run import validate

    _ctx, findings = validate(prefix, imports=False)
    errors = [f for f in findings if f.severity == "error"]
    if not errors:
        return
    shown = "; ".join(f"{f.check}: {f.message}" for f in errors[:_SHOW])
    more = f" (and {len(errors) - _SHOW} more)" if len(errors) > _SHOW else ""
    raise EnvtoolsError(
        f"refusing to seal {prefix}: validate finds {len(errors)} errors: {shown}{more}",
        f"fix them (envtools validate {prefix} says how), or seal it as it is with --force",
        exit_code=1)


def _epoch() -> int:
    v = os.environ.get("SOURCE_DATE_EPOCH", "0")
    try:
        t = int(v)
    except ValueError:
        raise EnvtoolsError(f"SOURCE_DATE_EPOCH={v!r} is not a number of seconds",
                            "unset it or give whole seconds since 1970") from None
    if not 0 <= t < 1 << 32:
        raise EnvtoolsError(f"SOURCE_DATE_EPOCH={v} is out of range (0 .. 2^32-1)",
                            "unset it or give whole seconds since 1970")
    return t


def mksquashfs_argv(prefix: Path, image: Path, manifest_file: Path, epoch: int,
                    has_dir: bool, processors: int | None = None) -> list[str]:
    """The mksquashfs command line of a seal (one function: the benchmark times it)."""
    tool = shutil.which("mksquashfs")
    if tool is None:
        raise EnvtoolsError("mksquashfs is not installed (it makes the image)",
                            "apt-get install squashfs-tools", exit_code=2)
    pseudo = []
    if not has_dir:
        pseudo += ["-p", f"{os.path.dirname(INNER)} D {epoch} 755 0 0"]
    pseudo += ["-p", f"{INNER} F {epoch} 444 0 0 cat {shlex.quote(str(manifest_file))}"]
    procs = processors or int(os.environ.get("ENVTOOLS_WORKERS", "0") or 0) or os.cpu_count()
    return [tool, str(prefix), str(image), "-noappend", "-comp", COMPRESSION,
            "-Xcompression-level", str(ZSTD_LEVEL), "-b", BLOCK_SIZE, "-all-root",
            "-no-xattrs", "-mkfs-time", str(epoch), "-processors", str(procs or 1),
            "-quiet", "-no-progress", *pseudo]


def seal(prefix: str | os.PathLike[str], out: str | os.PathLike[str], force: bool = False,
         processors: int | None = None) -> Manifest:
    """Seal ``prefix`` into the image ``out`` (+ ``out.sha256``, ``out.json``); returns the
    manifest written beside it (with the image's sha256 and size).

    Raises EnvtoolsError: not an env, ``out`` inside the env or existing, an env validate
    finds broken (unless ``force``), mksquashfs missing or failing. On any failure,
    Ctrl-C or SIGTERM nothing is left at ``out``.
    """
    from envtools.prefix.records import Prefix

    root = Prefix.load(prefix).root
    out = Path(os.path.abspath(out))
    mount_at = baked_prefix(root)
    check_out(root, out)
    if not force:
        _refuse_broken(root)
    digest, packages = records_digest(root)
    entries, size = tree_size(root)
    m = Manifest(prefix=mount_at, platform=_platform_of(root), records_sha256=digest,
                 envtools_version=envtools.__version__, packages=packages, files=entries,
                 env_bytes=size)
    epoch = _epoch()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EnvtoolsError(f"cannot create {out.parent}: {e.strerror}",
                            "choose an --out in a directory you can write to",
                            exit_code=1) from e
    tempdirs.reclaim(out.parent)

    def on_term(signum, frame):  # SIGTERM cleans up as Ctrl-C does
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term)
    tmp: Path | None = None
    lock = -1
    proc: subprocess.Popen | None = None
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}{tempdirs.TMP_TAG}", dir=out.parent))
        lock = tempdirs._claim(tmp, "seal")  # (gc's owner record: see envtools.prefix.tempdirs)
        inner = tmp / "image.json"
        inner.write_bytes(m.inner_bytes())
        img = tmp / "image"
        argv = mksquashfs_argv(root, img, inner, epoch,
                               (root / os.path.dirname(INNER)).is_dir(), processors)
        info(f"sealing {root} ({packages} packages, {size / 2**20:.0f} MiB) into ", str(out))
        t0 = time.monotonic()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, preexec_fn=die_with_parent())
        output = proc.communicate()[0].decode(errors="replace")
        lines = [ln for ln in output.splitlines() if ln.strip()]
        unread = [ln for ln in lines if "Failed to read" in ln or "Cannot stat" in ln
                  or "Could not open" in ln]
        if unread:  # (mksquashfs stores such a file empty, and exits 0)
            raise EnvtoolsError(
                f"cannot seal {root}: {len(unread)} of its files cannot be read by you: "
                f"{unread[0].strip().removesuffix(', creating empty file')}",
                "every file of an env must be readable by whoever seals it (ls -l shows "
                "its owner and mode): seal as a user who can read it, or fix its mode",
                exit_code=1)
        if proc.returncode != 0:
            raise EnvtoolsError(
                f"mksquashfs failed (exit {proc.returncode}): "
                f"{' / '.join(lines[-3:]) or 'no message'}",
                "the --out directory needs free space (about a third of the env's size) "
                "and must be writable by you", exit_code=1)
        img_bytes = os.stat(img).st_size
        chunk = chunk_for(img_bytes)
        sha, parts = digest_file(img, chunk)
        m = Manifest(**{**m.inner(), "image_sha256": sha, "image_bytes": img_bytes,
                        "chunk_bytes": chunk, "chunk_sha256": tuple(parts)})
        sha_file, json_file = sidecars(out)
        (tmp / "sha256").write_text(f"{sha}  {out.name}\n")
        (tmp / "json").write_bytes(m.beside_bytes())
        for f in (img, tmp / "sha256", tmp / "json"):
            os.chmod(f, 0o444)
        os.rename(tmp / "sha256", sha_file)
        os.rename(tmp / "json", json_file)
        try:
            os.link(img, out)
        except FileExistsError:
            raise EnvtoolsError(f"{out} was created by someone else while this seal ran",
                                "it was left as it is; choose another --out",
                                exit_code=1) from None
        info(f"sealed in {time.monotonic() - t0:.1f} s: {m.image_bytes / 2**20:.0f} MiB "
             f"({100 * m.image_bytes / max(size, 1):.0f}% of the env), sha256 {sha}")
        return m
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if tmp is not None:
            tempdirs.remove_tree(tmp)
        if lock >= 0:
            os.close(lock)
        signal.signal(signal.SIGTERM, old_term)


def _platform_of(root: Path) -> str:
    """The env's conda subdir from its records (most records say), else this node's."""
    import json

    counts: dict[str, int] = {}
    meta = root / "conda-meta"
    for n in os.listdir(meta):
        if not n.endswith(".json"):
            continue
        try:
            with open(meta / n, "rb") as fh:
                sub = json.load(fh).get("subdir")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(sub, str) and sub != "noarch":
            counts[sub] = counts.get(sub, 0) + 1
    return max(counts, key=counts.get) if counts else host_platform()

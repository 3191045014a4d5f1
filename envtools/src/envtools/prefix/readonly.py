"""The read-only marker and the guard every writing command goes through.

A prefix installed by ``envtools install`` carries ``conda-meta/envtools/readonly.json``.
envtools keeps its own files in ``conda-meta/envtools/``, a subdirectory, because conda,
mamba and rattler read every ``conda-meta/*.json`` as a package record.
File permissions alone do not protect a shared env (root and the owner can write anyway),
so envtools also refuses, by this marker, to write anywhere inside such a prefix.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

from envtools.errors import EnvtoolsError

MARKER = Path("conda-meta") / "envtools" / "readonly.json"
#: Where the prefix itself was installed (files carry this path); written for every env.
PREFIX_INFO = Path("conda-meta") / "envtools" / "prefix.json"


def default_cache_for(prefix: Path) -> Path:
    """The package cache kept beside a prefix: ``<prefix>.pkgs`` (a sibling directory)."""
    return prefix.parent / (prefix.name + ".pkgs")


def read_marker(prefix: Path) -> dict | None:
    fp = prefix / MARKER
    try:
        with open(fp) as fh:
            return json.load(fh)
    except FileNotFoundError:
        return None
    except (OSError, ValueError):
        return {"unreadable": True}


def readonly_root(path: Path) -> Path | None:
    """The read-only prefix containing ``path`` (or ``path`` itself), if any."""
    p = Path(os.path.abspath(path))
    for cand in [p, *p.parents]:
        if (cand / MARKER).exists():
            return cand
    return None


def refuse_readonly(path: Path, what: str) -> None:
    """Raise if ``path`` lies inside a prefix marked read-only by envtools."""
    root = readonly_root(path)
    if root is not None:
        raise EnvtoolsError(
            f"refusing to {what} {path}: it is inside the read-only environment {root} "
            f"(marked by {root / MARKER})",
            f"clone it first: envtools clone {root} ~/envs/mine, then work on the clone",
        )


def write_prefix_info(prefix: Path, recorded_prefix: Path, cache: Path | None,
                      channels: list[str] | None = None) -> None:
    """Remember the path baked into the env's files, where its package cache is, and the
    channels it was installed from (``envtools add`` and ``clone --add`` take packages
    from them)."""
    info = {"prefix": str(recorded_prefix), "package_cache": str(cache) if cache else None,
            "channels": list(channels or [])}
    (prefix / PREFIX_INFO).parent.mkdir(parents=True, exist_ok=True)
    with open(prefix / PREFIX_INFO, "w") as fh:
        json.dump(info, fh, indent=2)


def read_prefix_info(prefix: Path) -> dict:
    try:
        with open(prefix / PREFIX_INFO) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return {}


def shared_readonly_mode(mode: int) -> int:
    """No write bits; what the owner may read or execute, everyone may (a shared env)."""
    m = stat.S_IMODE(mode) & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    if m & stat.S_IRUSR:
        m |= stat.S_IRGRP | stat.S_IROTH
    if m & stat.S_IXUSR:
        m |= stat.S_IXGRP | stat.S_IXOTH
    return m


def make_readonly(root: Path) -> None:
    """Make ``root`` read-only and world-readable (files, then directories, bottom-up).

    rattler writes conda-meta records 0600; a shared env needs them readable by users.
    """
    for dirpath, dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames + dirnames:
            fp = os.path.join(dirpath, name)
            st = os.lstat(fp)
            if stat.S_ISLNK(st.st_mode):
                continue
            want = shared_readonly_mode(st.st_mode)
            if want != stat.S_IMODE(st.st_mode):
                os.chmod(fp, want)
    os.chmod(root, shared_readonly_mode(os.stat(root).st_mode))


def make_writable(root: Path, files: bool = False) -> None:
    """Give the owner write permission on ``root``'s directories (and files if asked).

    Directories are enough to add or delete entries. Files are left alone by default:
    they may be hardlinks shared with a package cache or other envs, and a chmod would
    change those too.
    """
    for dirpath, _dirnames, filenames in os.walk(root):
        os.chmod(dirpath, stat.S_IMODE(os.stat(dirpath).st_mode) | stat.S_IWUSR)
        if not files:
            continue
        for name in filenames:
            fp = os.path.join(dirpath, name)
            st = os.lstat(fp)
            if not stat.S_ISLNK(st.st_mode):
                os.chmod(fp, stat.S_IMODE(st.st_mode) | stat.S_IWUSR)


#: PEP 668: pip refuses to install into an interpreter whose stdlib directory holds this
EXTERNALLY_MANAGED = "EXTERNALLY-MANAGED"


def externally_managed_text(prefix: Path) -> str:
    """The marker's text: pip prints the Error value when it refuses."""
    return (
        "[externally-managed]\n"
        f"Error=This environment ({prefix}) is shared and read-only: it is managed by\n"
        " envtools, and pip may not change it. Clone it, then add packages to the clone:\n"
        f"   envtools clone {prefix} ~/envs/mine\n"
        "   ~/envs/mine/bin/python -m pip install PACKAGE   (or: envtools add ~/envs/mine SPEC)\n"
    )


#: CEP 22: conda refuses to change an env holding this (even as root), printing the
#: JSON's "message"
FROZEN = Path("conda-meta") / "frozen"
#: Where the site env's two markers really live. Both standard paths are relative links
#: to these files. The directory is one that neither ``conda create --clone`` (conda's
#: walk_prefix skips a top-level ``pkgs``) nor conda-pack (load_files skips it too)
#: copies, and that envtools clone leaves out: in a copy made by any of them the links
#: dangle (or are gone), so pip and conda see an env that is the user's to change, while
#: the site env itself stays closed to both. See envtools/README.md, "The site env's
#: markers".
SITE_ONLY = Path("pkgs") / "envtools-site-only"


def frozen_text(prefix: Path) -> str:
    """conda-meta/frozen's JSON (CEP 22): the message conda prints when it refuses."""
    return json.dumps({"message": (
        f"{prefix} is a shared, read-only environment managed by envtools: conda may not "
        "change it. Clone it and change the clone:\n"
        f"  conda create -p ~/envs/mine --clone {prefix}   (or: envtools clone {prefix} "
        "~/envs/mine)\n  conda install -p ~/envs/mine PACKAGE")}, indent=2) + "\n"


def write_site_markers(env: Path, prefix: Path, stdlib: str | None) -> None:
    """Close ``env`` (being built; installed at ``prefix``) to pip (PEP 668, in the
    stdlib directory ``stdlib``, e.g. lib/python3.11) and to conda (CEP 22), through
    links into :data:`SITE_ONLY` (see there why)."""
    d = env / SITE_ONLY
    d.mkdir(parents=True, exist_ok=True)
    (d / "README").write_text(
        "The real files behind this shared environment's PEP 668 and CEP 22 markers\n"
        f"({FROZEN} and <stdlib>/{EXTERNALLY_MANAGED} link here). Copies of the\n"
        "environment (conda create --clone, conda-pack, envtools clone) leave this\n"
        "directory out, so their links dangle and pip and conda may change the copy.\n")
    (d / "frozen").write_text(frozen_text(prefix))
    os.symlink(os.path.relpath(d / "frozen", (env / FROZEN).parent), env / FROZEN)
    if stdlib:
        (d / EXTERNALLY_MANAGED).write_text(externally_managed_text(prefix))
        (env / stdlib).mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(d / EXTERNALLY_MANAGED, env / stdlib),
                   env / stdlib / EXTERNALLY_MANAGED)


def is_site_only(root: Path, rel: str) -> bool:
    """Is ``rel`` (an untracked path of the env ``root``) one of the site markers' files
    or a link to one (dangling, in a copy made by conda)? A clone leaves them out."""
    site = SITE_ONLY.as_posix()
    if rel == site or rel.startswith(site + "/"):
        return True
    try:
        target = os.readlink(root / rel)
    except OSError:
        return False
    if os.path.isabs(target):
        return False
    resolved = os.path.normpath(os.path.join(os.path.dirname(rel), target))
    return resolved.startswith(site + "/")


def is_envtools_marker(path: Path) -> bool:
    """Is ``path`` the EXTERNALLY-MANAGED marker envtools wrote (clones leave it out)?"""
    try:
        with open(path, "rb") as fh:
            return b"envtools clone" in fh.read(4096)
    except OSError:
        return False


EXPLICIT = Path("conda-meta") / "envtools" / "explicit.txt"

"""Every path that comes from data stays inside its prefix: one rule, used everywhere.

Package archives and their ``info/paths.json``, ``conda-meta`` records, the record index,
``untracked.json`` and placeholders are written by somebody else: a package builder, the
owner of the env being cloned, whoever can write a package cache. A path from them is
joined onto a prefix only if it is **canonical and relative**: not absolute, no empty,
``.`` or ``..`` component, no NUL, and not under ``conda-meta/`` (the installer's own
records, which envtools writes after the files). The canonical form is checked rather
than normalised so that there is one spelling per file: the check and the write can never
disagree about which file is meant (``a/../b`` is refused, not rewritten to ``b``).

**A symlink the data creates is never written through**, whether it points inside the
prefix or out (stricter than "never out": it needs no resolution of link targets, which
could change between check and write). Install checks it before rattler links anything
(no path has another path that is a symlink as an ancestor); clone enforces it while
placing: every directory is made with :func:`mkdir`, which accepts an existing entry only
if ``lstat`` says it is a real directory, and every file is created with
``O_CREAT | O_EXCL | O_NOFOLLOW`` (:func:`create`), so neither a parent nor the file
itself can be a link the data placed, and nothing existing is ever overwritten.
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterable
from itertools import repeat

from envtools.errors import EnvtoolsError

#: the installer's records: no package or untracked file may put anything there
META = "conda-meta"


class UnsafePath(EnvtoolsError):
    """Data named a path outside its prefix (or through a link); nothing was written.

    Exit status 1: the input is hostile or damaged, which is not a usage error.
    """

    def __init__(self, message: str, hint: str = "", exit_code: int = 1) -> None:
        super().__init__(message, hint or HINT, exit_code)


HINT = ("the package or environment is damaged or hostile; nothing was written. Do not "
        "use it: rebuild the package, or clone a trusted environment")


def unsafe_reason(rel: object) -> str | None:
    """Why ``rel`` may not be joined onto a prefix, or None when it is a canonical
    relative path (see the module docstring)."""
    if not isinstance(rel, str):
        return "not a string"
    if not rel:
        return "empty"
    if "\0" in rel:
        return "contains a NUL byte"
    if rel.startswith("/"):
        return "absolute"
    parts = rel.split("/")
    if ".." in parts:
        return "contains '..'"
    if "" in parts or "." in parts:
        return "not in canonical form (an empty or '.' component)"
    if parts[0] == META:
        return f"inside {META}/, which holds the installer's own records"
    return None


def first_unsafe(paths: list[str], dirs: Iterable[str] | None = None
                 ) -> tuple[str, str] | None:
    """The first unsafe path of many and why, or None: :func:`unsafe_reason` for each,
    but whole-list C-level tests first, since a clone checks ~50,000 paths and a Python
    call per path would cost a few percent of the clone. Only when one of them finds
    something is the list walked path by path, to say which and why.

    ``dirs``, every ancestor directory of ``paths`` (:func:`ancestors`), if the caller
    has them anyway: then a middle component is checked as the last component of an
    ancestor, which is cheaper than searching the joined paths for ``/../``.
    """
    if not paths:
        return None
    try:
        joined = "\n".join(paths)
    except TypeError:  # (not all strings)
        joined = "\0"
    suspicious = (
        "\0" in joined or not all(paths)
        or any(map(str.startswith, paths, repeat(("/", "./", "../", META + "/"))))
        or any(map(str.endswith, paths, repeat(("/", "/.", "/.."))))
        or paths.count(".") or paths.count("..") or paths.count(META)
    )
    if not suspicious and dirs is None:
        suspicious = "//" in joined or "/./" in joined or "/../" in joined
    elif not suspicious:
        dirs = list(dirs)
        suspicious = (any(map(str.endswith, dirs, repeat(("/", "/.", "/.."))))
                      or dirs.count(".") or dirs.count("..") or dirs.count(""))
    if not suspicious:
        return None
    for p in paths:
        why = unsafe_reason(p)
        if why:
            return p, why
    return None


def check_paths(paths: Iterable[str], what: str) -> None:
    """Raise :class:`UnsafePath` naming ``what`` (a package, a file) and the first unsafe
    path in ``paths``."""
    bad = first_unsafe(list(paths))
    if bad:
        raise UnsafePath(f"{what}: refusing path {bad[0]!r}: {bad[1]}")


def check_name(name: object, what: str) -> str:
    """One path component taken from data (a record's ``name-version-build``, an entry
    point's name): no ``/``, not ``.`` or ``..``, not empty, no NUL."""
    if (not isinstance(name, str) or not name or "/" in name or "\0" in name
            or name in (".", "..")):
        raise UnsafePath(f"{what}: refusing name {name!r}: it must be a single file name")
    return name


def ancestors(paths: Iterable[str]) -> set[str]:
    """Every directory the paths need (``a`` and ``a/b`` for ``a/b/c``)."""
    dirs: set[str] = set()
    for p in paths:
        d = p.rpartition("/")[0]
        while d and d not in dirs:
            dirs.add(d)
            d = d.rpartition("/")[0]
    return dirs


def through_link(paths: Iterable[str], links: set[str]) -> tuple[str, str] | None:
    """A path that has one of ``links`` (symlinks the data creates) as an ancestor, and
    that link; None when no write would go through a link."""
    if not links:
        return None
    paths = list(paths)
    bad = ancestors(paths) & links
    if not bad:
        return None
    for p in paths:
        d = p.rpartition("/")[0]
        while d:
            if d in bad:
                return p, d
            d = d.rpartition("/")[0]
    return None


# ---------------------------------------------------------------- creating files
def mkdir(path: str, mode: int = 0o777) -> None:
    """Create a directory; an existing one is fine only if it is a real directory (not a
    symlink the data placed, whose target later writes would reach)."""
    try:
        os.mkdir(path, mode)
    except FileExistsError:
        if not stat.S_ISDIR(os.lstat(path).st_mode):
            raise UnsafePath(f"{path} is a symbolic link or a file where a directory is "
                             "needed: the data ships both, or a link to write through"
                             ) from None


def makedirs(root: str, rel_dir: str) -> None:
    """:func:`mkdir` for ``rel_dir`` and each of its parents under ``root`` (which must
    exist), parents first, so no component can be a link."""
    if not rel_dir:
        return
    parts = rel_dir.split("/")
    for i in range(1, len(parts) + 1):
        mkdir(f"{root}/{'/'.join(parts[:i])}")


#: flags for a new file: never an existing one (O_EXCL), never through a link (O_EXCL
#: already refuses a link as the last component; O_NOFOLLOW says so explicitly)
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def create(path: str, mode: int) -> int:
    """Open a new file for writing; refuse (clearly) if anything already exists there."""
    try:
        return os.open(path, CREATE, mode)
    except FileExistsError:
        raise UnsafePath(f"{path} exists already: the data lists it twice (or as a link "
                         "and a file); envtools never overwrites a file") from None


def symlink(target: str, path: str) -> None:
    """Create a symlink (never followed by envtools); refuse if ``path`` exists."""
    try:
        os.symlink(target, path)
    except FileExistsError:
        raise UnsafePath(f"{path} exists already: the data lists it both as a symbolic "
                         "link and as a file or directory") from None


def write_new(path: str, data: bytes, mode: int = 0o644) -> None:
    """Write a whole new file with :func:`create` (envtools' own metadata included, so a
    link the data placed there is refused rather than written through)."""
    fd = create(path, mode)
    try:
        if mode & ~_UMASK != mode:
            os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def replace(path: str, data: bytes, mode: int = 0o644) -> None:
    """Replace a file atomically: a new file beside it, renamed over it (a rename
    replaces a symlink itself, never its target)."""
    tmp = f"{path}.envtools-new"
    write_new(tmp, data, mode)
    os.rename(tmp, path)


def open_regular(path: str) -> int | None:
    """Open a file to read it, not following a symlink; None if it is not a regular file
    (a FIFO would block the reader, a device or socket cannot be copied)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError as e:
        if e.errno in (errno.ELOOP, errno.ENXIO):
            return None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        return None
    return fd


def read_regular(path: str) -> bytes | None:
    """The bytes of a regular file (see :func:`open_regular`), or None."""
    try:
        fd = open_regular(path)
    except FileNotFoundError:
        return None
    if fd is None:
        return None
    with os.fdopen(fd, "rb") as fh:
        return fh.read()


def is_real(root: str, rel: str) -> bool:
    """Is ``root/rel`` reached without passing a symlink (every component lstat'ed)?"""
    path = root
    for part in rel.split("/"):
        path = f"{path}/{part}"
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if stat.S_ISLNK(st.st_mode):
            return False
    return True


_UMASK = os.umask(0)
os.umask(_UMASK)

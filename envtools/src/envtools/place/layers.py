"""Directory links ("layers") in a non-owner's clone: one symlink for a whole directory
that one package owns, instead of a symlink per file.

A symlink per file is an inode per file, and on ext4 a 4 KiB block per link whose target
is 60 bytes or longer (every path into a package cache). Creating 46,000 of them costs
about what ``cp -as`` costs and, on a shared machine, can cost as much as copying. A
directory link is one inode for hundreds or thousands of files: the clone of the 46,000
file powerai env makes a few hundred.

What a directory link costs the user, and so where there is none:

* its files cannot be removed, replaced or added to by the user (the directory is the
  site's), so pip and conda cannot uninstall or upgrade the package in place: pip stops
  with "Permission denied" on a cache path and rolls back, changing nothing.
  ``envtools detach PREFIX PKG`` gives the package directories of the user's own (a
  symlink per file) first. Directories where anything is commonly added (the prefix's
  top level, ``lib/pythonX.Y``, ``site-packages`` and its namespace packages,
  ``include/pythonX.Y``, ``share/man``, ``etc``, ...) are never links;
* python cannot write ``__pycache__`` there: a directory is linked only if every ``.py``
  in it comes with its compiled ``.pyc`` (a noarch: python package ships none, but
  install compiles them into its cache entry: bytecode.py; the clone takes them along).
  The ``__pycache__`` of a directory that is never a link (``lib/pythonX.Y``: the
  stdlib's 500 pycs) is linked by itself when one package owns it; a source there
  whose bytecode the package does not ship (one holding the prefix, as python's
  ``_sysconfigdata``: install compiles it for the env, and a clone's differs) is then
  compiled in memory when imported (about 10 ms, only by sysconfig's users);
* everything in it is read from the cache: so no file in it may need to be the clone's
  own (relocated, made by the installer, an ELF program that would not run the same from
  the cache, a ``.pth``), no other package and no untracked file may live in it, and its
  package's symlinks must stay inside it;
* ``..`` from inside it is resolved by the kernel after following the link, so it leads
  into the package's cache directory, not the clone: no library in it may search
  ``$ORIGIN/..`` out of it for a library that is not its package's own at the same
  place in the env (checked), and code that opens ``dirname(__file__)/../x``
  without normalising the path finds its own package's cache directory (not checked:
  the reason this is ``--link-mode dirs``, not the default).

Each directory link is checked when it is placed, by the process that places it: the
cache directory must hold exactly the package's files there (a scandir of the cache), none
writable by anyone but root, and none a program that would not run from the cache;
otherwise that directory's files are placed one by one. The stats taken then are the
clone's stat cache entries for its files.

Root's install makes that check once and stores find(1)'s listing of each directory it
passed (:data:`LISTING_FORMAT`: every entry's name, type, mode, owner, size, mtime, inode
and link target) in its plan. A clone of root's env lists the same directories with find
before placing anything (one C program doing the ``lstat`` per file, ~0.1 s of CPU for
53,000 files, where the Python loop of :func:`verify` took ~0.9 s) and skips
:func:`verify` for each whose listing is install's byte for byte: nothing verify looks
at has changed, and only root could have changed it. Any difference (a file edited in
place changes its mtime, a replaced one its inode, a chmod its mode) sends that
directory through :func:`verify` again.
"""

from __future__ import annotations

import marshal
import os
import posixpath
import re
import stat
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from envtools.base import elf
from envtools.place import cachelinks
from envtools.prefix.hashing import entry_sha, file_key, key_holds

#: the path type of a layer item (a directory link) in a placement plan
LAYER = "layer"

#: directories right under the prefix's top ones that many packages add to: never
#: links, nor anything under them (share/man/man1, lib/pkgconfig, lib/cmake/Foo, ...)
SHARED_SUBTREES = frozenset({
    "man", "doc", "licenses", "locale", "info", "aclocal", "pkgconfig", "cmake",
    "jupyter", "applications", "icons", "mime", "bash-completion", "zsh", "fish",
    "conda", "gir-1.0", "girepository-1.0", "glib-2.0", "fonts", "themes", "metainfo",
    "vim", "emacs", "gtk-doc", "terminfo",
})
#: top-level directories whose contents are never links: configuration is edited in
#: place, programs are run by path, and conda's own
SHARED_TOPS = frozenset({"etc", "bin", "sbin", "conda-meta", "envs", "pkgs", "var", "tmp"})
_PY_DIR = re.compile(r"^python\d+(\.\d+)?t?$")


def shared(d: str) -> bool:
    """Is the directory ``d`` one that packages, pip or users commonly add to? The
    prefix's top two levels' usual places, ``lib/pythonX.Y`` and its ``site-packages``,
    ``include/pythonX.Y`` (pip's headers)."""
    parts = d.split("/")
    if len(parts) < 2 or parts[0] in SHARED_TOPS or parts[1] in SHARED_SUBTREES:
        return True
    if _PY_DIR.match(parts[1]):
        return len(parts) == 2 or (len(parts) == 3 and parts[2] in ("site-packages",
                                                                    "dist-packages"))
    return False


class _Dir:
    """What the files directly in one directory say about it."""

    __slots__ = ("keys", "dirty", "init")

    def __init__(self) -> None:
        self.keys: set[int] = set()  # the packages with files here
        self.dirty = False  # a file here must be the clone's own
        self.init = False  # holds __init__.py (a regular python package)


def plan(groups: list[tuple[int, list[tuple]]], linkable: Iterable[int],
         untracked: Iterable[str], in_archive: frozenset,
         no_bytecode: frozenset[str] = frozenset()) -> dict[str, int]:
    """Which directories become links: ``{dir: key of its package}``, the top-most ones.

    ``linkable``: the keys of packages whose files may be symlinked (a trusted cache);
    ``untracked``: SRC's files no package owns (they pin their directories);
    ``in_archive``: the path types a package archive has (others are the installer's);
    ``no_bytecode``: sources the env's python cannot compile (a py3.12-only module in
    torch's tests): python writes no bytecode for them, so they need none to be linked.
    Only paths are looked at here (no system calls): the checks that need the cache's
    files are made when each link is placed (:func:`verify`).
    """
    linkable = frozenset(linkable)
    dirs: dict[str, _Dir] = {}

    def at(d: str) -> _Dir:
        e = dirs.get(d)
        if e is None:
            e = dirs[d] = _Dir()
        return e

    for key, items in groups:
        ok = key in linkable
        for rel, _source, path_type, placeholder, _fm, from_cache, _sha, _size in items:
            d, _, name = rel.rpartition("/")
            e = at(d)
            e.keys.add(key)
            if (not ok or placeholder or not from_cache or path_type not in in_archive
                    or name.endswith(".pth")):
                e.dirty = True
            e.init = e.init or name == "__init__.py"
    for rel in untracked:
        at(rel.rpartition("/")[0]).dirty = True
    # (python would compile these on every import: it cannot write __pycache__ there)
    needs_pyc = {rel.rpartition("/")[0] for rel in without_bytecode(groups)
                 if rel not in no_bytecode}
    # fold each directory into its parent, deepest first: a directory may be a link
    # only if nothing under it says otherwise and one package owns all of it
    depth = {d: d.count("/") + 1 if d else 0 for d in dirs}
    for d in list(dirs):
        while d:
            d = d.rpartition("/")[0]
            if d in depth:
                break
            depth[d] = d.count("/") + 1 if d else 0
    bad: dict[str, bool] = {}
    keys: dict[str, set[int]] = {}
    for d in sorted(depth, key=depth.__getitem__, reverse=True):
        e = dirs.get(d)
        k = keys.setdefault(d, set())
        b = bad.get(d, False)
        if e is not None:
            k |= e.keys
            b = b or e.dirty or d in needs_pyc
        bad[d] = b = b or len(k) > 1
        if d:
            parent = d.rpartition("/")[0]
            bad[parent] = bad.get(parent, False) or b
            keys.setdefault(parent, set()).update(k)
    chosen: dict[str, int] = {}
    for d in sorted(depth, key=depth.__getitem__):
        if bad[d] or len(keys[d]) != 1 or shared(d) or _namespace(d, dirs):
            continue
        parent = d.rpartition("/")[0]
        while parent and parent not in chosen:
            parent = parent.rpartition("/")[0]
        if not parent:  # (no link above it already)
            chosen[d] = next(iter(keys[d]))
    return chosen


def without_bytecode(groups: list[tuple[int, list[tuple]]]) -> dict[str, str]:
    """The ``.py`` files that come without their ``.pyc`` in the ``__pycache__`` beside
    them (which keeps their directory from being linked: :func:`plan`): ``{rel:
    source}``."""
    py: dict[str, tuple[str, str]] = {}
    pyc: set[str] = set()
    for _key, items in groups:
        for it in items:
            rel = it[0]
            d, _, name = rel.rpartition("/")
            if name.endswith(".py"):
                py[f"{d}/{name[:-3]}"] = rel, it[1]
            elif name.endswith(".pyc") and d.endswith("/__pycache__"):
                pyc.add(f"{d[:-12]}/{name.split('.', 1)[0]}")
    return dict(v for k, v in py.items() if k not in pyc)


#: the plan install made for the env (plan.write_layer_plan)
PLAN = Path("conda-meta") / "envtools" / "layers.marshal"
PLAN_VERSION = 3


@dataclass
class Plan:
    """What install planned for ``--link-mode dirs`` clones of its env."""

    dirs: dict[str, str]  # linked directory -> its package's dist
    kept: set[str]  # the packages whose compiled bytecode the plan counted on
    real: frozenset[str]  # package files outside them that must be real files
    #: per linked directory, its cache directory's :func:`listing` once install had
    #: checked it (:func:`verify`): a clone whose listing is the same byte for byte
    #: checks nothing more (placement.start_prechecks)
    listings: dict[str, bytes]
    #: per listed directory, the cache directory install listed: a clone starts find
    #: on these before it has read the env's records (which name the same ones, or
    #: the listings are not used: clone.list_planned_early)
    targets: dict[str, str] = field(default_factory=dict)


def write_plan(prefix: Path, index_key: tuple, plan: Plan) -> None:
    """Store ``plan`` for the records of the index with stat key ``index_key``."""
    fp = prefix / PLAN
    fp.parent.mkdir(parents=True, exist_ok=True)
    fp.write_bytes(marshal.dumps((PLAN_VERSION, tuple(index_key), plan.dirs,
                                  sorted(plan.kept), sorted(plan.real), plan.listings,
                                  plan.targets)))


def read_plan(prefix: Path, index_key: tuple) -> Plan | None:
    """The stored plan, if it was made for the records of that index; else None."""
    try:
        with open(prefix / PLAN, "rb") as fh:
            version, key, dirs, kept, real, listings, targets = marshal.loads(fh.read())
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if version != PLAN_VERSION or tuple(key) != tuple(index_key) or not isinstance(dirs, dict):
        return None
    if not all(isinstance(d, str) and isinstance(v, str) for d, v in dirs.items()):
        return None
    if not isinstance(listings, dict) or not isinstance(targets, dict):
        listings, targets = {}, {}
    return Plan(dirs, {k for k in kept if isinstance(k, str)},
                frozenset(r for r in real if isinstance(r, str)),
                {d: v for d, v in listings.items()
                 if isinstance(d, str) and isinstance(v, bytes)},
                {d: t for d, t in targets.items() if isinstance(d, str) and isinstance(t, str)})


#: how find(1) lists a linked directory's cache copy (:func:`listing`): per entry, its
#: path below the directory, type, mode, owner, size, mtime, inode and link target, each
#: record three NUL-terminated fields (no name or target holds a NUL, so the bytes say
#: one thing only). Everything :func:`verify` looks at, but read by one C program
#: instead of a Python loop: 53,000 entries in ~0.1 s of CPU instead of ~0.9 s.
LISTING_FORMAT = "%P\\0%y %m %U %s %T@ %i\\0%l\\0"


@dataclass
class Listing:
    """A find(1) started by :func:`start_listing`, writing into an anonymous memory
    file rather than a pipe: its reader waits for it only once the clone has placed
    everything else, and a pipe (64 KiB) would stop find after its first 600 entries
    until then (measured: each find took 3-4x its own time)."""

    proc: subprocess.Popen
    out: int  # the memory file's descriptor

    def stop(self) -> None:
        """Kill it (its listing is not needed) and free the memory file."""
        self.proc.kill()
        self.proc.wait()
        os.close(self.out)


def start_listing(dirs: list[str]) -> Listing | None:
    """Start find(1) listing the directories ``dirs`` (absolute paths), in that order,
    without following a symlink anywhere (a link at the top is listed as a link). The
    C locale, so that an mtime's decimal point is the same for everyone."""
    if not dirs or not all(d.startswith("/") for d in dirs):
        return None  # (a start point must not read as an expression)
    try:
        out = os.memfd_create("envtools-listing", os.MFD_CLOEXEC)
    except (AttributeError, OSError):  # (no memfd: an unlinked file in the temp dir)
        import tempfile

        with tempfile.TemporaryFile() as fh:
            out = os.dup(fh.fileno())
    try:
        proc = subprocess.Popen(["find", "-P", *dirs, "-printf", LISTING_FORMAT],
                                stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.DEVNULL, close_fds=True,
                                env={"LC_ALL": "C", "PATH": os.defpath})
    except OSError:
        os.close(out)
        return None
    return Listing(proc, out)


def finish_listing(job: Listing | None) -> bytes | None:
    """What :func:`start_listing` printed, or None when find failed (a directory it
    could not read, one that is missing, no find)."""
    if job is None:
        return None
    try:
        if job.proc.wait() != 0:
            return None
        size = os.fstat(job.out).st_size
        data = os.pread(job.out, size, 0) if size else b""
        return data if len(data) == size else None
    finally:
        os.close(job.out)


def listing(d: str) -> bytes | None:
    """The :data:`LISTING_FORMAT` listing of one directory."""
    return finish_listing(start_listing([d]))


def split_listing(out: bytes | None) -> list[bytes]:
    """The listing of several directories cut into one per directory (at install: one
    find for all of them). Each record is three NUL-terminated fields, and a directory's
    listing starts with its top, the only record whose path is empty."""
    if not out:
        return []
    fields = out.split(b"\0")  # (3 per record, and the empty rest after the last NUL)
    if len(fields) % 3 != 1 or fields[0]:
        return []
    starts, pos = [], 0
    for i in range(0, len(fields) - 1, 3):
        if not fields[i]:
            starts.append(pos)
        pos += len(fields[i]) + len(fields[i + 1]) + len(fields[i + 2]) + 3
    starts.append(len(out))
    return [out[a:b] for a, b in zip(starts, starts[1:], strict=False)]


def same_listings(out: bytes | None, wants: list[bytes]) -> int:
    """How many of the directories listed in ``out`` (by :func:`start_listing`), from
    the first on, have the listings ``wants``: a walk along ``out`` up to the first that
    differs (after it, where one directory's listing ends is not known without parsing,
    so none counts). A listing must also end where the next directory's top entry
    begins (its path is empty: a NUL), or a directory with one entry more would pass."""
    if out is None:
        return 0
    view, pos, end = memoryview(out), 0, len(out)
    for n, want in enumerate(wants):
        if view[pos:pos + len(want)] != want:
            return n
        pos += len(want)
        if pos != end and out[pos] != 0:
            return n
    return len(wants)


def _namespace(d: str, dirs: dict[str, _Dir]) -> bool:
    """A directory right under site-packages without ``__init__.py`` (a namespace
    package, or data) other than a distribution's metadata or the libraries its wheel
    bundles (auditwheel's ``<dist>.libs``): others may install into it."""
    if not d.rpartition("/")[0].endswith("/site-packages"):
        return False
    e = dirs.get(d)
    return not (e is not None and e.init) and not d.endswith((".dist-info", ".egg-info",
                                                              ".libs"))


def verify(cache_dir: str, items: list[tuple], rel_dir: str, src_root: str,
           relocating: frozenset[str], euid: int | None = None,
           owner: int | None = 0, elf_checked: bool = False,
           vouch: dict | None = None) -> dict[str, tuple] | None:
    """Check a layer before linking it: ``cache_dir`` (the package's cache copy of
    ``rel_dir``) holds exactly ``items`` (its files and links, by path), every
    directory there is a real one that nobody but its owner can change, no file there
    is writable or may not be a link's target (cachelinks.symlink_is_safe, when
    ``euid`` is given: owned by ``owner``, None for anyone but us), no program there
    would run differently from the cache, and every link stays inside. Returns each
    file's stat cache entry (hashing.file_key), or None when the directory must be
    placed file by file. (Whether SRC vouches for the files' contents is the caller's.)

    ``elf_checked``: install checked its programs and libraries already (the plan it
    stored: plan.write_layer_plan), and their contents are vouched for by the caller,
    so what they load cannot have changed: they are not read again.

    ``vouch``: SRC's stat cache entries for the package (placement._vouch_table); when
    given, every file must also be vouched for by one, keyed by its path in the env or
    in the cache, with its stat and its record's sha256 (placement.vouched, inlined: it
    runs once per file of every linked directory)."""
    want = {it[0][len(rel_dir) + 1:]: it for it in items if it[2] != "directory"}
    found: dict[str, tuple] = {}
    found_links: set[str] = set()
    group_other_w = stat.S_IWGRP | stat.S_IWOTH
    exec_bits = cachelinks.EXEC_BITS
    missing = (None, None, None)
    stack = [""]
    while stack:
        sub = stack.pop()
        try:  # (no trailing slash for the top: it would follow a link there)
            fd = os.open(os.path.join(cache_dir, sub) if sub else cache_dir,
                         os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            return None
        try:
            dst = os.fstat(fd)
            if dst.st_mode & group_other_w or (
                    euid is not None and not cachelinks.owner_ok(dst.st_uid, owner, euid)):
                return None
            pre = sub + "/" if sub else ""
            with os.scandir(fd) as it:
                for entry in it:
                    name = pre + entry.name
                    st = entry.stat(follow_symlinks=False)
                    mode = st.st_mode
                    if stat.S_ISDIR(mode):
                        if mode & group_other_w:
                            return None
                        stack.append(name)
                        continue
                    w = want.get(name, missing)
                    kind = w[2]
                    if kind is None:
                        return None  # (not the package's: the cache was changed)
                    if stat.S_ISLNK(mode):
                        target = os.readlink(entry.name, dir_fd=fd)
                        inside = os.path.normpath(os.path.join(os.path.dirname(name), target))
                        if (kind != "softlink" or target.startswith("/")
                                or inside.startswith("..")):
                            return None
                        found_links.add(name)
                        continue
                    if kind == "softlink" or not stat.S_ISREG(mode) or mode & group_other_w:
                        return None
                    if euid is not None and not cachelinks.symlink_is_safe(st, euid, owner):
                        return None
                    if elf_checked:
                        pass
                    elif mode & exec_bits and cachelinks.stays_real(
                            f"{rel_dir}/{name}", os.path.join(cache_dir, name), st,
                            src_root, relocating):
                        return None
                    elif (".so" in entry.name or mode & exec_bits) and \
                            _origin_escapes(cache_dir, rel_dir, name, src_root):
                        return None
                    if vouch is not None:
                        sc = vouch.get(w[0])
                        if sc is None or not key_holds(sc, st):
                            sc = vouch.get(w[1])
                            if sc is None or not key_holds(sc, st):
                                return None
                        if not w[6] or entry_sha(sc) not in (None, w[6]):
                            return None
                    found[name] = file_key(st)
        finally:
            os.close(fd)
    if len(found) + len(found_links) != len(want):  # (something is missing)
        return None
    return {f"{rel_dir}/{n}": v for n, v in found.items()}


def _origin_escapes(cache_dir: str, rel_dir: str, name: str, src_root: str) -> bool:
    """Would this ELF file, linked with its directory ``rel_dir``, load other libraries
    than the env's copy does? Only when its RUNPATH/RPATH climbs out of the linked
    directory through ``$ORIGIN/..``: the kernel resolves ``..`` after following the
    directory link, so the loader searches the package's cache directory, not the
    clone's. That is harmless when every library found that way is the package's own at
    the same place in both trees (``$ORIGIN/../pillow.libs``, ``$ORIGIN/../lib``: the
    wheels' bundled libraries), the test :func:`cachelinks.runs_from_cache` makes for
    a program run from the cache; possible only when the cache holds the package at the
    env's paths (not a ``noarch: python`` one)."""
    info = elf.read_elf(os.path.join(cache_dir, name))
    if info is None:
        return False
    here = posixpath.dirname(name) or "."
    climbs = False
    for entry in info.runpath + info.rpath:
        if "$ORIGIN" in entry or "${ORIGIN}" in entry:
            d = posixpath.normpath(entry.replace("${ORIGIN}", here).replace("$ORIGIN", here))
            climbs = climbs or d == ".." or d.startswith("../")
    if not climbs:
        return False
    if not cache_dir.endswith("/" + rel_dir):
        return True
    pkg = cache_dir[:len(cache_dir) - len(rel_dir) - 1]
    return not cachelinks.runs_from_cache(f"{rel_dir}/{name}", pkg, src_root)


def layer_links(prefix: Path) -> dict[str, str]:
    """The directory links of a clone: ``{rel dir: target}`` (symlinked directories that
    lead out of the prefix)."""
    root = str(prefix)
    out: dict[str, str] = {}
    for dirpath, dirnames, _files in os.walk(root):
        for d in dirnames:
            p = os.path.join(dirpath, d)
            if os.path.islink(p):
                target = os.readlink(p)
                if target.startswith("/") and not target.startswith(root + "/"):
                    out[os.path.relpath(p, root)] = target
    return out



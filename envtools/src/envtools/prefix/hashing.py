"""sha256 of files and the stat cache that lets ``validate`` skip re-hashing unchanged files.

Hashing a multi-GB environment takes longer than the 3 s validate budget, so envtools
records each tracked file's stat key (:func:`file_key`: size, mtime_ns, inode, ctime_ns,
link count) together with its sha256 when it creates the env. A file whose key still
holds (:func:`key_holds`) has not been rewritten, so its recorded hash still holds;
every other file is hashed again. A write updates mtime, replacing a file changes its
inode, and an in-place edit whose mtime was put back afterwards (``touch -r``, or any
``utime``) still moves its ctime, which nothing but the kernel can set.

ctime also moves when a hardlink to the file is made or removed, and every clone in link
mode hardlinks every file of the package cache (removing a clone unlinks them): a key
that demanded the same ctime would make the next validate of every env sharing those
inodes re-hash all of them after each clone. A link made or removed also changes the
link count, so :func:`key_holds` excuses a ctime change that comes with a link count
change, and only that one. What that leaves undetected: an in-place edit with size and
mtime put back, of a file whose link count has changed since its key was taken (a clone
made or removed since, before or after the edit); the edit and the link are then one
change of ctime, which no stat tells apart. It is an acceptable trade because the
cache is writable only by its owner (the site's, root's: envtools install makes it
read-only), so such an edit is a deliberate act of the cache owner that also hides
its mtime; ``validate --full`` (hash everything) remains the check for a
cache one does not trust. To keep that window short, a clone takes each hardlinked
file's key after linking it (its own link is already counted), and ``validate`` of an
env the user may write refreshes the keys it excused (:func:`refresh_part`), so the next
edit is caught again until the next clone or removal changes the link count. The cost
the other way: a clone made and removed between two checks gives the link count back
with a moved ctime, which is what an edit looks like, so the next ``validate`` of an env
sharing those files hashes them once (then refreshes them, where it may), and a clone of
an env whose keys are in that state hashes the cache files it links.

The same entries let a clone trust a package cache file without hashing it: a file
hardlinked from the cache shares its inode with the env's file, so an entry whose key
holds for the cache file vouches for it. ``envtools install`` writes one part
per package (``pkg-<name-version-build>.marshal``, so that each placement process loads
only the packages it places), with an entry keyed by the cache file's absolute path for
each cache file the env does not share an inode with (those with a prefix placeholder);
a clone adds such entries for the cache files it copied or relocated, so that clones of
the clone can trust the cache the same way.

The cache is a directory of parts, each written by the process that placed or hashed
those files (a clone's placement processes write theirs in parallel), in marshal: a
46,000-file env's cache encodes 5x and loads 2x faster than as JSON. An entry
``rel -> (size, mtime_ns, ino, ctime_ns, nlink, sha256)`` may leave the hash out (five
items) when the file holds its package's recorded sha256, as every file hardlinked from
the package cache does. A part that cannot be read is skipped: its files are hashed again.

Version 5 added ctime and the link count. Parts of version 4 (entries of three or four
items: no ctime) are still read, with the check they were written for (size, mtime,
inode): an env made before costs nothing more than it did, and its first ``validate``
by a user who may write it stores the full keys of what it checked (one part written,
nothing hashed for that). Version 4 itself: before it, a clone wrote the package's hash
for every file it placed from the cache without checking the cache file, so a clone of a
tampered cache vouched for the tampered files and plain ``validate`` called it clean.
Parts of version 3 are therefore ignored, except ``hashed`` (written by ``install`` from
what it hashed). Version 5 parts are ignored by an envtools older than them (they would
read a ctime as a hash): such an envtools hashes those files again.
"""

from __future__ import annotations

import hashlib
import marshal
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from envtools.prefix.noarch import cache_rel

#: the stat cache: a directory of ``*.marshal`` parts, each ``(STAT_VERSION, entries)``
STAT_CACHE = Path("conda-meta") / "envtools" / "statcache"
STAT_VERSION = 5
#: versions whose parts are read whole: 4's entries have no ctime (see the module docstring)
READ_VERSIONS = frozenset({4, STAT_VERSION})
#: older versions whose parts of this name are still true (see the module docstring)
TRUSTED_OLD = {3: "hashed.marshal"}
#: the part :func:`refresh_part` writes (sorted last: its keys are the newest)
REFRESHED = "refreshed"


def sha256_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as fh:
        return sha256_fileobj(fh)


def sha256_fileobj(fh) -> str:
    """The sha256 of what is left to read in a binary file object."""
    if hasattr(hashlib, "file_digest"):  # Python 3.11+
        return hashlib.file_digest(fh, "sha256").hexdigest()
    h = hashlib.sha256()
    while chunk := fh.read(1 << 20):
        h.update(chunk)
    return h.hexdigest()


def stat_key(st: os.stat_result) -> tuple[int, int, int]:
    """(size, mtime_ns, inode): which version of a file an index was made from (the
    record index, install's layer plan). Not for vouching for contents: :func:`file_key`."""
    return st.st_size, st.st_mtime_ns, st.st_ino


def file_key(st: os.stat_result) -> tuple[int, int, int, int, int]:
    """A stat cache key (see the module docstring): (size, mtime_ns, inode, ctime_ns,
    link count)."""
    return st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns, st.st_nlink


def key_holds(entry: tuple, st: os.stat_result) -> bool:
    """Does the stat cache ``entry`` still vouch for the file whose stat is ``st``? Same
    size, mtime and inode, and the same ctime unless the link count changed too (a
    hardlink made or removed: see the module docstring). An entry of version 4 (three or
    four items, no ctime) is held to what it recorded."""
    if entry[0] != st.st_size or entry[1] != st.st_mtime_ns or entry[2] != st.st_ino:
        return False
    if len(entry) < 5:
        return True
    return entry[3] == st.st_ctime_ns or entry[4] != st.st_nlink


def key_exact(entry: tuple, st: os.stat_result) -> bool:
    """Is ``entry`` the file's current key (nothing for :func:`refresh_part` to update)?"""
    return len(entry) >= 5 and entry[3] == st.st_ctime_ns and entry[4] == st.st_nlink \
        and entry[:3] == (st.st_size, st.st_mtime_ns, st.st_ino)


def entry_sha(entry: tuple) -> str | None:
    """The sha256 a stat cache entry holds, or None: its package's recorded one."""
    n = len(entry)
    return entry[3] if n == 4 else entry[5] if n == 6 else None


def hash_many(
    paths: Iterable[str], workers: int | None = None, advance=None
) -> dict[str, str | None]:
    """Hash files in a thread pool (hashlib releases the GIL); None for unreadable ones."""

    def one(p: str) -> tuple[str, str | None]:
        try:
            return p, sha256_file(p)
        except OSError:
            return p, None

    from concurrent.futures import ThreadPoolExecutor  # (4 ms to import: clone never needs it)

    paths = list(paths)
    workers = workers or min(8, (os.cpu_count() or 2) * 2)
    out: dict[str, str | None] = {}
    with ThreadPoolExecutor(workers) as ex:
        for p, h in ex.map(one, paths, chunksize=64):
            out[p] = h
            if advance is not None:
                advance()
    return out


def write_package_parts(prefix: Path, records) -> list[Path]:
    """Hash every regular file the ``records`` (of a fresh install) list and write one
    stat cache part per package, with the entries for its cache files that the env does
    not share an inode with (see the module docstring); returns the parts written.

    An entry leaves the hash out when the file has its package's recorded sha256 and no
    placeholder (the convention of the clone's parts): most of them, so the parts load
    faster.
    """

    root = str(prefix)
    per: list[list[tuple]] = []  # per record: (rel, stat, placeholder, sha, cache path)
    for r in records:
        epd = r.extracted_package_dir
        files = []
        for rel, ptype, placeholder, _fm, sha, _size in r.plan_fields():
            if ptype in ("softlink", "directory"):
                continue
            try:
                st = os.lstat(f"{root}/{rel}")
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            # (bytecode install compiled into the cache entry: bytecode.compile_installed)
            src = f"{epd}/{cache_rel(r.noarch_python, rel)}" if epd and ptype in ("hardlink", None,
                                                                      "pyc_file") else None
            files.append((rel, st, placeholder, sha, src))
        per.append(files)
    hashes = hash_many(f"{root}/{f[0]}" for files in per for f in files)
    cache_files: dict[str, os.stat_result] = {}
    for files in per:
        for _rel, st, _ph, _sha, src in files:
            if src is None:
                continue
            try:
                cst = os.lstat(src)
            except OSError:
                continue
            if stat.S_ISREG(cst.st_mode) and cst.st_ino != st.st_ino:
                cache_files[src] = cst
    cache_hashes = hash_many(cache_files)
    out = []
    (prefix / STAT_CACHE).mkdir(parents=True, exist_ok=True)
    for r, files in zip(records, per, strict=True):
        entries: dict[str, tuple] = {}
        for rel, st, placeholder, sha, src in files:
            h = hashes.get(f"{root}/{rel}")
            if h is not None:
                entries[rel] = (*file_key(st), h) if placeholder or h != sha else file_key(st)
            ch = cache_hashes.get(src) if src else None
            if ch is not None:
                cst = cache_files[src]
                entries[src] = file_key(cst) if ch == sha else (*file_key(cst), ch)
        out.append(store_stat_part(prefix, package_part(r.dist), entries))
    return out


def package_part(dist: str) -> str:
    """The name of a package's part, written by ``install`` (see the module docstring)."""
    return f"pkg-{dist}"


def load_part(fp: str | os.PathLike[str]) -> dict[str, tuple] | None:
    """One part's entries, or None when it cannot be read or is of an untrusted version."""
    try:
        with open(fp, "rb") as fh:
            version, entries = marshal.loads(fh.read())  # (not load(fh): 4x slower)
    except (OSError, EOFError, ValueError, TypeError):
        return None
    if not isinstance(entries, dict):
        return None
    if version in READ_VERSIONS or TRUSTED_OLD.get(version) == os.path.basename(fp):
        return entries
    return None


def store_stat_part(prefix: str | os.PathLike[str], part: str, entries: dict[str, tuple]) -> Path:
    """Write one part of the stat cache (its directory must exist)."""
    fp = Path(prefix) / STAT_CACHE / f"{part}.marshal"
    with open(fp, "wb") as fh:
        fh.write(marshal.dumps((STAT_VERSION, entries)))
    return fp


def may_refresh(prefix: str | os.PathLike[str]) -> bool:
    """May this process store refreshed keys in the env's stat cache: its directory is
    ours and open to us for writing (a user's clone; not the read-only site env, nor
    another user's env, whose stat cache is theirs to vouch with)?"""
    d = Path(prefix) / STAT_CACHE
    try:
        st = os.stat(d)
    except OSError:
        return False
    return (st.st_uid == os.geteuid() and bool(st.st_mode & stat.S_IWUSR)
            and os.access(d, os.W_OK))


def refresh_part(prefix: str | os.PathLike[str], entries: dict[str, tuple]) -> bool:
    """Add ``entries`` (files ``validate`` found to hold their hash, with their current
    keys) to the part :data:`REFRESHED`, written whole beside it and renamed over it, so
    a reader sees the old part or the new one. Why: a key whose ctime change was excused
    by a link count change (:func:`key_holds`) would excuse every later ctime change as
    long as the link count differs; stored again, the next in-place edit is caught. Also
    how a version 4 env gets full keys. Returns whether it was written (False when it
    could not be: nothing is lost, those files are checked as before)."""
    d = Path(prefix) / STAT_CACHE
    fp = d / f"{REFRESHED}.marshal"
    merged = dict(load_part(fp) or {})
    merged.update(entries)
    tmp = d / f".{REFRESHED}.{os.getpid()}.tmp"  # (not *.marshal: never read as a part)
    try:
        try:
            os.unlink(tmp)  # (left by a killed run that had our pid)
        except FileNotFoundError:
            pass
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o644)
        with os.fdopen(fd, "wb") as fh:
            fh.write(marshal.dumps((STAT_VERSION, merged)))
        os.replace(tmp, fp)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return False
    return True


def rekey_moved(prefix: str | os.PathLike[str], names: Iterable[str]) -> None:
    """The parts ``names`` were written for files that were then renamed into ``prefix``
    (``envtools add`` stages a package and moves it in): a rename moves the renamed
    file's ctime, so each entry whose file is still the one it was taken of (same size,
    mtime and inode) gets the file's ctime and link count now. Without it the next
    ``validate`` would hash every added file once."""
    d = Path(prefix) / STAT_CACHE
    root = str(prefix)
    for name in names:
        fp = d / name
        entries = load_part(fp)
        if not entries:
            continue
        out: dict[str, tuple] = {}
        for k, e in entries.items():
            if k.startswith("/"):  # (a package cache file: not moved, its key stands)
                out[k] = e
                continue
            try:
                st = os.lstat(f"{root}/{k}")
            except OSError:
                out[k] = e
                continue
            same = stat.S_ISREG(st.st_mode) and e[:3] == (st.st_size, st.st_mtime_ns,
                                                          st.st_ino)
            sha = entry_sha(e)
            out[k] = ((*file_key(st), sha) if sha else file_key(st)) if same else e
        try:
            mode = os.stat(fp).st_mode
            tmp = d / f".{name}.{os.getpid()}.tmp"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                         | os.O_CLOEXEC, stat.S_IMODE(mode))
            with os.fdopen(fd, "wb") as fh:
                fh.write(marshal.dumps((STAT_VERSION, out)))
            os.replace(tmp, fp)
        except OSError:
            continue  # (the part stays as it was: those files are hashed once)


def load_stat_cache(prefix: Path) -> dict[str, tuple]:
    """Every part's entries; {} when there is no cache."""
    d = prefix / STAT_CACHE
    try:
        names = sorted(n for n in os.listdir(d) if n.endswith(".marshal"))
    except OSError:
        return {}
    out: dict[str, tuple] = {}
    for name in names:
        entries = load_part(d / name)
        if entries is not None:
            out.update(entries)
    return out

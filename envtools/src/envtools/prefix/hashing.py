"""sha256 of files and the stat cache that lets ``validate`` skip re-hashing unchanged files.

Hashing a multi-GB environment takes longer than the 3 s validate budget, so envtools
records each tracked file's (size, mtime_ns, inode) together with its sha256 when it
creates the env. A file whose stat still matches has not been rewritten (a write updates
mtime; replacing a file changes its inode), so its recorded hash still holds; every other
file is hashed again. ctime is deliberately not part of the key: every hardlink a clone
makes to a shared file changes its ctime. Resetting mtime by hand after an in-place edit
would go unnoticed, which is what ``validate --full`` (re-hash everything) is for.

The same entries let a clone trust a package cache file without hashing it: a file
hardlinked from the cache shares its inode with the env's file, so an entry whose (size,
mtime, inode) matches the cache file vouches for it. ``envtools install`` writes one part
per package (``pkg-<name-version-build>.marshal``, so that each placement process loads
only the packages it places), with an entry keyed by the cache file's absolute path for
each cache file the env does not share an inode with (those with a prefix placeholder);
a clone adds such entries for the cache files it copied or relocated, so that clones of
the clone can trust the cache the same way.

The cache is a directory of parts, each written by the process that placed or hashed
those files (a clone's placement processes write theirs in parallel), in marshal: a
46,000-file env's cache encodes 5x and loads 2x faster than as JSON. An entry
``rel -> (size, mtime_ns, ino, sha256)`` may leave the hash out (three items) when the
file holds its package's recorded sha256, as every file hardlinked from the package
cache does. A part that cannot be read is skipped: its files are hashed again.

Version 4: before it, a clone wrote the package's hash for every file it placed from the
cache without checking the cache file, so a clone of a tampered cache vouched for the
tampered files and plain ``validate`` called it clean. Parts of version 3 are therefore
ignored, except ``hashed`` (written by ``install`` from what it hashed).
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
STAT_VERSION = 4
#: older versions whose parts of this name are still true (see the module docstring)
TRUSTED_OLD = {3: "hashed.marshal"}


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
    return st.st_size, st.st_mtime_ns, st.st_ino


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
                entries[rel] = (*stat_key(st), h) if placeholder or h != sha else stat_key(st)
            ch = cache_hashes.get(src) if src else None
            if ch is not None:
                cst = cache_files[src]
                entries[src] = stat_key(cst) if ch == sha else (*stat_key(cst), ch)
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
    if version == STAT_VERSION or TRUSTED_OLD.get(version) == os.path.basename(fp):
        return entries
    return None


def store_stat_part(prefix: str | os.PathLike[str], part: str, entries: dict[str, tuple]) -> Path:
    """Write one part of the stat cache (its directory must exist)."""
    fp = Path(prefix) / STAT_CACHE / f"{part}.marshal"
    with open(fp, "wb") as fh:
        fh.write(marshal.dumps((STAT_VERSION, entries)))
    return fp


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

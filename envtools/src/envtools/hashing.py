"""sha256 of files and the stat cache that lets ``validate`` skip re-hashing unchanged files.

Hashing a multi-GB environment takes longer than the 3 s validate budget, so envtools
records each tracked file's (size, mtime_ns, inode) together with its sha256 when it
creates the env. A file whose stat still matches has not been rewritten (a write updates
mtime; replacing a file changes its inode), so its recorded hash still holds; every other
file is hashed again. ctime is deliberately not part of the key: every hardlink a clone
makes to a shared file changes its ctime. Resetting mtime by hand after an in-place edit
would go unnoticed, which is what ``validate --full`` (re-hash everything) is for.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from pathlib import Path

STAT_CACHE = Path("conda-meta") / "envtools" / "statcache.json"


def sha256_file(path: str | os.PathLike[str]) -> str:
    with open(path, "rb") as fh:
        if hasattr(hashlib, "file_digest"):  # Python 3.11+
            return hashlib.file_digest(fh, "sha256").hexdigest()
        h = hashlib.sha256()
        while chunk := fh.read(1 << 20):
            h.update(chunk)
        return h.hexdigest()


def stat_key(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino]


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


def write_stat_cache(prefix: Path, rel_paths: Iterable[str]) -> None:
    """Hash every regular tracked file and store it with its stat signature."""
    rels = []
    for rel in rel_paths:
        fp = prefix / rel
        if fp.is_file() and not fp.is_symlink():
            rels.append(rel)
    hashes = hash_many(str(prefix / r) for r in rels)
    entries = {}
    for rel in rels:
        h = hashes.get(str(prefix / rel))
        if h is None:
            continue
        entries[rel] = [*stat_key(os.stat(prefix / rel)), h]
    store_stat_cache(prefix, [encode_stat_entries(entries)])


def encode_stat_entries(entries: dict[str, list]) -> str:
    """Entries ``rel -> [size, mtime_ns, ino, sha256]`` as the members of a JSON object,
    so processes that placed parts of an env can each encode their own."""
    return json.dumps(entries, separators=(",", ":"))[1:-1]


def store_stat_cache(prefix: Path, encoded: Iterable[str]) -> None:
    """Write the stat cache (format version 2) from :func:`encode_stat_entries` parts."""
    (prefix / STAT_CACHE).parent.mkdir(parents=True, exist_ok=True)
    with open(prefix / STAT_CACHE, "w") as fh:
        fh.write('{"version":2,"files":{' + ",".join(m for m in encoded if m) + "}}")


def load_stat_cache(prefix: Path) -> dict[str, list]:
    try:
        with open(prefix / STAT_CACHE) as fh:
            data = json.load(fh)
        return data.get("files", {}) if data.get("version") == 2 else {}
    except (OSError, ValueError):
        return {}

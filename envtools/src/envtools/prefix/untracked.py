"""Files in a prefix that no package owns (pip installs, user files), found fast.

Walking a 20,000-file env to find the few files no record lists costs more than linking
the rest, so ``envtools install`` records the answer together with every directory's
mtime (git's "untracked cache" idea). Adding, removing or renaming an entry changes its
directory's mtime, so while all recorded mtimes match, the recorded answer still holds;
otherwise the prefix is walked again.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

UNTRACKED_CACHE = Path("conda-meta") / "envtools" / "untracked.json"


def scan(src: Path, owned: set[str]) -> tuple[list[str], list[str], dict[str, int]]:
    """Walk SRC: (untracked files, empty dirs, {dir: mtime_ns}); conda-meta is skipped,
    and so is a symlink where a package has a directory (a clone's directory link to
    the package cache, layers.py: its files are the package's)."""
    owned_dirs: set[str] | None = None
    files: list[str] = []
    empty: list[str] = []
    mtimes: dict[str, int] = {"": os.lstat(src).st_mtime_ns}
    stack = [""]
    root = str(src)
    while stack:
        rel_dir = stack.pop()
        path = f"{root}/{rel_dir}" if rel_dir else root
        n_entries = 0
        with os.scandir(path) as it:
            for entry in it:
                n_entries += 1
                rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
                if entry.is_dir(follow_symlinks=False):
                    if rel == "conda-meta":
                        continue
                    mtimes[rel] = entry.stat(follow_symlinks=False).st_mtime_ns
                    stack.append(rel)
                elif rel not in owned:
                    if entry.is_symlink() and entry.is_dir():
                        if owned_dirs is None:
                            owned_dirs = {d for f in owned for d in _parents(f)}
                        if rel in owned_dirs:
                            continue
                    files.append(rel)  # (a symlink to a directory is copied as a link)
        if n_entries == 0 and rel_dir:
            empty.append(rel_dir)
    return sorted(files), sorted(empty), mtimes


def _parents(rel: str):
    d = rel.rpartition("/")[0]
    while d:
        yield d
        d = d.rpartition("/")[0]


def write_cache(prefix: Path, owned: set[str]) -> None:
    files, empty, mtimes = scan(prefix, owned)
    (prefix / UNTRACKED_CACHE).parent.mkdir(parents=True, exist_ok=True)
    with open(prefix / UNTRACKED_CACHE, "w") as fh:
        fh.write(json.dumps({"version": 1, "files": files, "empty": empty, "dirs": mtimes}))


def untracked(src: Path, owned: Callable[[], set[str]]) -> tuple[list[str], list[str]]:
    """(untracked files, empty dirs) of SRC, from the cache when it still holds; the set
    of owned paths (``owned()``, tens of thousands of strings) is built only to scan."""
    try:
        with open(src / UNTRACKED_CACHE) as fh:
            data = json.load(fh)
        if data.get("version") == 1:
            root = str(src)
            for rel, mt in data["dirs"].items():
                if os.lstat(f"{root}/{rel}" if rel else root).st_mtime_ns != mt:
                    break
            else:
                return data["files"], data["empty"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    files, empty, _ = scan(src, owned())
    return files, empty


def find_editables(prefix: Path) -> list[str]:
    """Editable installs: they point outside the env, so a clone still uses that source."""
    found = []
    for site in prefix.glob("lib/python*/site-packages"):
        for p in site.glob("__editable__*.pth"):
            found.append(f"{p.relative_to(prefix)} (PEP 660 editable install)")
        for p in site.glob("*.egg-link"):
            target = p.read_text().splitlines()[0] if p.stat().st_size else "?"
            found.append(f"{p.relative_to(prefix)} -> {target} (setuptools develop)")
        for p in site.glob("*.dist-info/direct_url.json"):
            try:
                du = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if du.get("dir_info", {}).get("editable"):
                found.append(f"{p.parent.name} -> {du.get('url')} (editable)")
    return sorted(set(found))

"""The package cache kept beside an env: which cache directory holds each of its
packages."""

from __future__ import annotations

import json
import os
from pathlib import Path

from envtools.prefix.readonly import read_prefix_info
from envtools.prefix.records import Record


def find_cache(src: Path, records: list[Record]) -> dict[str, Path]:
    """Per package, a readable cache directory holding exactly that package, if any."""
    pinfo = read_prefix_info(src)
    roots = []
    if pinfo.get("package_cache"):
        roots.append(Path(pinfo["package_cache"]))
    found: dict[str, Path] = {}
    for r in records:
        cands = []
        epd = r.extracted_package_dir
        if epd:
            cands.append(Path(epd))
        cands += [root / r.dist for root in roots]
        for c in cands:
            idx = c / "info" / "index.json"
            try:
                with open(idx) as fh:
                    meta = json.load(fh)
            except (OSError, ValueError):
                continue
            if (meta.get("name"), str(meta.get("version")), meta.get("build")) == (
                r.name, r.version, r.build
            ) and os.access(c, os.R_OK | os.X_OK):
                # canonical: what a clone links to, and records, has no symlink on the way
                found[r.name] = Path(os.path.realpath(c))
                break
    return found


def cache_root_of(cache: dict[str, Path]) -> Path | None:
    roots = {p.parent for p in cache.values()}
    return roots.pop() if len(roots) == 1 else None

"""Where the cost model's measured alpha/beta live between runs.

One file per topology (and MPI library) under $DDL_CACHE_DIR, else
$XDG_CACHE_HOME/ddl-ce, else ~/.cache/ddl-ce, so a tune done once on a cluster serves
every later job with the same shape.
"""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    base = os.environ.get("DDL_CACHE_DIR")
    if base:
        return Path(base)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "ddl-ce"


def path_for(topology: str) -> Path:
    return cache_dir() / f"tune-{topology}.txt"

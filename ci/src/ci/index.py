"""Index a channel directory (repodata.json per subdir) with rattler's indexer."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rattler.index import index_fs


def index_channel(channel: Path, subdirs: list[str] | None = None) -> None:
    """Write repodata.json for ``noarch`` and every platform subdir present (or named).

    A conda channel always has ``noarch``, even when empty, so clients can read it.
    """
    channel.mkdir(parents=True, exist_ok=True)
    for sub in {"noarch", *(subdirs or [])}:
        (channel / sub).mkdir(exist_ok=True)
    asyncio.run(index_fs(channel, force=True))


def packages_in(channel: Path) -> dict[str, Path]:
    """``<subdir>/<filename>`` -> path for every package file in the channel."""
    out: dict[str, Path] = {}
    if channel.is_dir():
        for p in sorted(channel.glob("*/*.conda")) + sorted(channel.glob("*/*.tar.bz2")):
            out[f"{p.parent.name}/{p.name}"] = p
    return out

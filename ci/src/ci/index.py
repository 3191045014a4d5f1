"""Index a channel directory (repodata.json per subdir) with rattler's indexer."""

from __future__ import annotations

import asyncio
from pathlib import Path

from rattler.index import index_fs


def index_channel(channel: Path, subdirs: list[str] | None = None, force: bool = False) -> None:
    """Write repodata.json for ``noarch`` and every platform subdir present (or named).

    A conda channel always has ``noarch``, even when empty, so clients can read it.
    Incremental by default: packages already in repodata.json are not read again (the
    stand-in channel holds ~600 MB; hashing it on every rerun would cost most of the
    rerun budget).
    """
    channel.mkdir(parents=True, exist_ok=True)
    for sub in {"noarch", *(subdirs or [])}:
        (channel / sub).mkdir(exist_ok=True)
    asyncio.run(index_fs(channel, force=force))


def packages_in(channel: Path) -> dict[str, Path]:
    """``<subdir>/<filename>`` -> path for every package file in the channel."""
    out: dict[str, Path] = {}
    if channel.is_dir():
        for p in sorted(channel.glob("*/*.conda")) + sorted(channel.glob("*/*.tar.bz2")):
            out[f"{p.parent.name}/{p.name}"] = p
    return out

"""Index a channel directory (repodata.json per subdir) with rattler's indexer, and write
the channel's ``channeldata.json`` beside the subdirs (conda-index's summary of the
channel: each package's subdirs and newest version), which rattler's indexer does not."""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from rattler.index import index_fs


def index_channel(channel: Path, subdirs: list[str] | None = None, force: bool = False,
                  changed: Iterable[str] = ()) -> None:
    """Write repodata.json for ``noarch`` and every platform subdir present (or named).

    A conda channel always has ``noarch``, even when empty, so clients can read it.
    Incremental by default: packages already in repodata.json are not read again (the
    stand-in channel holds ~600 MB; hashing it on every rerun would cost most of the
    rerun budget). The indexer knows a package by its file name only, so a file replaced
    under the same name (a stand-in converted again) would keep its old record: the
    records of the files named in ``changed`` (``<subdir>/<file>``) and of every file
    whose size is not its record's are dropped first (see :func:`forget_changed`).
    """
    channel.mkdir(parents=True, exist_ok=True)
    for sub in {"noarch", *(subdirs or [])}:
        (channel / sub).mkdir(exist_ok=True)
    if not force:
        forget_changed(channel, set(changed))
    asyncio.run(index_fs(channel, force=force))
    write_channeldata(channel)
    world_readable(channel)


def forget_changed(channel: Path, changed: set[str]) -> list[str]:
    """Drop from each subdir's repodata.json the records of package files that are not
    what the record describes any more: named in ``changed``, or of another size than
    the record says (a stat per package, no hashing). The next incremental index then
    reads those files again. Returns the keys dropped."""
    dropped: list[str] = []
    for rd in sorted(channel.glob("*/repodata.json")):
        try:
            data = json.loads(rd.read_text())
        except (OSError, ValueError):
            continue  # (the indexer writes a new one)
        mine: list[tuple[str, str]] = []
        for section in ("packages", "packages.conda"):
            for name, rec in (data.get(section) or {}).items():
                key = f"{rd.parent.name}/{name}"
                try:
                    size = os.stat(rd.parent / name).st_size
                except OSError:
                    continue  # (gone: the indexer drops it)
                if key in changed or rec.get("size") != size:
                    mine.append((section, name))
        if mine:
            for section, name in mine:
                del data[section][name]
            tmp = rd.with_name(f".repodata.json.{os.getpid()}")
            tmp.write_text(json.dumps(data))
            os.replace(tmp, rd)
            dropped += [f"{rd.parent.name}/{name}" for _s, name in mine]
    return dropped


def channeldata(channel: Path) -> dict:
    """What conda-index puts in channeldata.json, from the subdirs' repodata.json: for
    every package name the subdirs that have it, its newest version, the newest build's
    timestamp and license."""
    from rattler import Version

    packages: dict[str, dict] = {}
    subdirs: list[str] = []
    for rd in sorted(channel.glob("*/repodata.json")):
        try:
            data = json.loads(rd.read_text())
        except (OSError, ValueError):
            continue
        subdirs.append(rd.parent.name)
        for rec in [*data.get("packages", {}).values(), *data.get("packages.conda", {}).values()]:
            name, version = rec.get("name"), str(rec.get("version", ""))
            if not name or not version:
                continue
            entry = packages.setdefault(name, {"subdirs": set(), "version": version})
            entry["subdirs"].add(rd.parent.name)
            try:
                newer = Version(version) > Version(entry["version"])
            except Exception:  # noqa: BLE001 - a version rattler cannot parse: keep the first
                newer = False
            if newer or version == entry["version"]:
                entry["version"] = version
                if rec.get("timestamp", 0) >= entry.get("timestamp", 0):
                    entry["timestamp"] = rec.get("timestamp", 0)
                    if rec.get("license"):
                        entry["license"] = rec["license"]
    for entry in packages.values():
        entry["subdirs"] = sorted(entry["subdirs"])
        if not entry.get("timestamp"):
            entry.pop("timestamp", None)
    return {"channeldata_version": 1, "packages": dict(sorted(packages.items())),
            "subdirs": subdirs}


def write_channeldata(channel: Path) -> None:
    """Write ``channel/channeldata.json`` (replacing it in one rename)."""
    tmp = channel / f".channeldata.json.{os.getpid()}"
    tmp.write_text(json.dumps(channeldata(channel), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, channel / "channeldata.json")


def world_readable(channel: Path) -> None:
    """Every file in the channel 0644 and every directory 0755, whatever the umask and
    whatever wrote them: rattler-build writes some packages 0600 (its temporary files
    keep their mode when renamed), and a channel is there to be read by every user of
    the site and by the web server in front of it. Files someone else owns are left."""
    for dirpath, dirnames, filenames in os.walk(channel):
        for name, want in [(".", 0o755), *((d, 0o755) for d in dirnames),
                           *((f, 0o644) for f in filenames)]:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
                if not stat.S_ISLNK(st.st_mode) and stat.S_IMODE(st.st_mode) != want:
                    os.chmod(p, want)
            except OSError:
                pass


def packages_in(channel: Path) -> dict[str, Path]:
    """``<subdir>/<filename>`` -> path for every package file in the channel."""
    out: dict[str, Path] = {}
    if channel.is_dir():
        for p in sorted(channel.glob("*/*.conda")) + sorted(channel.glob("*/*.tar.bz2")):
            out[f"{p.parent.name}/{p.name}"] = p
    return out

"""Make channel/ self-contained: copy in the upstream packages ``powerai`` needs.

WMLCE's channel carried the whole tested set, so an air-gapped cluster needed that one
channel only. ci does the same: after a successful build it solves every ``powerai``
build in the channel against channel + upstream, and hard-links (or copies) each
upstream package of the solution into ``channel/<subdir>/``. The packages are the
upstream's files, unchanged; ``.ci-state.json`` marks them ``origin: upstream``.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
from pathlib import Path
from urllib.parse import unquote, urlparse

from envtools.api import cuda_need

from ci.index import index_channel
from ci.install import solve
from ci.state import load_state, save_state


def _local_path(url: str) -> Path | None:
    parsed = urlparse(url)
    return Path(unquote(parsed.path)) if parsed.scheme in ("file", "") else None


def vendor_closure(channel: Path, upstream: list[str], platform: str, meta: str = "powerai") -> int:
    """Copy the upstream part of every ``meta`` build's solution into ``channel``.

    Returns how many files were added (0 on a rerun with nothing new).
    """
    rd = channel / platform / "repodata.json"
    if not rd.exists():
        return 0
    data = json.loads(rd.read_text())
    # each build with the CUDA it asks of the driver (its CUDA build solves as on a node
    # with one; the CPU build as on this host)
    builds = [
        (f"{r['name']} =={r['version']} {r['build']}", cuda_need(r.get("depends") or []))
        for r in {**data.get("packages", {}), **data.get("packages.conda", {})}.values()
        if r["name"] == meta
    ]
    state = load_state(channel)
    added = replaced = 0
    chan = str(channel.resolve())
    used: set[str] = set()
    for spec, cuda in builds:
        # the upstream first: a copy vendored here earlier must not shadow a newer build
        # of the same package there (a rebuilt python); our own names are not upstream's
        records, _ = solve([*upstream, chan], [spec], platform, cuda)
        for rec in records:
            src = _local_path(str(rec.url))
            if src is not None:
                used.add(f"{rec.subdir}/{src.name}")
            if src is None or str(src).startswith(chan) or not src.exists():
                continue
            dest = channel / rec.subdir / src.name
            # a stand-in converted again keeps its file name (the MPI mutex dependency
            # added to openmpi): the copy here must follow it, not shadow it
            if dest.exists() and filecmp.cmp(dest, src, shallow=False):
                continue
            replaced += dest.exists()
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = dest.with_name(dest.name + ".part")
            try:
                os.link(src, tmp)
            except OSError:
                shutil.copy2(src, tmp)
            os.replace(tmp, dest)
            state[f"{rec.subdir}/{src.name}"] = {"origin": "upstream", "test": "-"}
            added += 1
    # upstream copies of this platform that no powerai build uses any more (superseded)
    stale = [k for k, v in state.items() if k.startswith(f"{platform}/") and k not in used
             and isinstance(v, dict) and v.get("origin") == "upstream"] if builds else []
    for key in stale:
        name = key[len(platform) + 1:]
        if "/" not in name and name.endswith((".conda", ".tar.bz2")) and name[0] != ".":
            (channel / platform / name).unlink(missing_ok=True)  # (a state key is data)
        del state[key]
    if added or stale:
        index_channel(channel, [platform], force=bool(stale) or bool(replaced))
        save_state(channel, state)
    return added


def publish_upstream(src: Path, dest: Path, subdirs: list[str]) -> int:
    """Publish the offline stand-ins (``src``, ci's private cache) as the standard channel
    ``dest`` (``channel-upstream/``, the place conda-forge holds on a connected site), so
    that users, modulefiles and ``envtools add`` can name it. Packages are hard-linked
    (copied across filesystems), ones gone from ``src`` removed, and ``dest`` indexed.
    Returns how many package files were added or replaced."""
    from ci.index import packages_in

    have = packages_in(dest)
    want = {k: p for k, p in packages_in(src).items() if k.split("/")[0] in {*subdirs, "noarch"}}
    changed = 0
    replaced: list[str] = []
    for key, p in want.items():
        target = dest / key
        old = have.get(key)
        # the same file, or the same bytes: a stand-in converted again keeps its name
        # (the MPI mutex added to openmpi), and may keep its size too
        if old is not None and (os.path.samefile(old, p) or (
                old.stat().st_size == p.stat().st_size and filecmp.cmp(old, p, shallow=False))):
            continue
        if old is not None:
            replaced.append(key)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".part")
        tmp.unlink(missing_ok=True)
        try:
            os.link(p, tmp)
        except OSError:
            shutil.copy2(p, tmp)
        os.replace(tmp, target)
        changed += 1
    gone = [p for k, p in have.items() if k not in want]
    for p in gone:
        p.unlink()
    # (always: an index left stale by an earlier run, a record of a replaced file, is
    # found by its size and read again; an unchanged channel costs a stat per package)
    index_channel(dest, subdirs, force=bool(gone), changed=replaced)
    return changed

"""``python -m envtools.bench --add``: ``envtools add`` and ``drop`` of one small noarch
package in a clone of a large env, against a py-rattler install of the same package
into the same env, measured in the same run.

The env is ``--prefix`` (e.g. envs/powerai) or the generated bench env; it is cloned
once into the work directory (not timed). The package is ``bench-tiny`` (noarch:
generic, three files), built once into a channel of its own. Each round, in alternating
order:

* ``envtools add CLONE bench-tiny --channel TINY`` (a fresh process: solve with every
  installed package pinned, verify and extract the archive, link in the stage, commit),
  then ``envtools drop CLONE bench-tiny``;
* the baseline: a fresh python process that does what a py-rattler script does for the
  same change: reads the env's records, solves ``bench-tiny`` plus every installed name
  with the installed packages pinned, from the same channels, and runs
  ``rattler.install`` into the env (then the package is dropped again, not timed).

Both start with the package already in their package cache (``envtools add`` in the
user's ``~/.cache/envtools/pkgs``, rattler in its own directory in the work dir), so
neither figure includes fetching: the first, untimed, round fills both.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import statistics
import sys
import warnings
from pathlib import Path

from envtools.bench.measure import run_timed
from envtools.prefix.records import Prefix
from envtools.solve.adding import channel_sources, recorded_channels

TINY = (
    "package:\n  name: bench-tiny\n  version: 1.0.0\n"
    "build:\n  number: 0\n  noarch: generic\n  script:\n"
    "    - mkdir -p $PREFIX/share/bench-tiny\n"
    "    - echo tiny > $PREFIX/share/bench-tiny/a.txt\n"
    "    - echo 'prefix is here' > $PREFIX/share/bench-tiny/b.txt\n"
    "    - printf '#!/bin/sh\\necho bench-tiny\\n' > $PREFIX/share/bench-tiny/run.sh\n"
)

RATTLER_ADD = r'''
import asyncio, glob, os, sys, rattler
prefix, cache, *channels = sys.argv[1:]
installed = [rattler.PrefixRecord.from_path(p)
             for p in sorted(glob.glob(prefix + "/conda-meta/*.json"))]
specs = ["bench-tiny", *sorted({r.name.normalized for r in installed})]
recs = asyncio.run(rattler.solve(channels, specs, pinned_packages=installed))
asyncio.run(rattler.install(recs, target_prefix=prefix, cache_dir=cache,
                            installed_packages=installed, show_progress=False))
sys.stdout.flush()
os._exit(0)  # (py-rattler 0.28 can crash at interpreter shutdown: see envtools.cli._exit)
'''


def tiny_channel() -> Path:
    """The one-package channel (built once, cached)."""
    import rattler
    import rattler_build

    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddl-ce"
    import hashlib

    root = base / "envtools-bench" / ("tiny-" + hashlib.sha256(TINY.encode()).hexdigest()[:12])
    channel = root / "channel"
    if (channel / "noarch" / "repodata.json").exists():
        return channel
    shutil.rmtree(root, ignore_errors=True)
    (root / "recipe").mkdir(parents=True)
    (root / "recipe" / "recipe.yaml").write_text(TINY)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        rattler_build.build_recipes([str(root / "recipe" / "recipe.yaml")],
                                    output_dir=str(root / "out"), test="skip")
    (channel / "noarch").mkdir(parents=True)
    for pkg in (root / "out" / "noarch").glob("*.conda"):
        shutil.copy2(pkg, channel / "noarch" / pkg.name)
    asyncio.run(rattler.index.index_fs(channel, write_zst=False, write_shards=False))
    return channel


def _run(cmd: list[str]) -> tuple[float, str]:
    dt, p = run_timed(cmd)
    return dt, p.stdout


def run(src: Path, work: Path, repeat: int) -> dict[str, float]:
    """Clone ``src`` into ``work`` and time add/drop against py-rattler (medians)."""

    envtools = [sys.executable, "-m", "envtools"]
    tiny = tiny_channel()
    mine = work / "mine"
    _run([*envtools, "clone", str(src), str(mine)])
    chans = channel_sources([str(tiny), *recorded_channels(mine, Prefix.load(mine).records)])
    rcache = work / "rattler-pkgs"
    add, drop, base = [], [], []
    for i in range(repeat + 1):
        order = ("envtools", "rattler") if i % 2 else ("rattler", "envtools")
        for who in order:
            if who == "envtools":
                a, _ = _run([*envtools, "add", str(mine), "bench-tiny", "--channel", str(tiny)])
                d, _ = _run([*envtools, "drop", str(mine), "bench-tiny"])
                if i:
                    add.append(a)
                    drop.append(d)
            else:
                r, _ = _run([sys.executable, "-c", RATTLER_ADD, str(mine), str(rcache),
                             *chans])
                _run([*envtools, "drop", str(mine), "bench-tiny"])
                if i:
                    base.append(r)
    return {"add": statistics.median(add), "drop": statistics.median(drop),
            "rattler": statistics.median(base), "add_rounds": add, "rattler_rounds": base,
            "drop_rounds": drop}


def report(fig: dict, console) -> None:
    ratio = fig["add"] / fig["rattler"]
    console.print(
        f"envtools add of one noarch package: {fig['add']:.3f} s (median; target <= 3 s), "
        f"py-rattler solve + install of it into the same env: {fig['rattler']:.3f} s: "
        f"{ratio:.2f}x (target <= 1.0x)")
    console.print(f"envtools drop of it: {fig['drop']:.3f} s (median; target <= 1 s)")
    console.print("rounds: add " + ", ".join(f"{x:.3f}" for x in fig["add_rounds"])
                  + "; rattler " + ", ".join(f"{x:.3f}" for x in fig["rattler_rounds"])
                  + "; drop " + ", ".join(f"{x:.3f}" for x in fig["drop_rounds"]))

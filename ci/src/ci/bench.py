"""`python -m ci bench`: time `make channel` (a rerun, and with ``fresh`` a first run in a
clean clone with empty caches) and the solve of powerai, against the issue's targets."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console

from ci.config import Settings, host_subdir

console = Console(stderr=True)


def _first_run(s: Settings, cmd: list[str]) -> list[str]:
    """A fresh clone of this branch built with empty caches: the first-run figure."""
    scratch = s.root / "build" / "bench"
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    clone = scratch / "clone"
    branch = subprocess.run(
        ["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=s.root, capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(["git", "clone", "-q", "-b", branch, str(s.root), str(clone)], check=True)
    env = {
        **os.environ,
        "DDLCE_CACHE": str(scratch / "cache"),
        "RATTLER_CACHE_DIR": str(scratch / "rattler-cache"),
    }
    console.print(f"[bold]bench[/]: first run in {clone} with empty caches ({os.cpu_count()} CPUs)")
    t = time.monotonic()
    proc = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True)
    first = time.monotonic() - t
    (scratch / "first-run.log").write_text(proc.stdout + proc.stderr)
    out = [
        f"first make channel (fresh clone, empty caches): {first / 60:.1f} min "
        f"(target <= 60 min, three platforms)  rc={proc.returncode}  "
        f"log {scratch / 'first-run.log'}"
    ]
    report = clone / "channel" / "REPORT.md"
    if report.exists():
        out.append(f"per-stage times of the first run: {report}")
    return out


def bench(s: Settings, prefix: Path, *, fresh: bool) -> list[str]:
    """The figures, one line each."""
    from ci.install import solve

    cmd = (
        ["make", "-s", "channel"]
        if (s.root / "Makefile").exists()
        else [sys.executable, "-m", "ci", "channel", "--prefix", str(prefix)]
    )
    figures = _first_run(s, cmd) if fresh else []
    # make sure the channel here is built, then time a rerun with nothing changed
    subprocess.run(cmd, cwd=s.root, capture_output=True, text=True)
    t = time.monotonic()
    proc = subprocess.run(cmd, cwd=s.root, capture_output=True, text=True)
    rerun = time.monotonic() - t
    figures.append(
        f"make channel rerun (nothing changed): {rerun:.1f} s  (target <= 20 s)  "
        f"rc={proc.returncode}"
    )
    chans = [str(s.channel_dir.resolve())]
    times = [solve(chans, ["powerai"], host_subdir())[1] for _ in range(5)]
    figures.append(
        f"solve powerai for {host_subdir()} from channel/: best {min(times):.3f} s, "
        f"median {sorted(times)[2]:.3f} s  (target <= 2 s)"
    )
    load = os.getloadavg()
    figures.append(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f}")
    return figures

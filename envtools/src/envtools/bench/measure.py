"""What the benchmarks share: removing a tree that may be read-only, timing one command,
printing the medians."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

from envtools.base.progress import get_console


def rm_tree(p: Path) -> None:
    """Remove a tree, making only its *directories* writable: a chmod of its files would
    also change the package cache files they are hardlinked to."""
    if p.exists():
        for dirpath, _dirs, _files in os.walk(p):
            os.chmod(dirpath, 0o755)
        shutil.rmtree(p)


def run_timed(cmd: list[str], env: dict | None = None,
              ok: tuple[int, ...] = (0,)) -> tuple[float, subprocess.CompletedProcess]:
    """Run one command as a fresh process after a ``sync`` (not timed: no writeback left
    over from the previous command): its wall-clock seconds and its result; an error
    naming the command and its stderr's tail when it exits with a status not in ``ok``."""
    os.sync()
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if p.returncode not in ok:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n"
                           f"{p.stderr[-3000:]}")
    return dt, p


def time_cmd(cmd: list[str], env: dict | None = None) -> float:
    """The seconds of one command (validate may exit 1: it found something)."""
    return run_timed(cmd, env, (0, 1) if "validate" in cmd else (0,))[0]


def print_medians(title: str, results: dict[str, list[float]], med: dict[str, float]):  # noqa: ANN201
    """One table on stdout: each figure's median and its runs; returns the stdout console
    (rich's), for the lines that follow."""
    from rich.table import Table  # (rich costs ~25 ms: only when a table is printed)

    t = Table(title=title)
    t.add_column("what")
    t.add_column("median s", justify="right")
    t.add_column("runs s")
    for k, v in results.items():
        t.add_row(k, f"{med[k]:.3f}", " ".join(f"{x:.3f}" for x in v))
    out = get_console().__class__(width=120)  # (stdout)
    out.print(t)
    return out

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


def time_cmd(cmd: list[str], env: dict | None = None) -> float:
    os.sync()  # start clean: no writeback left over from the previous command
    t = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    dt = time.perf_counter() - t
    if p.returncode not in (0, 1) or (p.returncode == 1 and "validate" not in cmd):
        raise RuntimeError(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return dt


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

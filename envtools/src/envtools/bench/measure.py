"""What the benchmarks share: removing a tree that may be read-only, timing one command.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path


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

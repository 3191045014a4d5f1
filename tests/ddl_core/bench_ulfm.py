"""Time from a rank's SIGKILL to the survivors' ProcessFailedError and to a usable shrunk
world, under `mpirun --with-ft ulfm -n N` (workers/ulfm.py, case loop): medians over
trials, each trial one job. Not a test (pytest does not collect it); run it as

    python tests/ddl_core/bench_ulfm.py [--trials 10] [--np 4] [--liveness 1]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).parent
BIN = Path(sys.executable).parent


def trial(n: int, liveness: str, i: int, stamps: str) -> list[dict]:
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               PYTHONUNBUFFERED="1", DDL_TIMEOUT="30", DDL_ELASTIC="1",
               DDL_LIVENESS=liveness, ULFM_TAG=f"bench-{os.getpid()}-{i}",
               ULFM_STAMP_DIR=stamps)
    cmd = [str(BIN / "mpirun"), "--with-ft", "ulfm", "-n", str(n), "--map-by", ":OVERSUBSCRIBE",
           "--mca", "mpi_yield_when_idle", "1", sys.executable, str(HERE / "workers" / "ulfm.py"),
           "loop", str(n // 2), "5"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--np", type=int, default=4)
    ap.add_argument("--liveness", default="1", choices=["0", "1"])
    a = ap.parse_args()
    detect, usable, ok = [], [], 0
    stamps = tempfile.mkdtemp(prefix="bench-ulfm-")
    for i in range(a.trials):
        rows = trial(a.np, a.liveness, i, stamps)
        if len(rows) == a.np - 1 and all(r["ok"] for r in rows):
            ok += 1
            detect.append(max(r["detect_s"] for r in rows))  # the last survivor to know
            usable.append(max(r["shrink_s"] for r in rows))
    shutil.rmtree(stamps, ignore_errors=True)
    print(f"{a.np} ranks, DDL_LIVENESS={a.liveness}: {ok}/{a.trials} trials recovered; "
          f"kill -> ProcessFailedError on every survivor: median "
          f"{statistics.median(detect) * 1e3:.1f} ms (max {max(detect) * 1e3:.1f}); "
          f"kill -> shrunk world usable: median {statistics.median(usable) * 1e3:.1f} ms "
          f"(max {max(usable) * 1e3:.1f})")


if __name__ == "__main__":
    main()

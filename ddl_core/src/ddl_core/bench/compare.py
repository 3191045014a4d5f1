"""Before/after: this ddl_core's allreduce against another build's, in one run.

    python -m ddl_core.bench compare --baseline DIR [-n 2] [--rounds 15] [--sizes 8,1M]

DIR is a directory holding another build of the `ddl_core` package (libddl inside), e.g.
the main branch's, built with
    git archive main ddl_core | tar -x -C /tmp/ddl-main
    MPICC=.venv/bin/mpicc .venv/bin/pip install --no-build-isolation --no-deps \\
        --target /tmp/ddl-main/site /tmp/ddl-main/ddl_core

Why jobs and not one process: two libddl builds cannot share a process (one MPI_Init,
one set of symbols), so each round runs one job with DIR first on PYTHONPATH ("before")
and one without ("after"), in alternating order (before-after, after-before, ...) so
drift on a shared machine hits both alike. Both run the same timing code
(ddl_core/_compare_worker.py, copied out of the package and run by path): short bursts
of DDL allreduces and of mpi4py Allreduces on the same buffers, paired repetition by
repetition. mpi4py's code is the same in both builds, so DDL's time over mpi4py's in the
same repetition cancels most of what the machine's load does. The figure per size is
the median over rounds of that quotient after / before ("normalised"); the medians of
the raw times and their after/before are shown beside it.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .measure import parse_size

TARGET = 1.02


def one_job(ranks: int, sizes: list[int], reps: int, baseline: str | None, worker: Path,
            out: Path) -> dict[int, dict[str, float]]:
    """{size: {"ddl": us, "mpi": us, "ratio": ddl/mpi}} from one job of the worker."""
    env = dict(os.environ)
    if baseline:
        env["PYTHONPATH"] = baseline + os.pathsep + env.get("PYTHONPATH", "")
    ddlrun = str(Path(sys.executable).parent / "ddlrun")  # it forwards PYTHONPATH
    cmd = [ddlrun, "-n", str(ranks), sys.executable, str(worker),
           ",".join(map(str, sizes)), str(reps), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return {int(k): v for k, v in json.loads(out.read_text())["results"].items()}


def version(baseline: str | None) -> str:
    env = dict(os.environ)
    if baseline:
        env["PYTHONPATH"] = baseline + os.pathsep + env.get("PYTHONPATH", "")
    code = "import ddl_core, os; print(os.path.dirname(ddl_core.__file__))"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60).stdout.strip()


def compare(baseline: str, ranks: int, rounds: int, sizes: list[int], reps: int) -> int:
    if not (Path(baseline) / "ddl_core").is_dir():
        print(f"bench compare: error: {baseline} holds no ddl_core package (build one with "
              "pip install --target, see --help)", file=sys.stderr)
        return 2
    before_pkg, after_pkg = version(baseline), version(None)
    if before_pkg == after_pkg:
        print(f"bench compare: error: {baseline} does not shadow this ddl_core "
              f"({after_pkg}): nothing to compare", file=sys.stderr)
        return 2
    res: dict[str, list[dict[int, dict[str, float]]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        out, worker = Path(tmp) / "bench.json", Path(tmp) / "compare_worker.py"
        shutil.copy(Path(__file__).with_name("_compare_worker.py"), worker)
        for i in range(rounds):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for which in order:
                res[which].append(one_job(ranks, sizes, reps,
                                          baseline if which == "before" else None, worker,
                                          out))
            print(f"# round {i + 1}/{rounds} done", file=sys.stderr, flush=True)
    print(f"# ddl_core.bench compare: allreduce float32, {ranks} ranks, {rounds} rounds of one "
          f"job per build (alternating order), each job the median of {reps} paired "
          "repetitions")
    print(f"# before: {before_pkg}")
    print(f"# after:  {after_pkg}")
    print(f"# {'size (B)':>10} {'before us':>10} {'after us':>10} {'raw a/b':>8} "
          f"{'normalised a/b':>15} {'(rounds min-max)':>17} {'mpi4py us b / a':>16}")
    worst = 0.0
    for s in sizes:
        b = [r[s]["ddl"] for r in res["before"]]
        a = [r[s]["ddl"] for r in res["after"]]
        raw = statistics.median(x / y for x, y in zip(a, b, strict=True))
        norm = [ra[s]["ratio"] / rb[s]["ratio"]
                for ra, rb in zip(res["after"], res["before"], strict=True)]
        ratio = statistics.median(norm)
        worst = max(worst, ratio)
        mb = statistics.median(r[s]["mpi"] for r in res["before"])
        ma = statistics.median(r[s]["mpi"] for r in res["after"])
        print(f"  {s:>10} {statistics.median(b):>10.2f} {statistics.median(a):>10.2f} "
              f"{raw:>8.3f} {ratio:>15.3f} {min(norm):>8.2f}-{max(norm):<8.2f} "
              f"{mb:>7.2f} / {ma:<7.2f}")
    print(f"# target: normalised after/before <= {TARGET} at every size: "
          f"{'met' if worst <= TARGET else 'MISSED'} (worst {worst:.3f})")
    return 0


def main(args: Any) -> int:
    sizes = [parse_size(s) for s in args.sizes.split(",")]
    return compare(args.baseline, args.ranks, args.rounds, sizes, args.reps)

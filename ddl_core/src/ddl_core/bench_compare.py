"""Before/after: this ddl_core's allreduce against another build's, in one run.

    python -m ddl_core.bench compare --baseline DIR [-n 2] [--rounds 15] [--sizes 8,1M]

DIR is a directory holding another build of the `ddl_core` package (libddl inside), e.g.
the main branch's, built with
    git archive main ddl_core | tar -x -C /tmp/ddl-main
    MPICC=.venv/bin/mpicc .venv/bin/pip install --no-build-isolation --no-deps \\
        --target /tmp/ddl-main/site /tmp/ddl-main/ddl_core

Why jobs and not one process: two libddl builds cannot share a process (one MPI_Init,
one set of symbols), so each round runs the allreduce benchmark (`python -m
ddl_core.bench allreduce`: DDL and mpi4py interleaved, medians of its repetitions) once
with DIR first on PYTHONPATH ("before") and once without ("after"), in alternating order
(before-after, after-before, ...) so drift on a shared machine hits both alike. The
figure per size is the median over rounds of after/before within a round; the medians of
the times, and of DDL/mpi4py in the same jobs (a noise reference: MPI's code is the same
in both), are shown beside it.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

TARGET = 1.02


def one_job(ranks: int, sizes: list[int], reps: int, baseline: str | None,
            out: Path) -> dict[int, tuple[float, float]]:
    """{size: (ddl us, mpi us)} from one `python -m ddl_core.bench allreduce` job."""
    env = dict(os.environ)
    if baseline:
        env["PYTHONPATH"] = baseline + os.pathsep + env.get("PYTHONPATH", "")
    ddlrun = str(Path(sys.executable).parent / "ddlrun")  # it forwards PYTHONPATH
    times: dict[int, tuple[float, float]] = {}
    for size in sizes:
        cmd = [ddlrun, "-n", str(ranks), sys.executable, "-m",
               "ddl_core.bench", "allreduce", "-b", str(size), "-e", str(size), "-r", str(reps),
               "--json", str(out)]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
        rows = json.loads(out.read_text())["results"]
        by = {r["impl"]: r["time_us"] for r in rows}
        times[size] = (by["ddl"], by["mpi"])
    return times


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
    res: dict[str, list[dict[int, tuple[float, float]]]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "bench.json"
        for i in range(rounds):
            order = ("before", "after") if i % 2 == 0 else ("after", "before")
            for which in order:
                res[which].append(one_job(ranks, sizes, reps,
                                          baseline if which == "before" else None, out))
            print(f"# round {i + 1}/{rounds} done", file=sys.stderr, flush=True)
    print(f"# ddl_core.bench compare: allreduce float32, {ranks} ranks, {rounds} rounds of one "
          f"job each (alternating order), each job the median of {reps} repetitions")
    print(f"# before: {before_pkg}")
    print(f"# after:  {after_pkg}")
    print(f"# {'size (B)':>10} {'before us':>10} {'after us':>10} {'after/before':>13} "
          f"{'(rounds min-max)':>17} {'ddl/mpi before':>15} {'ddl/mpi after':>14}")
    worst = 0.0
    for s in sizes:
        b = [r[s][0] for r in res["before"]]
        a = [r[s][0] for r in res["after"]]
        ratios = [x / y for x, y in zip(a, b, strict=True)]
        rel_b = statistics.median(r[s][0] / r[s][1] for r in res["before"])
        rel_a = statistics.median(r[s][0] / r[s][1] for r in res["after"])
        ratio = statistics.median(ratios)
        worst = max(worst, ratio)
        print(f"  {s:>10} {statistics.median(b):>10.2f} {statistics.median(a):>10.2f} "
              f"{ratio:>13.3f} {min(ratios):>8.2f}-{max(ratios):<8.2f} {rel_b:>15.3f} "
              f"{rel_a:>14.3f}")
    print(f"# target: after/before <= {TARGET} at every size: "
          f"{'met' if worst <= TARGET else 'MISSED'} (worst {worst:.3f})")
    return 0


def main(args: Any) -> int:
    from .bench import parse_size

    sizes = [parse_size(s) for s in args.sizes.split(",")]
    return compare(args.baseline, args.ranks, args.rounds, sizes, args.reps)

"""What matching asynchronous requests by name costs: this libddl against a baseline
build, in one run.

    python -m ddl_core.bench matching --baseline SITE [-n 2] [--rounds 7]

SITE is a directory holding another installed ddl_core (e.g. built from `main`, see
docs/ddl_core.md, "Comparing two builds"). Each round launches one job per build
(ddlrun -n N), in alternating order, so noise on a shared machine hits both alike;
the table shows medians over the rounds of each job's median. A job measures, through
the C binding alone (ddl_core._ddl, so the two builds' Python layers do not differ), on
the same buffers:

  - a blocking allreduce of 8 B and of 1 MiB (the path the mismatch checks sit on);
  - a step of 100 asynchronous allreduces of 4 KiB, submitted then waited for (what DDP
    and Horovod produce every step), at the default cycle time (1 ms) and at 0 ms (every
    cycle's cost exposed); the baseline runs them unnamed, this build unnamed, named
    (the names reused every step, as gradients are), named in reverse order on every
    other rank, and named with new names every step (the worst case: every cycle
    exchanges names, and the table evicts old ones). Each result is checked.

The worker imports nothing but numpy and the one build's extension (loaded from its
file), so the two libddl builds never meet in one process.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

# The job each round runs, under `python -c`, with the extension's path as argument.
WORKER = r'''
import importlib.util, json, statistics, sys, time
import numpy as np
spec = importlib.util.spec_from_file_location("_ddl", sys.argv[1])
D = importlib.util.module_from_spec(spec)
spec.loader.exec_module(D)
D.init()
rank, size = D.rank(), D.size()
named_ok = "negotiation_stats" in dir(D)
F32, AVG = 2, 1  # averaging keeps the values: the results can be checked
if hasattr(D, "iallreduce"):  # a binding whose calls take the communicator first
    from functools import partial
    W = D.comm_world()
    allreduce, barrier = partial(D.allreduce, W), partial(D.barrier, W)
    submit = lambda buf, **kw: D.iallreduce(W, None, buf, F32, AVG, **kw)
else:  # an older one: world calls, and submit(kind, ...)
    allreduce, barrier = D.allreduce, D.barrier
    submit = lambda buf, **kw: D.submit(0, None, buf, F32, AVG, 0, **kw)

def slowest(t):
    """The slowest rank's time: collectives finish together, so it is the job's."""
    x = np.array([t], np.float64)
    allreduce(None, x, 3, 3)
    return float(x[0])

def timed(fn, iters):
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return slowest((time.perf_counter() - t0) / iters)

out = {}
for label, elems, iters in (("allreduce 8 B", 2, 2000), ("allreduce 1 MiB", 1 << 18, 100)):
    x = np.ones(elems, np.float32)
    y = np.empty_like(x)
    fn = lambda: allreduce(x, y, F32, 0)
    for _ in range(iters // 10):
        fn()
    out[label] = statistics.median(timed(fn, iters) for _ in range(int(sys.argv[2])))
    assert (y == size).all()

grads = [np.full(1024, float(i), np.float32) for i in range(100)]
names = [f"grad.{i}" for i in range(100)]
order = list(range(100))
rev = order[::-1] if rank % 2 else order

steps = [0]

def step(named, reverse=False, fresh=False):
    idx = rev if reverse else order
    steps[0] += 1
    if fresh:  # names never seen before: every step takes the full exchange
        hs = [submit(grads[i], name=f"s{steps[0]}.{i}") for i in idx]
    elif named:
        hs = [submit(grads[i], name=names[i]) for i in idx]
    else:
        hs = [submit(grads[i]) for i in idx]
    for h in hs:
        h.wait()

modes = [("unnamed", False, False, False)]
if named_ok:
    modes += [("named", True, False, False), ("named, reversed on odd ranks", True, True, False),
              ("named, new names every step", True, False, True)]
for cycle in (1.0, 0.0):
    D.set_fusion(64 << 20, cycle)
    for label, named, reverse, fresh in modes:
        for _ in range(20):
            step(named, reverse, fresh)
        key = f"100 x 4 KiB async, cycle {cycle:g} ms, {label}"
        out[key] = statistics.median(timed(lambda: step(named, reverse, fresh), 50)
                                     for _ in range(int(sys.argv[2])))
        for i, g in enumerate(grads):
            assert (g == float(i)).all(), (label, i, g[:3])
if rank == 0:
    print("RESULT " + json.dumps(out), flush=True)
D.finalize()
'''


def extension_of(site: Path | None) -> Path:
    """The _ddl extension of the ddl_core installed in `site` (None: this one)."""
    if site is None:
        spec = importlib.util.find_spec("ddl_core._ddl")
        if spec is None or spec.origin is None:
            raise SystemExit("ddl_core._ddl not found")
        return Path(spec.origin)
    found = sorted((site / "ddl_core").glob("_ddl*.so"))
    if not found:
        raise SystemExit(f"--baseline {site}: no ddl_core/_ddl*.so there; install a ddl_core "
                         f"into it first (pip install --target {site} ...)")
    return found[0]


def run_job(ext: Path, ranks: int, reps: int, mpi_args: str) -> dict[str, float]:
    cmd = [sys.executable, "-m", "ddl_core.runner.run", "-n", str(ranks)]
    if mpi_args:
        cmd += ["--mpi-args", mpi_args]
    cmd += ["--", sys.executable, "-c", WORKER, str(ext), str(reps)]
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    for line in proc.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT "):])
    raise SystemExit(f"job with {ext} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                     f"{proc.stderr[-3000:]}")


def fmt(seconds: float) -> str:
    us = seconds * 1e6
    return f"{us:.2f} us" if us < 100 else f"{us:.1f} us" if us < 1000 else f"{us / 1e3:.3f} ms"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_core.bench matching", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--baseline", required=True, type=Path,
                    help="a directory with another installed ddl_core (the 'before')")
    ap.add_argument("-n", "--ranks", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7, help="jobs per build (medians shown)")
    ap.add_argument("--reps", type=int, default=5, help="repetitions per job (its median)")
    ap.add_argument("--mpi-args", default="", help="passed to ddlrun --mpi-args")
    ap.add_argument("--json", help="write every job's figures here")
    args = ap.parse_args(argv)
    builds = {"baseline": extension_of(args.baseline), "this": extension_of(None)}
    runs: dict[str, list[dict[str, float]]] = {b: [] for b in builds}
    for i in range(args.rounds):
        order = list(builds) if i % 2 == 0 else list(builds)[::-1]
        for b in order:
            runs[b].append(run_job(builds[b], args.ranks, args.reps, args.mpi_args))
        print(f"# round {i + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    med = {b: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for b, rs in runs.items()}
    print(f"# {args.ranks} ranks; medians of {args.rounds} jobs per build, alternated; "
          f"baseline: {builds['baseline']}")
    print(f"{'case':<58} {'baseline':>11} {'this':>11} {'this/base':>9}")
    for key, t in med["this"].items():
        base_key = key.split(", named")[0] + ", unnamed" if ", named" in key else key
        b = med["baseline"].get(base_key)
        ratio = f"{t / b:9.3f}" if b else f"{'':>9}"
        base = fmt(b) if b else "-"
        print(f"{key:<58} {base:>11} {fmt(t):>11} {ratio}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"ranks": args.ranks, "builds": {k: str(v) for k, v in builds.items()},
                       "runs": runs, "medians": med}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

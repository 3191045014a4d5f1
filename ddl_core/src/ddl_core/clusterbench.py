"""Topology-aware allreduce against MPI on an emulated multi-host cluster, in one command.

    python -m ddl_core.clusterbench --hosts 2 --ranks 2 --link 200mbit [--json F]
    python -m ddl_core.clusterbench --hosts 4 --ranks 4 --link 200mbit --json bench-4x4.json

Why: DDL's claim is that it beats other allreduce libraries on a non-flat topology. Here
the topology is real: ranks of one emulated host share memory, hosts talk TCP over a
tbf-shaped link (ddl_core.cluster), slow enough that the benchmark is bound by the link
rather than by this machine's few cores. The command brings a cluster up, measures the
cost model's alpha/beta per level (ddl_core.tune), then runs three jobs:

  job "default": DDL topology-aware (cost model) and Open MPI's default MPI_Allreduce
                 (coll/han, hierarchical), interleaved repetition by repetition
  job "ring":    DDL topology-aware and Open MPI forced to a flat ring
                 (coll_tuned_use_dynamic_rules 1, coll_tuned_allreduce_algorithm 4, han off)
  job "flat":    DDL's flat ring (DDL_TOPOLOGY=<all ranks>, DDL_ALGO=ring) and the same MPI ring

Ratios against an MPI variant come from the job where both ran interleaved (the same
noise hits both); a ratio across jobs is marked '*'. For each it prints busbw, the ratio
to each MPI variant, the cost model's prediction (ddl_core.model, the same formulas as
csrc/model.c, with the tuned alpha/beta) and the link-bound limit: the time the bytes
that must leave a host, 2(H-1)/H x size for H hosts, take at the link rate.
The cluster is always removed, also when a job fails or the command is interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from . import model

MPI_RING = ["--mca", "coll_tuned_use_dynamic_rules", "1", "--mca",
            "coll_tuned_allreduce_algorithm", "4", "--mca", "coll_han_priority", "0",
            "--mca", "coll", "^han"]
JOBS = {  # name: (mpi args, env, (ddl label, mpi label))
    "default": ([], {}, ("ddl-topo", "mpi-default")),
    "ring": (MPI_RING, {}, ("ddl-topo", "mpi-ring")),
    "flat": (MPI_RING, {"DDL_ALGO": "ring"}, ("ddl-flat-ring", "mpi-ring")),
}


# ---- the worker, one per rank, under ddlrun --------------------------------------------

def worker(args: argparse.Namespace) -> int:
    import numpy as np
    from mpi4py import MPI

    import ddl_core as ddl

    ddl.init()
    comm = MPI.COMM_WORLD
    n, r = ddl.size(), ddl.rank()
    rows = []
    for nbytes in args.sizes:
        count = nbytes // 4
        x = ((np.arange(count) % 13) + r + 1).astype(np.float32)
        expect = sum(((np.arange(count) % 13) + q + 1) for q in range(n)).astype(np.float32)
        y = np.empty_like(x)
        fns = {"ddl": lambda x=x, y=y: ddl.allreduce(x, out=y),
               "mpi": lambda x=x, y=y: comm.Allreduce(x, y)}
        iters = max(2, min(50, (8 << 20) // nbytes))
        times: dict[str, list[float]] = {"ddl": [], "mpi": []}
        wrong = {}
        for impl, fn in fns.items():
            y[:] = 0
            fn()
            wrong[impl] = comm.allreduce(int(np.count_nonzero(y != expect)), op=MPI.SUM)
        for _ in range(args.reps):
            for impl, fn in fns.items():
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                dt = (time.perf_counter() - t0) / iters
                times[impl].append(comm.allreduce(dt, op=MPI.MAX))
        algos, predicted = ddl.plan(nbytes)
        rows.append({"size": nbytes, "iters": iters,
                     "ddl": statistics.median(times["ddl"]), "mpi": statistics.median(times["mpi"]),
                     "ddl_all": times["ddl"], "mpi_all": times["mpi"],
                     "wrong_ddl": wrong["ddl"], "wrong_mpi": wrong["mpi"],
                     "plan": list(algos), "plan_s": predicted})
    if r == 0:
        Path(args.out).write_text(json.dumps({"topology": list(ddl.topology()), "ranks": n,
                                              "version": ddl.version(), "rows": rows}))
    return 0


# ---- the driver ------------------------------------------------------------------------

def _ddlrun(cluster: str, ranks: int, argv: list[str], mpi_args: list[str],
            env: dict[str, str], timeout: float) -> None:
    cmd = [str(Path(sys.executable).parent / "ddlrun"), "--cluster", cluster, "--accelerators",
           str(ranks)]
    for k, v in env.items():
        cmd += ["-x", f"{k}={v}"]
    if mpi_args:
        cmd += ["--mpi-args", " ".join(mpi_args)]
    cmd += ["--", sys.executable, *argv]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    proc = subprocess.run(cmd, text=True, capture_output=True, timeout=timeout,
                          env=dict(os.environ, PYTHONUNBUFFERED="1", DDL_TIMEOUT="600"))
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout[-3000:]}\n"
                           f"{proc.stderr[-3000:]}")


def measure(cluster: str, hosts: int, ranks: int, link_bps: float, sizes: list[int],
            reps: int, workdir: Path, timeout: float) -> dict[str, Any]:
    tune_file = workdir / "tune.txt"
    _ddlrun(cluster, ranks, ["-m", "ddl_core.tune", "-o", str(tune_file)], [],
            {"DDL_TOPOLOGY": f"{ranks}x{hosts}"}, timeout)
    fabric = model.Fabric.from_tune_file(tune_file)
    jobs = {}
    for name, (mpi_args, env, _) in JOBS.items():
        env = dict(env, DDL_TUNE_FILE=str(tune_file),
                   DDL_TOPOLOGY=f"{ranks}x{hosts}" if name != "flat" else str(ranks * hosts))
        out = workdir / f"{name}.json"
        _ddlrun(cluster, ranks, ["-m", "ddl_core.clusterbench", "--worker", "--out", str(out),
                                 "--reps", str(reps), "--sizes", *map(str, sizes)],
                mpi_args, env, timeout)
        jobs[name] = json.loads(out.read_text())
    return {"hosts": hosts, "ranks_per_host": ranks, "link_bps": link_bps,
            "tune": tune_file.read_text(), "fabric": fabric.describe(), "jobs": jobs,
            "table": table(jobs, hosts, ranks, link_bps, fabric)}


def table(jobs: dict[str, Any], hosts: int, ranks: int, link_bps: float,
          fabric: model.Fabric) -> list[dict[str, Any]]:
    """One row per (size, implementation) with its ratios, prediction and link bound."""
    P = hosts * ranks
    out = []
    for i, size in enumerate(r["size"] for r in jobs["default"]["rows"]):
        t = {  # implementation -> (median seconds, job it ran in)
            "ddl-topo": (jobs["default"]["rows"][i]["ddl"], "default"),
            "ddl-flat-ring": (jobs["flat"]["rows"][i]["ddl"], "flat"),
            "mpi-default": (jobs["default"]["rows"][i]["mpi"], "default"),
            "mpi-ring": (jobs["ring"]["rows"][i]["mpi"], "ring"),
        }
        same_job = {("ddl-topo", "mpi-ring"): jobs["ring"]["rows"][i],
                    ("ddl-flat-ring", "mpi-ring"): jobs["flat"]["rows"][i]}
        link_s = model.link_bound(size, hosts, link_bps)
        dims = [ranks, hosts] if ranks > 1 else [hosts]
        pred = {
            "ddl-topo": model.hierarchical(fabric, dims, size)[0],
            "ddl-flat-ring": model.flat_ring_on(fabric, dims, size),
            "mpi-default": model.han_like(fabric, dims, size),
            "mpi-ring": model.flat_ring_on(fabric, dims, size),
        }
        for impl, (sec, job) in t.items():
            ratios = {}
            for m in ("mpi-default", "mpi-ring"):
                row = same_job.get((impl, m))
                if row is not None:  # both in one job: that job's own medians
                    ratios[m] = (row["mpi"] / row["ddl"], True)
                else:
                    ratios[m] = (t[m][0] / sec, job == t[m][1])
            wrong = sum(jobs[j]["rows"][i][k] for j in jobs for k in ("wrong_ddl", "wrong_mpi"))
            out.append({"size": size, "impl": impl, "time_s": sec, "job": job,
                        "busbw_MBps": size / sec * 2 * (P - 1) / P / 1e6,
                        "ratio": {m: v for m, (v, _) in ratios.items()},
                        "ratio_same_job": {m: s for m, (_, s) in ratios.items()},
                        "model_s": pred[impl], "link_bound_s": link_s,
                        "link_efficiency": link_s / sec, "wrong": wrong,
                        "ddl_plan": jobs[job]["rows"][i]["plan"] if impl.startswith("ddl")
                        else None})
    return out


def print_report(res: dict[str, Any], file: Any = sys.stdout) -> dict[str, bool]:
    H, R = res["hosts"], res["ranks_per_host"]
    topo = res["jobs"]["default"]
    print(f"# DDL cluster allreduce: {H} emulated hosts x {R} ranks, links "
          f"{res['link_bps'] / 1e6:g} Mbit/s (tbf), float32 sum, {topo['version']}", file=file)
    print(f"# detected/used grid {'x'.join(map(str, topo['topology']))}; cost model "
          f"(tuned): {res['fabric']}", file=file)
    print(f"# {'size':>9} {'impl':<14} {'time ms':>9} {'busbw':>8} {'vs mpi-':>8} "
          f"{'vs mpi-':>8} {'model ms':>9} {'meas/':>6} {'link ms':>8} {'% of':>5}  plan",
          file=file)
    print(f"# {'(B)':>9} {'':<14} {'(median)':>9} {'(MB/s)':>8} {'default':>8} {'ring':>8} "
          f"{'':>9} {'model':>6} {'bound':>8} {'link':>5}", file=file)
    for row in res["table"]:
        rd, rr = row["ratio"]["mpi-default"], row["ratio"]["mpi-ring"]
        sd = "" if row["ratio_same_job"]["mpi-default"] else "*"
        sr = "" if row["ratio_same_job"]["mpi-ring"] else "*"
        print(f"  {row['size']:>9} {row['impl']:<14} {row['time_s'] * 1e3:>9.1f} "
              f"{row['busbw_MBps']:>8.2f} {rd:>7.2f}{sd or ' '} {rr:>7.2f}{sr or ' '} "
              f"{row['model_s'] * 1e3:>9.1f} {row['time_s'] / row['model_s']:>6.2f} "
              f"{row['link_bound_s'] * 1e3:>8.1f} {100 * row['link_efficiency']:>5.0f}  "
              f"{','.join(row['ddl_plan']) if row['ddl_plan'] else ''}", file=file)
    print("# vs mpi-X = mpi-X time / this time (>1: faster than mpi-X); '*' = across jobs. "
          "busbw = size/time x 2(n-1)/n.", file=file)
    big = [r for r in res["table"] if r["impl"] == "ddl-topo" and r["size"] >= 16 << 20]
    targets = {
        "topology-aware >= 1.4x flat-ring MPI": all(r["ratio"]["mpi-ring"] >= 1.4 for r in big),
        "topology-aware >= 1.0x Open MPI default": all(r["ratio"]["mpi-default"] >= 1.0
                                                       for r in big),
        "within 25% of the model": all(abs(r["time_s"] / r["model_s"] - 1) <= 0.25 for r in big),
        ">= 80% of the link-bound limit": all(r["link_efficiency"] >= 0.8 for r in big),
        "every result correct": all(r["wrong"] == 0 for r in res["table"]),
    }
    if big:
        for k, ok in targets.items():
            print(f"# target (>= 16 MiB) {k}: {'met' if ok else 'MISSED'}", file=file)
    return targets


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_core.clusterbench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hosts", type=int, default=2)
    ap.add_argument("--ranks", type=int, default=2, help="ranks per host")
    ap.add_argument("--link", default="200mbit", help="each host's link rate (tc tbf)")
    ap.add_argument("--sizes", nargs="+", default=["1M", "4M", "16M", "32M"])
    ap.add_argument("--reps", type=int, default=9,
                    help="repetitions, DDL and MPI alternating (medians are shown)")
    ap.add_argument("--name", default=f"b{os.getpid() % 1000000}", help="cluster name")
    ap.add_argument("--json", help="write everything measured here")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per job")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    from .bench import parse_size

    args.sizes = [parse_size(s) if not s.isdigit() else int(s) for s in args.sizes]
    if args.worker:
        return worker(args)
    from . import cluster

    try:
        bps = cluster.parse_rate(args.link)
        with cluster.running(args.name, args.hosts, args.link) as c, \
                tempfile.TemporaryDirectory(prefix="ddl-clusterbench-") as tmp:
            res = measure(c.name, args.hosts, args.ranks, bps, args.sizes, args.reps,
                          Path(tmp), args.timeout)
    except cluster.ClusterError as e:
        print(f"clusterbench: error: {e}", file=sys.stderr)
        return 2
    targets = print_report(res)
    res["targets"] = targets
    res["command"] = "python -m ddl_core.clusterbench " + " ".join(argv or sys.argv[1:])
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if targets["every result correct"] else 1


if __name__ == "__main__":
    sys.exit(main())

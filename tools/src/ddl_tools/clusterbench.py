"""Topology-aware allreduce against MPI on an emulated multi-host cluster, in one command.

    python -m ddl_tools.clusterbench --hosts 2 --ranks 2 --link 200mbit [--json F]
    python -m ddl_tools.clusterbench --hosts 4 --ranks 4 --link 200mbit --json bench-4x4.json

Why: DDL's claim is that it beats other allreduce libraries on a non-flat topology. Here
the topology is real: ranks of one emulated host share memory, hosts talk TCP over a
tbf-shaped link (ddl_tools.cluster), slow enough that the benchmark is bound by the link
rather than by this machine's few cores. The command brings a cluster up, measures the
cost model's alpha/beta per level (ddl_core.bench.tune), then runs three jobs:

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

    python -m ddl_tools.clusterbench --split --hosts 2 --ranks 2 --link 200mbit

measures allreduce on split communicators in one job, each beside MPI on the same split
(MPI_Comm_split with the same color and key), interleaved repetition by repetition:
"world" (the job), "reordered" (every rank, in reverse order: a new communicator whose
grid is recomputed from its members) and "one-per-host" (color = rank mod ranks per host:
ranks-per-host communicators at once, each one rank on every host, all crossing the links
together). It prints each one's ratio to MPI next to the world's, the figure being that
a split communicator keeps the world's ratio.

    python -m ddl_tools.clusterbench --compare-launchers --hosts 2 --ranks 2 --link 200mbit

compares launchers instead, on a cluster that also runs Slurm: the same allreduce job
(DDL and MPI interleaved) started by ddlrun (mpirun over the cluster's launch agent), by
`salloc ... ddlrun` (srun --mpi=pmix: Slurm starts every rank) and by `salloc ... ddlrun
--launcher mpirun` (PRRTE starts its daemons through srun), in rounds whose launcher
order rotates. Per launcher and size it prints the median over every repetition of its
jobs and the ratio to the mpirun launch, and the seconds from `cluster up --slurm` to
every node idle and for `down` (medians of --updown cycles, measured first).
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

from ddl_core.bench.measure import parse_size
from ddl_core.model import Fabric, flat_ring_on, han_like, hierarchical, link_bound

from . import cluster

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


SPLITS = ("world", "reordered", "one-per-host")


def split_worker(args: argparse.Namespace) -> int:
    """Allreduce on the world and on split communicators, each against MPI on the same
    split; every implementation on every communicator interleaved, so one noise hits all."""
    import numpy as np
    from mpi4py import MPI

    import ddl_core as ddl

    ddl.init()
    world = MPI.COMM_WORLD
    r, n = world.rank, world.size
    colors = {"world": (0, r), "reordered": (0, n - 1 - r), "one-per-host": (r % args.ranks, r)}
    comms = {}
    for name, (color, key) in colors.items():
        d = ddl.comm_world() if name == "world" else ddl.comm_world().split(color, key=key)
        comms[name] = (d, world.Split(color, key))
    rows = []
    for nbytes in args.sizes:
        count = nbytes // 4
        row: dict[str, Any] = {"size": nbytes}
        fns = {}
        for name, (d, m) in comms.items():
            x = ((np.arange(count) % 13) + m.rank + 1).astype(np.float32)
            expect = sum(((np.arange(count) % 13) + q + 1) for q in range(m.size)).astype(
                np.float32)
            y = np.empty_like(x)
            fns[(name, "ddl")] = (lambda x=x, y=y, d=d: ddl.allreduce(x, out=y, comm=d), y, expect)
            fns[(name, "mpi")] = (lambda x=x, y=y, m=m: m.Allreduce(x, y), y, expect)
        for key, (fn, y, expect) in fns.items():
            y[:] = 0
            fn()
            row[f"wrong_{key[0]}_{key[1]}"] = world.allreduce(int(np.count_nonzero(y != expect)))
        times: dict[tuple[str, str], list[float]] = {k: [] for k in fns}
        for _ in range(args.reps):
            for key, (fn, _y, _e) in fns.items():
                world.Barrier()
                t0 = time.perf_counter()
                fn()
                times[key].append(world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        for (name, impl), ts in times.items():
            row[f"{name}_{impl}"] = statistics.median(ts)
        row["grids"] = {name: list(d.topology) for name, (d, _m) in comms.items()}
        rows.append(row)
    if r == 0:
        Path(args.out).write_text(json.dumps({"ranks": n, "version": ddl.version(),
                                              "rows": rows}))
    return 0


def print_split(res: dict[str, Any], file: Any = sys.stdout) -> dict[str, bool]:
    """The split table and its target: each split keeps the world's ratio to MPI (within
    5%, the noise of one link-bound run)."""
    H, R = res["hosts"], res["ranks_per_host"]
    print(f"# DDL allreduce on split communicators: {H} emulated hosts x {R} ranks, links "
          f"{res['link_bps'] / 1e6:g} Mbit/s (tbf), float32 sum, {res['version']}", file=file)
    print(f"# {'size':>9} {'communicator':<13} {'grid':<6} {'ddl ms':>9} {'mpi ms':>9} "
          f"{'mpi/ddl':>8} {'/ world':>8} {'#wrong':>6}", file=file)
    keeps = correct = True
    for row in res["rows"]:
        world = row["world_mpi"] / row["world_ddl"]
        for name in SPLITS:
            ratio = row[f"{name}_mpi"] / row[f"{name}_ddl"]
            wrong = row[f"wrong_{name}_ddl"] + row[f"wrong_{name}_mpi"]
            keeps = keeps and ratio >= 0.95 * world
            correct = correct and wrong == 0
            print(f"  {row['size']:>9} {name:<13} {'x'.join(map(str, row['grids'][name])):<6} "
                  f"{row[f'{name}_ddl'] * 1e3:>9.1f} {row[f'{name}_mpi'] * 1e3:>9.1f} "
                  f"{ratio:>8.2f} {ratio / world:>8.2f} {wrong:>6}", file=file)
    print("# mpi/ddl = MPI's median time / DDL's (>1: DDL faster); '/ world' = that ratio over "
          "the world communicator's in the same size", file=file)
    print(f"# target: every split keeps >= 0.95 of the world's ratio, every result correct: "
          f"{'met' if keeps and correct else 'MISSED'}", file=file)
    return {"split keeps the world's ratio": keeps, "every result correct": correct}


# ---- the driver ------------------------------------------------------------------------

def _ddlrun(c: cluster.Cluster, ranks: int, argv: list[str], mpi_args: list[str],
            env: dict[str, str], timeout: float) -> None:
    cmd = [str(Path(sys.executable).parent / "ddlrun"), *c.ddlrun_args(), "--accelerators",
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


def measure(c: cluster.Cluster, hosts: int, ranks: int, link_bps: float, sizes: list[int],
            reps: int, workdir: Path, timeout: float) -> dict[str, Any]:
    tune_file = workdir / "tune.txt"
    _ddlrun(c, ranks, ["-m", "ddl_core.bench", "tune", "-o", str(tune_file)], [],
            {"DDL_TOPOLOGY": f"{ranks}x{hosts}"}, timeout)
    fabric = Fabric.from_tune_file(tune_file)
    jobs = {}
    for name, (mpi_args, env, _) in JOBS.items():
        env = dict(env, DDL_TUNE_FILE=str(tune_file),
                   DDL_TOPOLOGY=f"{ranks}x{hosts}" if name != "flat" else str(ranks * hosts))
        out = workdir / f"{name}.json"
        _ddlrun(c, ranks, ["-m", "ddl_tools.clusterbench", "--worker", "--out", str(out),
                                 "--reps", str(reps), "--sizes", *map(str, sizes)],
                mpi_args, env, timeout)
        jobs[name] = json.loads(out.read_text())
    return {"hosts": hosts, "ranks_per_host": ranks, "link_bps": link_bps,
            "tune": tune_file.read_text(), "fabric": fabric.describe(), "jobs": jobs,
            "table": table(jobs, hosts, ranks, link_bps, fabric)}


# ---- launcher comparison (--compare-launchers) ------------------------------------------

LAUNCH_VARIANTS = ("mpirun", "srun", "mpirun-in-slurm")


def _launch_argv(c: Any, variant: str, ranks: int, ddlrun_args: list[str]) -> tuple[
        list[str], dict[str, str]]:
    """argv + env that start ddlrun_args through one launcher on cluster c."""
    ddlrun = str(Path(sys.executable).parent / "ddlrun")
    env = dict(os.environ, PYTHONUNBUFFERED="1", DDL_TIMEOUT="600")
    if variant == "mpirun":
        return [ddlrun, *c.ddlrun_args(), "--accelerators", str(ranks), *ddlrun_args], env
    env.update(c.job_env())
    hosts = len(c.hosts)
    salloc = ["salloc", "-N", str(hosts), "-n", str(hosts * ranks), ddlrun]
    if variant == "mpirun-in-slurm":
        salloc += ["--launcher", "mpirun"]
    return c.exec_argv(c.hosts[0], [*salloc, *ddlrun_args]), env


def updown_times(name: str, hosts: int, link: str, cycles: int) -> dict[str, list[float]]:
    """Seconds from `up --slurm` to every node idle, and for `down`, per cycle."""
    out: dict[str, list[float]] = {"up": [], "idle_after_daemons": [], "down": []}
    for _ in range(cycles):
        t0 = time.monotonic()
        c = cluster.up(name, hosts, link, slurm=True)
        out["up"].append(time.monotonic() - t0)
        out["idle_after_daemons"].append(c.slurm_ready_s or 0.0)
        t0 = time.monotonic()
        cluster.down(name)
        out["down"].append(time.monotonic() - t0)
    return out


def compare_launchers(c: Any, ranks: int, sizes: list[int], reps: int, rounds: int,
                      workdir: Path, timeout: float) -> dict[str, Any]:
    """The same worker job through each launcher, `rounds` times, order rotating."""
    hosts = len(c.hosts)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in LAUNCH_VARIANTS}
    for rnd in range(rounds):
        order = LAUNCH_VARIANTS[rnd % 3:] + LAUNCH_VARIANTS[:rnd % 3]
        for variant in order:
            out = workdir / f"{variant}-{rnd}.json"
            args = ["-x", f"DDL_TOPOLOGY={ranks}x{hosts}", "-v", "--", sys.executable, "-m",
                    "ddl_tools.clusterbench", "--worker", "--out", str(out), "--reps",
                    str(reps), "--sizes", *map(str, sizes)]
            argv, env = _launch_argv(c, variant, ranks, args)
            print("$ " + " ".join(argv), file=sys.stderr, flush=True)
            t0 = time.monotonic()
            proc = subprocess.run(argv, text=True, capture_output=True, timeout=timeout,
                                  env=env)
            if proc.returncode != 0 or not out.is_file():
                raise RuntimeError(f"{variant} job exited {proc.returncode}\n"
                                   f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
            job = json.loads(out.read_text())
            job["wall_s"] = time.monotonic() - t0
            job["command"] = [ln for ln in proc.stderr.splitlines()
                              if "ddl_tools.clusterbench --worker" in ln][-1:]
            runs[variant].append(job)
    rows = []
    for i, size in enumerate(sizes):
        med = {}
        for v in LAUNCH_VARIANTS:
            for impl in ("ddl", "mpi"):
                med[(v, impl)] = statistics.median(
                    t for job in runs[v] for t in job["rows"][i][f"{impl}_all"])
        wrong = sum(job["rows"][i]["wrong_ddl"] + job["rows"][i]["wrong_mpi"]
                    for v in LAUNCH_VARIANTS for job in runs[v])
        for v in LAUNCH_VARIANTS:
            rows.append({"size": size, "launcher": v, "ddl_s": med[(v, "ddl")],
                         "mpi_s": med[(v, "mpi")],
                         "ddl_vs_mpirun": med[(v, "ddl")] / med[("mpirun", "ddl")],
                         "mpi_vs_mpirun": med[(v, "mpi")] / med[("mpirun", "mpi")],
                         "topology": runs[v][0]["topology"], "wrong": wrong})
    return {"runs": runs, "rows": rows,
            "wall_s": {v: [j["wall_s"] for j in runs[v]] for v in LAUNCH_VARIANTS}}


def print_launchers(res: dict[str, Any], file: Any = sys.stdout) -> dict[str, bool]:
    ud = res["updown"]
    H, R = res["hosts"], res["ranks_per_host"]
    print(f"# Launchers on the emulated cluster: {H} hosts x {R} ranks, links "
          f"{res['link']}, Slurm {res['slurm_version']}, {res['rounds']} rounds x "
          f"{res['reps']} repetitions per launcher", file=file)
    if ud["up"]:
        print(f"# cluster up --slurm to every node idle: median {statistics.median(ud['up']):.2f}"
              f" s (runs {', '.join(f'{t:.2f}' for t in ud['up'])}; from the first daemon "
              f"{statistics.median(ud['idle_after_daemons']):.2f} s); down: median "
              f"{statistics.median(ud['down']):.2f} s (runs "
              f"{', '.join(f'{t:.2f}' for t in ud['down'])})", file=file)
    print(f"# {'size':>9} {'launcher':<16} {'ddl ms':>9} {'vs mpirun':>9} {'mpi ms':>9} "
          f"{'vs mpirun':>9}  grid   job wall s (median)", file=file)
    for r in res["launch"]["rows"]:
        wall = statistics.median(res["launch"]["wall_s"][r["launcher"]])
        print(f"  {r['size']:>9} {r['launcher']:<16} {r['ddl_s'] * 1e3:>9.1f} "
              f"{r['ddl_vs_mpirun']:>9.3f} {r['mpi_s'] * 1e3:>9.1f} {r['mpi_vs_mpirun']:>9.3f}"
              f"  {'x'.join(map(str, r['topology'])):<6} {wall:.1f}", file=file)
    print("# median over every repetition of every job of a launcher; vs mpirun = this "
          "time / the time under ddlrun's mpirun (over the launch agent)", file=file)
    srun_rows = [r for r in res["launch"]["rows"] if r["launcher"] == "srun"]
    targets = {
        "allreduce through srun within 5% of mpirun": all(
            abs(r["ddl_vs_mpirun"] - 1) <= 0.05 for r in srun_rows),
        "up --slurm to idle <= 30 s": bool(ud["up"]) and max(ud["up"]) <= 30,
        "down <= 10 s": bool(ud["down"]) and max(ud["down"]) <= 10,
        "every result correct": all(r["wrong"] == 0 for r in res["launch"]["rows"]),
    }
    for k, ok in targets.items():
        print(f"# target {k}: {'met' if ok else 'MISSED'}", file=file)
    return targets


def table(jobs: dict[str, Any], hosts: int, ranks: int, link_bps: float,
          fabric: Fabric) -> list[dict[str, Any]]:
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
        link_s = link_bound(size, hosts, link_bps)
        dims = [ranks, hosts] if ranks > 1 else [hosts]
        pred = {
            "ddl-topo": hierarchical(fabric, dims, size)[0],
            "ddl-flat-ring": flat_ring_on(fabric, dims, size),
            "mpi-default": han_like(fabric, dims, size),
            "mpi-ring": flat_ring_on(fabric, dims, size),
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
    ap = argparse.ArgumentParser(prog="python -m ddl_tools.clusterbench", description=__doc__,
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
    ap.add_argument("--compare-launchers", action="store_true",
                    help="compare mpirun, srun and mpirun inside Slurm (a Slurm cluster)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="--compare-launchers: jobs per launcher, launcher order rotating")
    ap.add_argument("--updown", type=int, default=3,
                    help="--compare-launchers: up --slurm / down cycles timed first")
    ap.add_argument("--split", action="store_true",
                    help="allreduce on split communicators against MPI's on the same splits")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.sizes = [parse_size(s) if not s.isdigit() else int(s) for s in args.sizes]
    if args.worker:
        return split_worker(args) if args.split else worker(args)
    if args.compare_launchers:
        return _main_launchers(args, argv)
    if args.split:
        return _main_split(args, argv)
    try:
        bps = cluster.parse_rate(args.link)
        with cluster.running(args.name, args.hosts, args.link) as c, \
                tempfile.TemporaryDirectory(prefix="ddl-clusterbench-") as tmp:
            res = measure(c, args.hosts, args.ranks, bps, args.sizes, args.reps,
                          Path(tmp), args.timeout)
    except cluster.ClusterError as e:
        print(f"ddl_tools.clusterbench: error: {e}", file=sys.stderr)
        return 2
    return _finish(res, print_report(res), args, argv)


def _main_launchers(args: argparse.Namespace, argv: list[str] | None) -> int:
    try:
        cluster.parse_rate(args.link)
        ud = updown_times(args.name, args.hosts, args.link, args.updown)
        with cluster.running(args.name, args.hosts, args.link, slurm=True) as c, \
                tempfile.TemporaryDirectory(prefix="ddl-clusterbench-") as tmp:
            launch = compare_launchers(c, args.ranks, args.sizes, args.reps, args.rounds,
                                       Path(tmp), args.timeout)
            version = subprocess.run(["sinfo", "--version"], capture_output=True, text=True,
                                     env=dict(os.environ, **c.job_env())).stdout.split()
    except cluster.ClusterError as e:
        print(f"ddl_tools.clusterbench: error: {e}", file=sys.stderr)
        return 2
    res = {"hosts": args.hosts, "ranks_per_host": args.ranks, "link": args.link,
           "rounds": args.rounds, "reps": args.reps, "updown": ud, "launch": launch,
           "slurm_version": version[-1] if version else "?"}
    return _finish(res, print_launchers(res), args, argv)


def _main_split(args: argparse.Namespace, argv: list[str] | None) -> int:
    try:
        bps = cluster.parse_rate(args.link)
        with cluster.running(args.name, args.hosts, args.link) as c, \
                tempfile.TemporaryDirectory(prefix="ddl-clusterbench-") as tmp:
            out = Path(tmp) / "split.json"
            _ddlrun(c, args.ranks, ["-m", "ddl_tools.clusterbench", "--worker", "--split",
                                         "--out", str(out), "--ranks", str(args.ranks),
                                         "--reps", str(args.reps),
                                         "--sizes", *map(str, args.sizes)],
                    [], {"DDL_TOPOLOGY": f"{args.ranks}x{args.hosts}"}, args.timeout)
            res = dict(json.loads(out.read_text()), hosts=args.hosts,
                       ranks_per_host=args.ranks, link_bps=bps)
    except cluster.ClusterError as e:
        print(f"ddl_tools.clusterbench: error: {e}", file=sys.stderr)
        return 2
    return _finish(res, print_split(res), args, argv)


def _finish(res: dict[str, Any], targets: dict[str, bool], args: argparse.Namespace,
            argv: list[str] | None) -> int:
    """The end of every mode: targets and command into the record, the record into
    --json; the exit status says whether every result was correct."""
    res["targets"] = targets
    res["command"] = "python -m ddl_tools.clusterbench " + " ".join(
        sys.argv[1:] if argv is None else argv)
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=1))
    return 0 if targets["every result correct"] else 1


if __name__ == "__main__":
    sys.exit(main())

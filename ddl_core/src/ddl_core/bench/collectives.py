"""nccl-tests-style benchmark of DDL's collectives against mpi4py, in one run, and the
benchmarks that share its options (check, liveness, hvd, compare).

    ddlrun -n 2 python -m ddl_core.bench allreduce [--json F] [--plot F.png]
    ddlrun -n 2 python -m ddl_core.bench alltoall|allgatherv|gather|scatter|reduce|sendrecv
    ddlrun -n 2 python -m ddl_core.bench check       # what the mismatch check costs
    ddlrun -n 2 python -m ddl_core.bench liveness    # what the liveness check costs
    ddlrun -n 2 python -m ddl_core.bench hvd -b 1M -e 64M  # what horovod-ddl's layer costs
    python -m ddl_core.bench compare --baseline DIR   (this build against another: see
                                                       ddl_core.bench.compare)
    python -m ddl_core.bench ddp|faults|gpu|lms|matching|tune --help
                                                     # the others, each with its own options

For every size, DDL and MPI run on the same buffers, interleaved repetition by
repetition so machine noise hits both alike; the table shows the median of the
repetitions (each the slowest rank's mean over its iterations), the bus bandwidth and
the DDL/MPI ratio. busbw = algbw x 2(n-1)/n for allreduce, (n-1)/n for allgather and
reduce_scatter, allgatherv, alltoall, gather and scatter, 1 for broadcast, reduce and
sendrecv (as nccl-tests; sendrecv: each rank sends `size` bytes to the next rank and
receives as much from the previous one). #wrong counts elements that differ from
the exact expected result after the timed loop.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

import ddl_core as ddl

from .measure import iterations, mpi, parse_size, timed

COLLECTIVES = ("allreduce", "allgather", "broadcast", "reduce_scatter", "alltoall", "allgatherv",
               "gather", "scatter", "reduce", "sendrecv")
_PARTED = ("allgather", "reduce_scatter", "alltoall", "allgatherv", "gather", "scatter")
NP_DTYPES = {"float32": np.float32, "float64": np.float64, "int32": np.int32,
             "int64": np.int64, "float16": np.float16, "int8": np.int8, "uint8": np.uint8}


def busbw_factor(coll: str, n: int) -> float:
    if coll == "allreduce":
        return 2.0 * (n - 1) / n
    if coll in _PARTED:
        return (n - 1) / n
    return 1.0


def _ring_sendrecv(send: Callable[[np.ndarray, int], Any],
                   recv: Callable[[np.ndarray, int], Any], x: np.ndarray, y: np.ndarray,
                   r: int, n: int) -> Callable[[], None]:
    """sendrecv's step for either library's blocking send and recv: x to the next rank, y
    from the previous one. Even ranks send first and odd ones receive first, so blocking
    calls pair up instead of every rank waiting in its send."""
    nxt, prv = (r + 1) % n, (r - 1) % n

    def sendrecv() -> None:
        if r % 2 == 0:
            send(x, nxt)
            recv(y, prv)
        else:
            recv(y, prv)
            send(x, nxt)

    return sendrecv


class Case:
    """Buffers and the two implementations of one collective at one size."""

    def __init__(self, coll: str, nbytes: int, dtype: Any, comm: Any) -> None:
        self.coll, self.comm = coll, comm
        n, r = ddl.size(), ddl.rank()
        es = np.dtype(dtype).itemsize
        # size = the bytes of the larger buffer, as nccl-tests reports it
        total = max(nbytes // es, n if coll in _PARTED else 1)
        if coll in _PARTED:
            total -= total % n
        self.count = total
        self.nbytes = total * es
        part = total // n
        vals = lambda k, m: ((np.arange(k) % 13) + m).astype(dtype)  # noqa: E731
        if coll == "allreduce":
            self.x, self.y = vals(total, r + 1), np.empty(total, dtype)
            self.expect = sum(vals(total, q + 1) for q in range(n)).astype(dtype)
        elif coll == "allgather":
            self.x, self.y = vals(part, r + 1), np.empty(total, dtype)
            self.expect = np.concatenate([vals(part, q + 1) for q in range(n)])
        elif coll == "reduce_scatter":
            self.x, self.y = vals(total, r + 1), np.empty(part, dtype)
            full = sum(vals(total, q + 1) for q in range(n)).astype(dtype)
            self.expect = full[r * part:(r + 1) * part]
        elif coll == "alltoall":  # block j of rank q holds q * n + j + 1
            self.x = np.concatenate([vals(part, r * n + j + 1) for j in range(n)])
            self.y = np.empty(total, dtype)
            self.expect = np.concatenate([vals(part, q * n + r + 1) for q in range(n)])
        elif coll in ("allgatherv", "gather"):
            self.x, self.y = vals(part, r + 1), np.empty(total, dtype)
            self.expect = np.concatenate([vals(part, q + 1) for q in range(n)])
            if coll == "gather" and r != 0:
                self.y = self.expect = np.empty(0, dtype)
        elif coll == "scatter":
            self.x = np.concatenate([vals(part, j + 1) for j in range(n)]) if r == 0 else (
                np.empty(total, dtype))
            self.y, self.expect = np.empty(part, dtype), vals(part, r + 1)
        elif coll == "reduce":
            self.x = vals(total, r + 1)
            self.y = np.empty(total if r == 0 else 0, dtype)
            self.expect = (sum(vals(total, q + 1) for q in range(n)).astype(dtype) if r == 0
                           else self.y)
        elif coll == "sendrecv":
            self.x, self.y = vals(total, r + 1), np.empty(total, dtype)
            self.expect = vals(total, (r - 1) % n + 1)
        else:
            self.x = self.y = vals(total, 7) if r == 0 else np.zeros(total, dtype)
            self.expect = vals(total, 7)
        self.part = part

    def ddl_fn(self) -> Callable[[], None]:
        x, y, r, n = self.x, self.y, ddl.rank(), ddl.size()
        sendrecv = _ring_sendrecv(ddl.send, ddl.recv, x, y, r, n)
        counts = [self.part] * n

        def allgatherv() -> None:
            ddl.allgatherv(x, counts, out=y)  # counts known, as MPI's Allgatherv needs

        return {
            "alltoall": lambda: ddl.alltoall(x, out=y),
            "allgatherv": allgatherv,
            "gather": lambda: ddl.gather(x, root=0, out=y if r == 0 else None),
            "scatter": lambda: ddl.scatter(x, root=0, out=y),
            "reduce": lambda: ddl.reduce(x, root=0, out=y if r == 0 else None),
            "sendrecv": sendrecv,
            "allreduce": lambda: ddl.allreduce(x, out=y),
            "allgather": lambda: ddl.allgather(x, out=y),
            "reduce_scatter": lambda: ddl.reduce_scatter(x, out=y),
            "broadcast": lambda: ddl.broadcast(x, 0),
        }[self.coll]

    def mpi_fn(self) -> Callable[[], None]:
        x, y, c = self.x, self.y, self.comm
        r, n = c.Get_rank(), c.Get_size()
        sendrecv = _ring_sendrecv(c.Send, c.Recv, x, y, r, n)
        counts = [self.part] * n
        return {
            "alltoall": lambda: c.Alltoall(x, y),
            "allgatherv": lambda: c.Allgatherv(x, [y, counts]),
            "gather": lambda: c.Gather(x, y if r == 0 else None, root=0),
            "scatter": lambda: c.Scatter(x if r == 0 else None, y, root=0),
            "reduce": lambda: c.Reduce(x, y if r == 0 else None, root=0),
            "sendrecv": sendrecv,
            "allreduce": lambda: c.Allreduce(x, y),
            "allgather": lambda: c.Allgather(x, y),
            "reduce_scatter": lambda: c.Reduce_scatter_block(x, y),
            "broadcast": lambda: c.Bcast(x, 0),
        }[self.coll]

    def wrong(self) -> int:
        return int(np.count_nonzero(self.y != self.expect))


def run(coll: str, sizes: list[int], dtype: Any, reps: int) -> list[dict[str, Any]]:
    comm = mpi().COMM_WORLD
    n = ddl.size()
    rows = []
    for nbytes in sizes:
        case = Case(coll, nbytes, dtype, comm)
        iters = iterations(case.nbytes)
        fns = {"ddl": case.ddl_fn(), "mpi": case.mpi_fn()}
        wrong: dict[str, int] = {}
        times: dict[str, list[float]] = {"ddl": [], "mpi": []}
        for impl, fn in fns.items():  # warm-up, and the correctness check
            for _ in range(min(iters, 20)):
                fn()
            wrong[impl] = comm.allreduce(case.wrong(), op=mpi().SUM)
        for _ in range(reps):
            for impl, fn in fns.items():
                times[impl].append(timed(fn, iters, comm))
        algo = ",".join(ddl.plan(case.nbytes)[0]) if coll == "allreduce" else "-"
        for impl in ("ddl", "mpi"):
            t = statistics.median(times[impl])
            algbw = case.nbytes / t / 1e9
            rows.append({
                "impl": impl, "algo": algo if impl == "ddl" else "MPI_" + coll,
                "size": case.nbytes, "count": case.count, "dtype": np.dtype(dtype).name,
                "redop": "sum" if coll in ("allreduce", "reduce_scatter", "reduce") else "none",
                "time_us": t * 1e6, "algbw": algbw,
                "busbw": algbw * busbw_factor(coll, n), "wrong": wrong[impl],
            })
    return rows


def print_table(coll: str, rows: list[dict[str, Any]], out: Any = sys.stdout) -> None:
    n = ddl.size()
    print(f"# ddl_core.bench {coll}: {n} ranks, topology {'x'.join(map(str, ddl.topology()))}, "
          f"{ddl.version()}", file=out)
    print(f"# {'size':>10} {'count':>11} {'type':>8} {'redop':>6} | {'ddl time':>9} "
          f"{'algbw':>7} {'busbw':>7} {'#wrong':>6} | {'mpi time':>9} {'algbw':>7} "
          f"{'busbw':>7} {'#wrong':>6} | {'ddl/mpi':>7}  algo", file=out)
    print(f"# {'(B)':>10} {'(elements)':>11} {'':>8} {'':>6} | {'(us)':>9} {'(GB/s)':>7} "
          f"{'(GB/s)':>7} {'':>6} | {'(us)':>9} {'(GB/s)':>7} {'(GB/s)':>7} {'':>6} | "
          f"{'busbw':>7}", file=out)
    for d, m in zip(rows[0::2], rows[1::2], strict=False):
        ratio = m["time_us"] / d["time_us"]
        print(f"  {d['size']:>10} {d['count']:>11} {d['dtype']:>8} {d['redop']:>6} | "
              f"{d['time_us']:>9.2f} {d['algbw']:>7.3f} {d['busbw']:>7.3f} {d['wrong']:>6} | "
              f"{m['time_us']:>9.2f} {m['algbw']:>7.3f} {m['busbw']:>7.3f} {m['wrong']:>6} | "
              f"{ratio:>7.2f}  {d['algo']}", file=out)
    big = [m["time_us"] / d["time_us"] for d, m in zip(rows[0::2], rows[1::2], strict=False)
           if d["size"] >= 1 << 20]
    small = rows[0]["time_us"] / rows[1]["time_us"]
    print(f"# smallest size: ddl time / mpi time = {small:.2f}", file=out)
    if big:
        print(f"# sizes >= 1 MiB: ddl/mpi busbw min {min(big):.2f}, median "
              f"{statistics.median(big):.2f}", file=out)
    print(f"# total #wrong: ddl {sum(r['wrong'] for r in rows[0::2])}, "
          f"mpi {sum(r['wrong'] for r in rows[1::2])}", file=out)


def plot(coll: str, rows: list[dict[str, Any]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for impl, style in (("ddl", "o-"), ("mpi", "s--")):
        pts = [r for r in rows if r["impl"] == impl]
        ax.plot([r["size"] for r in pts], [r["busbw"] for r in pts], style,
                label="DDL" if impl == "ddl" else "MPI (mpi4py)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("bus bandwidth (GB/s)")
    ax.set_title(f"{coll}, {ddl.size()} ranks")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def check_cost(reps: int) -> None:
    """What the mismatch check costs: nothing extra on the fused path; one header-only
    recursive doubling (= ddl.barrier) before every other collective."""
    comm = mpi().COMM_WORLD
    x, y = np.ones(2, np.float32), np.empty(2, np.float32)
    rows = {}
    for name, fn in (("ddl allreduce 8 B (header fused)", lambda: ddl.allreduce(x, out=y)),
                     ("mpi4py Allreduce 8 B", lambda: comm.Allreduce(x, y)),
                     ("ddl header-only check (= ddl.barrier)", ddl.barrier),
                     ("mpi4py Barrier", comm.Barrier)):
        for _ in range(200):
            fn()
        rows[name] = statistics.median(timed(fn, 2000, comm) for _ in range(reps)) * 1e6
    if ddl.rank() == 0:
        print(f"# mismatch-check cost, {ddl.size()} ranks (median of {reps} runs of 2000)")
        for name, us in rows.items():
            print(f"  {name:<40} {us:8.2f} us")


def liveness_cost(reps: int) -> None:
    """What the liveness check adds to a blocking allreduce (8 B and 1 MiB): the same
    buffers with the checks on and off in this process (libddl's ddl_live_checks: off, the
    collective numbering and the per-poll look at the departure counter are skipped),
    alternated repetition by repetition; medians."""
    from .. import _ddl

    comm = mpi().COMM_WORLD
    rows = []
    for nbytes in (8, 1 << 20):
        x = np.ones(nbytes // 4, np.float32)
        y = np.empty_like(x)

        def fn(x: np.ndarray = x, y: np.ndarray = y) -> None:
            ddl.allreduce(x, out=y)

        iters = iterations(nbytes)
        for _ in range(50):
            fn()
        times: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(reps):
            for on in ((True, False) if rep % 2 == 0 else (False, True)):
                _ddl._set_liveness_checks(on)
                times[on].append(timed(fn, iters, comm))
        _ddl._set_liveness_checks(True)
        # Each on/off pair ran back to back, so its ratio cancels the load of the moment
        # (the machine is shared); the median of those ratios is the figure.
        ratios = [a / b for a, b in zip(times[True], times[False], strict=True)]
        rows.append((nbytes, statistics.median(times[True]), statistics.median(times[False]),
                     statistics.median(ratios)))
    if ddl.rank() == 0:
        print(f"# liveness check cost, {ddl.size()} ranks, blocking allreduce ({reps} on/off "
              "pairs, alternated)")
        print(f"# {'size':>8} {'checks on':>11} {'checks off':>11} {'on/off':>7}  (medians; "
              "on/off: of the pairs' ratios)")
        for nbytes, on, off, ratio in rows:
            print(f"  {nbytes:>8} {on * 1e6:>9.2f}us {off * 1e6:>9.2f}us {ratio:>7.3f}")


# the benchmarks besides the collectives that take this module's options
SHARED_OPTIONS = ("check", "liveness", "hvd", "compare")


def main(argv: list[str] | None = None, others: tuple[str, ...] = ()) -> int:
    """The benchmarks that share this command line (the collectives, check, liveness,
    hvd, compare); `python -m ddl_core.bench` (bench/__init__.py) sends the others to
    their own modules before this parser sees them, and names them in `others` so that
    the usage lists every benchmark."""
    argv = sys.argv[1:] if argv is None else argv
    ap = argparse.ArgumentParser(prog="python -m ddl_core.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("collective",
                    choices=(*COLLECTIVES, *SHARED_OPTIONS, *others))
    ap.add_argument("-b", "--min-bytes", default="8")
    ap.add_argument("-e", "--max-bytes", default="256M")
    ap.add_argument("-f", "--factor", type=int, default=2, help="size multiplier per step")
    ap.add_argument("-d", "--dtype", default="float32", choices=sorted(NP_DTYPES))
    ap.add_argument("-r", "--reps", type=int, default=5, help="repetitions (median is shown)")
    ap.add_argument("--json", help="write the results as JSON")
    ap.add_argument("--plot", help="draw busbw against size to this PNG")
    cmp = ap.add_argument_group("compare (run it without ddlrun: it launches the jobs)")
    cmp.add_argument("--baseline", help="a directory holding another ddl_core build")
    cmp.add_argument("--rounds", type=int, default=21, help="jobs per build, alternating")
    cmp.add_argument("--sizes", default="8,1M", help="allreduce sizes, comma-separated")
    cmp.add_argument("-n", "--ranks", type=int, default=2)
    args = ap.parse_args(argv)
    if args.collective == "compare":
        if args.reps == 5:  # -r's default suits the tables; paired bursts want many more
            args.reps = 101
        if not args.baseline:
            ap.error("compare needs --baseline DIR")
        from .compare import main as compare_main

        return compare_main(args)
    ddl.init()
    if args.collective == "check":
        check_cost(args.reps)
        return 0
    if args.collective == "liveness":
        liveness_cost(args.reps)
        return 0
    if args.collective == "hvd":
        from . import hvd as bench_hvd

        lo = max(parse_size(args.min_bytes), 1 << 20)
        sizes = []
        while lo <= min(parse_size(args.max_bytes), 64 << 20):
            sizes.append(lo)
            lo *= 4 if args.factor == 2 else args.factor
        rows = bench_hvd.run(sizes, args.reps)
        if ddl.rank() == 0:
            bench_hvd.print_table(rows, args.reps)
        return 0
    sizes, s = [], parse_size(args.min_bytes)
    while s <= parse_size(args.max_bytes):
        sizes.append(s)
        s *= args.factor
    rows = run(args.collective, sizes, NP_DTYPES[args.dtype], args.reps)
    if ddl.rank() == 0:
        print_table(args.collective, rows)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"collective": args.collective, "ranks": ddl.size(),
                           "topology": list(ddl.topology()), "version": ddl.version(),
                           "results": rows}, f, indent=1)
        if args.plot:
            plot(args.collective, rows, args.plot)
    return 1 if any(r["wrong"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())

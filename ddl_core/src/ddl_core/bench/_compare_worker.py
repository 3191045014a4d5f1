"""One job of `python -m ddl_core.bench compare`: DDL against mpi4py, paired per repetition.

    ddlrun -n 2 python _compare_worker.py SIZES REPS OUT.json

Run by path from a copy outside the package, so the same code times whichever ddl_core
comes first on PYTHONPATH (the baseline build, or this one). It uses only the API every
build has (init, allreduce). Each repetition times a short burst (about 1-4 ms) of DDL
allreduces and one of mpi4py Allreduces on the same buffers, in alternating order; the
job's figure is the median over repetitions of DDL's time over mpi4py's in the same
repetition, so load that hits both alike cancels, and bursts hit by a preemption are
outvoted. Rank 0 writes {size: {"ddl": us, "mpi": us, "ratio": ddl/mpi}}.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import numpy as np
from mpi4py import MPI

import ddl_core as ddl


def burst(fn, iters: int, comm) -> float:  # noqa: ANN001 - a callable, an mpi4py comm
    """Seconds per call on the slowest rank."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX)


def main() -> int:
    sizes = [int(s) for s in sys.argv[1].split(",")]
    reps, out = int(sys.argv[2]), sys.argv[3]
    ddl.init()
    comm = MPI.COMM_WORLD
    res = {}
    for nbytes in sizes:
        x = np.arange(max(1, nbytes // 4), dtype=np.float32) % 7
        y = np.empty_like(x)
        iters = max(4, min(1000, (4 << 20) // max(nbytes, 1)))
        fns = {"ddl": lambda x=x, y=y: ddl.allreduce(x, out=y),
               "mpi": lambda x=x, y=y: comm.Allreduce(x, y)}
        for fn in fns.values():
            for _ in range(20):
                fn()
        t: dict[str, list[float]] = {"ddl": [], "mpi": []}
        for i in range(reps):
            for impl in ("ddl", "mpi") if i % 2 == 0 else ("mpi", "ddl"):
                t[impl].append(burst(fns[impl], iters, comm))
        res[nbytes] = {"ddl": statistics.median(t["ddl"]) * 1e6,
                       "mpi": statistics.median(t["mpi"]) * 1e6,
                       "ratio": statistics.median(d / m for d, m in zip(t["ddl"], t["mpi"],
                                                                         strict=True))}
    if comm.rank == 0:
        with open(out, "w") as f:
            json.dump({"version": ddl.version(), "results": res}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())

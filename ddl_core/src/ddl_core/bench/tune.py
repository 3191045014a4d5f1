"""Measure the cost model's alpha and beta per topology level and cache them.

    ddlrun -n 4 --topology 2x2 python -m ddl_core.bench tune

For each level, the two ranks whose grid coordinates differ only in that level (all
other coordinates 0) ping-pong: alpha is half the round trip of an 8-byte message, beta
the extra time per byte of a 4 MiB one. gamma (seconds per byte reduced) is timed
locally. Later jobs with the same grid read the cache (see ddl_core.tunecache) and the
model then picks algorithms from measured figures instead of defaults.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

import ddl_core as ddl

from ..tunecache import path_for


def grid_index(comm) -> int:  # noqa: ANN001 - an mpi4py communicator
    """This rank's place in the grid, the way libddl orders it (topology.c)."""
    import os

    if os.environ.get("DDL_TOPOLOGY"):
        return comm.rank
    from mpi4py import MPI

    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    leaders = comm.Split(0 if local.rank == 0 else MPI.UNDEFINED, comm.rank)
    node = leaders.rank if leaders != MPI.COMM_NULL else 0
    node = local.bcast(node, root=0)
    idx = node * local.size + local.rank
    if len(ddl.topology()) == 1:
        idx = comm.rank
    return idx


def pingpong(comm, me: int, peer: int, nbytes: int, iters: int) -> float:  # noqa: ANN001
    """Median one-way time between me and peer (both call this)."""
    buf = np.zeros(max(nbytes, 1), np.uint8)
    times = []
    first = me < peer
    for _ in range(iters):
        t0 = time.perf_counter()
        if first:
            comm.Send(buf, dest=peer, tag=7)
            comm.Recv(buf, source=peer, tag=7)
        else:
            comm.Recv(buf, source=peer, tag=7)
            comm.Send(buf, dest=peer, tag=7)
        times.append((time.perf_counter() - t0) / 2)
    return statistics.median(times)


def measure_gamma() -> float:
    n = 1 << 22
    a, b = np.ones(n, np.float32), np.ones(n, np.float32)
    times = []
    for _ in range(5):
        t0 = time.perf_counter()
        np.add(a, b, out=a)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) / a.nbytes


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_core.bench tune", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--output", help="write here instead of the cache")
    ap.add_argument("--large", default=4 << 20, type=int, help="bytes for the beta message")
    args = ap.parse_args(argv)
    ddl.init()
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    dims = ddl.topology()
    idx = grid_index(comm)
    coords, rest = [], idx
    for d in dims:
        coords.append(rest % d)
        rest //= d
    where = comm.allgather(idx)  # grid index -> world rank
    rank_of = {g: r for r, g in enumerate(where)}
    results = []
    for level, d in enumerate(dims):
        alpha = beta = 0.0
        if d > 1:
            others_zero = all(c == 0 for i, c in enumerate(coords) if i != level)
            stride = 1
            for k in range(level):
                stride *= dims[k]
            a, b = rank_of[0], rank_of[stride]
            if others_zero and coords[level] in (0, 1):
                peer = b if comm.rank == a else a
                small = pingpong(comm, comm.rank, peer, 8, 400)
                large = pingpong(comm, comm.rank, peer, args.large, 12)
                alpha, beta = small, max(large - small, 1e-12) / args.large
            alpha = comm.bcast(alpha, root=a)
            beta = comm.bcast(beta, root=a)
        results.append((alpha, beta))
        comm.Barrier()
    gamma = comm.allreduce(measure_gamma(), op=MPI.MAX)
    grid = "x".join(map(str, dims))
    if comm.rank == 0:
        path = Path(args.output) if args.output else path_for(grid)
        path.parent.mkdir(parents=True, exist_ok=True)
        lines = [f"# written by python -m ddl_core.bench tune ({ddl.version()})",
                 f"topology {grid}", f"gamma {gamma:.6e}"]
        lines += [f"level {i} {a:.6e} {b:.6e}" for i, (a, b) in enumerate(results)]
        tmp = path.with_suffix(".tmp")
        tmp.write_text("\n".join(lines) + "\n")
        tmp.replace(path)
        print(f"# cost model for topology {grid} -> {path}")
        print(f"# {'level':>5} {'ranks':>5} {'alpha (us)':>11} {'beta (GB/s)':>12}")
        for i, (a, b) in enumerate(results):
            print(f"  {i:>5} {dims[i]:>5} {a * 1e6:>11.2f} {1e-9 / b if b else 0:>12.2f}")
        print(f"# reduction: {1e-9 / gamma:.2f} GB/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

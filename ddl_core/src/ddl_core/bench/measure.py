"""What the benchmarks share: sizes as people write them, iteration counts every rank
agrees on, and the slowest rank's time of a loop.

The bottom of bench/: the benchmark modules import it and it imports none of them, so
the benchmarks that share a command line (collectives.py, compare.py, hvd.py) need not
import each other for these.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def parse_size(text: str) -> int:
    """'8', '64K', '1M', '2GB' -> bytes (binary multiples)."""
    text = text.strip().upper().removesuffix("B")
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    return int(float(text.rstrip("KMG")) * mult)


def iterations(nbytes: int) -> int:
    """The same on every rank (collectives must match): many for tiny sizes, few for big."""
    return max(3, min(2000, (64 << 20) // max(nbytes, 1)))


def mpi() -> Any:
    """mpi4py's MPI, imported when a benchmark first needs it (the baseline, optional)."""
    from mpi4py import MPI

    return MPI


def timed(fn: Callable[[], None], iters: int, comm: Any) -> float:
    """Mean seconds per call on the slowest rank."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t0) / iters
    return comm.allreduce(dt, op=mpi().MAX)

"""What horovod-ddl's Horovod layer costs: hvd.allreduce of gradient-sized torch tensors
against ddl_core.allreduce of the same buffers, in one run.

    ddlrun -n 2 python -m ddl_core.bench hvd [-b 1M -e 64M -r 7]

Three pairs per size, each interleaved repetition by repetition so machine noise hits
both alike: Horovod's out-of-place hvd.allreduce(t) (a new tensor: clone, asynchronous
request on libddl's progress thread, synchronize) against ddl_core.allreduce(x) (a new
array, blocking); the in-place hvd.allreduce_(t) against ddl_core.allreduce(x, out=x);
and hvd.allreduce_ named against the same named asynchronous request made on ddl_core
directly (the Horovod layer alone: the progress thread's negotiation is in both).
Both sides use the same torch tensor. Each repetition is the slowest rank's mean over
its iterations; the table shows medians
and the median of the per-repetition ratios hvd/ddl (1.05 = the layer costs 5%).
"""

from __future__ import annotations

import statistics
from typing import Any

import ddl_core as ddl

from .measure import iterations, timed


def _pairs(t: Any, x: Any, hvd: Any) -> list[tuple[str, Any, Any]]:
    return [
        ("hvd.allreduce  vs ddl_core.allreduce",
         lambda: hvd.allreduce(t, op=hvd.Sum), lambda: ddl.allreduce(x)),
        ("hvd.allreduce_ vs ddl_core.allreduce(out=x)",
         lambda: hvd.allreduce_(t, op=hvd.Sum), lambda: ddl.allreduce(x, out=x)),
        ("hvd.allreduce_ vs ddl_core.allreduce_async(..).wait()",
         lambda: hvd.allreduce_(t, op=hvd.Sum, name="g"),
         lambda: ddl.allreduce_async(x, out=x, name="g", shape=x.shape).wait()),
    ]


def run(sizes: list[int], reps: int) -> list[dict[str, Any]]:
    try:
        import horovod.torch as hvd
        import torch
    except ImportError as exc:
        raise SystemExit(f"bench hvd needs horovod-ddl and torch installed: {exc}") from exc
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    hvd.init()
    rows = []
    for nbytes in sizes:
        n = nbytes // 4
        t = torch.zeros(n, dtype=torch.float32)
        x = t  # the very same buffer for both (ddl_core takes torch CPU tensors)
        iters = iterations(nbytes)
        for label, hfn, dfn in _pairs(t, x, hvd):
            for fn in (hfn, dfn):  # warm-up
                for _ in range(min(iters, 5)):
                    fn()
            th: list[float] = []
            td: list[float] = []
            for rep in range(reps):
                order = ((hfn, th), (dfn, td)) if rep % 2 == 0 else ((dfn, td), (hfn, th))
                for fn, into in order:
                    into.append(timed(fn, iters, comm))
            ratios = [a / b for a, b in zip(th, td, strict=True)]
            rows.append({"bytes": nbytes, "pair": label, "hvd_s": statistics.median(th),
                         "ddl_s": statistics.median(td), "ratio": statistics.median(ratios)})
    return rows


def print_table(rows: list[dict[str, Any]], reps: int) -> None:
    print(f"# horovod-ddl layer cost, {ddl.size()} ranks, float32 (medians of {reps} "
          "interleaved repetitions; ratio: median of the per-repetition hvd/ddl)")
    print(f"# {'size':>9}  {'pair':<55} {'hvd':>10} {'ddl_core':>10} {'hvd/ddl':>8}")
    for r in rows:
        print(f"  {r['bytes'] >> 20:>7}Mi  {r['pair']:<55} {r['hvd_s'] * 1e3:>8.2f}ms "
              f"{r['ddl_s'] * 1e3:>8.2f}ms {r['ratio']:>8.3f}")
    worst = max(r["ratio"] for r in rows)
    print(f"# worst ratio {worst:.3f}: the Horovod layer costs {100 * (worst - 1):+.1f}% "
          "(target <= +5%)")

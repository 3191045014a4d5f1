"""DDL's benchmarks, behind one command: `python -m ddl_core.bench NAME [options]`.

    ddlrun -n 2 python -m ddl_core.bench allreduce [--json F] [--plot F.png]
    ddlrun -n 2 python -m ddl_core.bench alltoall|allgatherv|gather|scatter|reduce|sendrecv
    ddlrun -n 2 python -m ddl_core.bench allgather|broadcast|reduce_scatter
    ddlrun -n 2 python -m ddl_core.bench check       # what the mismatch check costs
    ddlrun -n 2 python -m ddl_core.bench liveness    # what the liveness check costs
    ddlrun -n 2 python -m ddl_core.bench hvd -b 1M -e 64M  # what horovod-ddl's layer costs
    python -m ddl_core.bench compare --baseline DIR  # this build's allreduce against another's
    python -m ddl_core.bench matching --baseline SITE  # request matching against another build
    python -m ddl_core.bench faults                  # time from a lost rank to the error
    python -m ddl_core.bench elastic                 # a lost rank's cost to an elastic job
    python -m ddl_core.bench stage IMAGE             # ddlrun --env's staging against cp
    ddlrun -n 2 python -m ddl_core.bench ddp         # DDP on the ddl backend against gloo
    ddlrun -n 1 python -m ddl_core.bench gpu         # CUDA tensors: ddl vs torch NCCL
    python -m ddl_core.bench lms                     # Large Model Support: largest batch, cost
    ddlrun -n 4 --topology 2x2 python -m ddl_core.bench tune  # measure the cost model

`python -m ddl_core.bench NAME --help` gives each one's options. The collectives, check,
liveness, hvd and compare share one command line (ddl_core.bench.collectives); every
other benchmark is a module here with options of its own, handed the rest of the line;
measure.py holds what they share (sizes, iteration counts, the slowest rank's time).
The emulated-cluster benchmark is the repository's own (tools/: ddl_tools.clusterbench).

Kept out of the core modules (comm, settings, model, ...): nothing in the library
imports a benchmark, so the import graph runs one way, from here to the core.
"""

from __future__ import annotations

import sys

# name -> module under ddl_core.bench for the benchmarks with options of their own
OWN_OPTIONS = {
    "ddp": "ddp",
    "elastic": "elastic",
    "faults": "faults",
    "gpu": "gpu",
    "lms": "lms",
    "matching": "matching",
    "stage": "stage",
    "tune": "tune",
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch `python -m ddl_core.bench NAME ...` to the module that runs NAME."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] in (["-h"], ["--help"], []):
        print(__doc__)
        return 0 if argv else 2
    name = argv[0]
    if name in OWN_OPTIONS:
        import importlib

        mod = importlib.import_module(f"{__name__}.{OWN_OPTIONS[name]}")
        return mod.main(argv[1:])
    from .collectives import main as collectives_main

    return collectives_main(argv, others=tuple(OWN_OPTIONS))

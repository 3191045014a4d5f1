"""TF_CONFIG for TensorFlow's own multi-worker strategies, one per rank.

Why: `tf.distribute.MultiWorkerMirroredStrategy` finds its peers in the TF_CONFIG
environment variable, `{"cluster": {"worker": ["host:port", ...]}, "task": {"type":
"worker", "index": i}}`, and each worker's differs (its index). A launcher passes one
environment to every rank, so ddlrun cannot hand out per-rank values by itself. The
design:

* ddlrun decides the worker addresses before launching, from the placement it already
  has (ranks per host, in rank order): rank r on host h listens on `base + its index
  among h's ranks`, so ranks sharing a host never collide. `base` is drawn at random
  from [20000, 32000) (below Linux's ephemeral range, so outgoing connections do not
  take the ports) and checked free on this machine where this machine is one of the
  hosts; two jobs sharing a host collide with probability ~ ranks/12000, and TensorFlow
  then fails with "address already in use" naming the port.
  Agreeing on ports at start (each rank binding its own, then exchanging them) would
  need a rendezvous service reachable from every rank before MPI exists; picking them
  up front needs nothing and shows in `ddlrun -v`.
* The list goes to every rank as DDL_TF_WORKERS; this file, run as a script in front
  of the program (`python .../tfconfig.py python train.py`: as a file, not a module,
  so the shim imports neither ddl_core nor numpy and costs one interpreter start),
  reads the rank the launcher gave the process (Open MPI, PMIx/Slurm, MPICH, jsrun),
  sets TF_CONFIG and execs the program, which thus keeps its pid, signals and exit code.
* A TF_CONFIG already in the environment is never replaced; ddlrun --no-tf-config
  leaves the shim out.
"""

from __future__ import annotations

import json
import os
import random
import socket
import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .plan import Plan

PORT_LO, PORT_HI = 20000, 32000
# Where launchers put the rank, most specific first: Open MPI's mpirun, a PMIx server
# (srun --mpi=pmix, prterun), Slurm's own task id, MPICH / Hydra and PMI-2, jsrun.
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID", "PMI_RANK",
             "JSM_NAMESPACE_RANK")


def _free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("", port))
        except OSError:
            return False
    return True


def pick_base(per_host: int, check_here: bool, rng: random.Random | None = None) -> int:
    """A base port with per_host consecutive ports after it (free here, if asked)."""
    rng = rng or random.SystemRandom()
    for _ in range(200):
        base = rng.randrange(PORT_LO, PORT_HI - per_host)
        if not check_here or all(_free(base + i) for i in range(per_host)):
            return base
    raise RuntimeError(f"no {per_host} consecutive free ports found in "
                       f"{PORT_LO}-{PORT_HI} on this machine")


def workers(placement: list[tuple[str, int]], base: int) -> list[str]:
    """'host:port' per rank in rank order; ranks on one host take consecutive ports."""
    return [f"{host}:{base + i}" for host, n in placement for i in range(n)]


def tf_config(workers_: list[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": workers_},
                       "task": {"type": "worker", "index": index}})


def rank_from(environ: dict[str, str] | os._Environ[str]) -> int | None:
    for name in RANK_VARS:
        v = environ.get(name, "")
        if v.isdigit():
            return int(v)
    return None


def add_tf_config(plan: Plan, environ: dict[str, str]) -> list[str] | None:
    """Put the shim in front of the plan's program and DDL_TF_WORKERS in its forwarded
    environment; returns the workers, or None where nothing was added (the user's own
    TF_CONFIG, or a placement ddlrun does not know)."""
    from .hosts import is_local

    if "TF_CONFIG" in environ or any(f.partition("=")[0] == "TF_CONFIG" for f in plan.forward):
        return None
    placement = plan.placement
    if placement is None:
        if plan.hosts or plan.hostfile:
            return None  # the launcher places the ranks (e.g. -n beyond the allocation)
        placement = [("localhost", plan.np or 1)]
    per_host = max(n for _, n in placement)
    base = pick_base(per_host, check_here=any(is_local(h) for h, _ in placement))
    addrs = workers(placement, base)
    plan.forward.append("DDL_TF_WORKERS=" + ",".join(addrs))
    plan.command = [sys.executable, "-I", "-S", os.path.abspath(__file__), *plan.command]
    return addrs


def shim(argv: list[str]) -> int:
    """Set this rank's TF_CONFIG from DDL_TF_WORKERS and exec argv."""
    if not argv:
        print("ddl tfconfig: no program given", file=sys.stderr)
        return 2
    if "TF_CONFIG" not in os.environ and os.environ.get("DDL_TF_WORKERS"):
        addrs = os.environ["DDL_TF_WORKERS"].split(",")
        rank = rank_from(os.environ)
        if rank is None:
            print(f"ddl tfconfig: no rank in the environment (looked for "
                  f"{', '.join(RANK_VARS)}); TF_CONFIG not set", file=sys.stderr)
        elif rank >= len(addrs):
            print(f"ddl tfconfig: rank {rank} but DDL_TF_WORKERS lists {len(addrs)} workers;"
                  " TF_CONFIG not set", file=sys.stderr)
        else:
            os.environ["TF_CONFIG"] = tf_config(addrs, rank)
    try:
        os.execvp(argv[0], argv)
    except OSError as e:
        print(f"ddl tfconfig: cannot run {argv[0]}: {e.strerror}", file=sys.stderr)
        return 127


if __name__ == "__main__":
    sys.exit(shim(sys.argv[1:]))

"""How fast a lost rank is reported: time from a rank's death or exit to the error on every
survivor, under plain mpirun and under `mpirun --runtime-options recoverable` (where the
launcher leaves survivors waiting), with the liveness check on and, as the baseline in the
same run, off (DDL_LIVENESS=0: only DDL_TIMEOUT notices).

    python -m ddl_core.bench faults [--reps 5] [--ranks 3] [--timeout 5]

Each repetition is a real job (`ddlrun -n RANKS python -m ddl_core.bench faults worker`):
every rank finishes one allreduce, then the victim (rank 1) waits 0.3 s, so the others are
inside the next collective, writes the time (CLOCK_MONOTONIC, shared by the processes of one
host) to a file and ends: SIGKILL, or sys.exit(0) (which finalizes DDL and so says BYE). Each
survivor reports when its collective raised; the table shows the median and the maximum of
(error - death) over all survivors of all repetitions.

The worker is also what tests/ddl_core/test_faults.py runs, so the figure and the tests
measure the same thing.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FAULTS = ("kill", "segv", "exit3", "exit0", "_exit0", "hang", "forkkill", "none")
COLLS = ("allreduce", "large", "async", "broadcast", "allgather", "barrier", "irecv")
LINE = re.compile(r"^FAULT rank=(\d+) error=(\w+) waited=([\d.]+) after_death=([\d.-]+) "
                  r"msg=(.*)$")


# -- the ranks' side ---------------------------------------------------------------------

def _collective(coll: str, n: int) -> None:
    import numpy as np

    import ddl_core as ddl

    x = np.ones(n, np.float32)
    if coll == "allreduce":
        ddl.allreduce(x)
    elif coll == "large":
        ddl.allreduce(np.ones(1 << 20, np.float32))
    elif coll == "async":
        ddl.allreduce_async(x).wait()
    elif coll == "broadcast":
        ddl.broadcast(x, root=0)
    elif coll == "allgather":
        ddl.allgather(x)
    elif coll == "irecv":  # a point-to-point request: rank 1 sends to every other rank
        if ddl.rank() == 1:
            for h in [ddl.isend(x, r) for r in range(ddl.size()) if r != 1]:
                h.wait()
        else:
            ddl.irecv(x, 1).wait()
    else:
        ddl.barrier()


def _fault(fault: str, stamp: Path) -> None:
    if fault == "forkkill" and os.fork() == 0:
        # A child that outlives its parent (a DataLoader worker) must not keep the parent's
        # liveness connection open: the parent's death is still seen at once.
        time.sleep(5)
        os._exit(0)
    stamp.write_text(f"{time.monotonic():.6f}")
    if fault in ("kill", "forkkill"):
        os.kill(os.getpid(), signal.SIGKILL)
    if fault == "segv":
        os.kill(os.getpid(), signal.SIGSEGV)
    if fault == "exit3":
        sys.exit(3)
    if fault == "exit0":
        sys.exit(0)
    if fault == "_exit0":
        os._exit(0)
    if fault == "hang":
        time.sleep(float(os.environ.get("DDL_TIMEOUT", "300")) + 2)
        os._exit(0)


def worker(fault: str, victim: int, stamp: Path, coll: str) -> None:
    """One rank of a fault job (see the module's docstring). A survivor prints
    `FAULT rank=R error=TYPE waited=S after_death=S msg=...` (and writes it to
    `fault-R` beside the stamp) and re-raises the error, so it exits as an unhandled DDL
    error would (status 1, noted as caused by a lost peer)."""
    import ddl_core as ddl

    ddl.init()
    r = ddl.rank()
    _collective("allreduce", 16)  # collective #1: every rank is up
    if r == victim and fault != "none":
        time.sleep(0.3)  # the others are inside collective #2 by now
        _fault(fault, stamp)
    t0 = time.monotonic()
    try:
        _collective(coll, 16)
    except ddl.DDLError as e:
        t = time.monotonic()
        death = float(stamp.read_text()) if stamp.exists() else t0
        msg = str(e).replace("\n", " ")
        line = (f"FAULT rank={r} error={type(e).__name__} waited={t - t0:.4f} "
                f"after_death={t - death:.4f} msg={msg}")
        # Also in a file beside the stamp: a launcher that ends the job may drop the last
        # output of its ranks (Open MPI did, under `recoverable`, after a non-zero exit).
        (stamp.parent / f"fault-{r}").write_text(line + "\n")
        print(line, flush=True)
        raise
    print(f"NOFAULT rank={r}", flush=True)


# -- the driver --------------------------------------------------------------------------

def ddlrun_cmd(ranks: int, recoverable: bool, *args: str) -> list[str]:
    mpi = "--mca mpi_yield_when_idle 1"
    if recoverable:
        mpi += " --runtime-options recoverable"
    return [str(Path(sys.executable).with_name("ddlrun")), "-n", str(ranks),
            f"--mpi-args={mpi}", sys.executable, "-m", "ddl_core.bench", "faults", "worker",
            *args]


def run_job(ranks: int, recoverable: bool, fault: str, victim: int, coll: str,
            env: dict[str, str], timeout: float = 120) -> tuple[int, list[dict[str, str]], str]:
    """(ddlrun's exit status, the survivors' FAULT lines as dicts, all output)."""
    with tempfile.TemporaryDirectory(prefix="ddl-faults-") as d:
        cmd = ddlrun_cmd(ranks, recoverable, "--fault", fault, "--victim", str(victim),
                         "--stamp", str(Path(d) / "death"), "--coll", coll)
        full = dict(os.environ, PYTHONUNBUFFERED="1", OMPI_ALLOW_RUN_AS_ROOT="1",
                    OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", **env)
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full)
        lines = [f.read_text() for f in sorted(Path(d).glob("fault-*"))]
    found = []
    for line in lines:
        m = LINE.match(line.strip())
        if m:
            found.append(dict(zip(("rank", "error", "waited", "after_death", "msg"),
                                  m.groups(), strict=True)))
    return proc.returncode, found, proc.stdout + proc.stderr


def measure(args: argparse.Namespace) -> int:
    # (recoverable, fault, victim, liveness on); plain mpirun with the check off is not a
    # baseline: mpirun kills the survivors (0.4-0.7 s) before any error is raised.
    cases = [(rec, fault, 1, True) for rec in (False, True) for fault in ("kill", "exit0")]
    cases += [(True, "kill", 0, True)]  # rank 0 runs the watcher: its own death
    cases += [(True, "kill", 1, False), (True, "exit0", 1, False)]
    rows = []
    for recoverable, fault, victim, live in cases:
        env = {"DDL_TIMEOUT": str(args.timeout), "DDL_LIVENESS": "1" if live else "0"}
        lat = []
        for _ in range(args.reps if live else 1):
            _, found, out = run_job(args.ranks, recoverable, fault, victim, "allreduce", env)
            if len(found) != args.ranks - 1:
                print(f"# a job did not report on every survivor:\n{out[-3000:]}",
                      file=sys.stderr)
                return 1
            lat += [float(f["after_death"]) for f in found]
        rows.append(("recoverable" if recoverable else "plain", f"{fault} r{victim}",
                     "on" if live else f"off (DDL_TIMEOUT={args.timeout:g})",
                     statistics.median(lat), max(lat), len(lat)))
    print(f"# ddl_core.bench faults: {args.ranks} ranks; the victim dies 0.3 s into "
          "collective #2; seconds from its death to the error on each survivor")
    print(f"# {'mpirun':<12} {'fault':<9} {'liveness':<22} {'median s':>9} {'max s':>7} "
          f"{'samples':>7}")
    for mode, fault, live, med, mx, n in rows:
        print(f"  {mode:<12} {fault:<9} {live:<22} {med:>9.3f} {mx:>7.3f} {n:>7}")
    worst = max(r[4] for r in rows if r[2] == "on")
    print(f"# liveness on: worst {worst:.3f} s (target <= 2 s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_core.bench faults", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="what")
    w = sub.add_parser("worker", help="one rank of a fault job (run under ddlrun)")
    w.add_argument("--fault", choices=FAULTS, required=True)
    w.add_argument("--victim", type=int, default=1)
    w.add_argument("--stamp", type=Path, required=True)
    w.add_argument("--coll", choices=COLLS, default="allreduce")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=5.0,
                    help="DDL_TIMEOUT of the jobs (the baseline's wait)")
    args = ap.parse_args(argv)
    if args.what == "worker":
        worker(args.fault, args.victim, args.stamp, args.coll)
        return 0
    return measure(args)


if __name__ == "__main__":
    sys.exit(main())

"""Worker for test_elastic_launch.py: under `ddlrun --elastic`, one rank ends mid-loop and
the survivors go on.

    elastic_kill.py API VICTIM HOW

API: mpi4py (ULFM directly: ERRORS_RETURN, Shrink), ddl (ddl_core's ProcessFailedError
and shrink_world, on allreduces) or ddl-p2p (the same on a ring of isend/irecv: a dead
peer's point-to-point requests fail with ProcessFailedError too). VICTIM -1: no rank
ends itself (a host is taken down from outside). HOW: kill (SIGKILL) or exit3 (exit status
3 without MPI_Finalize, as a crash would). Each survivor checks an allreduce on the
shrunk world and prints `OK <size> <seconds from the victim's end to that allreduce done>`.
"""

from __future__ import annotations

import os
import signal
import sys
import time

api, victim, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
# the test's temp dir (STAMP_DIR): nothing is left behind
stamp = os.path.join(os.environ.get("STAMP_DIR", "/tmp"),
                     f"ddl-elastic-{os.environ.get('DDL_EXIT_REPORT', 'x').rsplit(':', 1)[-1]}")


def end() -> None:
    with open(stamp, "w") as fh:  # the moment of the end (same host, same clock)
        fh.write(repr(time.time()))
    if how == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    os._exit(3)


def since_end() -> float:
    """Seconds since the victim's end; where no rank wrote it (VICTIM -1: a host is taken
    down from outside), since the time in the file named by END_STAMP, if any."""
    path = stamp if victim >= 0 else os.environ.get("END_STAMP", "")
    try:
        with open(path) as fh:
            return time.time() - float(fh.read())
    except (OSError, ValueError):
        return float("nan")


if api == "mpi4py":
    from mpi4py import MPI

    world = MPI.COMM_WORLD
    world.Set_errhandler(MPI.ERRORS_RETURN)
    me = world.Get_rank()
    try:
        for i in range(10000):
            if i == 10 and me == victim:
                end()
            world.allreduce(1)
            time.sleep(0.01)
        raise SystemExit("no failure seen")
    except MPI.Exception as e:
        assert e.Get_error_class() in (MPI.ERR_PROC_FAILED, MPI.ERR_REVOKED), e
        world.Revoke()
        new = world.Shrink()
        size = new.Get_size()
        ranks = new.allgather(me)
        assert victim not in ranks and new.allreduce(me) == sum(ranks), "wrong sum"
        print(f"OK {size} {since_end():.3f}", flush=True)
        new.Free()
else:
    import numpy as np

    import ddl_core as ddl

    ddl.init()
    assert ddl.fault_tolerant(), "DDL_ELASTIC jobs run with ULFM"
    me, n = ddl.rank(), ddl.size()
    try:
        world = ddl.comm_world()
        for i in range(10000):
            if i == 10 and me == victim:
                end()
            if api == "ddl-p2p":
                got = np.zeros(4)
                reqs = [world.isend(np.full(4, float(me)), (me + 1) % n, tag=i),
                        world.irecv(got, (me - 1) % n, tag=i)]
                for r in reqs:
                    r.wait()
                assert got[0] == (me - 1) % n, got
            else:
                ddl.allreduce(np.ones(4))
            time.sleep(0.01)
        raise SystemExit("no failure seen")
    except ddl.ProcessFailedError as e:
        assert victim in e.ranks, e.ranks
        ddl.shrink_world()
        out = ddl.allreduce(np.full(4, float(me)))
        assert ddl.size() == n - 1 and out[0] == sum(range(n)) - victim, out
        print(f"OK {ddl.size()} {since_end():.3f}", flush=True)

"""An elastic job that grows: mpi4py ranks under `ddlrun --host-discovery-script`.

Rank 0 widens the discovery script's answer (the file it prints) at step GROW_AT; every
step rank 0 reads ddlrun's host updates (ddl_core.hostupdates) and broadcasts what it
saw, so all ranks act on the same generation; when ddlrun announces ranks to spawn, the
world spawns them and merges them in (the new ranks join through join()). Each step's
allreduce is checked against the world's size. Prints `GROW <s>` (the hosts file written
-> the new rank running) on the new rank and `OK grow <size>` on every rank at the end.
"""

from __future__ import annotations

import os
import sys
import time

from ddl_core.hostupdates import HostWatch, join, spawn
from mpi4py import MPI

STEPS = int(os.environ.get("STEPS", "200"))
GROW_AT = int(os.environ.get("GROW_AT", "5"))
HOSTS_FILE = os.environ["HOSTS_FILE"]
WIDER = os.environ["WIDER"]  # the discovery answer from GROW_AT on


def main() -> None:
    watch = HostWatch.from_env()
    assert watch is not None, "no DDL_HOST_UPDATES: run under ddlrun --host-discovery-script"
    merged = join()
    world = merged if merged is not None else MPI.COMM_WORLD.Dup()
    gen = (watch.latest() or {}).get("generation", 0)
    step, wrote = 0, 0.0
    if merged is not None:  # a new rank: where the others are
        step, gen, wrote = world.bcast(None, root=0)
        print(f"GROW {time.time() - wrote:.3f}", flush=True)
    known = set((watch.latest() or {}).get("hosts", {}))
    while step < STEPS:
        total = world.allreduce(1)
        assert total == world.Get_size(), (total, world.Get_size())
        if world.Get_rank() == 0 and step == GROW_AT:
            with open(HOSTS_FILE + ".tmp", "w") as fh:
                fh.write(WIDER + "\n")
            os.replace(HOSTS_FILE + ".tmp", HOSTS_FILE)
            wrote = time.time()
        state = watch.latest() if world.Get_rank() == 0 else None
        state, wrote = world.bcast((state, wrote), root=0)
        step += 1
        if state and state["generation"] != gen:
            gen = state["generation"]
            if state["spawn"]:
                world = spawn(world, state["spawn"], known)
                world.bcast((step, gen, wrote), root=0)
            known |= set(state["hosts"])
        time.sleep(0.02)
    print(f"OK grow {world.Get_size()}", flush=True)
    world.Free()  # before MPI_Finalize (see ddl_core.hostupdates)
    watch.close()


if __name__ == "__main__":
    main()
    sys.stdout.flush()

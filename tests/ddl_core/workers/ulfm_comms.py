"""Worker for test_ulfm.py's communicator cases (plain mpirun -n 4, mpi4py beside ddl_core).

    ulfm_comms.py init_comm | create_group | replace_world

init_comm: each half of the job (mpi4py split) initialises DDL on its half: two DDL
worlds of 2. create_group: the two halves make their communicators at different times,
each called by its members only. replace_world: the world becomes an mpi4py communicator
in reversed order, and the module-level calls follow it. One 'OK <case>' line per rank.
"""

from __future__ import annotations

import sys
import time

import numpy as np
from mpi4py import MPI

import ddl_core as ddl

case = sys.argv[1]
me = MPI.COMM_WORLD.Get_rank()
n = MPI.COMM_WORLD.Get_size()

if case == "init_comm":
    half = MPI.COMM_WORLD.Split(me % 2, me)
    ddl.init(comm=half)
    assert ddl.size() == n // 2 and ddl.rank() == me // 2, (ddl.size(), ddl.rank())
    y = ddl.allreduce(np.array([me], dtype=np.int64))
    assert int(y[0]) == sum(r for r in range(n) if r % 2 == me % 2), y
    h = ddl.allreduce_async(np.ones(5), name="w")
    assert np.all(h.wait() == n // 2)
elif case == "create_group":
    ddl.init()
    world = ddl.comm_world()
    mine = [0, 1] if me < 2 else [2, 3]
    if me < 2:  # the other half makes and uses its group meanwhile, without these ranks
        time.sleep(0.5)
    g = world.create_group(mine)
    assert g.size == 2 and g.rank == mine.index(me) and list(g.members) == mine
    y = g.allreduce(np.array([me], dtype=np.int64))
    assert int(y[0]) == sum(mine), y
    try:
        world.create_group([r for r in range(n) if r not in mine])
        raise SystemExit("a rank outside the list was let in")
    except ddl.InvalidArgumentError as e:
        assert "only the members" in str(e), e
    g.free()
    ddl.barrier()
elif case == "replace_world":
    ddl.init()
    rev = MPI.COMM_WORLD.Split(0, n - me)
    w = ddl.replace_world(rev)
    assert ddl.comm_world() is w and ddl.rank() == n - 1 - me and ddl.size() == n
    assert list(w.members) == list(reversed(range(n))), w.members
    y = ddl.allgather(np.array([me], dtype=np.int64))
    assert list(y) == list(reversed(range(n))), y
    w2 = ddl.replace_world(MPI.COMM_WORLD)
    assert ddl.rank() == me and w._h is None  # the previous replacement was freed
    assert int(ddl.allreduce(np.array([1], dtype=np.int64))[0]) == n
    del w2
print(f"OK {case}", flush=True)

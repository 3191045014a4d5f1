"""A ddl_core training loop under `ddlrun --elastic` that outlives a network fault on one
host (the test cuts that host's MPI connections from outside).

Every step allreduces each rank's launch rank; on ProcessFailedError the survivors shrink
the world and go on. Rank 0 writes TRIGGER at step FAULT_AT (the test then cuts the
connections) and every rank that finishes prints `OK <size> <launch ranks of its world>`.
"""

from __future__ import annotations

import os
import time

import numpy as np

import ddl_core as ddl

STEPS = int(os.environ.get("STEPS", "60"))
FAULT_AT = int(os.environ.get("FAULT_AT", "10"))
TRIGGER = os.environ["TRIGGER"]

ddl.init()
assert ddl.fault_tolerant(), "run under ddlrun --elastic"
me0 = ddl.rank()
step = 0
while step < STEPS:
    if me0 == 0 and step == FAULT_AT:
        with open(TRIGGER, "w") as fh:
            fh.write("now")
    try:
        every = ddl.allgather(np.array([me0], dtype=np.int64))
        total = ddl.allreduce(np.array([float(me0)]))
        assert total[0] == every.sum(), (total, every)
    except ddl.ProcessFailedError as e:
        print(f"RESET {me0} lost {sorted(e.ranks)}", flush=True)
        ddl.shrink_world()
        continue
    step += 1
    time.sleep(0.05)
members = sorted(int(r) for r in ddl.allgather(np.array([me0], dtype=np.int64)))
print(f"OK {ddl.size()} {','.join(map(str, members))}", flush=True)

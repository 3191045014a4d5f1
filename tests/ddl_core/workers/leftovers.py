"""A job that ends as the test says, after printing where Open MPI's shared memory is.

    leftovers.py ok|exit|hang|kill|wait FLAG

Every rank prints `SEG <path>` for each btl/sm segment it has mapped (its own and its
node peers', from /proc/self/maps) and `DIR <rank> <btl_sm_backing_directory>`, then
`READY <rank>`. Then: ok ends; exit: rank 1 exits 3; hang: rank 0 sleeps past
DDL_TIMEOUT; kill: rank 1 (or LEFTOVERS_VICTIM) SIGKILLs itself; wait: every rank
waits for FLAG to exist, then one more allreduce, checked."""

from __future__ import annotations

import os
import signal
import sys
import time

import numpy as np

import ddl_core as ddl

ddl.init()
x = np.ones(1 << 16, dtype=np.float32)
out = ddl.allreduce(x)
assert np.all(out == ddl.size())
with open("/proc/self/maps") as f:
    segs = sorted({ln.split()[-1] for ln in f if "sm_segment." in ln})
for s in segs:
    print("SEG", s)
print("DIR", ddl.rank(), os.environ.get("OMPI_MCA_btl_sm_backing_directory", ""))
print("READY", ddl.rank(), flush=True)
mode, rank = sys.argv[1], ddl.rank()
if mode == "exit" and rank == 1:
    sys.exit(3)
elif mode == "hang" and rank == 0:
    time.sleep(120)
elif mode == "kill" and rank == int(os.environ.get("LEFTOVERS_VICTIM", "1")):
    os.kill(os.getpid(), signal.SIGKILL)
elif mode == "wait":
    while not os.path.exists(sys.argv[2]):
        time.sleep(0.05)
if mode != "ok":
    out = ddl.allreduce(x)
    assert np.all(out == ddl.size())
    if mode == "exit":
        time.sleep(60)  # rank 1 is gone: the launcher ends this one
print("DONE", rank, flush=True)

"""Clean ends that the liveness check must not report, and its configuration.

Usage: liveness.py MODE
  staggered  the last collectives (a large pipelined allreduce, an asynchronous one) end at
             different times on different ranks; rank 0 finalizes at once, the others leave
             later, one after the other: nobody may see an error, every rank exits 0.
  badenv     DDL_LIVENESS=maybe: init() raises InvalidArgumentError naming the variable.
"""

from __future__ import annotations

import sys
import time

import numpy as np

import ddl_core as ddl

mode = sys.argv[1]

if mode == "staggered":
    ddl.init()
    r, n = ddl.rank(), ddl.size()
    for _ in range(3):
        y = ddl.allreduce(np.full(1 << 21, 1.0, np.float32))  # pipelined on a 2x2 grid
        assert (y == n).all()
        h = ddl.allreduce_async(np.full(1000, float(r), np.float32))
        assert (h.wait() == sum(range(n))).all()
    if r == 0:
        ddl.finalize()  # leaves while the others may still be in the last collective
    print(f"OK staggered {r}", flush=True)
    time.sleep(0.15 * r)
elif mode == "badenv":
    try:
        ddl.init()
    except ddl.InvalidArgumentError as e:
        assert "DDL_LIVENESS=maybe" in str(e), e
        print("OK badenv", flush=True)
    else:
        raise AssertionError("DDL_LIVENESS=maybe was accepted")
else:
    raise SystemExit(f"unknown mode {mode}")

"""Point-to-point between some ranks of the world while the others do something else:
no rank may have to take part in another pair's messages (libddl once made the world's
point-to-point communicator on first use, a hidden collective the idle rank never
joined, so the pair hung). Ranks 0 and 1 exchange messages; the rest only wait."""

from __future__ import annotations

import sys
import time

import numpy as np

import ddl_core as ddl

ddl.init()
r, n = ddl.rank(), ddl.size()
x = np.arange(5, dtype=np.float64) + r
if r in (0, 1):
    peer = 1 - r
    got = np.empty(5)
    if r == 0:
        ddl.send(x, peer, tag=3)
        ddl.recv(got, peer, tag=4)
    else:
        ddl.recv(got, peer, tag=3)
        ddl.send(x, peer, tag=4)
    ok = np.array_equal(got, np.arange(5) + peer)
    h = ddl.irecv(got, peer, tag=5)
    ddl.isend(x * 2, peer, tag=5).wait()
    ok = ok and np.array_equal(h.wait(), (np.arange(5) + peer) * 2)
    if not ok:
        print(f"rank {r}: wrong data {got}", file=sys.stderr)
        sys.exit(1)
else:
    time.sleep(1.0)  # busy elsewhere: never touches point-to-point
total = ddl.allreduce(np.ones(1))
assert total[0] == n, total
print("OK p2p-pairs", flush=True)
ddl.finalize()

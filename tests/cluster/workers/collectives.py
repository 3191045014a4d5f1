"""Rank worker for the cluster tests: where am I, what grid did DDL build, and is every
collective right (checked against numpy on every rank)."""

import json
import socket

import numpy as np

import ddl_core as ddl

ddl.init()
r, n = ddl.rank(), ddl.size()
print("PLACE " + json.dumps({"rank": r, "host": socket.gethostname(), "local_rank":
                             ddl.local_rank(), "local_size": ddl.local_size(),
                             "topology": list(ddl.topology())}), flush=True)
# Sizes on both sides of the fused small path and large enough for the hierarchical path.
for count in (1, 7, 1000, 3 * n + 1, 1 << 18):
    for dtype in (np.float32, np.int64):
        x = ((np.arange(count) % 11) + r + 1).astype(dtype)
        expect = sum(((np.arange(count) % 11) + q + 1) for q in range(n)).astype(dtype)
        assert np.array_equal(ddl.allreduce(x), expect), ("allreduce", count, dtype)
        assert np.array_equal(ddl.allreduce(x, op="max"),
                              ((np.arange(count) % 11) + n).astype(dtype)), ("max", count)
        h = ddl.allreduce_async(x)
        assert np.array_equal(h.wait(), expect), ("allreduce_async", count)
        b = x.copy() if r == 1 % n else np.zeros_like(x)
        ddl.broadcast(b, root=1 % n)
        assert np.array_equal(b, ((np.arange(count) % 11) + (1 % n) + 1).astype(dtype))
        g = ddl.allgather(x)
        assert np.array_equal(g, np.concatenate(
            [((np.arange(count) % 11) + q + 1).astype(dtype) for q in range(n)]))
        full = np.tile(x, n)
        rs = ddl.reduce_scatter(full)
        assert np.array_equal(rs, expect), ("reduce_scatter", count)
ddl.barrier()
print("OK collectives", flush=True)

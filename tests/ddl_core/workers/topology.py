"""Allreduce under a given DDL_TOPOLOGY / DDL_ALGO, counts that do not divide."""

from __future__ import annotations

import os
import sys

from common import DTYPES, data, reference, same

import ddl_core as ddl

ddl.init()
r, n = ddl.rank(), ddl.size()
want = os.environ.get("EXPECT_TOPOLOGY")
if want and "x".join(map(str, ddl.topology())) != want:
    print(f"rank {r}: topology {ddl.topology()} != {want}", flush=True)
    sys.exit(1)
bad = []
for count in (0, 1, 3, 5, 7, 31, 1001, 16411, 70001, 262147):
    for dname in ("float32", "int32", "float16", "int8"):
        dt = DTYPES[dname]
        for op in ("sum", "avg", "max"):
            ref = reference([data(q, count, dt, op) for q in range(n)], dt, op)
            if not same(ddl.allreduce(data(r, count, dt, op), op=op), ref):
                bad.append(f"{dname} {op} {count} plan={ddl.plan(count * dt.itemsize)}")
            if os.environ.get("IN_PLACE"):
                x = data(r, count, dt, op)
                ddl.allreduce(x, op=op, out=x)
                if not same(x, ref):
                    bad.append(f"in place {dname} {op} {count}")
if bad:
    print(f"rank {r}: {bad[:4]}", flush=True)
    sys.exit(1)
print("OK topology", flush=True)

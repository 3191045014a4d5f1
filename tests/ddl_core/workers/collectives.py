"""Every collective x dtype x op x count, in place and out of place, against numpy."""

from __future__ import annotations

import sys

import numpy as np
from common import BITWISE, COUNTS, DTYPES, OPS, data, reference, same

import ddl_core as ddl

ddl.init()
r, n = ddl.rank(), ddl.size()
failures: list[str] = []


def expect(ok: bool, what: str) -> None:
    if not ok:
        failures.append(what)


for dname, dt in DTYPES.items():
    for op in OPS:
        for count in COUNTS:
            mine = data(r, count, dt, op)
            ref = reference([data(q, count, dt, op) for q in range(n)], dt, op)
            out = ddl.allreduce(mine, op=op)
            expect(same(out, ref), f"allreduce {dname} {op} {count}")
            expect(same(mine, data(r, count, dt, op)), f"allreduce input changed {dname}")
            inplace = mine.copy()
            ddl.allreduce(inplace, op=op, out=inplace)
            expect(same(inplace, ref), f"allreduce in-place {dname} {op} {count}")
            # reduce_scatter over n equal blocks of `count` elements each
            full = [np.concatenate([data(q, count, dt, op, salt=b) for b in range(n)])
                    for q in range(n)]
            rs = ddl.reduce_scatter(full[r], op=op)
            rs_ref = reference([f[r * count:(r + 1) * count] for f in full], dt, op)
            expect(same(rs, rs_ref), f"reduce_scatter {dname} {op} {count}")
        for count in COUNTS:
            mine = data(r, count, dt, "sum")
            g = ddl.allgather(mine)
            expect(same(g, np.concatenate([data(q, count, dt, "sum") for q in range(n)])),
                   f"allgather {dname} {count}")
            for root in sorted({0, n - 1}):
                b = data(r, count, dt, "max")
                ddl.broadcast(b, root=root)
                expect(same(b, data(root, count, dt, "max")), f"broadcast {dname} {count} {root}")
ddl.barrier()

# Bitwise ops on the integer dtypes, blocking and asynchronous (fused); refused for floats
# before anything moves, on every rank.
for dname, dt in DTYPES.items():
    for op in BITWISE:
        if dt.kind not in "iu":
            try:
                ddl.allreduce(np.ones(4, dt), op=op)
            except ddl.InvalidArgumentError as e:
                expect(f"{op} is defined for integer dtypes" in str(e) and dname in str(e),
                       f"{op} on {dname}: {e}")
            else:
                expect(False, f"{op} on {dname} was accepted")
            continue
        for count in COUNTS:
            mine = data(r, count, dt, op)
            ref = reference([data(q, count, dt, op) for q in range(n)], dt, op)
            expect(same(ddl.allreduce(mine, op=op), ref), f"allreduce {dname} {op} {count}")
            full = [np.concatenate([data(q, count, dt, op, salt=b) for b in range(n)])
                    for q in range(n)]
            rs = ddl.reduce_scatter(full[r], op=op)
            rs_ref = reference([f[r * count:(r + 1) * count] for f in full], dt, op)
            expect(same(rs, rs_ref), f"reduce_scatter {dname} {op} {count}")
        hs = [ddl.allreduce_async(data(r, c, dt, op), op=op) for c in COUNTS[1:6]]
        for c, h in zip(COUNTS[1:6], hs, strict=True):
            ref = reference([data(q, c, dt, op) for q in range(n)], dt, op)
            expect(same(h.wait(), ref), f"allreduce_async {dname} {op} {c}")
ddl.barrier()

# Shapes survive; 2-D inputs gather along the first axis.
m = np.full((3, 4), r, np.float32)
expect(ddl.allgather(m).shape == (3 * n, 4), "allgather keeps trailing shape")
expect(ddl.allreduce(m).shape == (3, 4), "allreduce keeps shape")

# Random floats: results are the same bits on every rank.
x = np.random.default_rng(r).standard_normal(100003).astype(np.float32)
y = ddl.allreduce(x)
allbits = ddl.allgather(y.view(np.uint8))
expect(all(same(allbits[q * y.nbytes:(q + 1) * y.nbytes], y.view(np.uint8)) for q in range(n)),
       "float allreduce identical on every rank")
ref = np.sum([np.random.default_rng(q).standard_normal(100003).astype(np.float32)
              for q in range(n)], axis=0)
expect(np.allclose(y, ref, rtol=1e-5, atol=1e-5), "float allreduce close to numpy")

if failures:
    print(f"rank {r}: {len(failures)} failures, first: {failures[:5]}", flush=True)
    sys.exit(1)
print("OK collectives", flush=True)

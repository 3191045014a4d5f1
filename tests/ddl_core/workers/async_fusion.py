"""Many asynchronous allreduces of mixed sizes, fused, against the blocking results."""

from __future__ import annotations

import os
import sys

import numpy as np
from common import DTYPES, data, reference, same

import ddl_core as ddl

ddl.init()
r, n = ddl.rank(), ddl.size()
bad: list[str] = []
rng = np.random.default_rng(42)  # same sequence of shapes on every rank
specs = [(int(rng.integers(0, 40000)) if i % 7 else int(rng.integers(0, 4)),
          ["float32", "float64", "int32", "float16"][int(rng.integers(0, 4))],
          ["sum", "avg", "max"][int(rng.integers(0, 3))]) for i in range(300)]
inputs = [data(r, c, DTYPES[d], op, salt=i) for i, (c, d, op) in enumerate(specs)]
handles = [ddl.allreduce_async(x, op=op) for x, (_, _, op) in zip(inputs, specs, strict=False)]
outs = [h.wait() for h in handles]
for i, ((c, d, op), out) in enumerate(zip(specs, outs, strict=False)):
    ref = reference([data(q, c, DTYPES[d], op, salt=i) for q in range(n)], DTYPES[d], op)
    if not same(out, ref):
        bad.append(f"async #{i} {d} {op} {c}")
    if not same(out, ddl.allreduce(inputs[i], op=op)):
        bad.append(f"async #{i} differs from blocking")
stats = ddl.async_stats()
fusion_on = float(os.environ.get("DDL_FUSION_THRESHOLD", "1")) > 0
if n > 1 and fusion_on and stats["fused_requests"] == 0:
    bad.append(f"nothing was fused: {stats}")
if not fusion_on and stats["fused_buffers"] != 0:
    bad.append(f"fused with a zero threshold: {stats}")

# Random floats on two ranks: one addition per element, so fused == unfused bit for bit.
if n == 2:
    xs = [np.random.default_rng(100 * r + i).standard_normal(1 + 37 * i).astype(np.float32)
          for i in range(64)]
    fused = [h.wait() for h in [ddl.allreduce_async(x) for x in xs]]
    if not all(same(f, ddl.allreduce(x)) for f, x in zip(fused, xs, strict=False)):
        bad.append("fused float results differ from unfused")

# The other asynchronous collectives, in place and out of place.
b = data(r, 1001, DTYPES["int32"], "max")
ddl.broadcast_async(b, root=n - 1).wait()
if not same(b, data(n - 1, 1001, DTYPES["int32"], "max")):
    bad.append("broadcast_async")
g = ddl.allgather_async(data(r, 77, DTYPES["float32"], "sum")).wait()
if not same(g, np.concatenate([data(q, 77, DTYPES["float32"], "sum") for q in range(n)])):
    bad.append("allgather_async")
full = data(r, 50 * n, DTYPES["float64"], "sum")
rs = ddl.reduce_scatter_async(full).wait()
ref = reference([data(q, 50 * n, DTYPES["float64"], "sum") for q in range(n)],
                DTYPES["float64"], "sum")[50 * r:50 * (r + 1)]
if not same(rs, ref):
    bad.append("reduce_scatter_async")

# One handle waited for by several threads at once: each gets the result, or each the
# request's error (a shape mismatch), and the request is freed once, after the last.
import threading  # noqa: E402

for mismatch in (False, True) if n > 1 else (False,):
    x = data(r, 3000 + (r if mismatch else 0), DTYPES["float32"], "sum")
    h = ddl.allreduce_async(x, name=f"shared-{mismatch}", shape=x.shape)
    seen: list[object] = []

    def waiter(h: ddl.Handle = h, seen: list[object] = seen) -> None:
        try:
            seen.append(h.wait())
        except ddl.MismatchError as exc:
            seen.append(exc)

    ts = [threading.Thread(target=waiter) for _ in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if mismatch and not (len(seen) == 4 and all(isinstance(s, ddl.MismatchError)
                                                 for s in seen)):
        bad.append(f"shared handle, mismatch: {seen}")
    want = reference([data(q, 3000, DTYPES["float32"], "sum") for q in range(n)],
                     DTYPES["float32"], "sum")
    if not mismatch and not (len(seen) == 4 and all(same(s, want) for s in seen)):
        bad.append("shared handle: a waiter's result differs")

# A thread that waits runs the negotiation itself when no other thread is at it (libddl's
# ddl_wait), rather than handing it to the progress thread and sleeping. With fusion off
# the progress thread is woken at each submission and may win every race for it.
# Each request is a race, so up to 200 are tried; every rank stops at the same request,
# once each has seen a waiter run a cycle (all ranks must make the same calls).
before = ddl.async_stats()["waiter_cycles"]
for i in range(200):
    if i >= 20 and ddl.allreduce(np.array([ddl.async_stats()["waiter_cycles"] > before],
                                          np.int32), op="min")[0]:
        break
    y = data(r, 8 + i, DTYPES["float32"], "sum", salt=i)
    got = ddl.allreduce_async(y, name="one-at-a-time", shape=y.shape).wait()
    if not same(got, reference([data(q, 8 + i, DTYPES["float32"], "sum", salt=i)
                                for q in range(n)], DTYPES["float32"], "sum")):
        bad.append(f"waited request #{i}")
if fusion_on and ddl.async_stats()["waiter_cycles"] == before:
    bad.append(f"no waiting thread ran a cycle itself: {ddl.async_stats()}")

# In place, and a handle polled until done.
x = data(r, 5000, DTYPES["float32"], "sum")
h = ddl.allreduce_async(x, out=x)
while not h.test():
    pass
if not same(x, reference([data(q, 5000, DTYPES["float32"], "sum") for q in range(n)],
                         DTYPES["float32"], "sum")):
    bad.append("in-place async")

if bad:
    print(f"rank {r}: {len(bad)} problems: {bad[:5]}", flush=True)
    sys.exit(1)
print("OK async", flush=True)

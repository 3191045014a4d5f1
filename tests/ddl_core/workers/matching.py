"""Asynchronous requests matched by name (any order) or by order (unnamed), and every
mismatch raising on every rank with nothing left queued.

Usage: matching.py MODE   (order | mismatch | duplicate | stall)
"""

from __future__ import annotations

import re
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from common import DTYPES, data, reference, same

import ddl_core as ddl

mode = sys.argv[1]
ddl.init()
r, n = ddl.rank(), ddl.size()
bad: list[str] = []


def queue_is_empty(where: str) -> None:
    """Nothing submitted is left behind on this rank (the stray-request bug)."""
    left = ddl.async_stats()["pending"]
    if left:
        bad.append(f"{where}: {left} request(s) left queued")


def next_collectives_work(where: str) -> None:
    """After whatever happened, blocking and asynchronous collectives still work."""
    x = np.full(5, 2.0, np.float32)
    if not (ddl.allreduce(x) == 2.0 * n).all():
        bad.append(f"{where}: the next blocking allreduce is wrong")
    h = ddl.allreduce_async(np.full(7, 3, np.int32), name=f"after {where}")
    if not (h.wait() == 3 * n).all():
        bad.append(f"{where}: the next named async allreduce is wrong")
    if not (ddl.allreduce_async(np.full(3, 1.0, np.float64)).wait() == n).all():
        bad.append(f"{where}: the next unnamed async allreduce is wrong")
    queue_is_empty(where)


if mode == "order":
    # Named requests of every kind, submitted in a different random order on every rank
    # (and every iteration), against numpy; unnamed ones interleaved at random positions
    # but in the same order on every rank. The names are reused every iteration, as
    # gradients' are, so after the first only the fast negotiation runs.
    specs = []
    spec_rng = np.random.default_rng(7)  # the same specs on every rank
    for i in range(60):
        count = int(spec_rng.choice([1, 5, 300, 1024, 20000]))
        dtype = ["float32", "float64", "int32", "float16"][int(spec_rng.integers(0, 4))]
        op = ["sum", "avg", "max"][int(spec_rng.integers(0, 3))]
        specs.append((f"t{i}", count, dtype, op))
    unnamed = [(u, 50 + 13 * u, "int64", "sum") for u in range(8)]
    full_after_first = None
    for it in range(4):
        order = np.random.default_rng(100 * r + it).permutation(len(specs))
        # the unnamed ones go in at random places, in their own order
        slots = sorted(np.random.default_rng(100 * r + it + 50).choice(
            len(specs) + len(unnamed), size=len(unnamed), replace=False))
        plan: list[tuple[str, Any]] = []
        k = u = 0
        for pos in range(len(specs) + len(unnamed)):
            if u < len(unnamed) and pos == slots[u]:
                plan.append(("u", unnamed[u]))
                u += 1
            else:
                plan.append(("n", specs[order[k]]))
                k += 1
        handles: list[tuple[Any, Any, tuple[Any, ...]]] = []
        for what, spec in plan:
            if what == "n":
                name, count, dtype, op = spec
                x = data(r, count, DTYPES[dtype], op, salt=it)
                shape = (count,) if count % 2 else (2, count // 2)
                h = ddl.allreduce_async(x.reshape(shape), op=op, name=name, shape=shape)
            else:
                idx, count, dtype, op = spec
                x = data(r, count, DTYPES[dtype], op, salt=1000 + it)
                h = ddl.allreduce_async(x, op=op)
            handles.append((h, spec, (what, it)))
        for h, spec, (what, it_) in handles:
            name, count, dtype, op = spec
            salt = it_ if what == "n" else 1000 + it_
            ref = reference([data(q, count, DTYPES[dtype], op, salt=salt) for q in range(n)],
                            DTYPES[dtype], op)
            if not same(h.wait().reshape(-1), ref):
                bad.append(f"iteration {it}: {what} {name} {dtype} {op} {count} is wrong")
        ddl.barrier()  # read between two barriers: no rank has begun the next round
        stats = ddl.async_stats()
        ddl.barrier()
        if it == 0:
            full_after_first = stats["full_cycles"]
        elif stats["full_cycles"] != full_after_first:
            bad.append(f"iteration {it}: names already negotiated took the full exchange "
                       f"again ({stats})")
    if n > 1 and ddl.async_stats()["fused_requests"] == 0:
        bad.append(f"named requests were never fused: {ddl.async_stats()}")

    # The other collectives, named and submitted in opposite orders.
    b = np.full(6, float(r), np.float32)
    g_in = np.full((2, 3), r, np.int32)
    v_in = np.arange(3 * (r + 1), dtype=np.int64).reshape(r + 1, 3) + 100 * r
    rs_in = data(r, 4 * n, DTYPES["float64"], "sum", salt=5)
    jobs: list[tuple[str, Callable[[], Any]]] = [
        ("bcast", lambda: ddl.broadcast_async(b, root=n - 1, name="bcast", shape=(6,))),
        ("gather", lambda: ddl.allgather_async(g_in, name="gather", shape=(2, 3))),
        ("gatherv", lambda: ddl.allgatherv_async(v_in, name="gatherv", shape=v_in.shape)),
        ("rs", lambda: ddl.reduce_scatter_async(rs_in, name="rs", shape=rs_in.shape)),
    ]
    if r % 2:
        jobs.reverse()
    hs = {name: fn() for name, fn in jobs}
    if not (hs["bcast"].wait() == n - 1).all():
        bad.append("named broadcast_async")
    if not same(hs["gather"].wait(), np.concatenate([np.full((2, 3), q, np.int32)
                                                    for q in range(n)])):
        bad.append("named allgather_async")
    want = np.concatenate([np.arange(3 * (q + 1), dtype=np.int64).reshape(q + 1, 3) + 100 * q
                           for q in range(n)])
    if not same(hs["gatherv"].wait(), want):
        bad.append("named allgatherv_async")
    # Rows of no elements (Horovod's allgather of a (k, 0) tensor): the result still has
    # every rank's rows, in numpy and torch, of the input's dtype.
    for zero in (np.zeros((r + 1, 0), np.float32), np.zeros((2, 0, 3), np.int64)):
        got = ddl.allgatherv_async(zero, name=f"empty-rows-{zero.ndim}", shape=zero.shape).wait()
        rows = sum(q + 1 for q in range(n)) if zero.ndim == 2 else 2 * n
        if got.shape != (rows, *zero.shape[1:]) or got.dtype != zero.dtype:
            bad.append(f"allgatherv_async of empty rows {zero.shape}: {got.shape} {got.dtype}")
    ref = reference([data(q, 4 * n, DTYPES["float64"], "sum", salt=5) for q in range(n)],
                    DTYPES["float64"], "sum")[4 * r:4 * (r + 1)]
    if not same(hs["rs"].wait(), ref):
        bad.append("named reduce_scatter_async")
    next_collectives_work("order")

elif mode == "mismatch":
    # Each case: a batch of small allreduces (fused) with one request that differs between
    # ranks somewhere in it, named or unnamed; the bad one raises MismatchError on every
    # rank with a message saying what differs, the others are right, nothing is left
    # queued, and the next collectives work.
    f32, f64 = np.float32, np.float64
    other = r == n - 1  # the rank that differs

    def ar(count: int = 8, dtype: Any = f32, op: str = "sum", shape: Any = None,
           name: str | None = None) -> Any:
        return ddl.allreduce_async(np.ones(count, dtype), op=op, shape=shape, name=name)

    cases: list[tuple[str, str, Callable[[str | None], Any]]] = [
        ("count", "counts", lambda nm: ar(8 + other, name=nm)),
        ("dtype", "data types", lambda nm: ar(dtype=f64 if other else f32, name=nm)),
        ("dtype of a large one", "data types",
         lambda nm: ar(40000, dtype=f64 if other else f32, name=nm)),
        ("op", "reduction ops", lambda nm: ar(op="max" if other else "sum", name=nm)),
        ("shape", "tensor shapes",
         lambda nm: ar(6, shape=(3, 2) if other else (2, 3), name=nm)),
        ("kind", "operations",
         lambda nm: ddl.broadcast_async(np.ones(8, f32), root=0, name=nm) if other
         else ar(name=nm)),
        ("root", "root ranks",
         lambda nm: ddl.broadcast_async(np.ones(8, f32), root=1 if other else 0, name=nm)),
        ("allgather dims", "tensor shapes",
         lambda nm: ddl.allgatherv_async(np.ones((2, 4 if other else 3), f32), name=nm,
                                         shape=(2, 4 if other else 3))),
    ]
    for case, topic, make in cases:
        for named in (True, False):
            where = f"{case} ({'named' if named else 'unnamed'})"
            good = [ddl.allreduce_async(np.full(16, float(i), f32),
                                        name=f"good{i}" if named else None) for i in range(3)]
            odd = make("odd" if named else None)
            more = [ddl.allreduce_async(np.full(16, float(i), f32),
                                        name=f"more{i}" if named else None) for i in range(3)]
            for i, h in enumerate(good + more):
                if not (h.wait() == float(i % 3) * n).all():
                    bad.append(f"{where}: a good request beside the bad one is wrong")
            try:
                odd.wait()
                bad.append(f"{where}: no MismatchError")
            except ddl.MismatchError as e:
                msg = str(e)
                if f"rank {r}" not in msg or topic not in msg:
                    bad.append(f"{where}: unclear message: {msg}")
                if named and "'odd'" not in msg:
                    bad.append(f"{where}: the message does not name the request: {msg}")
            next_collectives_work(where)
    # A blocking mismatch between asynchronous requests, and the reverse.
    hs = [ddl.allreduce_async(np.ones(4, f32), name="around") for _ in range(1)]
    try:
        ddl.allreduce(np.ones(10 + other, f32))
        bad.append("blocking mismatch: no MismatchError")
    except ddl.MismatchError:
        pass
    if not (hs[0].wait() == n).all():
        bad.append("blocking mismatch: the async request beside it is wrong")
    next_collectives_work("blocking mismatch")

elif mode == "duplicate":
    x = np.ones(4, np.float32)
    h = ddl.allreduce_async(x, name="dup")
    try:
        ddl.allreduce_async(np.ones(4, np.float32), name="dup")
        bad.append("no error for a duplicate name")
    except ddl.InvalidArgumentError as e:
        if "'dup'" not in str(e) or "in flight" not in str(e):
            bad.append(f"unclear duplicate message: {e}")
        if not isinstance(e, ValueError):
            bad.append("a duplicate name is not a ValueError")
    if not (h.wait() == n).all():
        bad.append("the first request of a duplicated name is wrong")
    # once complete, the name is free again
    if not (ddl.allreduce_async(x, name="dup").wait() == n).all():
        bad.append("a name could not be reused after completion")
    next_collectives_work("duplicate")

elif mode == "stall":
    # Different sets of names: what every rank submitted runs; what some rank never
    # submits fails after DDL_TIMEOUT on the ranks that did, naming those that did not.
    timeout = float(__import__("os").environ["DDL_TIMEOUT"])
    t0 = time.monotonic()
    common_h = ddl.allreduce_async(np.ones(4, np.float32), name="common")
    mine = ddl.allreduce_async(np.ones(4, np.float32), name=f"only on rank {r}")
    if not (common_h.wait() == n).all():
        bad.append("the common request is wrong")
    try:
        mine.wait()
        bad.append("no error for a name the other ranks never submitted")
    except ddl.DDLTimeoutError as e:
        took = time.monotonic() - t0
        others = ", ".join(str(q) for q in range(n) if q != r)
        if f"'only on rank {r}'" not in str(e) or "DDL_TIMEOUT" not in str(e):
            bad.append(f"unclear stall message: {e}")
        if n == 2 and f"rank {others}" not in str(e):
            bad.append(f"the stall message does not name rank {others}: {e}")
        if not timeout <= took <= timeout + 4:
            bad.append(f"the stall was reported after {took:.1f} s (DDL_TIMEOUT {timeout})")
    # a rank that goes on without the request: the others still hear of it in time
    t0 = time.monotonic()
    if r == 0:
        try:
            ddl.allreduce_async(np.ones(2, np.float32), name="rank 0 alone").wait()
            bad.append("no error for a name only rank 0 submitted")
        except ddl.DDLTimeoutError as e:
            if not re.search(r"by ranks? 1\b", str(e)):
                bad.append(f"the stall message does not name rank 1: {e}")
    else:
        time.sleep(timeout + 1.5)  # busy with anything but DDL
    next_collectives_work("stall")
else:
    raise SystemExit(f"unknown mode {mode}")

if bad:
    print(f"rank {r}: {len(bad)} problems: {bad[:6]}", flush=True)
    sys.exit(1)
print(f"OK {mode}", flush=True)

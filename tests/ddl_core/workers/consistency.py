"""Property test: every rank gets the same bits, whatever the inputs, algorithm and size.

Usage: consistency.py CASES [SEED]

Random cases, the same sequence on every rank (a shared seed): a dtype, an op, a count
(0, 1, primes, the 64 KiB small-message limit, DDL_SEGMENT and DDL_PIECE boundaries, a few
large), a forced algorithm (ddl.set_algorithm: auto, ring, rabenseifner, recdoubling,
mpi), a fusion threshold (ddl.set_fusion) and a way to call (blocking in or out of place,
one asynchronous call, a batch of asynchronous calls that fuse). Each rank's input mixes
ordinary values with NaN of random payload and sign (quiet and signalling), +-inf, -0.0,
+0.0, subnormals and values that overflow when added. Every rank regenerates every other
rank's input from the seed, so the checks need no communication of their own:
  - divergent: the result's bytes differ between ranks (gathered with mpi4py, not DDL);
  - wrong: min/max (any dtype) and integer ops differ from the numpy reference under
    DDL's rule (any NaN gives NaN; max(-0, +0) = +0, min(-0, +0) = -0), or a float
    sum/prod/avg is not NaN where an input was NaN;
  - noncanonical: a NaN in a result is not the canonical quiet NaN.
Rank 0 prints "CONSISTENCY cases=N divergent=D wrong=W noncanonical=C"; every rank prints
"OK consistency" when all three are 0.
"""

from __future__ import annotations

import os
import sys
import warnings

import ml_dtypes
import numpy as np
from common import DTYPES, reference
from mpi4py import MPI

import ddl_core as ddl

CANON = {2: 0x7E00, "bfloat16": 0x7FC0, 4: 0x7FC00000, 8: 0x7FF8000000000000}
UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
ALGOS = ("auto", "ring", "rabenseifner", "recdoubling", "mpi")
FUSION = (0, 64 * 1024, 64 << 20)
MODES = ("blocking", "in_place", "async", "fused", "reduce_scatter")


def canon_bits(dt: np.dtype) -> int:
    return CANON["bfloat16"] if dt == DTYPES["bfloat16"] else CANON[dt.itemsize]


def float_layout(dt: np.dtype) -> tuple[int, int]:
    """(exponent mask, mantissa mask) of a float dtype's bits."""
    if dt == DTYPES["bfloat16"]:
        return 0x7F80, 0x007F
    return {2: (0x7C00, 0x03FF), 4: (0x7F800000, 0x007FFFFF),
            8: (0x7FF0000000000000, 0x000FFFFFFFFFFFFF)}[dt.itemsize]


def gen(rng: np.random.Generator, n: int, dt: np.dtype, special: float) -> np.ndarray:
    """n values of dtype dt; a fraction `special` of them NaN/inf/zeros/subnormals/huge."""
    if dt.kind in "iu":
        info = np.iinfo(dt)
        if rng.random() < 0.5:  # small values too, so products are not all 0 or wrapped
            return rng.integers(-3 if dt.kind == "i" else 0, 4, size=n).astype(dt)
        return rng.integers(info.min, info.max, size=n, endpoint=True, dtype=np.int64
                            if dt.itemsize < 8 else dt).astype(dt)
    scale = 10.0 ** rng.integers(-2, 3)
    x = (rng.standard_normal(n) * scale).astype(np.float32).astype(dt)
    ut = UINT[dt.itemsize]
    bits = x.view(ut).copy()
    expo, mant = float_layout(dt)
    sign = ut(expo | mant) + ut(1)  # the sign bit
    kind = rng.integers(0, 8, size=n)
    pick = rng.random(n) < special
    raw = rng.integers(0, int(mant) + 1, size=n, dtype=np.uint64).astype(ut)
    signs = np.where(rng.random(n) < 0.5, sign, ut(0)).astype(ut)
    nan = (ut(expo) | np.maximum(raw & ut(mant), ut(1))) | signs  # any payload, q or s
    inf = ut(expo) | signs
    zero = signs
    sub = (np.maximum(raw & ut(mant), ut(1))) | signs
    huge = (ut(expo) - ut(1)) | signs  # the largest finite magnitude
    choice = [nan, nan, inf, zero, zero, sub, huge, bits]
    special_bits = np.choose(kind, choice)
    bits = np.where(pick, special_bits, bits).astype(ut)
    return bits.view(dt)


def as32(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float64)


def minmax_reference(inputs: list[np.ndarray], dt: np.dtype, op: str) -> np.ndarray:
    stack = np.stack([as32(a) for a in inputs])
    m = stack.max(axis=0) if op == "max" else stack.min(axis=0)  # numpy: NaN propagates
    zeros = stack == 0
    neg = np.signbit(stack) & zeros
    pos = ~np.signbit(stack) & zeros
    if op == "max":
        m = np.where(m == 0, np.where(pos.any(axis=0), 0.0, -0.0), m)
    else:
        m = np.where(m == 0, np.where(neg.any(axis=0), -0.0, 0.0), m)
    out = m.astype(dt)
    bits = out.view(UINT[dt.itemsize]).copy()
    bits[np.isnan(m)] = canon_bits(dt)
    return bits.view(dt)


def check_one(out: np.ndarray, inputs: list[np.ndarray], dt: np.dtype, op: str,
              block: tuple[int, int] | None) -> tuple[bool, int]:
    """(right, non-canonical NaNs) for one result; `block` cuts the reference for
    reduce_scatter."""
    lo, hi = block or (0, len(inputs[0]))
    ins = [a[lo:hi] for a in inputs]
    bits = out.view(UINT[dt.itemsize])
    if dt.kind in "iu":
        if op == "avg":  # the wrapped sum divided exactly, truncated toward zero
            s = np.sum(np.stack(ins), axis=0, dtype=dt).astype(np.int64)
            q = s // len(ins) + ((s % len(ins) != 0) & (s < 0))
            return bool(np.array_equal(out, q.astype(dt))), 0
        return bool(np.array_equal(out, reference(ins, dt, op))), 0
    nan_out = np.isnan(out.astype(np.float64))
    noncanon = int(np.count_nonzero(bits[nan_out] != canon_bits(dt)))
    if op in ("min", "max"):
        ref = minmax_reference(ins, dt, op)
        return bool(np.array_equal(bits, ref.view(UINT[dt.itemsize]))), noncanon
    any_nan = np.zeros(hi - lo, bool)
    for a in ins:
        any_nan |= np.isnan(a.astype(np.float64))
    return bool(np.all(nan_out[any_nan])), noncanon


def main() -> int:
    warnings.simplefilter("ignore", RuntimeWarning)  # casts of NaN and overflow: expected
    cases = int(sys.argv[1])
    seed = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    ddl.init()
    comm = MPI.COMM_WORLD
    r, n = ddl.rank(), ddl.size()
    segment = int(os.environ.get("DDL_SEGMENT", 2 << 20))
    piece = int(os.environ.get("DDL_PIECE", 128 << 10))
    rng = np.random.default_rng(seed)  # the same cases on every rank
    names = list(DTYPES)
    divergent = wrong = noncanon = done = 0
    first_bad: list[str] = []
    for case in range(cases):
        dname = names[int(rng.integers(len(names)))]
        dt = DTYPES[dname]
        op = ("sum", "avg", "min", "max", "prod")[int(rng.integers(5))]
        es = dt.itemsize
        edges = [65536 // es, segment // es, piece // es, 2 * piece // es + 3]
        pool = [0, 1, 2, 3, 5, 7, 13, 31, 97, 1009, 4099, 17011]
        pool += [e + d for e in edges for d in (-1, 0, 1) if e + d >= 0]
        count = int(rng.choice(pool)) if rng.random() < 0.9 else int(rng.integers(1, 200000))
        algo = ALGOS[int(rng.integers(len(ALGOS)))]
        fusion = FUSION[int(rng.integers(len(FUSION)))]
        mode = MODES[int(rng.integers(len(MODES)))]
        special = (0.0, 0.001, 0.05, 0.5)[int(rng.integers(4))]
        batch = int(rng.integers(2, 5)) if mode == "fused" else 1
        counts = [count] + [int(rng.choice(pool)) for _ in range(batch - 1)]
        if mode == "reduce_scatter":
            counts = [count - count % n]
        ddl.set_algorithm(algo)
        ddl.set_fusion(fusion, 0.5)
        data = [[gen(np.random.default_rng([seed, case, q, i]), c, dt, special)
                 for q in range(n)] for i, c in enumerate(counts)]
        mine = [d[r] for d in data]
        blocks = [None] * len(counts)
        if mode == "blocking":
            outs = [ddl.allreduce(mine[0], op=op)]
        elif mode == "in_place":
            buf = mine[0].copy()
            outs = [ddl.allreduce(buf, op=op, out=buf)]
        elif mode == "reduce_scatter":
            outs = [ddl.reduce_scatter(mine[0], op=op)]
            per = counts[0] // n
            blocks = [(r * per, (r + 1) * per)]
        else:  # one async call, or a batch submitted together (fused when it fits)
            handles = [ddl.allreduce_async(x, op=op) for x in mine]
            outs = [h.wait() for h in handles]
        for i, out in enumerate(outs):
            done += 1
            got = comm.allgather(out.tobytes() if blocks[i] is None else b"")
            if blocks[i] is None and any(g != got[0] for g in got):
                divergent += 1
                if len(first_bad) < 5:
                    first_bad.append(f"case {case} DIVERGENT {dname} {op} n={counts[i]} "
                                     f"algo={algo} fusion={fusion} mode={mode}")
            right, nc = check_one(out, data[i], dt, op, blocks[i])
            noncanon += nc
            if not right:
                wrong += 1
                if len(first_bad) < 5:
                    first_bad.append(f"case {case} WRONG {dname} {op} n={counts[i]} algo={algo} "
                                     f"fusion={fusion} mode={mode} rank={r}")
    wrong = comm.allreduce(wrong, op=MPI.SUM)
    noncanon = comm.allreduce(noncanon, op=MPI.SUM)
    if r == 0:
        print(f"CONSISTENCY ranks={n} cases={done} divergent={divergent} wrong={wrong} "
              f"noncanonical={noncanon} topology={'x'.join(map(str, ddl.topology()))}",
              flush=True)
    for line in first_bad:
        print(line, flush=True)
    ddl.set_algorithm("auto")
    ddl.finalize()
    if divergent == 0 and wrong == 0 and noncanon == 0:
        print("OK consistency", flush=True)
        return 0
    return 1


if __name__ == "__main__":
    assert ml_dtypes  # bfloat16 arrays come from ml_dtypes (through common.DTYPES)
    sys.exit(main())

"""Shared by the MPI workers: exact test data and numpy references."""

from __future__ import annotations

import ml_dtypes
import numpy as np

DTYPES = {
    "float16": np.dtype(np.float16), "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "float32": np.dtype(np.float32), "float64": np.dtype(np.float64),
    "int8": np.dtype(np.int8), "uint8": np.dtype(np.uint8),
    "int32": np.dtype(np.int32), "int64": np.dtype(np.int64),
}
OPS = ("sum", "avg", "min", "max", "prod")
BITWISE = ("band", "bor", "bxor")  # integer dtypes only
COUNTS = (0, 1, 2, 3, 7, 13, 64, 97, 1000, 4099, 17011, 70001)


def data(rank: int, count: int, dtype: np.dtype, op: str, salt: int = 0) -> np.ndarray:
    """Values whose reduction is exact in every dtype, so any order gives the same bits:
    small integers, and for 8-bit sums and products values large enough to wrap."""
    rng = np.random.default_rng(1000 * rank + 17 * count + salt)
    if op in BITWISE:  # every bit pattern of the dtype
        return rng.integers(0, 256, size=count * dtype.itemsize, dtype=np.uint8).view(dtype)
    if op == "prod":
        vals = rng.choice([1, 2, 3] if dtype.kind in "iu" else [1, 2, -1], size=count)
        if dtype.kind == "u":
            vals = np.abs(vals)
    elif dtype.kind in "iu" and dtype.itemsize == 1 and op in ("sum", "avg"):
        vals = rng.integers(0 if dtype.kind == "u" else -100, 100, size=count)
    else:
        vals = rng.integers(0 if dtype.kind == "u" else -4, 5, size=count)
    return vals.astype(dtype)


def reference(inputs: list[np.ndarray], dtype: np.dtype, op: str) -> np.ndarray:
    n = len(inputs)
    if dtype.kind in "iu":
        stack = np.stack(inputs)
        if op in BITWISE:
            fn = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}[op]
            return fn.reduce(stack, axis=0).astype(dtype)
        if op in ("sum", "avg"):
            s = np.sum(stack, axis=0, dtype=dtype)  # wraps like libddl
            if op == "sum":
                return s
            return (s.astype(np.int64) // 1 if n == 1 else
                    np.trunc(s.astype(np.float64) / n)).astype(np.int64).astype(dtype)
        if op == "prod":
            return np.prod(stack, axis=0, dtype=dtype)
        return (stack.min(axis=0) if op == "min" else stack.max(axis=0)).astype(dtype)
    stack = np.stack([x.astype(np.float64) for x in inputs])  # exact for these values
    if op in ("sum", "avg"):
        s = stack.sum(axis=0)
        if op == "avg":
            # libddl: the (exact) sum rounded to dtype, divided in float32 (64 for f64)
            s16 = s.astype(dtype)
            div = np.float64 if dtype == np.float64 else np.float32
            return (s16.astype(div) / div(n)).astype(dtype)
        return s.astype(dtype)
    if op == "prod":
        return stack.prod(axis=0).astype(dtype)
    return (stack.min(axis=0) if op == "min" else stack.max(axis=0)).astype(dtype)


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()

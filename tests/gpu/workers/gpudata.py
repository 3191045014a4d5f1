"""Exact test data and numpy references for the GPU workers (as tests/ddl_core's)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

DTYPES = {
    "float16": (np.dtype(np.float16), torch.float16),
    "bfloat16": (np.dtype(ml_dtypes.bfloat16), torch.bfloat16),
    "float32": (np.dtype(np.float32), torch.float32),
    "float64": (np.dtype(np.float64), torch.float64),
    "int8": (np.dtype(np.int8), torch.int8),
    "uint8": (np.dtype(np.uint8), torch.uint8),
    "int32": (np.dtype(np.int32), torch.int32),
    "int64": (np.dtype(np.int64), torch.int64),
}
OPS = ("sum", "avg", "min", "max", "prod")


def data(rank: int, count: int, dtype: np.dtype, op: str, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng(1000 * rank + 17 * count + salt)
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
        if op in ("sum", "avg"):
            s = np.sum(stack, axis=0, dtype=dtype)
            if op == "sum" or n == 1:
                return s
            return np.trunc(s.astype(np.float64) / n).astype(np.int64).astype(dtype)
        if op == "prod":
            return np.prod(stack, axis=0, dtype=dtype)
        return (stack.min(axis=0) if op == "min" else stack.max(axis=0)).astype(dtype)
    stack = np.stack([x.astype(np.float64) for x in inputs])
    if op in ("sum", "avg"):
        s = stack.sum(axis=0)
        if op == "avg":
            s16 = s.astype(dtype)
            div = np.float64 if dtype == np.float64 else np.float32
            return (s16.astype(div) / div(n)).astype(dtype)
        return s.astype(dtype)
    if op == "prod":
        return stack.prod(axis=0).astype(dtype)
    return (stack.min(axis=0) if op == "min" else stack.max(axis=0)).astype(dtype)


def to_cuda(a: np.ndarray, tdtype: torch.dtype) -> torch.Tensor:
    if a.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16).cuda()
    return torch.from_numpy(a.copy()).cuda()


def to_numpy(t: torch.Tensor, dtype: np.dtype) -> np.ndarray:
    t = t.cpu()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(dtype)
    return t.numpy()


def same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.tobytes() == b.tobytes()

"""Turn what users pass (numpy arrays, torch CPU tensors, buffer-protocol objects) into
what the C binding takes: a contiguous buffer object and libddl's dtype code, without
copying.

Kept apart from the collectives so framework integrations can reuse it, and so the
numpy fast path stays a couple of dictionary lookups: the latency of a small allreduce
is mostly this layer.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ddl_core import _ddl

DTYPES: tuple[str, ...] = _ddl.DTYPES  # libddl's names, in its code order
DTYPE_CODE = {name: i for i, name in enumerate(DTYPES)}
OPS: tuple[str, ...] = _ddl.OPS  # sum avg min max prod band bor bxor
BF16_CODE = DTYPE_CODE["bfloat16"]  # the one dtype numpy cannot hand over as a buffer
OP_CODE = {name: i for i, name in enumerate(OPS)}
OP_CODE["average"] = OP_CODE["avg"]
OP_CODE["mean"] = OP_CODE["avg"]
OP_CODE["product"] = OP_CODE["prod"]

_NP_CODE: dict[np.dtype, int] = {
    np.dtype(n): DTYPE_CODE[n] for n in DTYPES if n != "bfloat16"
}
try:  # bfloat16 arrays come from ml_dtypes (what JAX and TensorFlow use)
    import ml_dtypes

    BF16 = np.dtype(ml_dtypes.bfloat16)
    _NP_CODE[BF16] = BF16_CODE
except ImportError:  # pragma: no cover - ml_dtypes is optional
    BF16 = None

# memoryview formats -> dtype code (native sizes checked at use)
_FMT_CODE = {fmt: DTYPE_CODE[name] for fmt, name in (
    ("e", "float16"), ("f", "float32"), ("d", "float64"), ("b", "int8"), ("B", "uint8"),
    ("c", "uint8"))}
_INT_FMTS = {"i", "l", "q", "h", "n"}


def op_code(op: str | int) -> int:
    """libddl's code for an op name; an unknown op raises before any communication."""
    if isinstance(op, int) and 0 <= op < len(OPS):
        return op
    code = OP_CODE.get(op.lower() if isinstance(op, str) else op)
    if code is None:
        raise ValueError(f"unknown op {op!r}: use one of {', '.join(OPS)}")
    return code


def np_code(dtype: np.dtype) -> int:
    code = _NP_CODE.get(dtype)
    if code is None:
        raise TypeError(
            f"dtype {dtype} is not supported: use one of {', '.join(DTYPES)}"
        )
    return code


def _torch_view(t: Any) -> tuple[np.ndarray, int]:
    import torch

    if t.device.type != "cpu":
        raise TypeError(
            f"libddl takes CPU and CUDA tensors, not one on {t.device}: move it with .cpu()"
        )
    if not t.is_contiguous():
        raise ValueError(
            "the tensor is not contiguous (a transposed or sliced view): call "
            ".contiguous() first"
        )
    t = t.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), BF16_CODE
    if t.dtype == torch.float16:
        return t.view(torch.int16).numpy(), DTYPE_CODE["float16"]
    arr = t.numpy()
    return arr, np_code(arr.dtype)


def as_buffer(x: Any) -> tuple[Any, int]:
    """(object the C binding can read as a buffer, dtype code) for x, sharing memory."""
    if isinstance(x, np.ndarray):
        if not x.flags.c_contiguous:
            raise ValueError(
                "the array is not C-contiguous (a transposed or strided view): use "
                "np.ascontiguousarray(x) first"
            )
        code = np_code(x.dtype)
        if code == BF16_CODE:  # numpy cannot export bfloat16 through the buffer protocol
            return x.view(np.uint16), code
        return x, code
    mod = type(x).__module__
    if mod.startswith("torch"):
        return _torch_view(x)
    try:
        mv = memoryview(x)
    except TypeError:
        raise TypeError(
            f"{type(x).__name__} is neither a numpy array, a torch tensor nor a buffer"
        ) from None
    if not mv.c_contiguous:
        raise ValueError("the buffer is not C-contiguous: copy it into a contiguous one first")
    fmt = mv.format.lstrip("@=<")
    if fmt in _FMT_CODE:
        return mv, _FMT_CODE[fmt]
    if fmt.lower() in _INT_FMTS:
        signed = fmt.islower()
        if mv.itemsize == 4 and signed:
            return mv, DTYPE_CODE["int32"]
        if mv.itemsize == 8 and signed:
            return mv, DTYPE_CODE["int64"]
    raise TypeError(f"buffer format {mv.format!r} is not supported: use one of {', '.join(DTYPES)}")


def empty_like(x: Any, buf: Any, shape: tuple[int, ...] | None = None) -> tuple[Any, Any]:
    """A fresh output shaped like x (or `shape`) of x's kind: (user object, its buffer)."""
    if isinstance(x, np.ndarray):
        out = np.empty(shape if shape is not None else x.shape, dtype=x.dtype)
        return out, (out.view(np.uint16) if out.dtype == BF16 else out)
    if type(x).__module__.startswith("torch"):
        import torch

        out = torch.empty(shape if shape is not None else x.shape, dtype=x.dtype)
        return out, _torch_view(out)[0]
    arr = np.asarray(buf)
    out = np.empty(shape if shape is not None else arr.shape, dtype=arr.dtype)
    return out, out


# ---- the checks every collective makes, once: what it sends, where the result goes ------


def count(buf: Any) -> int:
    """Elements of a buffer (its bytes over the element size)."""
    if type(buf) is np.ndarray:
        return buf.size  # (a memoryview costs 0.3 us, a small allreduce's third)
    mv = memoryview(buf)
    return mv.nbytes // mv.itemsize


def check_out(out: Any, code: int, need: int | None, fn: str) -> Any:
    """out's buffer, once its dtype is `code` and it holds `need` elements (None: the C
    call checks the size itself)."""
    rbuf, rcode = as_buffer(out)
    if rcode != code:
        raise TypeError(f"{fn}: out has dtype {DTYPES[rcode]} but the input {DTYPES[code]}")
    if need is not None and count(rbuf) != need:
        raise ValueError(f"{fn}: out must hold {need} elements, not {count(rbuf)}")
    return rbuf


def result(x: Any, buf: Any, code: int, out: Any, fn: str, need: int | None = None,
           shape: tuple[int, ...] | None = None) -> tuple[Any, Any]:
    """(result object, its buffer) of a collective on x (already resolved to buf, code):
    `out` itself (checked), x for out=x (in place), else a new array of x's kind shaped
    `shape` (default: like x). `need`: the elements out must hold, where the C call does
    not check it (None: it does)."""
    if out is None:
        return empty_like(x, buf, shape)
    if out is x and (need is None or need == count(buf)):
        return x, buf
    if need is None:  # (check_out's dtype check inline: the async calls' latency)
        rbuf, rcode = as_buffer(out)
        if rcode == code:
            return out, rbuf
    return out, check_out(out, code, need, fn)


def gather_shape(x: Any, n: int) -> tuple[int, ...]:
    """The shape of n ranks' x concatenated along the first axis (flat x: n x its length)."""
    shape = tuple(getattr(x, "shape", ()) or ())
    return (n * shape[0], *shape[1:]) if shape else (n,)


def scatter_shape(x: Any, total: int, n: int, fn: str) -> tuple[int, ...]:
    """The shape of one of n equal blocks of x (total elements): x's first axis split when
    it divides, else flat."""
    if total % n:
        raise ValueError(f"{fn}: {total} elements do not split over {n} ranks")
    shape = tuple(getattr(x, "shape", ()) or ())
    if shape and shape[0] % n == 0:
        return (shape[0] // n, *shape[1:])
    return (total // n,)


def rank_counts(counts: Any, n: int, fn: str) -> np.ndarray:
    """n per-rank element counts as the uint64 array libddl takes, or ValueError."""
    arr = np.asarray(counts)
    if arr.shape != (n,) or arr.dtype.kind not in "iu" or (arr < 0).any():
        raise ValueError(f"{fn}: give {n} non-negative integer counts, one per rank")
    return np.ascontiguousarray(arr, dtype=np.uint64)

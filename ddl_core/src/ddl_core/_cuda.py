"""GPU arrays for libddl's device path: torch CUDA tensors, CuPy arrays, anything with
``__cuda_array_interface__`` (Numba, PyCUDA, ...) or DLPack (JAX, ...) become a raw
device pointer, an element count, libddl's dtype code and the CUDA stream to order on.

Nothing here imports CUDA: a CPU-only machine imports it fine, and host objects answer
None from `device_array` after a type check or two, so the host fast paths stay fast.

Streams: a torch tensor uses torch's current stream on its device, a CuPy array CuPy's
current stream, an object whose ``__cuda_array_interface__`` names a stream that one,
and DLPack producers are asked to make the data ready on the legacy default stream,
which libddl then uses.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

from ._buffers import DTYPES

# DLPack device types that CUDA pointers live on: kDLCUDA, kDLCUDAManaged
_DL_CUDA = (2, 13)
# (DLPack type code, bits) -> libddl dtype code; DLPack's codes: 0 int, 1 uint, 2 float,
# 4 bfloat (libddl's codes come from the extension, by name)
_DL_TYPE = {"float16": (2, 16), "bfloat16": (4, 16), "float32": (2, 32), "float64": (2, 64),
            "int8": (0, 8), "uint8": (1, 8), "int32": (0, 32), "int64": (0, 64)}
_DL_CODE = {_DL_TYPE[name]: code for code, name in enumerate(DTYPES)}
# __cuda_array_interface__ typestr (byte order stripped) -> libddl dtype code
# (numpy's typestr of each libddl dtype but bfloat16, which has none there)
_TYPESTR_CODE = {np.dtype(name).str[1:]: code for code, name in enumerate(DTYPES)
                 if name != "bfloat16"}
_TORCH_CODE: dict[Any, int] = {}


@dataclass(frozen=True)
class DeviceArray:
    """A C-contiguous array in GPU memory, as libddl takes it."""

    ptr: int
    count: int
    code: int
    device: int
    stream: int
    shape: tuple[int, ...]
    keep: Any  # what keeps the memory alive (the object, or a DLPack capsule)

    @property
    def dtype(self) -> str:
        return DTYPES[self.code]


def _torch_code(dtype: Any) -> int:
    if not _TORCH_CODE:
        import torch

        # torch names its dtypes as libddl does
        _TORCH_CODE.update({getattr(torch, name): code for code, name in enumerate(DTYPES)})
    code = _TORCH_CODE.get(dtype)
    if code is None:
        raise TypeError(f"dtype {dtype} is not supported: use one of {', '.join(DTYPES)}")
    return code


def _contiguous(shape: tuple[int, ...], strides: tuple[int, ...] | None, itemsize: int) -> bool:
    if strides is None:
        return True
    expect = itemsize
    for dim, stride in zip(reversed(shape), reversed(strides), strict=True):
        if dim != 1 and stride != expect:
            return False
        expect *= dim
    return True


def _stream_of(value: Any) -> int:
    # 1 is the legacy default stream (NULL to the runtime); 2 the per-thread one
    if value is None or value == 1:
        return 0
    return int(value)


def _from_torch(t: Any) -> DeviceArray | None:
    if t.device.type != "cuda":
        return None
    if not t.is_contiguous():
        raise ValueError(
            "the tensor is not contiguous (a transposed or sliced view): call .contiguous() "
            "first"
        )
    import torch

    stream = torch.cuda.current_stream(t.device).cuda_stream
    return DeviceArray(t.data_ptr(), t.numel(), _torch_code(t.dtype), t.device.index or 0,
                       _stream_of(stream), tuple(t.shape), t)


def _from_cai(x: Any, cai: dict[str, Any]) -> DeviceArray:
    typestr = str(cai["typestr"]).lstrip("<>|=")
    code = _TYPESTR_CODE.get(typestr)
    if code is None:
        raise TypeError(f"array type {cai['typestr']!r} is not supported: use one of "
                        f"{', '.join(DTYPES)}")
    shape = tuple(int(d) for d in cai["shape"])
    itemsize = int(typestr[1:])
    strides = cai.get("strides")
    if not _contiguous(shape, None if strides is None else tuple(strides), itemsize):
        raise ValueError("the array is not C-contiguous: copy it into a contiguous one first")
    count = 1
    for d in shape:
        count *= d
    stream = cai.get("stream")
    if stream is None and type(x).__module__.startswith("cupy"):
        stream = sys.modules["cupy"].cuda.get_current_stream().ptr
    ptr = int(cai["data"][0] or 0)
    return DeviceArray(ptr, count, code, -1, _stream_of(stream), shape, x)


def _from_dlpack(x: Any) -> DeviceArray | None:
    dev_type, dev_id = x.__dlpack_device__()
    if int(dev_type) not in _DL_CUDA:
        return None
    from . import _ddl

    cap = x.__dlpack__(stream=1)
    ptr, _, _, code, bits, lanes, count, contiguous = _ddl.dlpack_info(cap)
    ddl_code = _DL_CODE.get((code, bits)) if lanes == 1 else None
    if ddl_code is None:
        raise TypeError(f"DLPack type (code {code}, {bits} bits, {lanes} lanes) is not "
                        f"supported: use one of {', '.join(DTYPES)}")
    if not contiguous:
        raise ValueError("the array is not C-contiguous: copy it into a contiguous one first")
    shape = tuple(getattr(x, "shape", (count,)))
    return DeviceArray(ptr, count, ddl_code, int(dev_id), 0, shape, (x, cap))


_HOST_TYPES = frozenset({np.ndarray, bytes, bytearray, memoryview})


def device_array(x: Any) -> DeviceArray | None:
    """The DeviceArray for x when x lives in GPU memory, else None (a host object)."""
    if type(x) in _HOST_TYPES:  # (the common case, answered before any attribute lookup)
        return None
    mod = type(x).__module__
    if mod.startswith("torch"):
        return _from_torch(x)
    if mod.startswith("numpy") or isinstance(x, (bytes, bytearray, memoryview)):
        return None
    try:
        cai = x.__cuda_array_interface__
    except AttributeError:
        cai = None
    if cai is not None:
        return _from_cai(x, cai)
    if hasattr(x, "__dlpack_device__") and hasattr(x, "__dlpack__"):
        return _from_dlpack(x)
    return None


def empty_like(x: Any, d: DeviceArray, shape: tuple[int, ...] | None = None) -> Any:
    """A new GPU array of x's kind (torch or CuPy), for results when no `out` is given."""
    shape = d.shape if shape is None else shape
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=x.dtype, device=x.device)
    if mod.startswith("cupy"):
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(x.device.id):
            return cupy.empty(shape, dtype=x.dtype)
    raise TypeError(
        f"ddl_core cannot allocate a GPU array like {type(x).__name__}: pass out= (an array "
        "in GPU memory of the same dtype), or out=x to work in place"
    )

"""What Python objects DDL takes, without copying: torch CPU tensors, buffers, bf16."""

from __future__ import annotations

import array
import sys

import ml_dtypes
import numpy as np

import ddl_core as ddl

ddl.init()
r, n = ddl.rank(), ddl.size()
bad: list[str] = []


def check(ok: bool, what: str) -> None:
    if not ok:
        bad.append(what)


try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
               torch.int32, torch.int8, torch.uint8):
        t = torch.full((3, 5), r + 1, dtype=dt)
        ptr = t.data_ptr()
        ddl.allreduce(t, out=t)  # in place: the tensor's own memory must change
        check(t.data_ptr() == ptr, f"torch {dt} was reallocated")
        check(bool((t == n * (n + 1) // 2).all()), f"torch {dt} in-place sum")
        o = ddl.allreduce(torch.full((4,), r + 1, dtype=dt), op="max")
        check(isinstance(o, torch.Tensor) and o.dtype == dt and bool((o == n).all()),
              f"torch {dt} out-of-place max")
    g = torch.ones(8, requires_grad=True)
    check(bool((ddl.allreduce(g.detach() * (r + 1)) == n * (n + 1) / 2).all()), "grad tensor")
    try:
        ddl.allreduce(torch.ones(4, 4).t())
        bad.append("a transposed tensor was accepted")
    except ValueError as e:
        check("contiguous" in str(e), f"message for non-contiguous tensor: {e}")
    gathered = ddl.allgather(torch.full((2, 3), float(r)))
    check(tuple(gathered.shape) == (2 * n, 3), "torch allgather shape")
    b = torch.full((6,), float(r))
    ddl.broadcast(b, root=0)
    check(bool((b == 0).all()), "torch broadcast")
    h = ddl.allreduce_async(torch.full((1000,), 1.0), op="avg")
    check(bool((h.wait() == 1.0).all()), "torch async avg")

# numpy bfloat16 (ml_dtypes) and float16
x = np.full(9, r + 1, ml_dtypes.bfloat16)
check(bool((ddl.allreduce(x).astype(np.float32) == n * (n + 1) / 2).all()), "bfloat16 numpy")
# plain buffers: bytearray (uint8), array.array, memoryview
ba = bytearray([r + 1] * 10)
ddl.allreduce(ba, out=ba)
check(list(ba) == [n * (n + 1) // 2] * 10, "bytearray in place")
arr = array.array("d", [float(r)] * 4)
res = ddl.allreduce(arr)
check(list(res) == [float(sum(range(n)))] * 4, "array.array")
mv = memoryview(array.array("i", [r] * 4))
check(list(ddl.allreduce(mv, op="max")) == [n - 1] * 4, "memoryview int32")
try:
    ddl.allreduce(memoryview(bytearray(16)).cast("B", (4, 4))[::2])
    bad.append("a strided memoryview was accepted")
except (ValueError, TypeError, NotImplementedError) as e:
    check("contiguous" in str(e) or "slice" in str(e) or "multi" in str(e), str(e))

if bad:
    print(f"rank {r}: {bad}", flush=True)
    sys.exit(1)
print("OK buffers", flush=True)

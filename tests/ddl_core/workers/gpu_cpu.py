"""What the device path does on a machine without a usable GPU (run under mpirun).

argv[1] names the case:
  no-device   a GPU array (a fake __cuda_array_interface__) fails on every rank with the
              clear error that names why (no runtime, or no usable device), no hang;
  mixed       rank 0 passes a GPU array, the others host arrays: every rank fails
              (mismatch or the local error) instead of hanging;
  host-ok     host arrays keep working after a failed device call.
"""

from __future__ import annotations

import os
import sys

import numpy as np

import ddl_core as ddl


class FakeGpuArray:
    """Claims to live in GPU memory; the pointer is never dereferenced by a CPU."""

    def __init__(self, n: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (n,), "typestr": "<f4", "data": (0x7F0000001000, False),
            "version": 3, "strides": None, "stream": None,
        }


def expect_error(fn, *needles: str) -> str:
    try:
        fn()
    except ddl.DDLError as e:
        msg = str(e)
        assert any(n in msg for n in needles), msg
        return msg
    raise AssertionError("no error was raised")


def main() -> None:
    case = sys.argv[1]
    ddl.init()
    r = ddl.rank()
    want = os.environ.get("WANT", "")
    needles = (want,) if want else ("CUDA runtime not found", "no usable CUDA device")
    if case == "no-device":
        x = FakeGpuArray(8)
        msg = expect_error(lambda: ddl.allreduce(x, out=x), *needles)
        expect_error(lambda: ddl.broadcast(x, 0), *needles)
        expect_error(lambda: ddl.allgather(x, out=FakeGpuArray(8 * ddl.size())), *needles)
        # a GPU array with no allocator known to ddl_core needs out=
        try:
            ddl.allreduce(x)
        except TypeError as e:
            assert "pass out=" in str(e), e
        else:
            raise AssertionError("allreduce of a foreign GPU array without out= passed")
        print(f"rank {r}: {msg}", file=sys.stderr)
    elif case == "mixed":
        if r == 0:
            x = FakeGpuArray(8)
            expect_error(lambda: ddl.allreduce(x, out=x), *needles)
        else:
            a = np.ones(8, np.float32)
            try:
                ddl.allreduce(a, out=a)
            except ddl.MismatchError:
                pass
            else:
                raise AssertionError("a host allreduce matched a device one")
    elif case == "host-ok":
        x = FakeGpuArray(4)
        expect_error(lambda: ddl.allreduce(x, out=x), *needles)
        a = np.full(1000, r + 1, np.float64)
        out = ddl.allreduce(a)
        n = ddl.size()
        assert np.all(out == n * (n + 1) / 2), out[:4]
        info = ddl.gpu_info()
        assert info["mode"] == "undecided", info
    print(f"OK gpu-{case}")


if __name__ == "__main__":
    main()

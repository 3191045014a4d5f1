"""Every collective x dtype (x op) on torch CUDA tensors, checked against numpy on every
rank; then CuPy arrays and a DLPack-only object. argv[1]: the path expected (nccl or
staged), argv[2]: text the staging reason must hold (or '-')."""

from __future__ import annotations

import sys

import numpy as np
import torch
from gpudata import DTYPES, OPS, data, reference, same, to_cuda, to_numpy

import ddl_core as ddl

COUNTS = (0, 1, 7, 1000, 4099, 70001)


class DLPackOnly:
    """Exposes a tensor through DLPack alone (as JAX arrays do)."""

    def __init__(self, t: torch.Tensor) -> None:
        self.t = t
        self.shape = tuple(t.shape)

    def __dlpack__(self, stream: int | None = None) -> object:
        return self.t.__dlpack__(stream=stream)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.t.__dlpack_device__()


def check(cond: bool, what: str) -> None:
    if not cond:
        raise AssertionError(what)


def main() -> None:
    want_mode, want_reason = sys.argv[1], sys.argv[2]
    ddl.init()
    r, n = ddl.rank(), ddl.size()
    torch.cuda.set_device(0)
    checked = 0
    for name, (npdt, tdt) in DTYPES.items():
        for count in COUNTS:
            for op in OPS:
                mine = data(r, count, npdt, op)
                ref = reference([data(q, count, npdt, op) for q in range(n)], npdt, op)
                x = to_cuda(mine, tdt)
                y = ddl.allreduce(x, op=op)  # out of place: NCCL even on one rank
                check(y.is_cuda and same(to_numpy(y, npdt), ref), f"allreduce {name} {op} {count}")
                check(same(to_numpy(x, npdt), mine), f"allreduce input changed {name}")
                ddl.allreduce(x, op=op, out=x)  # in place (the fast path on one rank)
                check(same(to_numpy(x, npdt), ref), f"allreduce in place {name} {op} {count}")
                checked += 2
            root = n - 1
            b = to_cuda(data(r, count, npdt, "sum", salt=5), tdt)
            ddl.broadcast(b, root)
            check(same(to_numpy(b, npdt), data(root, count, npdt, "sum", salt=5)),
                  f"broadcast {name} {count}")
            g = ddl.allgather(to_cuda(data(r, count, npdt, "max", salt=7), tdt))
            want = np.concatenate([data(q, count, npdt, "max", salt=7) for q in range(n)])
            check(same(to_numpy(g, npdt), want), f"allgather {name} {count}")
            rs_in = [data(q, count * n, npdt, "sum", salt=9) for q in range(n)]
            rs = ddl.reduce_scatter(to_cuda(rs_in[r], tdt), op="sum")
            want = reference(rs_in, npdt, "sum")[r * count:(r + 1) * count]
            check(same(to_numpy(rs, npdt), want), f"reduce_scatter {name} {count}")
            checked += 3
    # a tensor on a side stream: the result is ordered on torch's current stream
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        big = torch.full((1 << 20,), float(r + 1), device="cuda")
        ddl.allreduce(big, out=big)
        check(float(big[-1]) == n * (n + 1) / 2, "allreduce on a side stream")
    # CuPy, and anything that speaks __cuda_array_interface__
    try:
        import cupy
    except ImportError:
        cupy = None
        print(f"rank {r}: cupy is not installed: CuPy arrays not checked", file=sys.stderr)
    if cupy is not None:
        c = cupy.arange(1000, dtype=cupy.float32) * (r + 1)
        out = ddl.allreduce(c)
        check(isinstance(out, cupy.ndarray), "cupy allreduce returns a cupy array")
        check(bool((out == cupy.arange(1000, dtype=cupy.float32) * (n * (n + 1) // 2)).all()),
              "cupy allreduce")
        ddl.broadcast(c, 0)
        check(bool((c == cupy.arange(1000, dtype=cupy.float32)).all()), "cupy broadcast")
        checked += 2
    # DLPack alone
    t = torch.full((333,), r + 1, dtype=torch.int32, device="cuda")
    obj = DLPackOnly(t)
    ddl.allreduce(obj, out=obj)
    torch.cuda.synchronize()
    check(bool((t == n * (n + 1) // 2).all()), "DLPack allreduce")
    checked += 1
    info = ddl.gpu_info()
    check(info["mode"] == want_mode, f"path {info['mode']}, expected {want_mode}: {info}")
    if want_reason != "-":
        check(want_reason in info["staged_reason"], f"reason: {info['staged_reason']}")
    calls = int(info["nccl_calls" if want_mode == "nccl" else "staged_calls"])
    check(calls > 0, f"no call took the {want_mode} path: {info}")
    if r == 0:
        print(f"rank 0: {checked} checks; {want_mode}: {calls} calls; cuda "
              f"{info.get('cuda_runtime')}; nccl {info.get('nccl')} {info.get('nccl_version')};"
              f" reason: {info['staged_reason'] or '-'}")
    print("OK gpu-collectives")


if __name__ == "__main__":
    main()

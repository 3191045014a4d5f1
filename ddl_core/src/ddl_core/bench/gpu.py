"""Allreduce of GPU buffers: ddl_core against torch.distributed, nccl-tests style.

    ddlrun -n 1 python -m ddl_core.bench gpu          # ddl (NCCL path) vs torch NCCL
    ddlrun -n 4 python -m ddl_core.bench gpu          # ranks share one GPU: ddl staged vs gloo

Every rank allreduces (sum, in place) a float32 torch CUDA tensor on GPU 0, or its local
rank's GPU when there are several. Each size is warmed up, then timed over `--iters`
calls ended by a stream synchronize; the figure is the slowest rank's mean. On one rank
ddl's in-place allreduce moves nothing (its fast path), so the table adds ddl's
out-of-place allreduce, which goes through NCCL (a device-to-device copy). busbw =
algbw x 2(n-1)/n as nccl-tests reports it (0 on one rank).

With ddl-torch installed the table also times `dist.all_reduce` on a process group of the
`ddl` backend (torch.distributed's own call, as a script makes it: ddl_pg_us) and gives
its ratio to the baseline backend (pg_vs_base: > 1 is faster than the baseline).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

import ddl_core as ddl


def _sizes(lo: int, hi: int) -> list[int]:
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= 4
    return out


def _time(fn: Any, iters: int, warmup: int, sync: Any, barrier: Any) -> float:
    for _ in range(warmup):
        fn()
    sync()
    barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    sync()
    return (time.perf_counter() - t0) / iters


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ddl_core.bench gpu",
                                description=__doc__.split("\n")[0])
    p.add_argument("--min-bytes", type=int, default=8)
    p.add_argument("--max-bytes", type=int, default=256 << 20)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--baseline", choices=["auto", "nccl", "gloo", "none"], default="auto")
    p.add_argument("--json", help="write the rows here (rank 0)")
    p.add_argument("--no-backend", dest="backend", action="store_false",
                   help="leave out the torch.distributed ddl backend's column")
    a = p.parse_args(argv)

    import numpy as np
    import torch
    import torch.distributed as dist

    if not torch.cuda.is_available():
        print("python -m ddl_core.bench gpu needs a CUDA device: torch.cuda.is_available() is "
              f"False here (torch {torch.__version__}, built for CUDA {torch.version.cuda})",
              file=sys.stderr)
        return 2
    ddl.init()
    rank, size = ddl.rank(), ddl.size()
    ngpu = torch.cuda.device_count()
    dev = torch.device("cuda", ddl.local_rank() % ngpu)
    torch.cuda.set_device(dev)
    shared = ddl.local_size() > ngpu
    baseline = a.baseline
    if baseline == "auto":
        baseline = "gloo" if shared else "nccl"
    ddl_pg = None
    if baseline != "none":
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", "29541")
        dist.init_process_group(baseline, rank=rank, world_size=size,
                                device_id=dev if baseline == "nccl" else None)
        if a.backend:
            from ddl_core.torch.backend import cpp_backend  # (registers the ddl backend)

            # ddl takes CUDA tensors through its C++ Backend (ddl-torch) only
            ddl_pg = dist.new_group(backend="ddl") if cpp_backend() is not None else None

    def slowest(t: float) -> float:
        return float(ddl.allreduce(np.array([t]), op="max")[0])

    sync = torch.cuda.synchronize
    rows = []
    x0 = torch.ones(1, device=dev)
    ddl.allreduce(x0, out=torch.empty_like(x0))  # sets the device path up
    info = ddl.gpu_info()
    if rank == 0:
        name = torch.cuda.get_device_name(dev)
        print(f"# device: {name} x{ngpu}, {size} rank(s){' sharing it' if shared else ''}; "
              f"ddl path: {info['mode']}"
              f"{' (' + info['staged_reason'] + ')' if info['staged_reason'] else ''}; "
              f"NCCL {info.get('nccl_version', '-')}; torch {torch.__version__}; "
              f"baseline: torch.distributed {baseline}")
        cols = ["size", "count", "type", "ddl_us", "algbw", "busbw"]
        if size == 1:
            cols += ["ddl_oop_us", "oop_algbw"]
        if baseline != "none":
            cols += [f"{baseline}_us", f"{baseline}_busbw", "speedup"]
        if ddl_pg is not None:
            cols += ["ddl_pg_us", "pg_vs_base"]
        print("".join(f"{c:>13}" for c in cols))
    factor = 2 * (size - 1) / size
    for nbytes in _sizes(a.min_bytes, a.max_bytes):
        count = nbytes // 4
        x = torch.ones(count, device=dev)
        y = torch.empty_like(x)
        iters = a.iters if nbytes < (64 << 20) else max(5, a.iters // 4)
        row: dict[str, Any] = {"size": nbytes, "count": count, "type": "float",
                               "ranks": size, "path": info["mode"]}
        t = slowest(_time(lambda x=x: ddl.allreduce(x, out=x), iters, a.warmup, sync,
                          ddl.barrier))
        row["ddl_us"] = t * 1e6
        row["algbw"] = nbytes / t / 1e9
        row["busbw"] = row["algbw"] * factor
        if size == 1:
            t2 = slowest(_time(lambda x=x, y=y: ddl.allreduce(x, out=y), iters, a.warmup, sync,
                               ddl.barrier))
            row["ddl_oop_us"] = t2 * 1e6
            row["oop_algbw"] = nbytes / t2 / 1e9
        if baseline != "none":
            tb = slowest(_time(lambda x=x: dist.all_reduce(x), iters, a.warmup, sync,
                               ddl.barrier))
            row[f"{baseline}_us"] = tb * 1e6
            row[f"{baseline}_busbw"] = nbytes / tb / 1e9 * factor
            row["speedup"] = tb / t
        if ddl_pg is not None:
            tp = slowest(_time(lambda x=x: dist.all_reduce(x, group=ddl_pg), iters, a.warmup,
                               sync, ddl.barrier))
            row["ddl_pg_us"] = tp * 1e6
            row["pg_vs_base"] = row[f"{baseline}_us"] / row["ddl_pg_us"]
        # correctness of what was timed: ones summed (warmup + iters) times in place
        x.fill_(1.0)
        ddl.allreduce(x, out=x)
        ok = bool((x == float(size)).all())
        row["wrong"] = 0 if ok else 1
        rows.append(row)
        if rank == 0:
            vals = [f"{nbytes:>13}", f"{count:>13}", f"{'float':>13}", f"{row['ddl_us']:>13.1f}",
                    f"{row['algbw']:>13.2f}", f"{row['busbw']:>13.2f}"]
            if size == 1:
                vals += [f"{row['ddl_oop_us']:>13.1f}", f"{row['oop_algbw']:>13.2f}"]
            if baseline != "none":
                vals += [f"{row[baseline + '_us']:>13.1f}", f"{row[baseline + '_busbw']:>13.2f}",
                         f"{row['speedup']:>12.2f}x"]
            if ddl_pg is not None:
                vals += [f"{row['ddl_pg_us']:>13.1f}", f"{row['pg_vs_base']:>12.2f}x"]
            print("".join(vals) + ("" if ok else "   WRONG"), flush=True)
    if rank == 0 and a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(dev), "ranks": size,
                       "gpu_info": info, "baseline": baseline, "rows": rows}, f, indent=1)
    if baseline != "none":
        dist.destroy_process_group()
    return 0 if all(r["wrong"] == 0 for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())

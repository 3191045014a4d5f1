"""Large Model Support: the largest batch with and without LMS, and what LMS costs.

    python -m ddl_core.bench lms                       # GPU capped at 8 GiB, MLP 16 x 8192
    python -m ddl_core.bench lms --gpu-memory 16G --width 4096 --depth 24 --json lms.json

One process, one GPU. The GPU is capped at `--gpu-memory` (torch's per-process memory
fraction) so the search is quick on an 80 GB device and the figure does not depend on
the card's size. The model is a stack of `--depth` blocks (Linear width x width, GELU),
float32, trained with SGD; every block saves width x batch x 4 bytes twice for backward,
so activations dominate memory as the batch grows.

1. the largest batch that trains without LMS: doubling from `--start` until CUDA runs out
   of memory, then bisection to 1/16 of the last step;
2. the same with `ddl_core.lms.offload(threshold=...)`, up to `--max-factor` times the
   first figure (pinned host memory is the limit there);
3. throughput (samples/s, median of `--reps` timed steps after warm-up): without LMS at
   its largest batch (the baseline), with LMS at that batch, and with LMS at 2x it.
   The cost is 1 - (LMS at 2x) / baseline.

Without CUDA it says so and exits 2: there is nothing to offload.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from contextlib import nullcontext
from typing import Any

from ..lms import Offloader, parse_bytes


def build_model(width: int, depth: int, device: str) -> Any:
    import torch

    layers: list[Any] = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    layers.append(torch.nn.Linear(width, 1))
    return torch.nn.Sequential(*layers).to(device)


def train_step(model: Any, opt: Any, batch: int, width: int, lms: Offloader | None) -> None:
    import torch

    x = torch.randn(batch, width, device="cuda")
    opt.zero_grad(set_to_none=True)
    with lms if lms is not None else nullcontext():
        loss = model(x).square().mean()
    loss.backward()
    opt.step()


def fits(model: Any, opt: Any, batch: int, width: int, lms: Offloader | None) -> bool:
    """One training step at `batch`: True if it ran, False if CUDA ran out of memory."""
    import torch

    try:
        train_step(model, opt, batch, width, lms)
        torch.cuda.synchronize()
        return True
    except torch.cuda.OutOfMemoryError:
        return False
    finally:
        opt.zero_grad(set_to_none=True)
        torch.cuda.empty_cache()


def largest_batch(model: Any, opt: Any, width: int, lms: Offloader | None, start: int,
                  stop: int) -> int:
    """The largest batch that trains (0 if not even `start`), searched up to `stop`."""
    good, b = 0, start
    while b <= stop and fits(model, opt, b, width, lms):
        good, b = b, b * 2
    if good == 0 or good >= stop:
        return min(good, stop)
    bad = min(b, stop + 1)
    step = max(good // 16, 1)
    while bad - good > step:
        mid = (good + bad) // 2
        if fits(model, opt, mid, width, lms):
            good = mid
        else:
            bad = mid
    return good


def throughput(model: Any, opt: Any, batch: int, width: int, lms: Offloader | None,
               reps: int) -> float:
    """Samples per second: the median over `reps` timed steps after two warm-up steps."""
    import torch

    for _ in range(2):
        train_step(model, opt, batch, width, lms)
    times = []
    for _ in range(reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        train_step(model, opt, batch, width, lms)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return batch / statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_core.bench lms", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpu-memory", default="8G", help="cap on the GPU memory torch may use")
    ap.add_argument("--width", type=int, default=8192)
    ap.add_argument("--depth", type=int, default=16)
    ap.add_argument("--start", type=int, default=256, help="first batch size tried")
    ap.add_argument("--max-factor", type=int, default=8,
                    help="search LMS batches up to this many times the no-LMS figure")
    ap.add_argument("--threshold", default="1M", help="LMS: smaller tensors stay on the GPU")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("python -m ddl_core.bench lms needs torch with CUDA; torch is not installed",
              file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("python -m ddl_core.bench lms needs a CUDA device: torch.cuda.is_available() is "
              f"False here (torch {torch.__version__}, built for CUDA {torch.version.cuda}). "
              "Run it on a GPU node; LMS is a no-op for CPU tensors.", file=sys.stderr)
        return 2
    cap = parse_bytes(args.gpu_memory, "--gpu-memory") or 0
    total = torch.cuda.get_device_properties(0).total_memory
    if not 0 < cap <= total:
        ap.error(f"--gpu-memory {args.gpu_memory}: must be > 0 and at most the device's "
                 f"{total / 2**30:.1f} GiB")
    torch.cuda.set_per_process_memory_fraction(cap / total, 0)
    model = build_model(args.width, args.depth, "cuda")
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    dev = torch.cuda.get_device_name(0)
    print(f"# {dev}, torch {torch.__version__} (CUDA {torch.version.cuda}), GPU capped at "
          f"{cap / 2**30:.1f} GiB; MLP {args.depth} x {args.width} float32, SGD")
    plain_max = largest_batch(model, opt, args.width, None, args.start, 1 << 30)
    if plain_max == 0:
        print(f"not even batch {args.start} fits without LMS; lower --start", file=sys.stderr)
        return 1
    lms = Offloader(threshold=args.threshold)
    lms_max = largest_batch(model, opt, args.width, lms, plain_max,
                            plain_max * args.max_factor)
    print(f"  largest batch without LMS: {plain_max}")
    print(f"  largest batch with LMS:    {lms_max} ({lms_max / plain_max:.2f}x; search "
          f"stopped at {args.max_factor}x)")
    base = throughput(model, opt, plain_max, args.width, None, args.reps)
    same = throughput(model, opt, plain_max, args.width, lms, args.reps)
    rows = {"plain_max": plain_max, "lms_max": lms_max, "plain_sps": base, "lms_same_sps": same}
    print(f"  samples/s without LMS at {plain_max}: {base:,.0f} (baseline)")
    print(f"  samples/s with LMS at {plain_max}:    {same:,.0f} ({same / base:.2f}x)")
    if lms_max >= 2 * plain_max:
        double = throughput(model, opt, 2 * plain_max, args.width, lms, args.reps)
        rows["lms_double_sps"] = double
        print(f"  samples/s with LMS at {2 * plain_max}:    {double:,.0f} ({double / base:.2f}x; "
              f"throughput cost {100 * (1 - double / base):.0f}%)")
    s = lms.stats.as_dict()
    print(f"  LMS moved {s['offloaded']} tensors ({s['offloaded_bytes'] / 2**30:.1f} GiB) out, "
          f"kept {s['kept']} small ones; peak pinned host {s['peak_host_bytes'] / 2**30:.1f} GiB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": dev, "torch": torch.__version__, "gpu_memory": cap,
                       "width": args.width, "depth": args.depth, **rows, "lms_stats": s}, f,
                      indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Large Model Support: train with a batch whose activations do not fit on the GPU.

    python lms_pytorch.py                          # GPU capped at 6 GiB: fails without LMS,
    python lms_pytorch.py --no-lms                 # ... shows the out-of-memory error
    ddlrun -n 2 python lms_pytorch.py --ddl        # the same, gradients averaged by DDL

The model is a deep MLP (24 blocks of Linear 4096 x 4096 + GELU, float32). At batch 16384
each block saves 2 x 256 MiB for backward, 12 GiB in all: more than the 6 GiB the GPU is
capped to here (`--gpu-memory`, torch's per-process memory fraction, so the example
behaves the same on any card). Inside `ddl_core.lms.offload()` those activations go to
pinned host memory as forward produces them and come back, prefetched on a side
stream, as backward needs them; only the parameters and their gradients (3.2 GB) and a
few blocks' activations stay on the GPU.

On a machine without CUDA it trains a small batch on the CPU, where LMS is a no-op and
says so once.
"""

import argparse
import time

import ddl_core.lms as lms
import torch

ap = argparse.ArgumentParser(description=__doc__,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--batch-size", type=int, default=16384)
ap.add_argument("--width", type=int, default=4096)
ap.add_argument("--depth", type=int, default=24)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--gpu-memory", default="6G", help="cap on the GPU memory torch may use")
ap.add_argument("--threshold", default="1M", help="smaller saved tensors stay on the GPU")
ap.add_argument("--no-lms", action="store_true", help="train without LMS (to see it fail)")
ap.add_argument("--ddl", action="store_true", help="average gradients over ranks with DDL")
args = ap.parse_args()

cuda = torch.cuda.is_available()
if cuda:
    if args.ddl:
        import ddl_core as ddl

        ddl.init()
        torch.cuda.set_device(ddl.local_rank() % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    cap = lms.parse_bytes(args.gpu_memory, "--gpu-memory")
    torch.cuda.set_per_process_memory_fraction(
        min(1.0, cap / torch.cuda.get_device_properties(dev).total_memory), dev)
else:
    dev = torch.device("cpu")
    args.batch_size, args.width, args.depth = 64, 256, 4
    print("no CUDA device: a small batch on the CPU, where LMS does nothing")
    if args.ddl:
        import ddl_core as ddl

        ddl.init()

torch.manual_seed(0)
blocks = []
for _ in range(args.depth):
    blocks += [torch.nn.Linear(args.width, args.width), torch.nn.GELU()]
model = torch.nn.Sequential(*blocks, torch.nn.Linear(args.width, 1)).to(dev)
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
offloader = None if args.no_lms else lms.offload(threshold=args.threshold)

for step in range(args.steps):
    t0 = time.perf_counter()
    x = torch.randn(args.batch_size, args.width, device=dev)
    y = x[:, :1].clone()
    opt.zero_grad(set_to_none=True)
    try:
        if offloader is None:
            loss = torch.nn.functional.mse_loss(model(x), y)
        else:
            with offloader:
                loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
    except torch.cuda.OutOfMemoryError as e:
        raise SystemExit(f"batch {args.batch_size} does not fit in {args.gpu_memory} without "
                         f"LMS: {str(e).splitlines()[0]}") from None
    if args.ddl:
        for p in model.parameters():
            ddl.allreduce(p.grad, op="avg", out=p.grad)
    opt.step()
    if cuda:
        torch.cuda.synchronize()
    dt = time.perf_counter() - t0
    peak = torch.cuda.max_memory_allocated(dev) / 2**30 if cuda else 0.0
    print(f"step {step}: loss {loss.item():.4f}, {args.batch_size / dt:,.0f} samples/s, "
          f"GPU peak {peak:.2f} GiB")
if offloader is not None:
    s = offloader.stats
    print(f"LMS: {s.offloaded} tensors ({s.offloaded_bytes / 2**30:.1f} GiB) offloaded, "
          f"{s.kept} kept, {s.cpu_noop} CPU no-ops, {s.prefetched} prefetched")

"""DDP throughput on the ddl backend against gloo, in one run.

    ddlrun -n 2 python -m ddl_core.bench ddp [--steps 20 --rounds 5 --batch 32]
    ddlrun -n 2 python -m ddl_core.bench ddp --timeline /tmp/tl.json   # the timeline's cost

One job holds both process groups (ddl as the default group, gloo from new_group) and
two DDP copies of the same model; rounds alternate between them so machine noise hits
both alike. Two models (--model picks one): a small CNN, compute-bound (on 2 CPU ranks its
step is mostly compute, so the backend can change it by ~10% at most), and a wide MLP,
gradient-bound (16.8 MB of gradients for a few ms of compute, where averaging is most of
the step, as in the large models data parallelism is for). Reported, as medians over
rounds:

- samples/s: global samples per second of full training steps (forward, backward with
  DDP's overlapped gradient averaging, SGD step);
- exposed averaging cost per step: DDP step time minus the step time of the same model
  without DDP (no communication at all), i.e. what averaging adds to a step once DDP has
  overlapped what it can with the backward pass;
- allreduce of all gradients: one blocking allreduce of a tensor the size of the model
  (the whole averaging cost per step when nothing overlaps);
- a blocking 4 KiB all_reduce (`dist.all_reduce(t)`, async_op=False): its median and its
  25th percentile (gloo's "fast case"), each call timed alone after a barrier;
- all_to_all_single of 16 MiB per rank (even splits), each call timed alone;
- FSDP2: a training step (forward, backward, AdamW) of a small transformer
  (ddl_core.torch.models) under `fully_shard` on a DeviceMesh of each group, interleaved.
  Needs ddl-torch (the C++ Backend): without it the row is left out.

With --timeline PATH it measures instead what the timeline (ddl_core.timeline, what
DDL_TIMELINE / HOROVOD_TIMELINE open) adds to a ddl DDP step: steps alternate between
recording into PATH and not recording, each timed alone from a barrier; medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(32 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10))


def wide_mlp() -> nn.Module:
    """Gradient-bound: 4.2 M parameters (16.8 MB of gradients) for a few ms of compute."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(3 * 32 * 32, 1024), nn.ReLU(), nn.Linear(1024, 1024), nn.ReLU(),
        nn.Linear(1024, 10))


MODELS = {"cnn": small_cnn, "mlp": wide_mlp}
DESCRIBED = {"cnn": "small CNN (compute-bound)", "mlp": "wide MLP (gradient-bound)"}


def _timed(fn: Callable[[], None], steps: int) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(steps):
        fn()
    return (time.perf_counter() - t0) / steps


def timeline_cost(a: argparse.Namespace) -> int:
    """DDP (ddl) step time with the timeline recording and without, alternated step by
    step so machine noise hits both alike; medians and the median of paired ratios."""
    from ddl_core import timeline

    torch.set_num_threads(a.threads)
    dist.init_process_group("ddl")
    rank, size = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    ddp = DDP(small_cnn())
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(a.batch, 3, 32, 32)
    y = torch.randint(0, 10, (a.batch,))

    def step() -> None:
        opt.zero_grad()
        nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()

    for _ in range(3):
        step()
    timeline.start(a.timeline)  # rank 0 writes (every rank with "{rank}" in the path)
    times: dict[bool, list[float]] = {True: [], False: []}
    for i in range(a.rounds * a.steps):
        for on in ((True, False) if i % 2 == 0 else (False, True)):
            timeline.record(on)
            times[on].append(_timed(step, 1))
    timeline.stop()
    ratios = [t / f for t, f in zip(times[True], times[False], strict=True)]
    if rank == 0:
        on, off = statistics.median(times[True]), statistics.median(times[False])
        print(f"# timeline cost: DDP small CNN, {size} ranks, batch {a.batch}/rank, "
              f"{len(ratios)} steps each way, alternated")
        print(f"  step with the timeline {on * 1e3:.2f} ms, without {off * 1e3:.2f} ms; "
              f"median paired ratio {statistics.median(ratios):.3f} "
              f"({100 * (statistics.median(ratios) - 1):+.1f}%, target <= +3%)")
    dist.barrier()
    dist.destroy_process_group()
    return 0


def _ddp_times(make: Callable[[], nn.Module], groups: dict[str, dist.ProcessGroup],
               a: argparse.Namespace) -> dict:
    """DDP steps of one model on each group, steps without DDP, and a blocking allreduce
    of all its gradients: per group its rows, with the model's size and local step."""
    torch.manual_seed(0)
    base = make()
    nparams = sum(p.numel() for p in base.parameters())
    x = torch.randn(a.batch, 3, 32, 32)
    y = torch.randint(0, 10, (a.batch,))
    runs = {}
    for name, pg in groups.items():
        model = make()
        model.load_state_dict(base.state_dict())
        ddp = DDP(model, process_group=pg)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)

        def step(ddp: DDP = ddp, opt: torch.optim.Optimizer = opt) -> None:
            opt.zero_grad()
            nn.functional.cross_entropy(ddp(x), y).backward()
            opt.step()

        flat = torch.randn(nparams)

        def allreduce(pg: dist.ProcessGroup = pg, flat: torch.Tensor = flat) -> None:
            dist.all_reduce(flat, group=pg)

        for _ in range(3):
            step()  # warm-up: buckets rebuilt after the first iteration
        runs[name] = (step, allreduce)

    plain = make()
    plain.load_state_dict(base.state_dict())
    popt = torch.optim.SGD(plain.parameters(), lr=0.01)

    def local() -> None:
        popt.zero_grad()
        nn.functional.cross_entropy(plain(x), y).backward()
        popt.step()

    # Every iteration times one step of each kind back to back (ddl DDP, gloo DDP, no DDP,
    # then the two allreduces), so load from other processes on a shared machine lands on
    # all of them alike; every timed call starts from a barrier.
    res: dict[str, dict[str, list[float]]] = {n: {"step": [], "ar": []} for n in groups}
    local_times: list[float] = []
    for _ in range(a.rounds * a.steps):
        for name, (step, _ar) in runs.items():
            res[name]["step"].append(_timed(step, 1))
        local_times.append(_timed(local, 1))
        for name, (_step, ar) in runs.items():
            res[name]["ar"].append(_timed(ar, 1))
    lo = statistics.median(local_times)
    size = dist.get_world_size()
    out: dict = {"params": nparams, "local_ms": lo * 1e3}
    for name, r in res.items():
        st, ar = (statistics.median(r[k]) for k in ("step", "ar"))
        out[name] = {"samples_per_s": a.batch * size / st, "step_ms": st * 1e3,
                     "exposed_avg_ms": (st - lo) * 1e3, "allreduce_ms": ar * 1e3}
    out["ratio"] = out["ddl"]["samples_per_s"] / out["gloo"]["samples_per_s"]
    return out


def _fsdp2_times(groups: dict[str, dist.ProcessGroup], iters: int,
                 batch: int) -> dict[str, list[float]] | None:
    """Step times of the same small transformer under fully_shard on a DeviceMesh of each
    group, interleaved; None when the ddl group has no c10d Backend (no ddl-torch)."""
    from ddl_core.torch.backend import cpp_backend

    if cpp_backend() is None:
        return None
    from torch.distributed.device_mesh import DeviceMesh

    from ddl_core.torch.models import TinyTransformer, lm_loss, shard, token_batch

    rank = dist.get_rank()
    steps = {}
    for name, pg in groups.items():
        torch.manual_seed(0)
        model = shard(TinyTransformer(), DeviceMesh.from_group(pg, "cpu"))
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        def step(model: nn.Module = model, opt: torch.optim.Optimizer = opt,
                 xy: tuple[torch.Tensor, torch.Tensor] = token_batch(0, rank, max(1, batch // 4))
                 ) -> None:
            x, y = xy
            opt.zero_grad()
            lm_loss(model(x), y).backward()
            opt.step()

        for _ in range(2):
            step()  # warm-up
        steps[name] = step
    times: dict[str, list[float]] = {n: [] for n in groups}
    for _ in range(iters):
        for name, step in steps.items():
            times[name].append(_timed(step, 1))
    return times


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_core.bench ddp", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=10, help="timed iterations per round")
    ap.add_argument("--rounds", type=int, default=4, help="rounds (iterations = rounds x steps)")
    ap.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--model", choices=[*sorted(MODELS), "both"], default="both",
                    help="the DDP model: cnn (compute-bound), mlp (gradient-bound) or both")
    ap.add_argument("--json", help="also write the figures to this file (rank 0)")
    ap.add_argument("--timeline", help="measure the timeline's cost, recording into this file")
    a = ap.parse_args(argv)
    if a.timeline:
        return timeline_cost(a)

    torch.set_num_threads(a.threads)
    dist.init_process_group("ddl")  # the ddl:// rendezvous under ddlrun
    rank, size = dist.get_rank(), dist.get_world_size()
    groups = {"ddl": dist.group.WORLD, "gloo": dist.new_group(backend="gloo")}
    models = sorted(MODELS) if a.model == "both" else [a.model]
    ddp_runs = {m: _ddp_times(MODELS[m], groups, a) for m in models}
    a2a_in = torch.randn(4 << 20)  # 16 MiB of float32 per rank
    a2a_out = torch.empty_like(a2a_in)
    a2a_times: dict[str, list[float]] = {n: [] for n in groups}
    for _ in range(max(3, a.rounds * 2)):
        for name, pg in groups.items():
            a2a_times[name].append(_timed(
                lambda pg=pg: dist.all_to_all_single(a2a_out, a2a_in, group=pg), 1))
    fsdp2 = _fsdp2_times(groups, a.rounds * a.steps, a.batch)
    small = {n: torch.ones(1024) for n in groups}  # 4 KiB of float32
    small_times: dict[str, list[float]] = {n: [] for n in groups}
    for _ in range(a.rounds * a.steps * 5):
        for name, pg in groups.items():
            small_times[name].append(
                _timed(lambda pg=pg, t=small[name]: dist.all_reduce(t, group=pg), 1))

    out: dict = {}
    for name in groups:
        q = statistics.quantiles(small_times[name], n=4)
        out[name] = {"allreduce_4k_us": statistics.median(small_times[name]) * 1e6,
                     "allreduce_4k_p25_us": q[0] * 1e6,
                     "alltoall_16m_ms": statistics.median(a2a_times[name]) * 1e3}
        if fsdp2:
            out[name]["fsdp2_step_ms"] = statistics.median(fsdp2[name]) * 1e3
    if rank == 0:
        for m, d in ddp_runs.items():
            print(f"# DDP {DESCRIBED[m]} ({d['params']} parameters, {d['params'] * 4 / 1e6:.2f} "
                  f"MB of gradients), {size} ranks, batch {a.batch}/rank, {a.threads} "
                  f"thread(s)/rank, median of {a.rounds * a.steps} interleaved steps each")
            print(f"# step without DDP (no communication): {d['local_ms']:.2f} ms")
            print(f"{'backend':>8} {'samples/s':>10} {'step ms':>9} {'exposed avg ms':>15} "
                  f"{'allreduce ms':>13}")
            for name in groups:
                o = d[name]
                print(f"{name:>8} {o['samples_per_s']:10.1f} {o['step_ms']:9.2f} "
                      f"{o['exposed_avg_ms']:15.2f} {o['allreduce_ms']:13.2f}")
            print(f"ddl/gloo throughput ({m}): {d['ratio']:.2f}x")
        print(f"blocking 4 KiB all_reduce: ddl median {out['ddl']['allreduce_4k_us']:.1f} us "
              f"against gloo's 25th percentile {out['gloo']['allreduce_4k_p25_us']:.1f} us "
              f"(target: no slower; gloo's median {out['gloo']['allreduce_4k_us']:.1f} us)")
        print(f"all_to_all_single 16 MiB/rank: ddl {out['ddl']['alltoall_16m_ms']:.2f} ms, "
              f"gloo {out['gloo']['alltoall_16m_ms']:.2f} ms: "
              f"{out['gloo']['alltoall_16m_ms'] / out['ddl']['alltoall_16m_ms']:.2f}x gloo's "
              "speed (target >= 1.0x)")
        if fsdp2:
            print(f"FSDP2 step (small transformer, fully_shard over {size} ranks): ddl "
                  f"{out['ddl']['fsdp2_step_ms']:.2f} ms, gloo {out['gloo']['fsdp2_step_ms']:.2f} "
                  f"ms: {out['gloo']['fsdp2_step_ms'] / out['ddl']['fsdp2_step_ms']:.2f}x "
                  "gloo's speed (target >= 1.0x)")
        else:
            print("FSDP2 step: not measured (ddl-torch, the C++ Backend, is not installed)")
        first = ddp_runs[models[0]]["ddl"]
        print("-" * 64)
        print(f"total images/sec ({models[0]}): {first['samples_per_s']:.2f}")
        print("-" * 64)
        if a.json:
            with open(a.json, "w") as fh:
                json.dump({"ranks": size, "batch": a.batch, "ddp": ddp_runs, **out}, fh,
                          indent=1)
    # Let gloo's worker thread drop its last work (it needs the GIL for that) before the
    # groups are destroyed: ~ProcessGroupGloo joins that thread while holding the GIL.
    dist.barrier()
    time.sleep(0.2)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

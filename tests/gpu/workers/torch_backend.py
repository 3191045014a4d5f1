"""The `ddl` torch.distributed backend on CUDA tensors, with `init_process_group("ddl")`
alone, each mode against what it must compute. argv[1:]: modes.

  collectives  every c10d operation on CUDA tensors (async ones waited on from another
               stream), dtypes libddl maps (bool, int16, complex), a non-contiguous tensor,
               bitwise ops, uneven all_gather, all_to_all_single with splits, send/recv,
               a subgroup (staged through host memory)
  sharding     functional collectives, DTensor and FSDP2 on a CUDA DeviceMesh; FSDP2's
               parameters after N steps equal one process trained on every batch
  ddp          DDP on CUDA; the parameters equal one process trained on every batch
  mixed        rank 0 passes a CUDA tensor, the others a CPU one: an error on every rank
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # reproducible GEMMs
sys.path.insert(0, str(Path(__file__).parents[2] / "frameworks" / "workers"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed._functional_collectives as fc  # noqa: E402
from common import cnn, reference, train  # noqa: E402

STEPS, LR = 4, 0.05
dist.init_process_group("ddl")
rank, size = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(0)
dev = torch.device("cuda", 0)
assert dist.get_backend() == "ddl"


def expect(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.device != dev:
        raise AssertionError(f"rank {rank}: {what}: the result is on {got.device}, not {dev}")
    if not torch.equal(got.cpu(), want.cpu()):
        raise AssertionError(f"rank {rank}: {what}: got {got}, want {want}")


def vals(k: int, n: int = 6, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (torch.arange(n) + 10 * k).to(dtype)


def collectives() -> None:
    every = [vals(k) for k in range(size)]
    total = sum(every)
    t = vals(rank).to(dev)
    dist.all_reduce(t)
    expect(t, total, "all_reduce sum")
    for dtype in (torch.float16, torch.bfloat16, torch.float64, torch.int8, torch.int32,
                  torch.int64, torch.int16):
        t = vals(rank, dtype=dtype).to(dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        expect(t, vals(size - 1, dtype=dtype), f"all_reduce max {dtype}")
    t = vals(rank).to(dev)
    dist.all_reduce(t, op=dist.ReduceOp.AVG)
    torch.testing.assert_close(t.cpu(), total / size)
    b = torch.tensor([rank % 2 == 0, True, False], device=dev)
    dist.all_reduce(b)  # bool sum: logical or
    expect(b, torch.tensor([True, True, False]), "all_reduce bool")
    bits = torch.tensor([1 << rank, 7], dtype=torch.int32, device=dev)
    dist.all_reduce(bits, op=dist.ReduceOp.BOR)
    expect(bits, torch.tensor([(1 << size) - 1, 7], dtype=torch.int32), "all_reduce bor")
    z = torch.complex(vals(rank), -vals(rank)).to(dev)
    dist.all_reduce(z)
    expect(z, torch.complex(total, -total), "all_reduce complex")
    nc = vals(rank, 12).reshape(3, 4).to(dev).t()  # non-contiguous
    dist.all_reduce(nc)
    expect(nc, sum(vals(k, 12) for k in range(size)).reshape(3, 4).t(), "non-contiguous")

    # async, waited on from another stream: the wait orders that stream after the work
    big = torch.full((1 << 20,), float(rank + 1), device=dev)
    side = torch.cuda.Stream()
    work = dist.all_reduce(big, async_op=True)
    with torch.cuda.stream(side):
        work.wait()
        out = big * 2
    side.synchronize()
    expect(out, torch.full((1 << 20,), float(size * (size + 1))), "async all_reduce waited on")
    fut = dist.all_reduce(big, async_op=True).get_future()
    fut.wait()
    expect(big, torch.full((1 << 20,), float(size * (size + 1) // 2 * size)), "future")

    t = vals(rank).to(dev)
    dist.broadcast(t, src=size - 1)
    expect(t, vals(size - 1), "broadcast")
    out = torch.empty(6 * size, device=dev)
    dist.all_gather_into_tensor(out, vals(rank).to(dev))
    expect(out, torch.cat(every), "all_gather_into_tensor")
    outs = [torch.empty(6, device=dev) for _ in range(size)]
    dist.all_gather(outs, vals(rank).to(dev))
    expect(torch.cat(outs), torch.cat(every), "all_gather")
    uneven = [torch.empty(k + 1, device=dev) for k in range(size)]
    dist.all_gather(uneven, vals(rank, rank + 1).to(dev))
    expect(torch.cat(uneven), torch.cat([vals(k, k + 1) for k in range(size)]),
           "all_gather uneven")
    full = (torch.arange(4 * size) * (rank + 1)).float().to(dev)
    part = torch.empty(4, device=dev)
    dist.reduce_scatter_tensor(part, full)
    want = torch.arange(4 * size).float() * sum(range(1, size + 1))
    expect(part, want[4 * rank:4 * rank + 4], "reduce_scatter_tensor")
    t = vals(rank).to(dev)
    dist.reduce(t, dst=0)
    if rank == 0:
        expect(t, total, "reduce")
    gathered = [torch.empty(6, device=dev) for _ in range(size)] if rank == 0 else None
    dist.gather(vals(rank).to(dev), gathered, dst=0)
    if rank == 0:
        expect(torch.cat(gathered), torch.cat(every), "gather")
    got = torch.empty(6, device=dev)
    dist.scatter(got, [vals(k).to(dev) for k in range(size)] if rank == 0 else None, src=0)
    expect(got, vals(rank), "scatter")
    rows = (torch.arange(2 * size) + 100 * rank).float().to(dev)
    back = torch.empty(2 * size, device=dev)
    dist.all_to_all_single(back, rows)
    expect(back, torch.cat([torch.arange(2 * rank, 2 * rank + 2).float() + 100 * k
                            for k in range(size)]), "all_to_all_single")
    # rank r sends r + 1 rows to every rank
    mine = torch.full((size * (rank + 1),), float(rank), device=dev)
    recv = torch.empty(sum(k + 1 for k in range(size)), device=dev)
    dist.all_to_all_single(recv, mine, [k + 1 for k in range(size)], [rank + 1] * size)
    expect(recv, torch.cat([torch.full((k + 1,), float(k)) for k in range(size)]),
           "all_to_all_single with splits")
    if size > 1:  # a ring: everyone sends right and receives from the left
        right, left = (rank + 1) % size, (rank - 1) % size
        inbox = torch.empty(6, device=dev)
        ops = [dist.P2POp(dist.isend, vals(rank).to(dev), right),
               dist.P2POp(dist.irecv, inbox, left)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        expect(inbox, vals(left), "batch_isend_irecv ring")
    dist.barrier()
    # a subgroup of the even ranks (libddl runs device buffers on the world only: staged)
    evens = list(range(0, size, 2))
    sub = dist.new_group(evens)
    if rank in evens:
        t = vals(rank).to(dev)
        dist.all_reduce(t, group=sub)
        expect(t, sum(vals(k) for k in evens), "subgroup all_reduce")
        out = torch.empty(6 * len(evens), device=dev)
        dist.all_gather_into_tensor(out, vals(rank).to(dev), group=sub)
        expect(out, torch.cat([vals(k) for k in evens]), "subgroup all_gather_into_tensor")
    dist.destroy_process_group(sub)
    torch.cuda.synchronize()


def sharding() -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

    pg = dist.group.WORLD
    every = [vals(k) for k in range(size)]
    mine = vals(rank).to(dev)
    expect(fc.all_reduce(mine, "sum", pg).wait(), sum(every), "functional all_reduce")
    expect(fc.all_gather_tensor(mine, 0, pg).wait(), torch.cat(every), "functional all_gather")
    mesh = init_device_mesh("cuda", (size,))
    a = torch.arange(8 * size, dtype=torch.float32).reshape(2 * size, 4)
    d = distribute_tensor(a.to(dev), mesh, [Shard(0)])
    expect(d.redistribute(mesh, [Replicate()]).to_local(), a, "DTensor Shard -> Replicate")

    torch.manual_seed(1234)  # the same start everywhere (FSDP2 does not broadcast)
    model = cnn()
    ref = reference(model, STEPS, size, LR)
    model = model.to(dev)
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train(model, STEPS, rank, LR, dev)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        if not isinstance(p, DTensor):
            raise AssertionError(f"{name} is not sharded by fully_shard")
        full = p.full_tensor().detach().cpu()
        if not torch.allclose(full, q.detach(), atol=1e-5, rtol=1e-4):
            raise AssertionError(f"rank {rank}: FSDP2 {name} is not the single-process "
                                 f"result: max diff {(full - q.detach()).abs().max().item()}")


def ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(1234 + rank)  # DDP broadcasts rank 0's parameters
    model = cnn().to(dev)
    torch.manual_seed(1234)
    ref = reference(cnn(), STEPS, size, LR)
    net = DDP(model, device_ids=[0], bucket_cap_mb=0.001)  # several buckets
    train(net, STEPS, rank, LR, dev)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        if not torch.allclose(p.detach().cpu(), q.detach(), atol=1e-5, rtol=1e-4):
            raise AssertionError(f"rank {rank}: DDP {name} is not the single-process result")


def mixed() -> None:
    t = vals(rank).to(dev) if rank == 0 else vals(rank)
    try:
        dist.all_reduce(t)
        torch.cuda.synchronize()
    except RuntimeError as exc:
        print(f"rank {rank}: mixed CPU/CUDA all_reduce raised: {type(exc).__name__}: "
              f"{str(exc)[:200]}", flush=True)
    else:
        raise AssertionError(f"rank {rank}: a CPU/CUDA mix across ranks did not raise")
    t = vals(rank).to(dev)  # the next call works
    dist.all_reduce(t)
    expect(t, sum(vals(k) for k in range(size)), "all_reduce after the mismatch")


for mode in sys.argv[1:]:
    {"collectives": collectives, "sharding": sharding, "ddp": ddp, "mixed": mixed}[mode]()
    print(f"OK {mode}", flush=True)
dist.destroy_process_group()

"""torch's sharding stack on the ddl backend, each mode against what it must compute:
functional collectives (groups by name), DTensor on a 1-D DeviceMesh, FSDP2 (fully_shard)
on a 1-D mesh, and HSDP (fully_shard on a 2-D replicate x shard mesh, 4 ranks). FSDP2's
parameters after N steps equal one process trained on the concatenated batches."""

import sys

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
from common import cnn, reference, train
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor

STEPS, LR = 4, 0.05
dist.init_process_group("ddl")
rank, size = dist.get_rank(), dist.get_world_size()
pg = dist.group.WORLD
assert dist.get_backend() == "ddl"
assert pg.group_name, "the ddl group has no name"
import ddl_torch  # noqa: E402 - after init: the check is on the group it made

assert ddl_torch.backend_impl(pg._get_backend(torch.device("cpu"))) is not None, \
    "the ddl group's backend is not ddl-torch's C++ Backend"


def expect(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.allclose(got, want):
        raise AssertionError(f"rank {rank}: {what}: got {got}, want {want}")


def functional() -> None:
    vals = [torch.arange(6, dtype=torch.float32) + 10 * k for k in range(size)]
    mine = vals[rank]
    expect(fc.all_reduce(mine, "sum", pg.group_name).wait(), sum(vals), "all_reduce")
    expect(fc.all_reduce(mine, "max", pg).wait(), torch.stack(vals).max(0).values,
           "all_reduce max")
    expect(fc.all_gather_single(mine, 0, pg).wait(), torch.cat(vals), "all_gather_single")
    full = torch.arange(4 * size, dtype=torch.float32) * (rank + 1)
    want = torch.arange(4 * size, dtype=torch.float32) * sum(range(1, size + 1))
    expect(fc.reduce_scatter_single(full, "sum", 0, pg).wait(),
           want[4 * rank:4 * rank + 4], "reduce_scatter_single")
    rows = torch.arange(2 * size, dtype=torch.float32) + 100 * rank
    got = fc.all_to_all_single(rows, None, None, pg).wait()
    expect(got, torch.cat([torch.arange(2 * rank, 2 * rank + 2, dtype=torch.float32) + 100 * k
                           for k in range(size)]), "all_to_all_single")
    expect(fc.broadcast(mine, 0, pg).wait(), vals[0], "broadcast")


def dtensor() -> None:
    mesh = init_device_mesh("cpu", (size,))
    a = torch.arange(8 * size, dtype=torch.float32).reshape(2 * size, 4)
    d = distribute_tensor(a, mesh, [Shard(0)])
    expect(d.to_local(), a[2 * rank:2 * rank + 2], "Shard(0) local part")
    expect(d.redistribute(mesh, [Replicate()]).to_local(), a, "Shard -> Replicate")
    w = distribute_tensor(torch.ones(4, 3), mesh, [Replicate()])
    expect((d @ w).full_tensor(), a @ torch.ones(4, 3), "DTensor matmul")
    expect(d.sum().full_tensor(), a.sum(), "DTensor sum (a partial reduced)")


def fsdp2(mesh_shape: tuple[int, ...], names: tuple[str, ...]) -> None:
    mesh = init_device_mesh("cpu", mesh_shape, mesh_dim_names=names)
    torch.manual_seed(1234)  # the same start everywhere (FSDP2 does not broadcast)
    model = cnn()
    ref = reference(model, STEPS, size, LR)
    for layer in (model[0], model[3]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train(model, STEPS, rank, LR)
    for (name, p), q in zip(model.named_parameters(), ref.parameters(), strict=True):
        if not isinstance(p, DTensor):
            raise AssertionError(f"{name} is not sharded by fully_shard")
        full = p.full_tensor().detach()
        if not torch.allclose(full, q.detach(), atol=1e-5, rtol=1e-4):
            raise AssertionError(f"rank {rank}: {name} is not the single-process result: max "
                                 f"diff {(full - q.detach()).abs().max().item()}")


for mode in sys.argv[1:]:
    if mode == "functional":
        functional()
    elif mode == "dtensor":
        dtensor()
    elif mode == "fsdp2":
        fsdp2((size,), ("shard",))
    elif mode == "hsdp":
        fsdp2((2, size // 2), ("replicate", "shard"))
    else:
        raise SystemExit(f"unknown mode {mode}")
    print(f"OK {mode}", flush=True)
dist.destroy_process_group()

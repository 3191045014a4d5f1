"""new_group(ranks, use_local_synchronization=True) on the ddl backend: only the members
call it, each with its own list (MPI_Comm_create_group underneath), while the other ranks
do something else; collectives and object collectives on each group are right.

With 3 ranks: ranks 0 and 1 make [0, 1]; rank 2 makes [2] alone; then every rank makes
[1, 2] or skips it, by membership; all of it in different orders on different ranks."""

import torch
import torch.distributed as dist

dist.init_process_group("ddl")
rank, size = dist.get_rank(), dist.get_world_size()
assert size == 3, size

if rank in (0, 1):
    g = dist.new_group([0, 1], use_local_synchronization=True)
    t = torch.tensor([float(rank + 1)])
    dist.all_reduce(t, group=g)
    assert t.item() == 3.0, t
    out = [None, None]
    dist.all_gather_object(out, {"rank": rank}, group=g)
    assert out == [{"rank": 0}, {"rank": 1}], out
    objs = [f"from {rank}"]
    dist.broadcast_object_list(objs, src=1, group=g)
    assert objs == ["from 1"], objs
else:
    alone = dist.new_group([2], use_local_synchronization=True)
    t = torch.tensor([5.0])
    dist.all_reduce(t, group=alone)
    assert t.item() == 5.0, t
if rank in (1, 2):
    h = dist.new_group([1, 2], use_local_synchronization=True)
    got = [None, None]
    dist.all_gather_object(got, rank * 10, group=h)
    assert got == [10, 20], got
    dist.barrier(group=h)
dist.barrier()
print("OK localsync", flush=True)
dist.destroy_process_group()

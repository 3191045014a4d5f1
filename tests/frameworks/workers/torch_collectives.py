"""Every torch.distributed collective on the ddl backend against what it must compute."""

import torch
import torch.distributed as dist

dist.init_process_group(init_method="ddl://", backend="ddl")
r, n = dist.get_rank(), dist.get_world_size()


def expect(got, want, what):
    if not torch.equal(got, want):
        raise AssertionError(f"rank {r}: {what}: got {got}, want {want}")


vals = [torch.arange(6, dtype=torch.float32) + 10 * k for k in range(n)]
OPS = [(dist.ReduceOp.SUM, lambda v: sum(v)),
       (dist.ReduceOp.MAX, lambda v: torch.stack(v).max(0).values),
       (dist.ReduceOp.MIN, lambda v: torch.stack(v).min(0).values),
       (dist.ReduceOp.AVG, lambda v: sum(v) / n),
       (dist.ReduceOp.PRODUCT, lambda v: torch.stack(v).prod(0))]
for op, fn in OPS:
    t = vals[r].clone()
    dist.all_reduce(t, op=op)
    expect(t, fn(vals), f"all_reduce {op}")

# bitwise ops: integer tensors (bool too), as gloo has them; refused for floats
ints = [torch.randint(-2**31, 2**31 - 1, (17,), dtype=torch.int64,
                      generator=torch.Generator().manual_seed(k)) for k in range(n)]
for op, fn in ((dist.ReduceOp.BAND, torch.bitwise_and), (dist.ReduceOp.BOR, torch.bitwise_or),
               (dist.ReduceOp.BXOR, torch.bitwise_xor)):
    for dtype in (torch.int64, torch.int32, torch.uint8, torch.int8):
        t = ints[r].to(dtype).clone()  # (.to() of the same dtype is the tensor itself)
        want = ints[0].to(dtype)
        for k in range(1, n):
            want = fn(want, ints[k].to(dtype))
        dist.all_reduce(t, op=op)
        expect(t, want, f"all_reduce {op} {dtype}")
    bools = [torch.tensor([k == 0, True, False, k % 2 == 1]) for k in range(n)]
    bt = bools[r].clone()
    bwant = bools[0]
    for k in range(1, n):
        bwant = fn(bwant, bools[k])
    dist.all_reduce(bt, op=op)
    expect(bt, bwant, f"all_reduce {op} bool")
    try:
        dist.all_reduce(torch.ones(3), op=op)
    except Exception as exc:  # noqa: BLE001
        assert "integer dtypes" in str(exc), exc
    else:
        raise AssertionError(f"{op} of a float tensor was accepted")

# dtypes libddl lacks, and a non-contiguous view
b = torch.tensor([r == 0, False, True])
dist.all_reduce(b)
expect(b, torch.tensor([True, False, True]), "bool all_reduce (or)")
i16 = torch.full((3,), r + 1, dtype=torch.int16)
dist.all_reduce(i16)
expect(i16, torch.full((3,), sum(range(1, n + 1)), dtype=torch.int16), "int16 all_reduce")
m = torch.arange(12, dtype=torch.float64).reshape(3, 4) * (r + 1)
col = m[:, 1]  # strided view: reduced through a copy and written back
dist.all_reduce(col)
expect(m[:, 1], torch.tensor([1.0, 5.0, 9.0], dtype=torch.float64) * sum(range(1, n + 1)),
       "strided all_reduce")

# async work and futures
t = torch.ones(1000) * r
w = dist.all_reduce(t, async_op=True)
fut = w.get_future()
w.wait()
assert fut.done()
expect(t, torch.full((1000,), float(sum(range(n)))), "async all_reduce")

bc = torch.arange(5) if r == 1 else torch.zeros(5, dtype=torch.int64)
dist.broadcast(bc, src=1)
expect(bc, torch.arange(5), "broadcast")

outs = [torch.empty(2, 3) for _ in range(n)]
dist.all_gather(outs, torch.full((2, 3), float(r)))
for k in range(n):
    expect(outs[k], torch.full((2, 3), float(k)), "all_gather")
big = torch.empty(n * 4, dtype=torch.bfloat16)
dist.all_gather_into_tensor(big, torch.full((4,), float(r), dtype=torch.bfloat16))
expect(big, torch.arange(n).repeat_interleave(4).to(torch.bfloat16), "all_gather_into_tensor")

rs = torch.empty(3)
dist.reduce_scatter_tensor(rs, torch.arange(3 * n, dtype=torch.float32) * (r + 1))
want = torch.arange(3 * n, dtype=torch.float32)[3 * r: 3 * r + 3] * sum(range(1, n + 1))
expect(rs, want, "reduce_scatter_tensor")

a2a_in = torch.arange(n * 2, dtype=torch.float32) + 100 * r
a2a_out = torch.empty(n * 2)
dist.all_to_all_single(a2a_out, a2a_in)
expect(a2a_out, torch.cat([torch.arange(2 * r, 2 * r + 2, dtype=torch.float32) + 100 * k
                          for k in range(n)]), "all_to_all_single")

# uneven splits of 2-D rows (rank q sends q + j + 1 rows to rank j), and the list form
def rows(q, j):
    return torch.full((q + j + 1, 3), float(10 * q + j), dtype=torch.float64)


a2a_in = torch.cat([rows(r, j) for j in range(n)])
a2a_out = torch.empty((sum(q + r + 1 for q in range(n)), 3), dtype=torch.float64)
dist.all_to_all_single(a2a_out, a2a_in, output_split_sizes=[q + r + 1 for q in range(n)],
                       input_split_sizes=[r + j + 1 for j in range(n)])
expect(a2a_out, torch.cat([rows(q, r) for q in range(n)]), "all_to_all_single uneven")
outs = [torch.empty(q + r + 1, dtype=torch.int32) for q in range(n)]
dist.all_to_all(outs, [torch.full((r + j + 1,), 10 * r + j, dtype=torch.int32)
                       for j in range(n)])
for q in range(n):
    expect(outs[q], torch.full((q + r + 1,), 10 * q + r, dtype=torch.int32), "all_to_all")

if r == 0:
    sc = [torch.full((2,), float(k + 7)) for k in range(n)]
else:
    sc = None
got = torch.empty(2)
dist.scatter(got, sc, src=0)
expect(got, torch.full((2,), float(r + 7)), "scatter")
gl = [torch.empty(2) for _ in range(n)] if r == 0 else None
dist.gather(torch.full((2,), float(r)), gl, dst=0)
if r == 0:
    for k in range(n):
        expect(gl[k], torch.full((2,), float(k)), "gather")

objs = [None] * n
dist.all_gather_object(objs, {"rank": r, "s": "x" * (r + 1)})
assert objs == [{"rank": k, "s": "x" * (k + 1)} for k in range(n)], objs
lst = [{"cfg": 42}] if r == 0 else [None]
dist.broadcast_object_list(lst, src=0)
assert lst == [{"cfg": 42}]
dist.barrier()

# a ddl group of a subset of ranks (a libddl communicator): here a one-rank group
solo = dist.new_group([0], backend="ddl")
if r == 0:
    t = torch.full((3,), 5.0)
    dist.all_reduce(t, group=solo)
    expect(t, torch.full((3,), 5.0), "one-rank group all_reduce")
else:
    assert solo == dist.GroupMember.NON_GROUP_MEMBER, solo

print("OK collectives", flush=True)
dist.destroy_process_group()

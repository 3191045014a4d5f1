"""A blocking collective does not wait out the fusion cycle; async ones still fuse.

Run with DDL_CYCLE_TIME_MS=200: a blocking 4 KiB all_reduce that waited for the cycle
would take >= 200 ms; one that hurries the progress thread takes a small message's time.
Twenty async_op=True all_reduces submitted back to back, then waited, must still be
fused into fewer batches than requests, with the right sums. A blocking all_reduce after
an async one on the same tensor, not waited for, sees its result (the group's order).
"""

import statistics
import time

import torch
import torch.distributed as dist

import ddl_core

dist.init_process_group("ddl")
rank, size = dist.get_rank(), dist.get_world_size()
t = torch.full((1024,), float(rank + 1))
times = []
for _ in range(10):
    t.fill_(rank + 1)
    dist.barrier()
    t0 = time.perf_counter()
    dist.all_reduce(t)
    times.append(time.perf_counter() - t0)
    assert torch.all(t == size * (size + 1) / 2), t[:4]
median = statistics.median(times)
assert median < 0.1, f"blocking all_reduce took {median * 1e3:.1f} ms (the cycle is 200 ms)"
print("OK blocking", f"{median * 1e3:.2f} ms", flush=True)

before = ddl_core.async_stats()
ts = [torch.full((256,), float(rank + i)) for i in range(20)]
works = [dist.all_reduce(x, async_op=True) for x in ts]
for w in works:
    w.wait()
for i, x in enumerate(ts):
    want = sum(r + i for r in range(size))
    assert torch.all(x == want), (i, x[:4], want)
after = ddl_core.async_stats()
fused = after["fused_requests"] - before["fused_requests"]
assert fused >= 2, (before, after)
print("OK fused", fused, flush=True)

# A blocking all_reduce (run on the calling thread) right after an async one on the same
# tensor, not waited for: it goes after it, as torch orders a group's operations.
# x = rank + 1 -> sum (async) -> max of equal sums (blocking) = the sum; the other order
# would give max then sum = size * size. (One async op on x: libddl's fusion reads a
# buffer queued twice in one batch once.)
x = torch.full((512,), float(rank + 1))
pending = [dist.all_reduce(torch.ones(8), async_op=True), dist.all_reduce(x, async_op=True)]
dist.all_reduce(x, op=dist.ReduceOp.MAX)
want = sum(r + 1 for r in range(size))
assert torch.all(x == want), (x[:4], want)
assert all(w.is_completed() for w in pending)
print("OK ordered", flush=True)
dist.destroy_process_group()

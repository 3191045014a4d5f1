"""Print the cost model's plan for a few sizes and level 0's alpha/beta (rank 0)."""

import ddl_core as ddl

ddl.init()
if ddl.rank() == 0:
    for nbytes in (8, 4096, 1 << 20, 64 << 20):
        algos, t = ddl.plan(nbytes)
        print(nbytes, algos, f"{t:.3e}", flush=True)
    a, b = ddl._ddl.get_level_cost(0)
    print(f"cost0 {a!r} {b!r}", flush=True)

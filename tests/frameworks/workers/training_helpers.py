"""The communicating training helpers on 2 ranks: global_mean over uneven shards and
disjoint shards covering the data."""

import numpy as np
from ddl_core.training import global_mean, shard_indices

import ddl_core

ddl_core.init()
r, n = ddl_core.rank(), ddl_core.size()
values = np.arange(11, dtype=np.float64)  # 11 samples: uneven over 2 ranks
mine = shard_indices(len(values), r, n, shuffle=True, seed=3, epoch=1)
everyone = ddl_core.allgather(np.array([len(mine)], dtype=np.int64))
gathered = ddl_core.allgather(np.pad(mine, (0, int(everyone.max()) - len(mine)),
                                     constant_values=-1).astype(np.int64))
got = np.sort(gathered[gathered >= 0])
assert np.array_equal(got, np.arange(11)), got  # disjoint and complete
m = global_mean(values[mine].sum(), len(mine))
assert abs(m - values.mean()) < 1e-12, m
# the mean of per-rank means would be wrong here; the helper must not compute that
per_rank = ddl_core.allreduce(np.array([values[mine].mean()]), op="avg")[0]
assert n == 1 or abs(per_rank - values.mean()) > 1e-9
print("OK helpers", flush=True)

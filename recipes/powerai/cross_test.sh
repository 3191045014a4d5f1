#!/bin/bash
# Run by ci for a cross-built powerai (linux-ppc64le, linux-aarch64): $PREFIX is powerai
# installed for the target from the channels, as a user there gets it (on linux-aarch64
# the CUDA build, as on a Grace Hopper node). Under qemu-user ($CROSS_RUN, $CROSS_MPIRUN:
# ci/src/ci/sysroot.py), with the sysroot's Open MPI as the site's MPI: python starts and
# imports the set, the CLIs answer, the env holds one libddl, and 2 ranks under the
# target's mpirun allreduce with ddl and with mpi4py. Where powerai pins the frameworks
# (linux-aarch64): torch, tensorflow and the companions import and compute, and 2 ranks
# take one DDP training step on the ddl backend.
set -euo pipefail
py=$PREFIX/bin/python3.11
test "$(find "$PREFIX" -name 'libddl.so*' -type f | wc -l)" = 1
"$CROSS_RUN" "$py" -c '
import platform
import ddl_core, horovod, mpi4py, numpy, envtools
print("imports", platform.machine(), "ok")'
"$CROSS_RUN" "$py" "$PREFIX/bin/envtools" --help | head -2
"$CROSS_RUN" "$py" "$PREFIX/bin/ddlrun" --help | head -2
cat > allreduce.py <<'PY'
import platform
import numpy as np
from mpi4py import MPI
import ddl_core as ddl
ddl.init()
n, r = ddl.size(), ddl.rank()
y = ddl.allreduce(np.full(4096, r + 1, np.float64))
assert (y == n * (n + 1) / 2).all(), y[:4]
assert MPI.COMM_WORLD.allreduce(r + 1) == n * (n + 1) // 2
print(f"powerai {r}/{n} {platform.machine()} ok")
PY
out=$("$CROSS_MPIRUN" -n 2 "$CROSS_RUN" "$py" "$PWD/allreduce.py" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
# (two ranks' lines can arrive joined: count the matches, not the lines)
test "$(echo "$out" | grep -Eo "[01]/2 [a-z0-9_]+ ok" | sort -u | wc -l)" = 2

sp=$(ls -d "$PREFIX"/lib/python3.*/site-packages)
[[ -d "$sp/torch" ]] || { echo "no frameworks pinned for $target_platform"; exit 0; }
"$CROSS_RUN" "$py" -c '
import platform
import h5py, keras, sklearn, xgboost
import tensorflow as tf
import torch
assert torch.ones(2).sum().item() == 2
assert int(tf.reduce_sum(tf.ones([3]))) == 3
print("frameworks", platform.machine(), torch.__version__, tf.__version__, "ok")'
cat > ddp.py <<'PY'
import platform
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("ddl")
r, n = dist.get_rank(), dist.get_world_size()
torch.manual_seed(r)  # different data and initial weights per rank: DDP must agree them
model = DDP(torch.nn.Linear(8, 2))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(4, 8), torch.randn(4, 2)
torch.nn.functional.mse_loss(model(x), y).backward()
opt.step()
w = model.module.weight.detach().clone()
ws = [torch.empty_like(w) for _ in range(n)]
dist.all_gather(ws, w)
assert all(torch.equal(ws[0], v) for v in ws), "ranks diverged after the DDP step"
print(f"ddp {r}/{n} {platform.machine()} ok")
dist.destroy_process_group()
PY
out=$("$CROSS_MPIRUN" -n 2 "$CROSS_RUN" "$py" "$PWD/ddp.py" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
test "$(echo "$out" | grep -Eo "ddp [01]/2 [a-z0-9_]+ ok" | sort -u | wc -l)" = 2

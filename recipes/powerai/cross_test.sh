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
# one DDP step on the ddl backend: pytorch-ddl's own recipe test, run here under qemu
out=$("$CROSS_MPIRUN" -n 2 "$CROSS_RUN" "$py" "$RECIPE_DIR/../pytorch-ddl/test_ddp.py" 2>&1) \
    || { echo "$out"; exit 1; }
echo "$out"
test "$(echo "$out" | grep -Eo "pytorch-ddl OK [01]" | sort -u | wc -l)" = 2

#!/bin/bash
# Run by ci for a cross-built powerai (linux-ppc64le): $PREFIX is powerai installed for the
# target from the channels, as a Power user gets it. Under qemu-user ($CROSS_RUN,
# $CROSS_MPIRUN: ci/src/ci/sysroot.py), with the sysroot's Open MPI as the site's MPI:
# python starts and imports the set, the CLIs answer, the env holds one libddl, and 2 ranks
# under the target's mpirun allreduce with ddl and with mpi4py.
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

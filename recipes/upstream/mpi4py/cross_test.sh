#!/bin/bash
# Run by ci for a cross-built mpi4py: $PREFIX is an env for the target holding it and
# python; the sysroot's Open MPI plays the site's. One rank, then 2 ranks under the
# target's mpirun, all under qemu-user ($CROSS_RUN, $CROSS_MPIRUN: ci/src/ci/sysroot.py).
set -euo pipefail
cat > allreduce.py <<'PY'
import platform
from mpi4py import MPI
c = MPI.COMM_WORLD
total = c.allreduce(c.Get_rank() + 1)
assert total == c.Get_size() * (c.Get_size() + 1) // 2, total
print(f"mpi4py {c.Get_rank()}/{c.Get_size()} {platform.machine()} ok")
PY
out=$("$CROSS_RUN" "$PREFIX/bin/python3.11" allreduce.py 2>&1) || { echo "$out"; exit 1; }
echo "$out"
echo "$out" | grep -q "0/1 .* ok$"
out=$("$CROSS_MPIRUN" -n 2 "$CROSS_RUN" "$PREFIX/bin/python3.11" "$PWD/allreduce.py" 2>&1) \
    || { echo "$out"; exit 1; }
echo "$out"
# (two ranks' lines can arrive joined: count the matches, not the lines)
test "$(echo "$out" | grep -Eo "[01]/2 [a-z0-9_]+ ok" | sort -u | wc -l)" = 2

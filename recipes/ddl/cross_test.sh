#!/bin/bash
# Run by ci for a cross-built ddl: $PREFIX is an env for the target holding it and its run
# dependencies (python, numpy, libddl); the sysroot's Open MPI plays the site's (the
# `external` MPI). Under qemu-user ($CROSS_RUN, $CROSS_MPIRUN: ci/src/ci/sysroot.py):
# ddl_core imports and loads the env's one libddl, ddlrun answers, and 2 ranks under the
# target's mpirun allreduce with ddl.
set -euo pipefail
py=$PREFIX/bin/python3.11
test "$(find "$PREFIX" -name 'libddl.so*' -type f | wc -l)" = 1
cat > check.py <<'PY'
import os, platform, sys
import numpy as np
import ddl_core as ddl
maps = open("/proc/self/maps").read()
assert os.path.realpath(os.environ["PREFIX"] + "/lib/libddl.so.1") in maps, "libddl not the env's"
ddl.init()
x = np.full(1000, ddl.rank() + 1, np.float32)
y = ddl.allreduce(x)
n = ddl.size()
assert (y == n * (n + 1) / 2).all(), y[:4]
print(f"ddl {ddl.rank()}/{n} {platform.machine()} ok")
PY
out=$("$CROSS_RUN" "$py" check.py 2>&1) || { echo "$out"; exit 1; }
echo "$out"
echo "$out" | grep -q "0/1 .* ok$"
"$CROSS_RUN" "$py" "$PREFIX/bin/ddlrun" --help | head -3
out=$("$CROSS_MPIRUN" -n 2 "$CROSS_RUN" "$py" "$PWD/check.py" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
# (two ranks' lines can arrive joined: count the matches, not the lines)
test "$(echo "$out" | grep -Eo "[01]/2 [a-z0-9_]+ ok" | sort -u | wc -l)" = 2

#!/bin/bash
# Run by ci for a cross-built libddl (linux-ppc64le, linux-aarch64; $PREFIX = an env for
# the target holding it): compile test_allreduce.c with the cross compiler against it and
# its MPI (the sysroot's for external, the env's Open MPI for openmpi), then run it under
# qemu-user: 1 rank, then 2 ranks under the target's mpirun ($CROSS_RUN, $CROSS_MPIRUN:
# see ci/src/ci/sysroot.py).
set -euo pipefail
lib="$DDLCE_SYSROOT/usr/lib/$CROSS_TRIPLE"
lib2="$DDLCE_SYSROOT/lib/$CROSS_TRIPLE"
mpi=(-L"$lib/openmpi/lib" -L"$lib")
if [[ -e "$PREFIX/include/mpi.h" ]]; then   # mpi=openmpi: the env's own Open MPI
    mpi=(-Wl,-rpath-link,"$PREFIX/lib/openmpi")
fi
"$CROSS_TRIPLE-gcc" -I"$PREFIX/include" "$RECIPE_DIR/test_allreduce.c" -L"$PREFIX/lib" -lddl \
    "${mpi[@]}" -Wl,-rpath-link,"$lib:$lib2" -lmpi -o test_allreduce
file test_allreduce | grep -Eq "PowerPC|ARM aarch64"
out=$("$CROSS_RUN" ./test_allreduce 2>&1) || { echo "$out"; exit 1; }
echo "$out"
echo "$out" | grep -q "libddl allreduce ok (size 1)"
out=$("$CROSS_MPIRUN" -n 2 "$CROSS_RUN" "$PWD/test_allreduce" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
# (two ranks' lines can arrive joined: count the matches, not the lines)
test "$(echo "$out" | grep -o "libddl allreduce ok (size 2)" | wc -l)" = 2

#!/bin/bash
# Run by ci for a cross-built libddl (linux-ppc64le): compile test_allreduce.c with the
# cross compiler against the built package ($PREFIX = the unpacked .conda) and the
# sysroot's MPI, then run it under qemu-user: a 1-rank init + allreduce + finalize.
set -euo pipefail
triplet=powerpc64le-linux-gnu
lib="$DDLCE_SYSROOT/usr/lib/$triplet"
lib2="$DDLCE_SYSROOT/lib/$triplet"
"$triplet-gcc" -I"$PREFIX/include" "$RECIPE_DIR/test_allreduce.c" -L"$PREFIX/lib" -lddl \
    -L"$lib/openmpi/lib" -L"$lib" -Wl,-rpath-link,"$lib:$lib2" -lmpi -o test_allreduce
file test_allreduce | grep -q "PowerPC"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$(qemu-ppc64le -L "/usr/$triplet" \
    -E LD_LIBRARY_PATH="$PREFIX/lib:$lib:$lib2:/usr/$triplet/lib" \
    -E OPAL_PREFIX="$DDLCE_SYSROOT/usr" ./test_allreduce 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep "libddl allreduce ok (size 1)"

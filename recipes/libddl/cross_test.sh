#!/bin/bash
# Run by ci for a cross-built libddl (linux-ppc64le, linux-aarch64): compile
# test_allreduce.c with the cross compiler against the built package ($PREFIX = the
# unpacked .conda) and the sysroot's MPI, then run it under qemu-user: a 1-rank init +
# allreduce + finalize.
set -euo pipefail
case "$target_platform" in
    linux-ppc64le) triplet=powerpc64le-linux-gnu qemu=qemu-ppc64le machine=PowerPC ;;
    linux-aarch64) triplet=aarch64-linux-gnu qemu=qemu-aarch64 machine=aarch64 ;;
    *) echo "no emulator known for $target_platform" >&2; exit 1 ;;
esac
lib="$DDLCE_SYSROOT/usr/lib/$triplet"
lib2="$DDLCE_SYSROOT/lib/$triplet"
"$triplet-gcc" -I"$PREFIX/include" "$RECIPE_DIR/test_allreduce.c" -L"$PREFIX/lib" -lddl \
    -L"$lib/openmpi/lib" -L"$lib" -Wl,-rpath-link,"$lib:$lib2" -lmpi -o test_allreduce
file test_allreduce | grep -q "$machine"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=$("$qemu" -L "/usr/$triplet" \
    -E LD_LIBRARY_PATH="$PREFIX/lib:$lib:$lib2:/usr/$triplet/lib" \
    -E OPAL_PREFIX="$DDLCE_SYSROOT/usr" ./test_allreduce 2>&1) || { echo "$out"; exit 1; }
echo "$out" | grep "libddl allreduce ok (size 1)"

#!/bin/bash
# libddl without CMake or Python, so the same script builds natively and cross.
# Compiler: the build host's gcc, or Debian's cross gcc for linux-ppc64le (conda-forge's
# compiler packages are not reachable offline).
set -euxo pipefail
SOURCES=$(ls csrc/*.c | grep -v pymodule.c)
CFLAGS_DDL="-O3 -fPIC -std=c11 -D_GNU_SOURCE -D_POSIX_C_SOURCE=200809L -Icsrc/include -Icsrc"
if [[ "${target_platform}" != "${build_platform}" ]]; then
    case "${target_platform}" in
        linux-ppc64le) triplet=powerpc64le-linux-gnu ;;
        *) echo "no cross compiler known for ${target_platform}" >&2; exit 1 ;;
    esac
    : "${DDLCE_SYSROOT:?cross build needs DDLCE_SYSROOT (a Debian sysroot with MPI; ci sets it)}"
    lib="$DDLCE_SYSROOT/usr/lib/$triplet"
    CC="$triplet-gcc"
    MPI_FLAGS="-I$lib/openmpi/include -L$lib/openmpi/lib -L$lib -Wl,-rpath-link,$lib:$DDLCE_SYSROOT/lib/$triplet -lmpi"
else
    CC="$PREFIX/bin/mpicc"   # wraps the host gcc with the host-env MPI's flags
    MPI_FLAGS=""
fi
mkdir -p "$PREFIX/lib" "$PREFIX/include"
# shellcheck disable=SC2086
$CC $CFLAGS_DDL -shared -Wl,-soname,libddl.so.1 -o "$PREFIX/lib/libddl.so.${PKG_VERSION}" \
    $SOURCES $MPI_FLAGS -lm -lpthread
ln -sf "libddl.so.${PKG_VERSION}" "$PREFIX/lib/libddl.so.1"
ln -sf libddl.so.1 "$PREFIX/lib/libddl.so"
cp csrc/include/ddl.h "$PREFIX/include/ddl.h"

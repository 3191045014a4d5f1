#!/bin/bash
# libddl with ddl_core's CMakeLists.txt, the one build of the library: natively with the
# host env's MPI wrapper, or cross with the target's toolchain file (cmake/toolchain-<triple>.cmake:
# Debian's cross gcc and the target MPI from the sysroot ci makes, $DDLCE_SYSROOT, or for
# mpi=openmpi the host env's Open MPI package for the target).
# Compiler: the build host's gcc (conda-forge's compiler packages are not reachable offline).
set -euxo pipefail
exec > >(tee -a build.log) 2>&1   # kept in the work dir: ci shows it when a cross build fails
args=(-G Ninja -S . -B build -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PREFIX"
      -DCMAKE_INSTALL_LIBDIR=lib -DCMAKE_INSTALL_INCLUDEDIR=include -DDDL_PYTHON=OFF)
if [[ "${target_platform}" != "${build_platform}" ]]; then
    case "${target_platform}" in
        linux-ppc64le) triple=powerpc64le-linux-gnu ;;
        linux-aarch64) triple=aarch64-linux-gnu ;;
        *) echo "no cross toolchain known for ${target_platform} (cmake/toolchain-*.cmake)" >&2; exit 1 ;;
    esac
    : "${DDLCE_SYSROOT:?cross build needs DDLCE_SYSROOT (a Debian sysroot with MPI; ci sets it)}"
    args+=(-DCMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-${triple}.cmake")
    if [[ -e "$PREFIX/include/mpi.h" ]]; then   # mpi=openmpi: the host env's, for the target
        args+=(-DDDL_MPI_INCLUDE_DIR="$PREFIX/include" -DDDL_MPI_LIBRARY="$PREFIX/lib/libmpi.so")
    fi
else
    args+=(-DMPI_C_COMPILER="$PREFIX/bin/mpicc")   # the host env's MPI (openmpi or mpich)
fi
cmake "${args[@]}"
cmake --build build --parallel "${CPU_COUNT:-2}"
cmake --install build

#!/bin/bash
# Compiler: the build host's gcc (conda-forge compilers are not reachable offline).
# MPI: mpicc from the host environment's openmpi/mpich package.
set -euxo pipefail
export CC=${CC:-gcc}
export MPICC="$PREFIX/bin/mpicc"
"$PYTHON" -m pip install . --no-deps --no-build-isolation --no-compile -v
mkdir -p "$PREFIX/include"
cp csrc/include/ddl.h "$PREFIX/include/ddl.h"
# C consumers find libddl the usual way ($PREFIX/lib, $PREFIX/include); the file itself
# lives beside the Python extension, which finds it through $ORIGIN.
mkdir -p "$PREFIX/lib"
lib=$(cd "$SP_DIR/ddl_core" && ls libddl.so.* | sort | tail -1)
ln -sf "../lib/python${PY_VER}/site-packages/ddl_core/$lib" "$PREFIX/lib/$lib"
ln -sf "$lib" "$PREFIX/lib/libddl.so"

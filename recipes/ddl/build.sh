#!/bin/bash
# Compiler: the build host's gcc (conda-forge compilers are not reachable offline).
# MPI: mpicc from the host environment's openmpi/mpich package.
set -euxo pipefail
export CC=${CC:-gcc}
export MPICC="$PREFIX/bin/mpicc"
"$PYTHON" -m pip install . --no-deps --no-build-isolation --no-compile -v

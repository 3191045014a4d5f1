#!/bin/bash
# Compilers: the build host's (Debian's cross gcc for a cross build); see recipe.yaml.
set -euxo pipefail
if [[ "${target_platform}" != "${build_platform}" ]]; then
    source "$SRC_DIR/cross/python-ext.sh"
    # setuptools on the build python with the target's sysconfig; the target's Python.h
    # first (the build python's own include dir comes later on the command line)
    MPICC=$CROSS_DIR/mpicc CFLAGS="-I$PREFIX/include/python$PY_VER" \
        cross_python -m pip wheel --no-deps --no-build-isolation -w dist .
    install_wheel dist/mpi4py-*.whl
else
    "$PYTHON" -m pip install --no-deps --no-build-isolation .
fi

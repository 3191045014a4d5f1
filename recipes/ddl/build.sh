#!/bin/bash
# Compiler: the build host's gcc (conda-forge compilers are not reachable offline).
# libddl: the libddl package's, already in the host prefix (DDL_LIBDDL=installed): only the
# extension is built, linked to $PREFIX/lib/libddl.so.1 and finding it at run time through
# its RUNPATH ($ORIGIN/../../..), so an env holds exactly one libddl.
# Cross (linux-ppc64le, linux-aarch64): scikit-build-core on the build python with the
# target's sysconfig (cross/python-ext.sh), CMake with the target's toolchain file, the
# target's Python.h and extension suffix; the wheel is then installed into $PREFIX.
set -euxo pipefail
export CC=${CC:-gcc}
args=(--config-settings=cmake.define.DDL_LIBDDL=installed
      --config-settings=cmake.define.CMAKE_PREFIX_PATH="$PREFIX")
if [[ "${target_platform}" != "${build_platform}" ]]; then
    source "$SRC_DIR/cross/python-ext.sh"
    cross_python -m pip wheel . --no-deps --no-build-isolation -w dist -v "${args[@]}" \
        --config-settings=cmake.define.CMAKE_TOOLCHAIN_FILE="$PWD/cmake/toolchain-$CROSS_TRIPLE.cmake" \
        --config-settings=cmake.define.DDL_LIBRARY="$PREFIX/lib/libddl.so" \
        --config-settings=cmake.define.DDL_INCLUDE_DIR="$PREFIX/include" \
        --config-settings=cmake.define.Python_INCLUDE_DIR="$PREFIX/include/python$PY_VER" \
        --config-settings=cmake.define.Python_SOABI="$CROSS_SOABI"
    install_wheel dist/ddl_core-*.whl
    compile_python=$BUILD_PYTHON   # the same Python version: the same bytecode
else
    "$PYTHON" -m pip install . --no-deps --no-build-isolation --no-compile -v "${args[@]}"
    compile_python=$PYTHON
fi
# Hash-based pycs (PEP 552, checked-hash): valid whatever mtimes the archive and the
# installer give the sources, so Python never recompiles them for a user of a shared
# read-only env, nor rewrites them when root imports ddl_core (rattler-build compiles only
# the .py files that have no .pyc yet, with timestamps that go stale at install).
sp=$(ls -d "$PREFIX"/lib/python3.*/site-packages)
"$compile_python" - "$sp" <<'PY'
import py_compile
import sys
from pathlib import Path

site = Path(sys.argv[1])
dist = next(site.glob("ddl_core-*.dist-info"))
for line in (dist / "RECORD").read_text().splitlines():
    f = site / line.split(",")[0]
    if f.suffix == ".py" and f.exists():
        py_compile.compile(str(f), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
PY

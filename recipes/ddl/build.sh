#!/bin/bash
# Compiler: the build host's gcc (conda-forge compilers are not reachable offline).
# libddl: the libddl package's, already in the host prefix (DDL_LIBDDL=installed): only the
# extension is built, linked to $PREFIX/lib/libddl.so.1 and finding it at run time through
# its RUNPATH ($ORIGIN/../../..), so an env holds exactly one libddl.
set -euxo pipefail
export CC=${CC:-gcc}
"$PYTHON" -m pip install . --no-deps --no-build-isolation --no-compile -v \
    --config-settings=cmake.define.DDL_LIBDDL=installed \
    --config-settings=cmake.define.CMAKE_PREFIX_PATH="$PREFIX"
# Hash-based pycs (PEP 552, checked-hash): valid whatever mtimes the archive and the
# installer give the sources, so Python never recompiles them for a user of a shared
# read-only env, nor rewrites them when root imports ddl_core (rattler-build compiles only
# the .py files that have no .pyc yet, with timestamps that go stale at install).
"$PYTHON" - <<'PY'
import importlib.metadata as md
import py_compile

dist = md.distribution("ddl_core")
for f in dist.files or ():
    if f.suffix == ".py":
        py_compile.compile(str(f.locate()), doraise=True,
                           invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
PY

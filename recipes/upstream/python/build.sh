#!/bin/bash
# Build with the build host's gcc: conda-forge's compiler packages are not reachable offline.
set -euxo pipefail
export CC=${CC:-gcc}
./configure --prefix="$PREFIX" --without-ensurepip --disable-test-modules --with-system-ffi \
    >configure.log 2>&1 || { tail -50 configure.log; exit 1; }
make -j"${CPU_COUNT:-2}" >make.log 2>&1 || { tail -80 make.log; exit 1; }
make install >install.log 2>&1 || { tail -50 install.log; exit 1; }
ln -sf python3 "$PREFIX/bin/python"
ln -sf pydoc3 "$PREFIX/bin/pydoc"
# not needed at run time and large: the test suite leftovers, idle, tkinter demos, static lib
rm -rf "$PREFIX/lib/python3.11/idlelib" "$PREFIX/lib/python3.11/tkinter" "$PREFIX/lib/python3.11/turtledemo"
# (make install puts the static lib in lib/ as well as in config-3.11-*/: both go; nothing
# in the channel embeds python, and each clone relocated its 48 MB for nothing)
rm -f "$PREFIX/lib/libpython3.11.a"
find "$PREFIX/lib/python3.11/config-3.11-"* -name 'libpython3.11.a' -delete || true
# CPython's default flags carry -g: 17.5 of bin/python3.11's 24 MB are debug info, written
# again (relocated) by every install and clone. Ship it, and the extension modules,
# without, as distributions do (strip --strip-debug keeps the symbol table for tracebacks
# of native frames).
strip --strip-debug "$PREFIX/bin/python3.11" "$PREFIX/lib/python3.11/lib-dynload/"*.so
# keep the stdlib .pyc files: a shared read-only install can never write them later;
# but not those of sources that hold the build prefix (_sysconfigdata, python-config.py):
# conda rewrites such a source for its prefix and the installer compiles it again, so the
# shipped bytecode is stale everywhere and would pin its __pycache__ to the package cache
{ grep -rlF --include='*.py' "$PREFIX" "$PREFIX/lib/python3.11" || true; } | while read -r src; do
    stem=$(basename "$src" .py)
    rm -f "$(dirname "$src")/__pycache__/$stem".cpython-311*.pyc
done

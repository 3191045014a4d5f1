#!/bin/bash
# Build with the build host's gcc: conda-forge's compiler packages are not reachable offline.
# Cross (target_platform != build_platform): Debian's cross gcc, the target's libraries
# (libffi, zlib, bz2, lzma, ssl, sqlite) from the sysroot ci makes ($DDLCE_SYSROOT), and
# this host's python3.11 as the build python CPython's cross build needs (same 3.11).
set -euxo pipefail
args=(--prefix="$PREFIX" --without-ensurepip --disable-test-modules --with-system-ffi)
if [[ "${target_platform}" != "${build_platform}" ]]; then
    case "${target_platform}" in
        linux-ppc64le) triple=powerpc64le-linux-gnu ;;
        linux-aarch64) triple=aarch64-linux-gnu ;;
        *) echo "no cross toolchain known for ${target_platform}" >&2; exit 1 ;;
    esac
    : "${DDLCE_SYSROOT:?a cross build needs DDLCE_SYSROOT (a Debian sysroot; ci sets it)}"
    build_python=$(command -v python3.11) && "$build_python" -c 'import sys; assert sys.version_info[:2] == (3, 11)' \
        || { echo "a cross build needs python3.11 on the build host (apt-get install python3.11)" >&2; exit 1; }
    S=$DDLCE_SYSROOT
    # what configure cannot run on the build host to find out
    printf '%s\n' ac_cv_file__dev_ptmx=yes ac_cv_file__dev_ptc=no ac_cv_buggy_getaddrinfo=no \
        > config.site
    export CONFIG_SITE=$PWD/config.site
    export CC=$triple-gcc CXX=$triple-g++ AR=$triple-ar RANLIB=$triple-ranlib READELF=$triple-readelf
    export CPPFLAGS="-I$S/usr/include -I$S/usr/include/$triple"
    export LDFLAGS="-L$S/usr/lib/$triple -L$S/lib/$triple -Wl,-rpath-link,$S/usr/lib/$triple:$S/lib/$triple"
    export PKG_CONFIG_LIBDIR=$S/usr/lib/$triple/pkgconfig:$S/usr/share/pkgconfig PKG_CONFIG_SYSROOT_DIR=$S
    args+=(--host="$triple" --build="$(uname -m)-linux-gnu" --with-build-python="$build_python")
else
    export CC=${CC:-gcc}
fi
./configure "${args[@]}" >configure.log 2>&1 || { tail -50 configure.log; exit 1; }
if [[ -n "${triple:-}" ]]; then
    # Debian keeps ffi.h in the multiarch include folder, where setup.py does not look
    # (without this _ctypes is built but not linked to libffi)
    sed -i "s|^LIBFFI_INCLUDEDIR=.*|LIBFFI_INCLUDEDIR=\t$S/usr/include/$triple|" Makefile
fi
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
"${triple:+$triple-}strip" --strip-debug "$PREFIX/bin/python3.11" "$PREFIX/lib/python3.11/lib-dynload/"*.so
# keep the stdlib .pyc files: a shared read-only install can never write them later;
# but not those of sources that hold the build prefix (_sysconfigdata, python-config.py):
# conda rewrites such a source for its prefix and the installer compiles it again, so the
# shipped bytecode is stale everywhere and would pin its __pycache__ to the package cache
{ grep -rlF --include='*.py' "$PREFIX" "$PREFIX/lib/python3.11" || true; } | while read -r src; do
    stem=$(basename "$src" .py)
    rm -f "$(dirname "$src")/__pycache__/$stem".cpython-311*.pyc
done

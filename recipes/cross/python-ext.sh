# Sourced by a recipe's build.sh to cross-build a Python package with compiled code for
# $target_platform on this build host (recipes list this file as a `path:` source, so it
# lands in $SRC_DIR/cross/). Debian's cross gcc compiles; the target's libraries come
# from the Debian sysroot ci makes ($DDLCE_SYSROOT); the target's python is the host
# env's ($PREFIX, the cross-built stand-in). Three ways to ask the target python:
#
#   cross_python ARGS   the build env's python (same 3.11) that reports the *target's*
#                       sysconfig (_sysconfigdata of $PREFIX, _PYTHON_HOST_PLATFORM): what
#                       setuptools and scikit-build-core read for the suffix, flags, tag
#   $CROSS_DIR/python   the target python itself under qemu-user: meson's introspection
#                       and code generators (named in $CROSS_MESON, the cross file)
#   $CROSS_DIR/mpicc    the target's MPI compiler wrapper, as a build-host script
#
# install_wheel WHEEL puts a built wheel into $PREFIX as pip would on the target.
case "${target_platform}" in
    linux-ppc64le) CROSS_TRIPLE=powerpc64le-linux-gnu CROSS_QEMU=qemu-ppc64le
                   CROSS_CPU_FAMILY=ppc64 CROSS_CPU=ppc64le
                   CROSS_LONGDOUBLE=IBM_DOUBLE_DOUBLE_LE ;;
    linux-aarch64) CROSS_TRIPLE=aarch64-linux-gnu CROSS_QEMU=qemu-aarch64
                   CROSS_CPU_FAMILY=aarch64 CROSS_CPU=aarch64
                   CROSS_LONGDOUBLE=IEEE_QUAD_LE ;;
    *) echo "no cross toolchain known for ${target_platform}" >&2; exit 1 ;;
esac
: "${DDLCE_SYSROOT:?a cross build needs DDLCE_SYSROOT (a Debian sysroot of the target; ci sets it)}"
# the output also goes to build.log in the work dir: ci shows it when a cross build fails
exec > >(tee -a "$SRC_DIR/build.log") 2>&1
CROSS_DIR=$SRC_DIR/.cross
# qemu's -L prefix: the cross libc, and on arm64 the emulated CPU's /proc/cpuinfo, which
# torch reads at import (ci/src/ci/sysroot.py emulated_root)
_qroot=$DDLCE_SYSROOT/ddlce-qemu
[[ -d "$_qroot" ]] || { echo "$_qroot missing: ci's sysroot.prepare_for_qemu makes it" >&2; exit 1; }
mkdir -p "$CROSS_DIR/sysconfig"
_t=$CROSS_TRIPLE
_lib=$DDLCE_SYSROOT/usr/lib/$_t
BUILD_PYTHON=$BUILD_PREFIX/bin/python
_sysconfig=$(ls "$PREFIX"/lib/python3.*/_sysconfigdata__linux_*.py)
PY_VER=$(basename "$(dirname "$_sysconfig")"); PY_VER=${PY_VER#python}
cp "$_sysconfig" "$CROSS_DIR/sysconfig/"

cross_python() {
    _PYTHON_HOST_PLATFORM=${target_platform} \
    _PYTHON_SYSCONFIGDATA_NAME=$(basename "$_sysconfig" .py) \
    PYTHONPATH=$CROSS_DIR/sysconfig \
        "$BUILD_PYTHON" "$@"
}
CROSS_SOABI=$(cross_python -c 'import sysconfig; print(sysconfig.get_config_var("SOABI"))')
[[ "$CROSS_SOABI" == *"$_t"* ]] || { echo "target sysconfig not in effect: SOABI $CROSS_SOABI" >&2; exit 1; }

cat > "$CROSS_DIR/python" <<EOF
#!/bin/sh
exec $CROSS_QEMU -L $_qroot -E LD_LIBRARY_PATH=$PREFIX/lib:$_lib:$DDLCE_SYSROOT/lib/$_t $PREFIX/bin/python$PY_VER "\$@"
EOF
cat > "$CROSS_DIR/mpicc" <<EOF
#!/bin/sh
# the target's Open MPI (the sysroot's) for a compiler that runs here
case " \$* " in *" -c "*|*" -E "*|*" -S "*) exec $_t-gcc -I$_lib/openmpi/include "\$@" ;; esac
exec $_t-gcc -I$_lib/openmpi/include "\$@" -L$_lib/openmpi/lib -L$_lib \
    -Wl,-rpath-link,$_lib:$DDLCE_SYSROOT/lib/$_t -lmpi
EOF
chmod +x "$CROSS_DIR/python" "$CROSS_DIR/mpicc"
CROSS_MESON=$CROSS_DIR/meson-cross.ini
cat > "$CROSS_MESON" <<EOF
[binaries]
c = '$_t-gcc'
cpp = '$_t-g++'
ar = '$_t-ar'
strip = '$_t-strip'
python = '$CROSS_DIR/python'
exe_wrapper = ['$CROSS_QEMU', '-L', '$_qroot']

[host_machine]
system = 'linux'
cpu_family = '$CROSS_CPU_FAMILY'
cpu = '$CROSS_CPU'
endian = 'little'

[properties]
longdouble_format = '$CROSS_LONGDOUBLE'
EOF

install_wheel() {
    # pip installs a foreign wheel only with --target: stage it, then move it into the
    # prefix, console scripts with the target python's shebang
    local stage=$CROSS_DIR/stage sp=$PREFIX/lib/python$PY_VER/site-packages
    rm -rf "$stage"
    "$BUILD_PYTHON" -m pip install --no-deps --no-index --no-compile --disable-pip-version-check \
        --target "$stage" --platform "linux_$CROSS_CPU" --python-version "$PY_VER" \
        --implementation cp --abi "cp${PY_VER/./}" --only-binary=:all: "$@"
    rm -f "$stage"/*.dist-info/direct_url.json
    mkdir -p "$sp" "$PREFIX/bin"
    if [[ -d "$stage/bin" ]]; then
        for f in "$stage"/bin/*; do
            sed -i "1s|^#!.*python.*|#!$PREFIX/bin/python$PY_VER|" "$f"
            mv "$f" "$PREFIX/bin/"
        done
        rmdir "$stage/bin"
    fi
    cp -a "$stage"/. "$sp"/
}

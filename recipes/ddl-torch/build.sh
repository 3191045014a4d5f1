#!/bin/bash
# ddl_torch._C against the host env's pytorch (setup.py: torch.utils.cpp_extension).
# Compiler: the build host's g++ (conda-forge compilers are not reachable offline).
# Cross (linux-aarch64): torch.utils.cpp_extension imports torch, which only the target's
# python can, so setup.py runs on the target python under qemu-user ($CROSS_DIR/python,
# cross/python-ext.sh). The compilers it spawns are Debian's cross gcc, programs of the
# build host: qemu hands their exec to the host kernel. The wheel goes in as on the target.
set -euxo pipefail
if [[ "${target_platform}" != "${build_platform}" ]]; then
    source "$SRC_DIR/cross/python-ext.sh"
    CC=$CROSS_TRIPLE-gcc CXX=$CROSS_TRIPLE-g++ LDSHARED="$CROSS_TRIPLE-g++ -shared" \
        "$CROSS_DIR/python" setup.py -q bdist_wheel -d dist
    install_wheel dist/ddl_torch-*.whl
    strip=$CROSS_TRIPLE-strip
else
    "$PYTHON" -m pip install . --no-deps --no-build-isolation --no-compile -v
    strip=strip
fi
# python's CFLAGS carry -g: 11.2 of the extension's 11.5 MB are debug info, which holds
# the build prefix, so every install and clone rewrote all of it. Shipped without.
"$strip" --strip-debug "$SP_DIR"/ddl_torch/_C*.so

#!/bin/bash
# Compilers: the build host's (Debian's cross gcc for a cross build); see recipe.yaml.
set -euxo pipefail
args=(-Csetup-args=-Dallow-noblas=true -Csetup-args=-Dblas=none -Csetup-args=-Dlapack=none
      -Cbuild-dir=build)
if [[ "${target_platform}" != "${build_platform}" ]]; then
    source "$SRC_DIR/cross/python-ext.sh"
    # meson-python runs on the build python: only the wheel's platform tag is the target's
    # (the cross file's python answers meson's questions)
    _PYTHON_HOST_PLATFORM=${target_platform} "$BUILD_PYTHON" -m pip wheel --no-deps \
        --no-build-isolation -w dist . "${args[@]}" -Csetup-args=--cross-file="$CROSS_MESON"
    install_wheel dist/numpy-*.whl
else
    "$PYTHON" -m pip install --no-deps --no-build-isolation . "${args[@]}"
fi

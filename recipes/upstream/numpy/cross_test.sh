#!/bin/bash
# Run by ci for a cross-built numpy: $PREFIX is an env for the target holding it and its
# run dependencies (the cross-built python); numpy imports and computes under qemu-user
# ($CROSS_RUN, see ci/src/ci/sysroot.py).
set -euo pipefail
out=$("$CROSS_RUN" "$PREFIX/bin/python3.11" -c '
import platform
import numpy as np
a = np.arange(12, dtype=np.float64).reshape(3, 4)
assert a.sum() == 66 and (a @ a.T).shape == (3, 3)
assert abs(np.linalg.det(np.eye(3) * 2) - 8) < 1e-12
assert np.random.default_rng(0).integers(0, 10, 5).shape == (5,)
assert np.finfo(np.longdouble).nmant > 52, np.finfo(np.longdouble)
print("numpy", np.__version__, platform.machine(), "ok")
' 2>&1) || { echo "$out"; exit 1; }
echo "$out"
echo "$out" | grep -q " ok$"

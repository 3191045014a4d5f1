#!/bin/bash
# Run by ci for a cross-built python ($PREFIX = an env for the target holding it): the
# interpreter starts under qemu-user ($CROSS_RUN, see ci/src/ci/sysroot.py) with the
# target's libraries from the sysroot, and every extension module the native package's
# test imports loads.
set -euo pipefail
file "$PREFIX/bin/python3.11" | grep -Eq "PowerPC|ARM aarch64"
out=$("$CROSS_RUN" "$PREFIX/bin/python3.11" -c '
import platform, sys
import bz2, ctypes, hashlib, json, lzma, sqlite3, ssl, venv, zlib
assert sys.version_info[:2] == (3, 11), sys.version
print("python", platform.python_version(), platform.machine(), "ok")
' 2>&1) || { echo "$out"; exit 1; }
echo "$out"
echo "$out" | grep -q " ok$"

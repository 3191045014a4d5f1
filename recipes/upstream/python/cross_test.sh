#!/bin/bash
# Run by ci for a cross-built python ($PREFIX = the unpacked .conda): the interpreter starts
# under qemu-user with the target's libraries from the sysroot, and every extension module
# the native package's test imports loads.
set -euo pipefail
case "$target_platform" in
    linux-ppc64le) triple=powerpc64le-linux-gnu qemu=qemu-ppc64le ;;
    linux-aarch64) triple=aarch64-linux-gnu qemu=qemu-aarch64 ;;
    *) echo "no emulator known for $target_platform" >&2; exit 1 ;;
esac
S=$DDLCE_SYSROOT
file "$PREFIX/bin/python3.11" | grep -Eq "PowerPC|ARM aarch64"
out=$("$qemu" -L "/usr/$triple" -E LD_LIBRARY_PATH="$PREFIX/lib:$S/usr/lib/$triple:$S/lib/$triple" \
    "$PREFIX/bin/python3.11" -c '
import platform, sys
import bz2, ctypes, hashlib, json, lzma, sqlite3, ssl, venv, zlib
assert sys.version_info[:2] == (3, 11), sys.version
print("python", platform.python_version(), platform.machine(), "ok")
' 2>&1) || { echo "$out"; exit 1; }
echo "$out"
echo "$out" | grep -q " ok$"

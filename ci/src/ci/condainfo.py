"""Add files to a built ``.conda`` package's ``info/`` (and fields to its index.json).

Why: rattler-build's ``assemble_package`` writes no ``info/link.json`` for a
``noarch: python`` package, and a file staged under ``info/`` lands in paths.json too
(an installer would then link it into the prefix). conda-pack reads a package's noarch
type from ``info/link.json`` only, so a wheel made into a noarch package without it is
packed as if its ``site-packages/...`` paths were prefix paths, and refused. The package
tarball (``pkg-*.tar.zst``) is copied byte for byte; only the small info tarball is
rewritten, with the same owner, mode and mtime as the index.json beside it, so the
result is as reproducible as the input.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import tarfile
import zipfile
from pathlib import Path

from ci.errors import CiError

#: what conda-build writes into info/link.json for noarch: python (no entry points: our
#: packages ship their console scripts as files in python-scripts/)
NOARCH_PYTHON_LINK = {"noarch": {"type": "python"}, "package_metadata_version": 1}


def link_json_bytes() -> bytes:
    return (json.dumps(NOARCH_PYTHON_LINK, indent=2, sort_keys=True) + "\n").encode()


def _zstd(args: list[str], data: bytes) -> bytes:
    exe = shutil.which("zstd")
    if exe is None:
        raise CiError("the zstd command is needed to add info/link.json to converted packages",
                      "install it (Debian: apt-get install zstd)")
    p = subprocess.run([exe, "-q", *args], input=data, capture_output=True, check=False)
    if p.returncode != 0:
        raise CiError(f"zstd {' '.join(args)} failed: {p.stderr.decode(errors='replace')}",
                      "the package archive may be damaged: convert the wheel again")
    return p.stdout


def read_info(path: Path) -> dict[str, bytes]:
    """``info/`` member name -> contents, from a .conda archive (for checks and tests)."""
    with zipfile.ZipFile(path) as zf:
        name = next(n for n in zf.namelist() if n.startswith("info-") and n.endswith(".tar.zst"))
        raw = _zstd(["-dc"], zf.read(name))
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        return {m.name: tf.extractfile(m).read() for m in tf.getmembers() if m.isfile()}


def patch_info(path: Path, add: dict[str, bytes] | None = None,
               index_fields: dict | None = None) -> bool:
    """Rewrite ``path`` (a .conda) with ``add`` (``info/NAME`` -> bytes) in its info
    tarball and ``index_fields`` set in its ``info/index.json`` where they are missing.
    Returns whether anything changed (an archive already carrying them is left as is)."""
    add = add or {}
    index_fields = index_fields or {}
    with zipfile.ZipFile(path) as zf:
        entries = [(zi, zf.read(zi)) for zi in zf.infolist()]
    info_i = next((i for i, (zi, _) in enumerate(entries)
                   if zi.filename.startswith("info-") and zi.filename.endswith(".tar.zst")), None)
    if info_i is None:
        raise CiError(f"{path}: not a .conda archive (no info-*.tar.zst inside)",
                      "rebuild or convert the package again")
    raw = _zstd(["-dc"], entries[info_i][1])
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        members = [(m, tf.extractfile(m).read() if m.isfile() else None)
                   for m in tf.getmembers()]
    names = {m.name for m, _ in members}
    index_m = next((m for m, _ in members if m.name == "info/index.json"), None)
    if index_m is None:
        raise CiError(f"{path}: its info has no index.json", "rebuild the package")
    changed = False
    out: list[tuple[tarfile.TarInfo, bytes | None]] = []
    for m, data in members:
        if m.name == "info/index.json" and data is not None:
            index = json.loads(data)
            missing = {k: v for k, v in index_fields.items() if k not in index}
            if missing:
                index.update(missing)
                data = (json.dumps(index, indent=2, sort_keys=True) + "\n").encode()
                m.size = len(data)
                changed = True
        out.append((m, data))
    for name, data in sorted(add.items()):
        if name in names:
            continue
        ti = tarfile.TarInfo(name)
        ti.size, ti.mode, ti.mtime = len(data), 0o644, index_m.mtime
        ti.uid, ti.gid, ti.uname, ti.gname = index_m.uid, index_m.gid, index_m.uname, index_m.gname
        out.append((ti, data))
        changed = True
    if not changed:
        return False
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tf:
        for m, data in out:
            tf.addfile(m, io.BytesIO(data) if data is not None else None)
    entries[info_i] = (entries[info_i][0], _zstd(["-19", "-c"], buf.getvalue()))
    tmp = path.with_name(f".{path.name}.patch-{os.getpid()}")
    try:
        with zipfile.ZipFile(tmp, "w") as zf:
            for zi, data in entries:
                zf.writestr(zi, data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return True

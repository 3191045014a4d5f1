"""Build hostile conda packages and channels for the security tests.

rattler-build will not write a package whose paths leave its prefix, so these are written
here with the standard library: real ``.tar.bz2`` conda packages (``info/index.json``,
``info/paths.json``, the files as tar members, exactly as given, ``../`` and absolute
names included) that rattler indexes, solves and extracts like any other. A real
``.conda`` from the fixture channel is *repacked* (zip of zstd-compressed tars, with the
``zstd`` command) with one file changed, for the tampered-archive tests.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

PLACEHOLDER = "/opt/hostile_placeholder_" + "p" * 60


@dataclass
class Entry:
    """One path of a package: a file (``data``), a symlink (``target``) or a directory;
    ``placeholder`` marks a text file with the prefix in it."""

    path: str
    data: bytes = b"hostile\n"
    target: str | None = None
    directory: bool = False
    placeholder: bool = False


@dataclass
class Package:
    name: str
    entries: list[Entry] = field(default_factory=list)
    depends: list[str] = field(default_factory=list)
    entry_points: list[str] | None = None  # makes it a noarch: python package
    version: str = "1.0"

    @property
    def fn(self) -> str:
        return f"{self.name}-{self.version}-0.tar.bz2"


def _add(tar: tarfile.TarFile, name: str, data: bytes | None = None, target: str | None = None,
         directory: bool = False) -> None:
    ti = tarfile.TarInfo(name)
    ti.mtime = 1_700_000_000
    if target is not None:
        ti.type, ti.linkname = tarfile.SYMTYPE, target
        tar.addfile(ti)
    elif directory:
        ti.type, ti.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(ti)
    else:
        ti.size, ti.mode = len(data or b""), 0o644
        tar.addfile(ti, io.BytesIO(data or b""))


def write_package(subdir: Path, pkg: Package) -> Path:
    """Write ``pkg`` as ``subdir/<name>-<version>-0.tar.bz2``."""
    paths = []
    for e in pkg.entries:
        data = e.data.replace(b"@PREFIX@", PLACEHOLDER.encode()) if e.placeholder else e.data
        if e.target is not None:
            paths.append({"_path": e.path, "path_type": "softlink",
                          "sha256": hashlib.sha256(e.target.encode()).hexdigest(),
                          "size_in_bytes": len(e.target)})
        elif e.directory:
            paths.append({"_path": e.path, "path_type": "directory"})
        else:
            entry = {"_path": e.path, "path_type": "hardlink",
                     "sha256": hashlib.sha256(data).hexdigest(), "size_in_bytes": len(data)}
            if e.placeholder:
                entry.update(prefix_placeholder=PLACEHOLDER, file_mode="text")
            paths.append(entry)
    index = {"name": pkg.name, "version": pkg.version, "build": "0", "build_number": 0,
             "depends": pkg.depends, "subdir": "noarch",
             "noarch": "python" if pkg.entry_points is not None else "generic"}
    out = subdir / pkg.fn
    with tarfile.open(out, "w:bz2") as tar:
        _add(tar, "info/index.json", json.dumps(index).encode())
        _add(tar, "info/paths.json", json.dumps({"paths": paths, "paths_version": 1}).encode())
        if pkg.entry_points is not None:
            _add(tar, "info/link.json", json.dumps(
                {"noarch": {"type": "python", "entry_points": pkg.entry_points},
                 "package_metadata_version": 1}).encode())
        for e in pkg.entries:
            data = e.data.replace(b"@PREFIX@", PLACEHOLDER.encode()) if e.placeholder else e.data
            _add(tar, e.path, data, e.target, e.directory)
    return out


def index(channel: Path) -> None:
    import rattler

    for sub in ("noarch", "linux-64"):
        (channel / sub).mkdir(parents=True, exist_ok=True)
    asyncio.run(rattler.index.index_fs(channel, write_zst=False, write_shards=False))


def build_channel(channel: Path, packages: list[Package], base: Path | None = None) -> Path:
    """An indexed channel with ``packages`` (noarch) and, from the fixture channel
    ``base``, its ``linux-64`` packages (python, for ``noarch: python`` ones)."""
    (channel / "noarch").mkdir(parents=True, exist_ok=True)
    (channel / "linux-64").mkdir(parents=True, exist_ok=True)
    if base is not None:
        for p in (base / "linux-64").glob("*.conda"):
            shutil.copy2(p, channel / "linux-64" / p.name)
    for pkg in packages:
        write_package(channel / "noarch", pkg)
    index(channel)
    return channel


def repodata(channel: Path, sub: str) -> dict:
    return json.loads((channel / sub / "repodata.json").read_text())


def set_repodata(channel: Path, sub: str, fn: str, **fields) -> None:
    """Change (or, with None, remove) fields of one package's repodata entry, as a
    hostile or broken channel would have them."""
    doc = repodata(channel, sub)
    for key in ("packages", "packages.conda"):
        if fn in doc.get(key, {}):
            for k, v in fields.items():
                if v is None:
                    doc[key][fn].pop(k, None)
                else:
                    doc[key][fn][k] = v
    (channel / sub / "repodata.json").write_text(json.dumps(doc))


def repack_conda(path: Path, member: str, change) -> None:
    """Rewrite a ``.conda`` in place with ``member`` of its pkg tar replaced by
    ``change(old_bytes)``: a valid archive that differs from what was indexed."""
    with zipfile.ZipFile(path) as z:
        parts = {n: z.read(n) for n in z.namelist()}
    name = next(n for n in parts if n.startswith("pkg-") and n.endswith(".tar.zst"))
    raw = subprocess.run(["zstd", "-d", "-c", "-q"], input=parts[name], capture_output=True,
                         check=True).stdout
    out = io.BytesIO()
    with tarfile.open(fileobj=io.BytesIO(raw)) as src, tarfile.open(fileobj=out, mode="w") as dst:
        for ti in src.getmembers():
            data = src.extractfile(ti).read() if ti.isfile() else None
            if ti.name == member:
                data = change(data)
                ti.size = len(data)
            dst.addfile(ti, io.BytesIO(data) if data is not None else None)
    parts[name] = subprocess.run(["zstd", "-c", "-q", "-3"], input=out.getvalue(),
                                 capture_output=True, check=True).stdout
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, data in parts.items():
            z.writestr(n, data)

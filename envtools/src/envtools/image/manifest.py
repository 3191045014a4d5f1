"""What an image says about itself: its manifest, inside the image and beside it.

Inside the image, ``conda-meta/envtools/image.json`` (envtools' own subdirectory, which
nothing that lists an env's records or files reads) holds the prefix the env was built
for, its platform, the envtools version that sealed it and a digest of the env's conda
records. Beside the image, ``IMAGE.json`` holds the same fields plus the image's size and
sha256, and ``IMAGE.sha256`` the sha256 in ``sha256sum`` form, so ``sha256sum -c`` checks
a copy without envtools.

Every manifest is data someone else may have written (an image is handed from user to
user, node to node): :func:`parse` is the one place it is read, and it checks each field's
type and range. The prefix, which becomes a mountpoint, must be an absolute, normalized
path of printable characters outside the system's own directories.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from envtools.errors import EnvtoolsError

#: the manifest's format; an image of another format is refused, not guessed at
FORMAT = "envtools-image/1"
#: where the manifest lives inside the image (relative to the prefix)
INNER = "conda-meta/envtools/image.json"
#: the files beside IMAGE
SHA_SUFFIX = ".sha256"
JSON_SUFFIX = ".json"
#: what mksquashfs compresses with (Debian's squashfs-tools and squashfuse both have it)
COMPRESSION = "zstd"
#: conda subdirs by ``uname -m``
_SUBDIRS = {"x86_64": "linux-64", "ppc64le": "linux-ppc64le", "aarch64": "linux-aarch64"}
PLATFORMS = frozenset(_SUBDIRS.values())
#: directories an image may not be mounted on or under (the system's own)
_SYSTEM = ("/proc", "/sys", "/dev", "/run", "/etc", "/bin", "/sbin", "/lib", "/lib32",
           "/lib64", "/libx32", "/usr", "/boot")
_HEX64 = re.compile(r"[0-9a-f]{64}")


def host_platform() -> str:
    """This node's conda subdir (what an image must have been sealed for)."""
    machine = os.uname().machine
    return _SUBDIRS.get(machine, f"linux-{machine}")


def sidecars(image: Path) -> tuple[Path, Path]:
    """(IMAGE.sha256, IMAGE.json): what travels with an image."""
    return image.with_name(image.name + SHA_SUFFIX), image.with_name(image.name + JSON_SUFFIX)


@dataclass(frozen=True)
class Manifest:
    """An image's description. ``image_sha256``/``image_bytes`` are only known beside the
    image (the image cannot hold its own hash); inside it they are empty."""

    prefix: str
    platform: str
    envtools_version: str
    records_sha256: str
    packages: int
    files: int
    env_bytes: int
    compression: str = COMPRESSION
    format: str = FORMAT
    image_sha256: str = ""
    image_bytes: int = 0
    #: beside only, and optional (images sealed before them have none): the sha256 of
    #: every ``chunk_bytes`` of the image, so a copy is checked on all cores
    #: (envtools.image.chunks)
    chunk_bytes: int = 0
    chunk_sha256: tuple[str, ...] = ()

    def inner(self) -> dict:
        """The fields stored inside the image."""
        d = asdict(self)
        for k in ("image_sha256", "image_bytes", "chunk_bytes", "chunk_sha256"):
            del d[k]
        return d

    def inner_bytes(self) -> bytes:
        return (json.dumps(self.inner(), indent=2, sort_keys=True) + "\n").encode()

    def beside_bytes(self) -> bytes:
        d = asdict(self)
        if not self.chunk_sha256:  # (as an image sealed before chunks reads)
            del d["chunk_bytes"], d["chunk_sha256"]
        return (json.dumps(d, indent=2, sort_keys=True) + "\n").encode()


def check_prefix(prefix: object, where: str) -> str:
    """The prefix as a mountpoint: absolute, normalized, printable, not a system path."""
    if not isinstance(prefix, str) or not prefix:
        raise _bad(where, "its prefix is not a path")
    if any(ord(c) < 32 or ord(c) == 127 for c in prefix) or ":" in prefix:
        raise _bad(where, f"its prefix {prefix!r} holds a control character or ':'")
    if not prefix.startswith("/") or os.path.normpath(prefix) != prefix or prefix == "/":
        raise _bad(where, f"its prefix {prefix!r} is not an absolute, normalized path")
    if prefix.startswith("//"):
        raise _bad(where, f"its prefix {prefix!r} is not an absolute, normalized path")
    for s in _SYSTEM:
        if prefix == s or prefix.startswith(s + "/"):
            raise _bad(where, f"its prefix {prefix} is a system directory ({s})")
    return prefix


def _bad(where: str, what: str) -> EnvtoolsError:
    return EnvtoolsError(f"{where} is not a usable envtools image manifest: {what}",
                         "seal the env again (envtools seal PREFIX --out IMAGE)", exit_code=2)


def parse(data: bytes, where: str, beside: bool) -> Manifest:
    """Read a manifest (inside the image: ``beside=False``), checking every field."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as e:
        raise _bad(where, f"not JSON ({e})") from e
    if not isinstance(doc, dict):
        raise _bad(where, "not a JSON object")
    if doc.get("format") != FORMAT:
        raise EnvtoolsError(
            f"{where}: image format {doc.get('format')!r} is not {FORMAT!r}",
            "seal the env again with this envtools (envtools seal PREFIX --out IMAGE)")

    def field(name: str, kind: type, check=lambda v: True) -> object:
        v = doc.get(name)
        if not isinstance(v, kind) or isinstance(v, bool) or not check(v):
            raise _bad(where, f"field {name!r} is missing or out of range ({v!r})")
        return v

    nonneg = lambda v: 0 <= v < 1 << 62  # noqa: E731
    m = Manifest(
        prefix=check_prefix(doc.get("prefix"), where),
        platform=field("platform", str, lambda v: re.fullmatch(r"[a-z0-9_-]{1,40}", v)),
        envtools_version=field("envtools_version", str, lambda v: 0 < len(v) < 64),
        records_sha256=field("records_sha256", str, _HEX64.fullmatch),
        packages=field("packages", int, nonneg),
        files=field("files", int, nonneg),
        env_bytes=field("env_bytes", int, nonneg),
        compression=field("compression", str, lambda v: v == COMPRESSION),
        image_sha256=field("image_sha256", str, _HEX64.fullmatch) if beside else "",
        image_bytes=field("image_bytes", int, nonneg) if beside else 0,
    )
    if beside and ("chunk_bytes" in doc or "chunk_sha256" in doc):
        m = _with_chunks(m, doc, where)
    return m


def _with_chunks(m: Manifest, doc: dict, where: str) -> Manifest:
    """The manifest with its chunk digests, checked: a power-of-two chunk size in range,
    and exactly one well-formed sha256 per chunk of the image."""
    from envtools.image.chunks import MAX_CHUNK, MIN_CHUNK, count

    size, digests = doc.get("chunk_bytes"), doc.get("chunk_sha256")
    if (not isinstance(size, int) or isinstance(size, bool) or size & (size - 1)
            or not MIN_CHUNK <= size <= MAX_CHUNK):
        raise _bad(where, f"field 'chunk_bytes' is out of range ({size!r})")
    if (not isinstance(digests, list) or len(digests) != count(m.image_bytes, size)
            or not all(isinstance(d, str) and _HEX64.fullmatch(d) for d in digests)):
        raise _bad(where, "field 'chunk_sha256' is not one sha256 per chunk of the image")
    return replace(m, chunk_bytes=size, chunk_sha256=tuple(digests))


def records_digest(prefix: Path) -> tuple[str, int]:
    """sha256 over the env's conda records (names and contents, sorted), and their count:
    what says "the same packages, the same files" without listing them."""
    h = hashlib.sha256()
    meta = prefix / "conda-meta"
    names = sorted(n for n in os.listdir(meta) if n.endswith(".json"))
    for n in names:
        with open(meta / n, "rb") as fh:
            h.update(n.encode() + b"\0" + hashlib.sha256(fh.read()).digest())
    return h.hexdigest(), len(names)


def tree_size(prefix: Path) -> tuple[int, int]:
    """(entries, bytes) of an env: every file, link and directory; each inode's bytes once
    (hardlinks share them), as ``du --apparent-size`` counts."""
    seen: set[tuple[int, int]] = set()
    entries = size = 0
    for dirpath, dirnames, filenames in os.walk(prefix):
        entries += len(dirnames) + len(filenames)
        for n in filenames:
            try:
                st = os.lstat(os.path.join(dirpath, n))
            except OSError:
                continue
            if st.st_nlink > 1:
                key = (st.st_dev, st.st_ino)
                if key in seen:
                    continue
                seen.add(key)
            size += st.st_size
    return entries, size

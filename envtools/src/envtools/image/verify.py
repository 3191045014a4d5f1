"""Check an image before anything mounts it: complete, unaltered, for this platform.

A truncated copy (a full stage dir, an interrupted ``cp``) or a flipped bit must be an
error here, in one line, and never a mount that fails half-way through a job or, worse,
one that works until a rank reads the damaged block. So the whole file is hashed and
compared with ``IMAGE.sha256`` (chunk by chunk on every core, where IMAGE.json lists the
chunks' sha256s: envtools.image.chunks) before any mount, its size first (a truncated
copy is named as such without reading it), and the manifest inside the image (read with
``unsquashfs -cat``, which parses the image in this process's user space, not in the
kernel) must agree with the one beside it.

What this proves: the image is the one that was sealed with these sidecars. It does not
say who sealed it: a sha256 beside a file vouches for the copy, not the author. Root
mounting an image with the kernel's squashfs should trust its author (see
envtools/README.md, "Sealed images").
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
from pathlib import Path

from envtools.errors import EnvtoolsError
from envtools.image.chunks import first_bad
from envtools.image.manifest import (
    INNER,
    Manifest,
    host_platform,
    parse,
    sidecars,
)
from envtools.prefix.hashing import sha256_fileobj

#: squashfs superblock: magic "hsqs", and compression id 6 (zstd) at offset 20
_MAGIC = b"hsqs"
_ZSTD = 6
#: a sidecar larger than this is not ours (IMAGE.json lists up to 8,192 chunk digests)
_SIDECAR_MAX = 1 << 20


def _read_small(path: Path, what: str, fix: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(_SIDECAR_MAX + 1)
    except FileNotFoundError:
        raise EnvtoolsError(f"{path} is missing: {what}", fix, exit_code=2) from None
    except OSError as e:
        raise EnvtoolsError(f"cannot read {path}: {e.strerror}", fix, exit_code=2) from e
    if len(data) > _SIDECAR_MAX:
        raise EnvtoolsError(f"{path} is too large to be {what}", fix, exit_code=2)
    return data


def read_sha256(image: Path) -> str:
    """The sha256 in ``IMAGE.sha256`` (``<hex>  <name>``), checked for form."""
    sha_file, _ = sidecars(image)
    fix = (f"copy {sha_file.name} together with the image, or seal the env again "
           "(envtools seal PREFIX --out IMAGE)")
    text = _read_small(sha_file, "the image's sha256 (it travels beside the image)", fix)
    word = text.decode(errors="replace").split()[:1]
    if not word or len(word[0]) != 64 or any(c not in "0123456789abcdef" for c in word[0]):
        raise EnvtoolsError(f"{sha_file} does not hold a sha256", fix, exit_code=2)
    return word[0]


def open_image(image: str | os.PathLike[str]) -> tuple[Path, int]:
    """(absolute path, an O_RDONLY descriptor) of a regular file, or a clear error."""
    path = Path(os.path.abspath(image))
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise EnvtoolsError(f"{path} does not exist",
                            "give the image file envtools seal wrote", exit_code=2) from None
    except OSError as e:
        raise EnvtoolsError(f"cannot read {path}: {e.strerror}",
                            "check its permissions: every user of an image must be able to "
                            "read it", exit_code=2) from e
    import stat

    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise EnvtoolsError(f"{path} is not a file", "give the image file envtools seal wrote",
                            exit_code=2)
    return path, fd


def verify_fd(path: Path, fd: int, expected_sha256: str | None = None,
              hash_it: bool = True) -> Manifest:
    """:func:`verify` on an open descriptor (the one a mount will then use, so the file
    checked is the file mounted even if the name is replaced meanwhile). ``hash_it``
    False skips only the sha256 check of its contents (size, magic, manifests and
    platform are still checked): for a caller that hashed this very file just before (ddlrun --env
    after staging it), where hashing again per rank would cost seconds each."""
    sha = expected_sha256 or read_sha256(path)
    _, json_file = sidecars(path)
    refit = f"copy {json_file.name} together with the image, or seal the env again"
    m = parse(_read_small(json_file, "the image's manifest (it travels beside the image)",
                          refit), str(json_file), beside=True)
    if m.image_sha256 != sha:
        raise EnvtoolsError(f"{json_file} and its .sha256 name different images",
                            "copy the image and both files beside it together, from one seal",
                            exit_code=2)
    size = os.fstat(fd).st_size
    if size != m.image_bytes:
        how = "truncated" if size < m.image_bytes else "longer than sealed"
        raise EnvtoolsError(
            f"{path} is {how}: {size} bytes, sealed as {m.image_bytes}",
            "copy it again from where it was sealed (an interrupted copy or a full disk?)",
            exit_code=2)
    head = os.pread(fd, 24, 0)
    if head[:4] != _MAGIC or struct.unpack_from("<H", head, 20)[0] != _ZSTD:
        raise EnvtoolsError(f"{path} is not a zstd SquashFS image",
                            "give the image file envtools seal wrote", exit_code=2)
    os.lseek(fd, 0, os.SEEK_SET)
    if hash_it and m.chunk_sha256:  # on every core (envtools.image.chunks)
        at = first_bad(fd, size, m.chunk_bytes, m.chunk_sha256)
        if at is not None:
            raise EnvtoolsError(
                f"{path} was altered or damaged: its {m.chunk_bytes >> 20} MiB at offset "
                f"{at} differ from what was sealed (sha256 {sha})",
                "copy it again from where it was sealed, or seal the env again; "
                "it was not mounted", exit_code=2)
    elif hash_it:
        with os.fdopen(os.dup(fd), "rb") as fh:
            got = sha256_fileobj(fh)
        if got != sha:
            raise EnvtoolsError(
                f"{path} was altered or damaged: its sha256 is {got}, sealed as {sha}",
                "copy it again from where it was sealed, or seal the env again; "
                "it was not mounted", exit_code=2)
    inner = parse(_cat_inner(path, fd), f"{path}:{INNER}", beside=False)
    if inner.inner() != m.inner():
        raise EnvtoolsError(f"the manifest inside {path} differs from {json_file}",
                            "copy the image and both files beside it together, from one seal",
                            exit_code=2)
    here = host_platform()
    if m.platform != here:
        raise EnvtoolsError(
            f"{path} is an image for {m.platform}; this node is {here}",
            f"use an image sealed from an env for {here} (seal it on a {here} node)",
            exit_code=2)
    return m


def verify(image: str | os.PathLike[str], expected_sha256: str | None = None) -> Manifest:
    """Check an image completely before it is mounted; returns its manifest.

    ``expected_sha256``: check against this instead of ``IMAGE.sha256`` (a copy staged
    elsewhere, checked against the sum read from the original). Raises EnvtoolsError
    (exit 2) naming what is wrong and what to do.
    """
    path, fd = open_image(image)
    try:
        return verify_fd(path, fd, expected_sha256)
    finally:
        os.close(fd)


def _cat_inner(path: Path, fd: int) -> bytes:
    """The manifest inside the image, read without mounting it."""
    tool = shutil.which("unsquashfs")
    if tool is None:
        raise EnvtoolsError("unsquashfs is not installed (it reads an image's manifest)",
                            "apt-get install squashfs-tools", exit_code=2)
    p = subprocess.run([tool, "-cat", f"/proc/self/fd/{fd}", INNER], pass_fds=(fd,),
                       capture_output=True)
    if p.returncode != 0 or not p.stdout:
        raise EnvtoolsError(
            f"{path} holds no envtools manifest ({INNER}): "
            f"{p.stderr.decode(errors='replace').strip()[:200] or 'unsquashfs failed'}",
            "give an image made by envtools seal", exit_code=2)
    return p.stdout

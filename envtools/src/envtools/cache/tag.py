"""The cache directory tag (``CACHEDIR.TAG``) goes on the package cache, never on an env.

A directory holding a ``CACHEDIR.TAG`` that starts with the standard signature is
skipped by backup tools (``tar --exclude-caches``, borg, restic). That is right for the
package cache, which can be fetched again, and wrong for an environment. py-rattler's
installer writes the tag into the *target prefix*; install and ``clone --add`` remove
it from there (unless a package owns that file), install tags the package cache
instead, and clone does not carry a tag over from an env made before this was fixed.
"""

from __future__ import annotations

import os
from pathlib import Path

NAME = "CACHEDIR.TAG"
SIGNATURE = b"Signature: 8a477f597d28d172789f06886806bc55"
TEXT = (SIGNATURE.decode() + "\n"
        "# This file is a cache directory tag created by envtools: the extracted packages\n"
        "# here can be fetched again, so backups may skip them. See https://bford.info/cachedir/\n")


def is_tag(path: str | os.PathLike[str]) -> bool:
    """A regular file starting with the tag's signature."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        return os.read(fd, len(SIGNATURE)) == SIGNATURE
    finally:
        os.close(fd)


def drop_from_env(prefix: Path, owned: set[str] | None = None) -> None:
    """Remove the tag an installer left at an env's root (not one a package owns)."""
    p = prefix / NAME
    if (owned is None or NAME not in owned) and is_tag(p):
        p.unlink()


def tag_cache(cache: Path) -> None:
    """Mark the package cache as a cache (kept if one is there already)."""
    p = cache / NAME
    if not is_tag(p):
        with open(p, "w") as fh:
            fh.write(TEXT)

"""Prefix relocation of file contents: text and binary (C-string) replacement.

This mirrors what conda and rattler do when they link a package: a *text* file has every
occurrence of the old prefix replaced; a *binary* file keeps its size, so each
NUL-terminated string holding the old prefix is rewritten in place and padded with NULs
(the old prefix must have been at least as long, which the 255-character build
placeholder guarantees; relocating an already-installed binary to a longer path can
only use the NUL padding left after the string).
"""

from __future__ import annotations

from envtools.errors import EnvtoolsError


def replace_text(data: bytes, old: bytes, new: bytes) -> bytes:
    """Replace every occurrence; used for files recorded with ``file_mode: text``."""
    return data.replace(old, new)


def replace_binary(data: bytes, old: bytes, new: bytes, what: str = "file") -> bytes:
    """Rewrite C strings containing ``old`` without changing the file's length.

    Each string's growth is paid for by the NULs that follow it; if there are too few
    the file cannot be relocated to ``new`` and we say so instead of corrupting it.
    """
    if old not in data:
        return data
    out = bytearray()
    pos = 0
    n = len(data)
    while True:
        i = data.find(old, pos)
        if i < 0:
            out += data[pos:]
            break
        # the C string containing this occurrence: from the previous NUL to the next one
        prev = data.rfind(b"\0", pos, i)
        start = prev + 1 if prev >= 0 else pos
        end = data.find(b"\0", i)
        terminated = end >= 0
        if not terminated:
            end = n
        nul_end = end
        while nul_end < n and data[nul_end] == 0:
            nul_end += 1
        segment = data[start:end]
        new_segment = segment.replace(old, new)
        room = nul_end - start  # string plus all its trailing NULs
        if len(new_segment) + (1 if terminated else 0) > room:
            raise EnvtoolsError(
                f"cannot relocate {what}: the new prefix {new.decode(errors='replace')!r} is "
                f"{len(new) - len(old)} bytes longer than the old one and the binary has no "
                "room for it",
                "clone to a shorter path (binary prefixes are limited by the build placeholder)",
            )
        out += data[pos:start]
        out += new_segment
        out += b"\0" * (room - len(new_segment))
        pos = nul_end
    assert len(out) == len(data)
    return bytes(out)


def relocate(data: bytes, old: str, new: str, mode: str, what: str = "file") -> bytes:
    """Replace ``old`` by ``new`` in ``data`` according to the record's ``file_mode``."""
    o, w = old.encode(), new.encode()
    if mode == "binary":
        return replace_binary(data, o, w, what)
    return replace_text(data, o, w)


def looks_binary(data: bytes) -> bool:
    """Heuristic for untracked files (pip installs have no file_mode): NUL in the head."""
    return b"\0" in data[:8192]

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


def binary_pieces(data: bytes, old: bytes, new: bytes, what: str = "file") -> list:
    """Rewrite C strings containing ``old`` without changing the file's length, as a list
    of pieces whose concatenation is the new file.

    The unchanged spans are views into ``data``, not copies: a relocated libpython.a or
    python binary is tens of MB with a handful of prefix strings, and copying it twice
    more (into a buffer, then into bytes) cost more than reading, hashing and writing it.
    Each string's growth is paid for by the NULs that follow it; if there are too few
    the file cannot be relocated to ``new`` and we say so instead of corrupting it.
    """
    i = data.find(old)
    if i < 0:
        return [data]
    view = memoryview(data)
    pieces: list = []
    pos = 0
    n = len(data)
    while i >= 0:
        # the C string containing this occurrence: from the previous NUL to the next one
        prev = data.rfind(b"\0", pos, i)
        start = prev + 1 if prev >= 0 else pos
        end = data.find(b"\0", i)
        terminated = end >= 0
        if not terminated:
            end = n
        nul_end = _nul_run_end(data, end)
        new_segment = data[start:end].replace(old, new)
        room = nul_end - start  # string plus all its trailing NULs
        if len(new_segment) + (1 if terminated else 0) > room:
            raise EnvtoolsError(
                f"cannot relocate {what}: the new prefix {new.decode(errors='replace')!r} is "
                f"{len(new) - len(old)} bytes longer than the old one and the binary has no "
                "room for it",
                "clone to a shorter path (binary prefixes are limited by the build placeholder)",
            )
        pieces += (view[pos:start], new_segment, bytes(room - len(new_segment)))
        pos = nul_end
        i = data.find(old, pos)
    pieces.append(view[pos:])
    return pieces


def _nul_run_end(data: bytes, i: int) -> int:
    """Index just past the run of NULs starting at ``i`` (a bytes scan, not a loop per
    byte: the padding after a placeholder string is hundreds of bytes)."""
    n = len(data)
    while i < n:
        chunk = data[i:i + 4096]
        rest = chunk.lstrip(b"\0")
        if rest:
            return i + len(chunk) - len(rest)
        i += len(chunk)
    return n


def relocate_pieces(data: bytes, old: str, new: str, mode: str, what: str = "file") -> list:
    """Replace ``old`` by ``new`` according to the record's ``file_mode``, as pieces to
    write and hash in turn (see :func:`binary_pieces`)."""
    o, w = old.encode(), new.encode()
    if mode == "binary":
        return binary_pieces(data, o, w, what)
    return [replace_text(data, o, w)]


def looks_binary(data: bytes) -> bool:
    """Heuristic for untracked files (pip installs have no file_mode): NUL in the head."""
    return b"\0" in data[:8192]

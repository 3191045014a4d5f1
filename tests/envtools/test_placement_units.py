"""Relocation pieces and cost-balanced shards: the parts of a clone that decide its
speed, checked against plain constructions (the whole clone is checked in test_clone)."""

from __future__ import annotations

import hashlib
import mmap
import os

import pytest
from envtools.errors import EnvtoolsError
from envtools.place.placement import (
    BYTES_PER_COST,
    DIR_COST,
    RELOCATED,
    Ctx,
    item_cost,
    place,
    split_units,
)
from envtools.place.relocate import binary_pieces, relocate_pieces
from envtools.prefix.hashing import file_key

OLD = b"/opt/build_placehold_placehold_placehold"
NEW = b"/home/u/env"


def _expected(strings: list[tuple[bytes, int]]) -> bytes:
    """A C string with OLD replaced, padded back to its old length plus its NULs."""
    return b"".join(s.replace(OLD, NEW).ljust(len(s) + pad, b"\0") for s, pad in strings)


def test_binary_pieces_keep_length_and_rewrite_each_string():
    strings = [(b"\x7fELF head", 1), (OLD + b"/lib:" + OLD + b"/lib64", 3), (b"mid", 1),
               (b"x" + OLD, 9000)]  # the last one's NUL run spans several 4 KiB chunks
    data = b"".join(s + b"\0" * pad for s, pad in strings) + b"tail"
    pieces = binary_pieces(data, OLD, NEW)
    out = b"".join(pieces)
    assert len(out) == len(data)
    assert out == _expected(strings) + b"tail"
    # the unchanged spans are views of the input, not copies
    assert any(isinstance(p, memoryview) and p.obj is data for p in pieces)


def test_binary_pieces_unterminated_string_at_end():
    data = b"abc\0" + OLD + b"/bin"
    assert b"".join(relocate_pieces(data, OLD.decode(), NEW.decode(), "binary")) == (
        b"abc\0" + NEW + b"/bin" + b"\0" * (len(OLD) - len(NEW)))


def test_binary_pieces_without_the_prefix_give_the_input_back():
    data = b"nothing to see\0here"
    assert binary_pieces(data, OLD, NEW) == [data]


def test_binary_pieces_refuse_a_longer_prefix_without_room():
    data = b"\0" + OLD + b"\0rest"
    with pytest.raises(EnvtoolsError, match="no room"):
        binary_pieces(data, OLD, OLD + b"/longer", what="lib/x.so")


def test_place_relocates_a_large_binary_through_a_map(tmp_path):
    """Binaries of 1 MiB and more are mapped, not read: the result must be the same bytes,
    hash and mode, and the map must be closed even though the pieces point into it."""
    payload = os.urandom(3 << 20).replace(b"\0", b"\1")
    data = payload[:1000] + b"\0" + OLD + b"/lib\0\0\0" + payload[1000:]
    src = tmp_path / "cache" / "libbig.so"
    src.parent.mkdir()
    src.write_bytes(data)
    src.chmod(0o555)
    dest = tmp_path / "dest"
    (dest / "lib").mkdir(parents=True)
    ctx = Ctx(dest_tmp=dest, new_prefix=NEW.decode(), old_prefix="/srcenv", src_root="/srcenv",
              euid=os.geteuid(), link_mode="auto")
    item = ("lib/libbig.so", str(src), "hardlink", OLD.decode(), "binary", True,
            hashlib.sha256(data).hexdigest(), len(data))
    # (no stat cache vouches for the cache file here: it is hashed, as read, and matches)
    rel, how, sha, key, cache_key = place(ctx, item)
    assert cache_key == tuple(file_key(src.stat()))  # vouches for it to clones of the clone
    out = (dest / "lib" / "libbig.so").read_bytes()
    want = data.replace(OLD + b"/lib\0\0\0", NEW + b"/lib" + b"\0" * (len(OLD) - len(NEW) + 3))
    assert (rel, how) == ("lib/libbig.so", RELOCATED)
    assert out == want and sha == hashlib.sha256(want).hexdigest()
    assert (dest / "lib" / "libbig.so").stat().st_mode & 0o777 == 0o755
    assert key[0] == len(data)
    with open(src, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert b"".join(binary_pieces(mm, OLD, NEW)) == want  # maps work as input too


def _item(rel: str, size: int = 0, placeholder: str | None = None) -> tuple:
    return (rel, "/cache/" + rel, "hardlink", placeholder, "binary" if placeholder else None,
            True, None, size)


def test_split_units_balances_cost_not_file_count():
    """One package holding a big relocated binary weighs as much as thousands of links."""
    big = 4000 * BYTES_PER_COST
    groups = [
        (0, [_item("lib/libpython.a", big, "/ph")] + [_item(f"lib/p{i}") for i in range(10)]),
        *[(k, [_item(f"site/pkg{k}/f{i}") for i in range(400)]) for k in range(1, 11)],
    ]
    shards = split_units(groups, 2, hardlinks=True)

    def cost(it: tuple) -> int:
        return item_cost(it, hardlinks=True)

    assert len(shards) == 2
    placed = [it for shard in shards for u in shard for it in u.items]
    assert placed == [it for _k, items in groups for it in items]  # all, in order, once
    files = [sum(len(u.items) for u in shard) for shard in shards]
    assert files[0] < files[1] / 2  # by count this would be an even split
    weights = [sum(cost(it) for u in shard for it in u.items) for shard in shards]
    assert abs(weights[0] - weights[1]) < 0.1 * sum(weights) + 60 * DIR_COST
    units = [u for shard in shards for u in shard]
    # a unit's cost is its files' plus the directories it is first to need
    assert sum(u.cost for u in units) == sum(weights) + DIR_COST * len(
        {it[0].rpartition("/")[0] for u in units for it in u.items})
    split = 0
    for key, items in groups:
        parts = [u for u in units if u.key == key]
        writers = [u for u in parts if u.writes_record]
        if len(parts) == 1:
            assert writers == parts
        elif any(it[3] for it in items):  # relocates: its record waits for every part
            split += 1
            assert writers == []
        else:  # the first part writes it: the record does not depend on placing
            split += 1
            assert writers == [parts[0]]
    assert split  # (the case above is exercised)


def test_item_cost_kinds():
    link = _item("a")
    assert item_cost(link, hardlinks=True) == 1
    assert item_cost(link, hardlinks=False) > 1  # copied
    assert item_cost(_item("b", 10 * BYTES_PER_COST, "/ph"), hardlinks=True) >= 10
    assert item_cost(("d", "", "directory", None, None, True, None, 0), True) == DIR_COST

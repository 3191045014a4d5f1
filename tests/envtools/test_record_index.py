"""The record index: what clone reads instead of the records' JSON, used only while
every record is the one it was made from."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from conftest import run_envtools
from envtools.prefix import record_index
from envtools.prefix.hashing import entry_sha, load_stat_cache
from envtools.prefix.records import Prefix
from test_clone import tree_digest


def _writable_copy(env, tmp_path):
    """A copy of the read-only fixture env that a test may change (new inodes: the
    install's index no longer matches it)."""
    copy = tmp_path / "src"
    subprocess.run(["cp", "-a", str(env), str(copy)], check=True)
    for dirpath, _dirs, _files in os.walk(copy):
        os.chmod(dirpath, 0o755)
    os.chmod(copy / "conda-meta" / "envtools", 0o755)
    return copy


def test_install_writes_an_index_that_matches_the_json(env):
    indexed = record_index._from_index(env)
    assert indexed is not None, "envtools install should leave a current index"
    parsed = Prefix.load(env)
    assert [r.path for r in indexed.records] == [r.path for r in parsed.records]
    for a, b in zip(indexed.records, parsed.records, strict=True):
        assert a.summary() == b.summary()
        assert a.dist == b.dist and a.noarch_python == b.noarch_python
    # data is still there for whoever needs all of it, read on first use
    assert indexed.records[0].data == parsed.records[0].data


def test_a_changed_added_or_damaged_record_set_falls_back_to_the_json(env, tmp_path):
    src = _writable_copy(env, tmp_path)
    assert record_index._from_index(src) is None  # copied: other inodes
    records = Prefix.load(src).records
    record_index.write(src, records)
    assert record_index._from_index(src) is not None

    rec = records[0].path  # rewritten in place with the same bytes: a new mtime
    os.chmod(rec, 0o644)
    data = rec.read_bytes()
    rec.write_bytes(data)
    os.utime(rec, ns=(1, 1))
    assert record_index._from_index(src) is None
    record_index.write(src, Prefix.load(src).records)

    extra = src / "conda-meta" / "extra-1.0-0.json"  # a package added by another tool
    extra.write_text(json.dumps({"name": "extra", "version": "1.0", "build": "0"}))
    assert record_index._from_index(src) is None
    assert "extra" in {r.name for r in record_index.load_prefix(src).records}
    extra.unlink()

    (src / record_index.INDEX).write_bytes(b"not marshal")
    assert record_index._from_index(src) is None
    assert [r.name for r in record_index.load_prefix(src).records] == [r.name for r in records]


def test_clone_from_the_index_equals_clone_from_the_json(env, tmp_path):
    src = _writable_copy(env, tmp_path)
    dest = tmp_path / "w" / "env"
    digests = []
    for with_index in (False, True):
        if with_index:
            record_index.write(src, Prefix.load(src).records)
        assert (record_index._from_index(src) is not None) == with_index
        run_envtools("clone", src, dest)
        d = tree_digest(dest, skip=())
        del d["conda-meta/history"]  # (a time stamp)
        for k in [k for k in d if k.startswith("conda-meta/envtools/statcache/")]:
            del d[k]  # (inode numbers)
        d["stat cache"] = sorted((k, v[0], entry_sha(v)) for k, v in load_stat_cache(dest).items())
        digests.append(d)
        shutil.rmtree(dest)
    assert digests[0] == digests[1]

"""The stat cache key (envtools.prefix.hashing): an in-place edit of a package cache file whose
size and mtime were put back (``touch -r``) is caught by ``clone`` and by plain
``validate``; a second clone linking the same cache files does not make validate of the
first hash them; an env whose stat cache was written before ctime was in the key (stat
cache version 4) still validates without hashing, and gets the full keys.

The clones are made by the owner of root's files without root's privileges (a user
namespace), as the owner of a cache does: they hardlink every cache file, which is what
moves the shared inodes' ctime and link count (root copies instead).
"""

from __future__ import annotations

import json
import marshal
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import ENVTOOLS, run_envtools
from envtools.prefix.hashing import STAT_CACHE

EDITED = "include/demo.h"
#: the part validate stores refreshed keys in (hashing.REFRESHED)
REFRESHED = "refreshed"


def _as(who: str, *args) -> subprocess.CompletedProcess:
    """The envtools CLI as root, or as the owner of root's files without root's
    privileges (``owner``: unshare --user), so that a clone hardlinks."""
    cmd = [*ENVTOOLS, *map(str, args)]
    if who == "owner":
        if os.geteuid() != 0 or not shutil.which("unshare"):
            pytest.skip("needs root to create a user namespace with unshare --user")
        cmd = ["unshare", "--user", "--", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=180,
                       env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})
    if who == "owner" and p.returncode != 0 and "unshare" in p.stderr:
        pytest.skip(f"user namespaces unavailable: {p.stderr.strip()}")
    return p


def _site(channel: Path, tmp_path: Path) -> Path:
    site = tmp_path / "site" / "p"
    run_envtools("install", "--channel", channel, "--prefix", site, "demo-meta")
    return site


def _cache_file(site: Path) -> Path:
    return next((site.parent / "p.pkgs").glob("libdemo-*")) / EDITED


def _edit_in_place(fp: Path) -> None:
    """Change a byte of ``fp`` in place, keeping its size, mtime, inode and mode
    (``touch -r`` afterwards): only its ctime tells."""
    st = fp.stat()
    data = fp.read_bytes()
    assert b"demo" in data
    with open(fp, "r+b") as fh:  # (root: the read-only mode does not stop it)
        fh.write(data.replace(b"demo", b"evil", 1))
    os.utime(fp, ns=(st.st_atime_ns, st.st_mtime_ns))
    after = fp.stat()
    assert (after.st_size, after.st_mtime_ns, after.st_ino, after.st_mode) == \
        (st.st_size, st.st_mtime_ns, st.st_ino, st.st_mode)
    assert after.st_ctime_ns != st.st_ctime_ns


def _validate(who: str, prefix: Path) -> dict:
    p = _as(who, "validate", prefix, "--json", "--no-imports")
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


def _altered(doc: dict) -> list[list[str]]:
    return [f["paths"] for f in doc["findings"] if f["check"] == "altered-file"]


def _clone(who: str, src: Path, dest: Path) -> None:
    p = _as(who, "clone", src, dest)
    assert p.returncode == 0, p.stderr
    if who == "owner":
        assert os.stat(dest / EDITED).st_ino == os.stat(_cache_file(src)).st_ino, \
            "the owner's clone was to hardlink the cache file"


@pytest.mark.parametrize("who", ["root", "owner"])
def test_clone_refuses_a_cache_file_edited_in_place_with_its_mtime_kept(channel, tmp_path,
                                                                        who):
    """The edited cache file keeps the (size, mtime, inode) the site env's stat cache
    holds for it (the site env shares its inode): only its ctime says it changed. The
    clone hashes it, refuses it and leaves nothing; plain validate of the site env
    reports the file."""
    site = _site(channel, tmp_path)
    target = _cache_file(site)
    _edit_in_place(target)
    p = _as(who, "clone", site, tmp_path / "dest")
    assert p.returncode == 1, p.stderr
    assert "does not match its record" in p.stderr and str(target) in p.stderr, p.stderr
    assert not (tmp_path / "dest").exists()
    assert _altered(_validate("root", site)) == [[EDITED]]


def test_validate_of_a_clone_reports_a_cache_file_edited_in_place(channel, tmp_path):
    """A clone that hardlinked the cache file: plain validate (no --full) of the clone
    reports the in-place edit of the shared inode."""
    site = _site(channel, tmp_path)
    dest = tmp_path / "dest"
    _clone("owner", site, dest)
    before = _validate("owner", dest)
    assert before["exit_status"] == 0 and before["checked"]["hashed"] == 0, before
    _edit_in_place(_cache_file(site))
    doc = _validate("owner", dest)
    assert _altered(doc) == [[EDITED]], doc["findings"]
    assert doc["checked"]["hashed"] == 1, doc["checked"]


def test_a_second_clone_does_not_make_validate_of_the_first_hash(channel, tmp_path):
    """A second clone hardlinks the same cache files, which changes the shared inodes'
    ctime and link count: validate of the first clone still hashes nothing (a link
    count change excuses the ctime change) and stores the keys again, so that an
    in-place edit after that is caught by the next validate of either clone. Nor does
    validate of the site env hash, and it writes nothing into it (root's, read-only)."""
    site = _site(channel, tmp_path)
    first, second = tmp_path / "first", tmp_path / "second"
    _clone("owner", site, first)
    _clone("owner", site, second)
    parts = sorted(p.name for p in (site / STAT_CACHE).iterdir())
    doc = _validate("root", site)
    assert doc["exit_status"] == 0 and doc["checked"]["hashed"] == 0, doc["checked"]
    assert sorted(p.name for p in (site / STAT_CACHE).iterdir()) == parts
    doc = _validate("owner", first)
    assert doc["exit_status"] == 0, doc["findings"]
    assert doc["checked"]["files"] > 10 and doc["checked"]["hashed"] == 0, doc["checked"]
    refreshed = first / STAT_CACHE / f"{REFRESHED}.marshal"
    assert refreshed.is_file()
    again = _validate("owner", first)
    assert again["exit_status"] == 0 and again["checked"]["hashed"] == 0
    _edit_in_place(_cache_file(site))
    for prefix in (first, second):
        doc = _validate("owner", prefix)
        assert _altered(doc) == [[EDITED]], (prefix.name, doc["findings"])


def _to_version_4(prefix: Path) -> int:
    """Rewrite ``prefix``'s stat cache as envtools wrote it before ctime was in the key
    (version 4: ``rel -> (size, mtime_ns, ino[, sha256])``); returns the entries."""
    d = prefix / STAT_CACHE
    os.chmod(d, 0o755)
    n = 0
    for fp in d.glob("*.marshal"):
        _version, entries = marshal.loads(fp.read_bytes())
        old = {k: v[:3] + v[5:] if len(v) >= 5 else v for k, v in entries.items()}
        assert all(len(v) in (3, 4) for v in old.values())
        os.chmod(fp, 0o644)
        fp.write_bytes(marshal.dumps((4, old)))
        n += len(old)
    return n


def test_an_env_with_the_old_key_format_validates_and_gets_the_new_keys(channel, tmp_path):
    """A clone whose stat cache is of version 4 (no ctime): plain validate hashes
    nothing and calls it clean (no mass re-hash, no error), and, the clone being the
    user's, stores the full keys of what it checked, so that an in-place edit after
    that is caught."""
    site = _site(channel, tmp_path)
    dest = tmp_path / "dest"
    _clone("owner", site, dest)
    assert _to_version_4(dest) > 10
    doc = _validate("owner", dest)
    assert doc["exit_status"] == 0 and doc["checked"]["hashed"] == 0, doc
    _version, refreshed = marshal.loads(
        (dest / STAT_CACHE / f"{REFRESHED}.marshal").read_bytes())
    assert refreshed and all(len(v) in (5, 6) for v in refreshed.values())
    _edit_in_place(_cache_file(site))
    assert _altered(_validate("owner", dest)) == [[EDITED]]



def test_validate_after_add_hashes_nothing(channel, tmp_path):
    """``envtools add`` hashes the package it stages and renames its files into the env,
    which moves their ctime: the keys it stores are taken again after the move, so the
    next validate hashes none of the added files (and stores nothing)."""
    site = _site(channel, tmp_path)
    dest = tmp_path / "dest"
    _clone("root", site, dest)
    run_envtools("add", dest, "demo-extra")
    doc = _validate("root", dest)
    assert doc["exit_status"] == 0 and doc["checked"]["hashed"] == 0, doc["checked"]
    assert not (dest / STAT_CACHE / f"{REFRESHED}.marshal").exists()

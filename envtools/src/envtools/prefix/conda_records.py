"""Package records in the shape conda itself writes, and conda's records read right.

conda, ``conda doctor`` and conda-pack read ``conda-meta/*.json`` as conda writes it
(conda/core/path_actions.py), which differs from py-rattler's in two ways that matter:

* ``sha256_in_prefix``: conda records it for every file it links (the package's sha256,
  or the hash after prefix replacement) and for no symbolic link. rattler leaves it out
  for files it links unchanged, so ``conda doctor`` could not see an edit to them, and
  gives a symlink the hash of its target's *path*, which ``conda doctor`` (hashing the
  file the link points to) reports as altered. :func:`conda_shape` rewrites the records
  of a fresh install to conda's convention.
* a ``noarch: python`` package: conda writes ``files`` prefix-relative
  (``lib/python3.11/site-packages/x.py``) but ``paths_data`` with the package's own paths
  (``site-packages/x.py``, ``python-scripts/x``) for the files it linked, and prefix paths
  for what it made (bytecode, entry points). :func:`prefix_paths` turns such entries into
  prefix paths when a record is read, so every reader of :attr:`Record.paths` (validate,
  clone, the untracked scan) sees the files where they are.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from envtools.prefix import confine
from envtools.prefix.hashing import hash_many

#: a noarch: python package's own directories and where conda installs them (bin/ for
#: python-scripts/; site-packages/ goes to the env's site-packages directory)
_SITE, _SCRIPTS = "site-packages/", "python-scripts/"


def _site_dir(files: list[str]) -> str | None:
    """The env's site-packages directory, as the record's (prefix-relative) ``files``
    name it: ``lib/python3.11/site-packages``."""
    for f in files:
        i = f.find("/site-packages/")
        if i > 0:
            return f[:i + len("/site-packages")]
    return None


def prefix_paths(entries: list[dict], files: list[str] | None) -> list[dict]:
    """``entries`` of a noarch: python record with every package-relative ``_path``
    (conda's way) made prefix-relative; entries already so (rattler's, envtools')
    come back as they are. Only paths the record's ``files`` confirm are translated:
    a prefix path that merely starts with ``site-packages/`` is left alone."""
    if not entries or not any(e["_path"].startswith((_SITE, _SCRIPTS)) for e in entries):
        return entries
    listed = set(files or ())
    site = _site_dir(files or [])
    out = []
    for e in entries:
        p = e["_path"]
        new = None
        if p.startswith(_SITE) and site and p not in listed:
            new = f"{site}/{p[len(_SITE):]}"
        elif p.startswith(_SCRIPTS) and p not in listed:
            new = f"bin/{p[len(_SCRIPTS):]}"
        if new is not None and new in listed:
            e = {**e, "_path": new}
        out.append(e)
    return out


def conda_shape(prefix: Path, names: set[str] | None = None) -> int:
    """Give the records of ``prefix`` (those of packages in ``names``, or all) conda's
    ``sha256_in_prefix``: for a linked file the package's sha256 when it was linked
    unchanged, the hash of the file in the env when its prefix was replaced and the
    installer did not record one; none for a symbolic link. Returns how many records
    changed. Idempotent: a record already in this shape is not rewritten."""
    meta = prefix / "conda-meta"
    changed = 0
    for fp in sorted(meta.glob("*.json")):
        raw = confine.read_regular(str(fp))
        if raw is None:
            continue
        data = json.loads(raw)
        if not isinstance(data, dict) or (names is not None and data.get("name") not in names):
            continue
        entries = (data.get("paths_data") or {}).get("paths") or []
        to_hash: list[dict] = []
        dirty = False
        for e in entries:
            pt = e.get("path_type", "hardlink")
            if pt == "softlink":
                if "sha256_in_prefix" in e:
                    del e["sha256_in_prefix"]
                    dirty = True
            elif pt == "hardlink" and not e.get("sha256_in_prefix"):
                if e.get("prefix_placeholder"):
                    to_hash.append(e)
                elif e.get("sha256"):
                    e["sha256_in_prefix"] = e["sha256"]
                    dirty = True
        if to_hash:
            files = prefix_paths(to_hash, data.get("files"))
            confine.check_paths([f["_path"] for f in files], f"record {fp.name}")
            got = hash_many(str(prefix / f["_path"]) for f in files)
            for e, f in zip(to_hash, files, strict=True):
                h = got.get(str(prefix / f["_path"]))
                if h:
                    e["sha256_in_prefix"] = h
                    dirty = True
        if dirty:
            mode = os.stat(fp).st_mode & 0o777
            tmp = fp.with_name(f".{fp.name}.envtools-shape")
            confine.write_new(str(tmp), json.dumps(data).encode(), mode | 0o200)
            os.chmod(tmp, mode)
            os.replace(tmp, fp)
            changed += 1
    return changed


def write_cache_records(cache: Path, records: list) -> int:
    """Make ``cache`` a package cache conda can read (``pkgs_dirs``): every extracted
    package gets conda's ``info/repodata_record.json`` (its repodata record: conda
    matches a package it needs against the url, size and md5 there, and without the
    file it would re-read the archive, which this cache does not keep), and the cache
    its ``urls.txt``. ``records``: rattler's RepoDataRecords of what was installed.
    Returns how many entries got a record."""

    n = 0
    urls: list[str] = []
    for r in records:
        info = cache / dist_of(r) / "info"
        if not (info / "index.json").is_file() or info.is_symlink():
            continue
        confine.replace(str(info / "repodata_record.json"), (r.to_json() + "\n").encode(),
                        0o644)
        urls.append(str(r.url))
        n += 1
    confine.replace(str(cache / "urls.txt"), "".join(f"{u}\n" for u in sorted(urls)).encode(),
                    0o644)
    return n


def dist_of(r) -> str:
    """``name-version-build``: the cache directory rattler looks for."""
    return confine.check_name(f"{r.name.normalized}-{r.version}-{r.build}",
                              f"package {r.file_name}")

"""Checks of the files against their records: each recorded file there with its sha256
(the stat cache vouching for unchanged ones), no path unsafe, none clobbered, a clone's
own links to its package cache, the explicit package set install wrote.

A record's path is data (see :mod:`envtools.prefix.confine`): one that is absolute,
holds ``..``, or lies under a symlink is reported as ``unsafe-path`` and never opened.
The one kind of link validate follows is a clone's own link to its package cache
(cachelinks.link_target: a package file, or with ``--link-mode dirs`` a directory, that
leads to the same path in the cache directory its record names); any other link where
a record has a file is reported as ``altered-file``, and its target is not read.
"""

from __future__ import annotations

import bisect
import json
import os
import stat
from pathlib import Path

from envtools.base.progress import task
from envtools.place import cachelinks
from envtools.prefix import confine
from envtools.prefix.hashing import (
    entry_sha,
    file_key,
    hash_many,
    key_exact,
    key_holds,
    load_stat_cache,
    may_refresh,
    refresh_part,
)
from envtools.prefix.readonly import EXPLICIT
from envtools.prefix.records import Record
from envtools.validate.binaries import env_python
from envtools.validate.findings import Context


# ---------------------------------------------------------------- files
def check_files(ctx: Context) -> None:
    """Missing and altered files (sha256 against the records), clobbered paths.

    A file whose stat cache entry holds (hashing.key_holds) is not hashed. In an env
    this user may write (hashing.may_refresh), the current keys of the files whose entry
    was not exact (a link count change excused a ctime change, a version 4 entry) or that
    were hashed and hold their hash are stored again (hashing.refresh_part): no hashing
    for that, and the next in-place edit is caught by its ctime."""
    root = ctx.prefix.root
    cache = {} if ctx.full else load_stat_cache(root)
    refresh: dict[str, tuple] | None = {} if may_refresh(root) else None
    stats: dict[str, os.stat_result] = {}
    expected: dict[str, tuple[Record, dict]] = {}
    for r in ctx.prefix.records:
        for e in r.paths:
            rel = e["_path"]
            ctx.owners.setdefault(rel, []).append(r)
            expected[rel] = (r, e)
    for rel in _unsafe(ctx, expected):
        del expected[rel]
    for rel, owners in ctx.owners.items():
        if len(owners) > 1:
            names = [o.name for o in owners]
            shas = {o_e.get("sha256") for o in owners for o_e in o.paths if o_e["_path"] == rel}
            ctx.add("clobbered-file",
                    "error" if len(shas) > 1 else "warning",
                    f"{rel} is installed by {len(owners)} packages ({', '.join(names)}); the "
                    f"last one linked ({names[-1]}) won", names, [rel],
                    hint="remove one of the packages, or rebuild them so they do not share files")
    to_hash: list[str] = []
    want: dict[str, str] = {}
    for rel, (r, e) in expected.items():
        fp = os.path.join(root, rel)
        pt = e.get("path_type", "hardlink")
        try:
            st = os.lstat(fp)
            if stat.S_ISLNK(st.st_mode) and pt not in ("softlink", "directory"):
                # a package file may be a clone's link to its package cache (a
                # non-owner's clone): then what counts is the content read through it.
                # Any other link is not the package's file, and is not followed.
                target = os.readlink(fp)
                if target != cachelinks.link_target(r.extracted_package_dir,
                                                    r.noarch_python, rel):
                    ctx.add("altered-file", "error", f"{rel} of {r.name} {r.version} is a "
                            f"symbolic link to {target}, not the package's file", [r.name],
                            [rel], hint=f"remove the link and reinstall {r.name} (or clone "
                            "the env again)")
                    continue
                ctx.cache_links.add(rel)
                st = os.stat(fp)
        except FileNotFoundError:
            if rel in ctx.cache_links:
                ctx.add("missing-file", "error",
                        f"{rel} of {r.name} {r.version} is a symlink to {os.readlink(fp)}, "
                        "which is gone", [r.name], [rel], hint=_CACHE_GONE)
                continue
            gone = _dangling_link(root, rel, ctx.linked_dirs)
            if gone:  # (a clone's directory link to a package cache that is gone)
                ctx.add("missing-file", "error",
                        f"{rel} of {r.name} {r.version} is missing: {gone[0]} is a link to "
                        f"{gone[1]}, which is gone", [r.name], [rel], hint=_CACHE_GONE)
                continue
            ctx.add("missing-file", "error", f"{rel} of {r.name} {r.version} is missing",
                    [r.name], [rel], hint=f"reinstall {r.name} (clone the env again, or "
                    f"restore the file)")
            continue
        except OSError as ex:
            ctx.add("missing-file", "error", f"cannot read {rel}: {ex.strerror}", [r.name], [rel],
                    hint="check the file's permissions")
            continue
        if pt in ("softlink", "directory"):
            continue
        if not stat.S_ISREG(st.st_mode):
            _altered(ctx, r, rel)
            continue
        sha = e.get("sha256_in_prefix") or e.get("sha256")
        if not sha:
            continue
        want[rel] = sha
        size = e.get("size_in_bytes")
        if size is not None and not e.get("prefix_placeholder") and st.st_size != size:
            _altered(ctx, r, rel)
            continue
        c = cache.get(rel)
        if c is not None and key_holds(c, st):
            held = entry_sha(c)
            if (held or e.get("sha256")) != sha:  # (None: the package's)
                _altered(ctx, r, rel)
            elif refresh is not None and not key_exact(c, st):
                refresh[rel] = (*file_key(st), held) if held else file_key(st)
            continue
        to_hash.append(rel)
        stats[rel] = st
    with task("hashing files", len(to_hash)) as advance:
        got = hash_many((os.path.join(root, rel) for rel in to_hash), advance=advance)
    for rel in to_hash:
        h = got.get(os.path.join(root, rel))
        if h is not None and h != want[rel]:
            _altered(ctx, expected[rel][0], rel)
        elif h is not None and refresh is not None:
            st = stats[rel]
            refresh[rel] = file_key(st) if h == expected[rel][1].get("sha256") \
                else (*file_key(st), h)
    if refresh:
        refresh_part(root, refresh)
    ctx.checked["files"] = len(expected)
    ctx.checked["hashed"] = len(to_hash)
    _settle_pycs(ctx)


_CACHE_GONE = ("the package cache this env links to is gone or unreadable: clone the "
               "environment again from its source (--link-mode copy gives a clone that "
               "does not depend on the cache)")


def _dangling_link(root: Path, rel: str, linked: dict[str, str]) -> tuple[str, str] | None:
    """The clone's directory link (``linked``) on the way to ``rel`` whose target is
    gone, if any."""
    d = rel.rpartition("/")[0]
    while d:
        if d in linked and not os.path.exists(os.path.join(root, d)):
            return d, linked[d]
        d = d.rpartition("/")[0]
    return None


def _unsafe(ctx: Context, expected: dict[str, tuple[Record, dict]]) -> list[str]:
    """Record paths validate must not open: unsafe by the path rule, or under a directory
    that is a symlink (or not a directory) in the env; one finding per cause."""
    bad: list[str] = []
    rels = list(expected)
    dirs = confine.ancestors(rels)
    if confine.first_unsafe(rels, dirs):
        for rel in rels:
            why = confine.unsafe_reason(rel)
            if why:
                r = expected[rel][0]
                ctx.add("unsafe-path", "error", f"the record of {r.name} {r.version} lists "
                        f"{rel!r}, which is {why}: a path outside the environment",
                        [r.name], [rel], hint="the record is damaged or hostile; do not use "
                        "this environment: clone it from a trusted source or reinstall it")
                bad.append(rel)
        unsafe = set(bad)
        rels = [rel for rel in rels if rel not in unsafe]
        dirs = confine.ancestors(rels)
    root = str(ctx.prefix.root)
    linked: list[str] = []
    skip: tuple[str, ...] = ()  # (below a link: the first one on the way decides)
    ordered = sorted(rels)

    def under_dir(d: str) -> list[str]:  # (the record paths under d: a slice)
        return ordered[bisect.bisect_left(ordered, d + "/"):bisect.bisect_left(ordered, d + "0")]

    for d in sorted(dirs):
        if skip and d.startswith(skip):
            continue
        try:
            st = os.lstat(f"{root}/{d}")
        except OSError:
            continue  # (its files are reported missing)
        if stat.S_ISDIR(st.st_mode):
            continue
        skip += (d + "/",)
        if stat.S_ISLNK(st.st_mode):
            target = _clone_dir_link(root, d, under_dir(d), ctx.owners)
            if target is not None:
                ctx.linked_dirs[d] = target
                continue
        linked.append(d)
    for d in linked:
        under = under_dir(d)
        names = sorted({expected[rel][0].name for rel in under})
        ctx.add("unsafe-path", "error", f"{d} is a symbolic link or a file, and the records of "
                f"{', '.join(names)} list {len(under)} file(s) under it; they were not read",
                names, under[:20], hint="something replaced a directory of the environment "
                "with a link; remove the link and reinstall those packages")
        bad += under
    return bad


def _clone_dir_link(root: str, d: str, under: list[str],
                    owners: dict[str, list[Record]]) -> str | None:
    """The target of ``d`` if it is a clone's directory link to its package cache
    (layers.py): one package owns every record path under it, and it leads to the
    same directory in that package's cache directory (cachelinks.link_target)."""
    recs = {id(r): r for rel in under for r in owners.get(rel, ())}
    if len(recs) != 1:
        return None
    r = next(iter(recs.values()))
    target = os.readlink(f"{root}/{d}")
    return target if target == cachelinks.link_target(r.extracted_package_dir,
                                                      r.noarch_python, d) else None


def check_explicit(ctx: Context) -> None:
    """``conda-meta/envtools/explicit.txt`` (written by install) and the records agree:
    the same packages, from the same URLs, with the same archive sha256."""

    try:
        text = (ctx.prefix.root / EXPLICIT).read_text()
    except FileNotFoundError:
        return
    except OSError as ex:
        ctx.add("explicit", "error", f"cannot read {EXPLICIT}: {ex.strerror}",
                hint="check its permissions")
        return
    listed: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("#", "@")):
            url, _, sha = line.partition("#sha256:")
            listed[url] = sha
    hint = ("explicit.txt is written by envtools install from the verified archives; a "
            "difference means the records or the file were changed since: reinstall")
    seen: set[str] = set()
    for r in ctx.prefix.records:
        url, sha = r.data.get("url"), r.data.get("sha256")
        if url not in listed:
            ctx.add("explicit", "error", f"{r.name} {r.version} is installed but "
                    f"{EXPLICIT} does not list it ({url})", [r.name], hint=hint)
            continue
        seen.add(url)
        if sha != listed[url]:
            ctx.add("explicit", "error", f"{r.name} {r.version}: its record says archive "
                    f"sha256 {sha}, {EXPLICIT} says {listed[url] or 'none'}", [r.name],
                    hint=hint)
    for url in sorted(set(listed) - seen):
        fn = url.rsplit("/", 1)[-1]
        name = fn.removesuffix(".conda").removesuffix(".tar.bz2").rsplit("-", 2)[0]
        ctx.add("explicit", "error", f"{EXPLICIT} lists {url}, which is not installed "
                f"(removed behind conda's back?)", [name],
                hint=f"reinstall {name}: clone the env again, or reinstall it")


def _altered(ctx: Context, r: Record, rel: str) -> None:
    if rel.endswith(".pyc") and "/__pycache__/" in f"/{rel}":
        ctx.pending_pycs.append((r, rel))  # settled by _settle_pycs
        return
    ctx.add("altered-file", "error", f"{rel} of {r.name} {r.version} was changed after install",
            [r.name], [rel],
            hint=f"if pip or a user overwrote it, undo that; otherwise reinstall {r.name}")


#: run by the env's python: which of these pycs are exactly what its import system writes
#: for the source as it is now (compile + the pyc's own header kind)?
_REGEN = r"""
import importlib._bootstrap_external as be, importlib.util as iu, json, os, struct, sys
out = []
for pyc in json.loads(sys.stdin.read()):
    head, name = os.path.split(pyc)
    src = os.path.join(os.path.dirname(head), name.split(".", 1)[0] + ".py")
    try:
        data = open(pyc, "rb").read()
        sb = open(src, "rb").read()
        flags, = struct.unpack("<I", data[4:8])
        code = compile(sb, src, "exec", dont_inherit=True)
        if flags & 1:
            new = be._code_to_hash_pyc(code, iu.source_hash(sb), bool(flags & 2))
        else:
            st = os.stat(src)
            new = be._code_to_timestamp_pyc(code, st.st_mtime, st.st_size)
        out.append(new == data)
    except Exception:
        out.append(False)
print(json.dumps(out))
"""


def _settle_pycs(ctx: Context) -> None:
    """An altered ``.pyc`` is harmless when it is byte for byte what the env's python
    writes for its source as installed: the package shipped a cache that was stale
    at install (a relocated or re-stamped .py) and an import by someone allowed to write
    (root, the owner) replaced it. Anything else is reported as altered."""
    import subprocess

    pending, ctx.pending_pycs = ctx.pending_pycs, []
    if not pending:
        return
    same = [False] * len(pending)
    python = env_python(ctx.prefix.root)
    if python:
        try:
            p = subprocess.run([python, "-I", "-B", "-c", _REGEN], capture_output=True,
                               text=True, timeout=60, input=json.dumps(
                                   [os.path.join(ctx.prefix.root, rel) for _, rel in pending]))
            got = json.loads(p.stdout) if p.returncode == 0 else []
            if isinstance(got, list) and len(got) == len(pending):
                same = [g is True for g in got]
        except (OSError, subprocess.TimeoutExpired, ValueError):
            pass
    for (r, rel), ok in zip(pending, same, strict=True):
        if ok:
            ctx.add("altered-file", "warning", f"{rel} of {r.name} {r.version} was rewritten by "
                    "Python with the bytecode of its source as installed: the package's own "
                    "was stale, and an import by someone allowed to write (root, or the env's "
                    "owner) replaced it", [r.name], [rel],
                    hint=f"harmless for running code; {r.name} should ship hash-based pycs of "
                    "its installed sources (or none); reinstall it to undo")
        else:
            ctx.add("altered-file", "error",
                    f"{rel} of {r.name} {r.version} was changed after install", [r.name], [rel],
                    hint=f"if pip or a user overwrote it, undo that; otherwise reinstall {r.name}")



"""``envtools validate``: does everything in an environment still fit together?

Each check yields :class:`Finding` objects with a severity, the packages involved and a
hint how to fix it. Users typically run this after adding packages to a clone (with
conda, pip or envtools), to learn whether their additions broke the curated set.

JSON output (``--json``), schema version 1::

    {
      "schema": "envtools-validate/1",
      "prefix": "/abs/path",
      "exit_status": 0 | 1,               # 0: no error-severity findings
      "summary": {"error": N, "warning": N, "info": N},
      "virtual_packages": ["__glibc=2.36=0", ...],
      "checked": {"packages": N, "files": N, "hashed": N, "pip_distributions": N,
                  "elf_files": N, "imports": N},
      "findings": [
        {"check": "depends", "severity": "error" | "warning" | "info",
         "message": "...", "packages": ["name", ...], "paths": ["rel/path", ...],
         "hint": "..."}
      ]
    }

Checks (the ``check`` field): depends, constrains, unsafe-path, missing-file,
altered-file, clobbered-file, explicit, pip-duplicate, pip-requires, pip-overwrote,
editable-install, linked-directories, elf-arch, elf-damaged, elf-unresolved,
elf-optional, elf-mpi-flavour, duplicate-library, python-abi, import-error, import-crash,
numpy-abi, import-shadowed, import-optional, import-timeout, import-skipped, cuda-driver,
interrupted-change.
Libraries are resolved the way ld.so loads them (:mod:`envtools.loader`); modules are
imported by the env's python (:mod:`envtools.imports`, unless ``--no-imports``).

A record's path is data (see :mod:`envtools.confine`): one that is absolute, holds
``..``, or lies under a symlink is reported as ``unsafe-path`` and never opened. The one
kind of link validate follows is a clone's own link to its package cache
(cachelinks.link_target: a package file, or with ``--link-mode dirs`` a directory, that
leads to the same path in the cache directory its record names); any other link where
a record has a file is reported as ``altered-file``, and its target is not read.
"""

from __future__ import annotations

import bisect
import json
import os
import re
import stat
import sys
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

import rattler

from envtools import cachelinks, confine, cudaenv, elf, loader, virtual
from envtools.errors import EnvtoolsError
from envtools.hashing import (
    entry_sha,
    file_key,
    hash_many,
    key_exact,
    key_holds,
    load_stat_cache,
    may_refresh,
    refresh_part,
)
from envtools.prefix_records import Prefix, Record
from envtools.progress import info, task

SCHEMA = "envtools-validate/1"
SEVERITIES = ("error", "warning", "info")
#: libraries the GPU driver provides; unresolved only means "no driver on this node"
DRIVER_LIBS = re.compile(r"^lib(cuda|nvidia-ml|nvidia-[\w-]+|nvcuvid|nvidia)\.so")
DUP_FAMILIES = {"nccl": re.compile(r"^libnccl\.so"), "mpi": re.compile(r"^libmpi\.so")}
EXT_RE = re.compile(r"\.(cpython-(\d)(\d+)[a-z]*)-[\w-]+\.so$")


@dataclass
class Finding:
    check: str
    severity: str
    message: str
    packages: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    hint: str = ""


@dataclass
class Context:
    """What the checks share: the env, its records, virtual packages, and file facts."""

    prefix: Prefix
    virtuals: list[virtual.Virtual]
    full: bool
    #: run the import smoke test (``--no-imports`` turns it off), per-module limit in s
    imports: bool = True
    import_timeout: float = 60.0
    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    #: rel path -> owning conda record names (more than one means clobbered)
    owners: dict[str, list[Record]] = field(default_factory=dict)
    pip_owned: dict[str, str] = field(default_factory=dict)
    #: a clone's own links to its package cache that check_files accepted (and so the
    #: only links check_binaries follows): files (rel) and directories ({rel: target})
    cache_links: set[str] = field(default_factory=set)
    linked_dirs: dict[str, str] = field(default_factory=dict)
    #: the import smoke test running beside the other checks (see start_imports)
    import_job: tuple | None = None
    #: (record, rel) of altered .pyc files, checked together by _settle_pycs
    pending_pycs: list[tuple[Record, str]] = field(default_factory=list)
    #: what the import smoke test found, by module (envtools.imports.Outcome): for callers
    #: that need one module's result, as the channel pipeline does for its curated imports
    import_outcomes: dict = field(default_factory=dict)

    def add(self, check: str, severity: str, message: str, packages=(), paths=(), hint=""):
        self.findings.append(Finding(check, severity, message, list(packages), list(paths),
                                     hint))

    @property
    def subdir(self) -> str:
        subs = [r.data.get("subdir") for r in self.prefix.records]
        subs = [s for s in subs if s and s != "noarch"]
        if subs:
            return max(set(subs), key=subs.count)
        machine = os.uname().machine
        return {"x86_64": "linux-64"}.get(machine, f"linux-{machine}")

    def python_version(self) -> tuple[int, int] | None:
        r = self.prefix.by_name().get("python")
        if r is None:
            return None
        parts = r.version.split(".")
        try:
            return int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            return None


# ---------------------------------------------------------------- package dependencies
def check_depends(ctx: Context) -> None:
    """Every depends/constrains of every record against installed + virtual packages."""
    subdir = ctx.subdir
    installed: dict[str, rattler.PackageRecord] = {}
    for r in ctx.prefix.records:
        installed[r.name] = rattler.PackageRecord(
            name=r.name, version=r.version, build=rattler.BuildString(r.build),
            build_number=int(r.data.get("build_number", 0)), subdir=r.data.get("subdir", subdir),
        )
    virtuals = {v.name: v.record(subdir) for v in ctx.virtuals}
    spec_cache: dict[str, rattler.MatchSpec | None] = {}

    def spec_of(s: str) -> rattler.MatchSpec | None:
        if s not in spec_cache:
            try:
                spec_cache[s] = rattler.MatchSpec(s)
            except Exception:
                spec_cache[s] = None
        return spec_cache[s]

    def have(name: str) -> rattler.PackageRecord | None:
        return virtuals.get(name) if name.startswith("__") else installed.get(name)

    for r in ctx.prefix.records:
        for dep in r.data.get("depends", []):
            ms = spec_of(dep)
            if ms is None:
                ctx.add("depends", "warning", f"{r.name} has an unparsable dependency {dep!r}",
                        [r.name], hint="report it to the package's maintainers")
                continue
            name = ms.name.normalized
            if name == "__cuda":
                continue  # the driver against the env's CUDA: check_cuda, one finding
            got = have(name)
            if got is None:
                if name.startswith("__"):
                    ctx.add("depends", "error",
                            f"{r.name} {r.version} needs the virtual package {dep!r}, which this "
                            "machine does not provide", [r.name],
                            hint=f"run on a machine that has it, or describe the target node with "
                            f"--virtual {name}=VERSION")
                else:
                    ctx.add("depends", "error",
                            f"{r.name} {r.version} depends on {dep!r} but {name} is not installed",
                            [r.name, name],
                            hint=f"install it: envtools clone ENV NEW --add '{dep}' (or conda "
                            f"install '{dep}' in a writable clone)")
            elif not ms.matches(got):
                ctx.add("depends", "error",
                        f"{r.name} {r.version} depends on {dep!r} but {name} {got.version} "
                        "is installed", [r.name, name],
                        hint=f"install a {name} that satisfies {dep!r}, or a {r.name} built for "
                        f"{name} {got.version}")
        for con in r.data.get("constrains", []):
            ms = spec_of(con)
            if ms is None:
                continue
            name = ms.name.normalized
            if name == "__cuda":
                continue  # check_cuda
            got = have(name)
            if got is not None and not ms.matches(got):
                ctx.add("constrains", "error",
                        f"{r.name} {r.version} constrains {con!r} but {name} {got.version} "
                        "is installed", [r.name, name],
                        hint=f"change {name} to satisfy {con!r}, or remove one of them")
    ctx.checked["packages"] = len(ctx.prefix.records)


def check_cuda(ctx: Context) -> None:
    """The CUDA driver (the __cuda virtual package) against the CUDA the env is built for.

    The env's CUDA is the highest ``__cuda`` lower bound its packages state (pytorch's CUDA
    build depends on ``__cuda >=13.0``, cuda-version constrains it): one finding naming
    both versions and the packages, never one per package. No driver at all is a note:
    login nodes have none, and the env is still fine for compute nodes that do.
    """
    need = cudaenv.env_cuda(ctx.prefix.records)
    if need is None:
        return
    who = ", ".join(need.packages)
    cuda = next((v for v in ctx.virtuals if v.name == "__cuda"), None)
    if cuda is None:
        ctx.add("cuda-driver", "info",
                f"the env is built for CUDA {need.version} ({who}) but no CUDA driver was "
                "found here; GPU code will not run on this node", list(need.packages),
                hint="normal on login nodes; validate on a GPU node, or pass --virtual "
                "__cuda=VERSION to check against a node's driver")
        return
    if not cudaenv.supports(cuda.version, need):
        ctx.add("cuda-driver", "error",
                f"the CUDA driver here supports CUDA {cuda.version}, but the env is built for "
                f"CUDA {need.version} ({who} need __cuda >={need.version})",
                list(need.packages),
                hint=f"update the NVIDIA driver to one for CUDA {need.version} or newer, or "
                "use the CPU build of the env (e.g. envtools install ... 'powerai=*=cpu*')")


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
    from envtools.install import EXPLICIT

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
    python = _env_python(ctx.prefix.root)
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


# ---------------------------------------------------------------- pip
def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _read_metadata(d: Path) -> dict:
    """Name, version and Requires-Dist from a dist-info METADATA / egg-info PKG-INFO."""
    fp = d / ("METADATA" if d.suffix == ".dist-info" else "PKG-INFO")
    meta: dict = {"name": None, "version": None, "requires": []}
    try:
        text = fp.read_text(errors="replace")
    except OSError:
        return meta
    for line in text.split("\n\n", 1)[0].splitlines():
        k, _, v = line.partition(":")
        v = v.strip()
        if k == "Name":
            meta["name"] = v
        elif k == "Version":
            meta["version"] = v
        elif k == "Requires-Dist":
            meta["requires"].append(v)
    try:
        extra = (d / "requires.txt").read_text(errors="replace") if d.suffix == ".egg-info" \
            else ""
    except OSError:
        extra = ""
    if extra:
        for line in extra.splitlines():
            if line.startswith("["):
                break
            if line.strip():
                meta["requires"].append(line.strip())
    return meta


def check_pip(ctx: Context) -> None:
    """pip-installed distributions against conda ones."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    root = ctx.prefix.root
    conda_names = {_norm(r.name): r.name for r in ctx.prefix.records}
    dists: dict[str, dict] = {}  # normalized name -> info (conda or pip)
    pip_dists = []
    for site in sorted(root.glob("lib/python*/site-packages")):
        for d in sorted(site.iterdir()):
            if d.suffix not in (".dist-info", ".egg-info") or not d.is_dir():
                continue
            meta = _read_metadata(d)
            if not meta["name"]:
                continue
            rel = str(d.relative_to(root))
            owner = ctx.owners.get(rel + "/METADATA") or ctx.owners.get(rel + "/PKG-INFO")
            info = {"dir": d, "rel": rel, **meta,
                    "conda": owner[0].name if owner else None}
            n = _norm(meta["name"])
            if owner is None:
                pip_dists.append(info)
                other = dists.get(n)
                conda_pkg = conda_names.get(n)
                if (other and other["conda"]) or conda_pkg:
                    pkg = other["conda"] if other and other["conda"] else conda_pkg
                    ctx.add("pip-duplicate", "error",
                            f"{meta['name']} {meta['version']} was installed by pip over the "
                            f"conda package {pkg}", [pkg, f"pip:{meta['name']}"], [rel],
                            hint=f"pip uninstall {meta['name']}, then install the version you "
                            f"need with envtools clone --add / conda install")
                elif other:
                    ctx.add("pip-duplicate", "error",
                            f"{meta['name']} is installed twice by pip ({other['rel']}, {rel})",
                            [f"pip:{meta['name']}"], [other["rel"], rel],
                            hint="pip uninstall it until only one copy remains")
            dists.setdefault(n, info)
            if owner is not None:
                dists[n] = info
    for n, r in conda_names.items():  # conda packages without a dist-info still count
        dists.setdefault(n, {"name": r, "version": ctx.prefix.by_name()[r].version,
                             "conda": r, "rel": None})
    pyver = ctx.python_version()
    env = {"extra": ""}
    if pyver:
        env.update(python_version=f"{pyver[0]}.{pyver[1]}",
                   python_full_version=ctx.prefix.by_name()["python"].version)
    for info in pip_dists:
        for req_s in info["requires"]:
            try:
                req = Requirement(req_s)
            except InvalidRequirement:
                continue
            try:
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
            except Exception:
                continue
            have = dists.get(_norm(req.name))
            if have is None:
                ctx.add("pip-requires", "error",
                        f"{info['name']} {info['version']} (pip) requires {req_s!r} but "
                        f"{req.name} is not installed", [f"pip:{info['name']}", req.name],
                        [info["rel"]], hint=f"install {req.name} (prefer the conda package: "
                        f"envtools clone --add {req.name}), or pip uninstall {info['name']}")
                continue
            try:
                ok = not req.specifier or req.specifier.contains(Version(have["version"]),
                                                                 prereleases=True)
            except InvalidVersion:
                ok = True
            if not ok:
                who = f"conda package {have['conda']}" if have.get("conda") else "pip"
                ctx.add("pip-requires", "error",
                        f"{info['name']} {info['version']} (pip) requires {req_s!r} but "
                        f"{have['name']} {have['version']} is installed (from {who})",
                        [f"pip:{info['name']}", have.get("conda") or req.name], [info["rel"]],
                        hint=f"pip install a {info['name']} compatible with {have['name']} "
                        f"{have['version']}, or change {have['name']}")
        # pip files written over conda files
        try:
            record_text = (info["dir"] / "RECORD").read_text(errors="replace")
        except OSError:
            record_text = None
        if record_text is not None:
            site_rel = str(info["dir"].parent.relative_to(root))
            clobbered = []
            for line in record_text.splitlines():
                path = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line
                rel = os.path.normpath(os.path.join(site_rel, path))
                ctx.pip_owned[rel] = info["name"]
                if rel in ctx.owners:
                    clobbered.append(rel)
            if clobbered:
                pkgs = sorted({o.name for rel in clobbered for o in ctx.owners[rel]})
                ctx.add("pip-overwrote", "error",
                        f"pip's {info['name']} {info['version']} wrote {len(clobbered)} file(s) "
                        f"that belong to conda package(s) {', '.join(pkgs)}",
                        [f"pip:{info['name']}", *pkgs], clobbered[:20],
                        hint=f"pip uninstall {info['name']} and reinstall {', '.join(pkgs)}")
    ctx.checked["pip_distributions"] = len(pip_dists)
    # altered-file findings that pip explains are reported once, as pip-overwrote
    pip_over = {p for f in ctx.findings if f.check == "pip-overwrote" for p in f.paths}
    ctx.findings = [f for f in ctx.findings
                    if not (f.check == "altered-file" and set(f.paths) <= pip_over)]
    from envtools.clone import find_editables

    for e in find_editables(root):
        ctx.add("editable-install", "info", f"editable install: {e}",
                hint="it runs code from outside the env; clones share that source directory")


# ---------------------------------------------------------------- binaries
#: top-level directories with no ELF files worth checking (their links are still found)
_NO_ELF = ("include", "share", "man", "doc")


def _elf_candidates(root: Path, cache_links: set[str],
                    linked_dirs: dict[str, str]) -> list[str]:
    """Files that may be ELF objects (``.so`` in the name, or executable). A clone's links
    to the package cache (``cache_links``, accepted by check_files) count as the files
    they lead to, and its directory links (``linked_dirs``: layers.py) are walked by the
    clone's path, where a library in one is opened (its $ORIGIN is the clone's). No
    other link is followed: a package's own links are checked at their targets, and
    anything else is data (see the module docstring)."""
    out: list[str] = []
    roots = str(root)
    cut = len(roots) + 1
    stack = [(roots, False)]
    while stack:
        dirpath, quiet = stack.pop()
        try:
            it = os.scandir(dirpath)
        except OSError:
            continue
        with it:
            for entry in it:
                fp = entry.path
                top = dirpath == roots
                if top and entry.name == "conda-meta":
                    continue
                skip = quiet or (top and entry.name in _NO_ELF)
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((fp, skip))
                        continue
                    if entry.is_symlink():
                        rel = fp[cut:]
                        if rel in linked_dirs:
                            stack.append((fp, skip))
                            continue
                        if skip or rel not in cache_links:
                            continue
                        st = None if ".so" in entry.name else os.stat(fp)
                    elif skip or ".so" in entry.name:
                        st = None
                    else:
                        st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if skip:
                    continue
                if ".so" in entry.name or (
                        st is not None and stat.S_ISREG(st.st_mode) and st.st_mode & 0o111
                        and not entry.name.endswith((".py", ".sh", ".txt"))):
                    out.append(fp)
    return out


def _env_python(root: Path) -> str | None:
    """The env's interpreter, ``bin/python`` as users run it (a venv-style env finds its
    pyvenv.cfg through that path); its real path is the program ld.so loads."""
    for name in ("python", "python3"):
        fp = root / "bin" / name
        if os.path.lexists(fp):  # (a dangling link is a python that cannot run: reported)
            return str(fp)
    return None


def _for_platform(owners: list[str], what: str) -> str:
    """The hint for a file built for the wrong platform or python, naming its package."""
    if owners == ["(untracked)"]:
        return f"remove it (no package owns it), or reinstall what put it there for {what}"
    pip = [o[4:] for o in owners if o.startswith("pip:")]
    if pip:
        return f"pip install --force-reinstall {pip[0]} (the wheel for {what})"
    return f"reinstall {', '.join(owners)} built for {what}"


def check_binaries(ctx: Context) -> None:
    """ELF arch, damaged ELF files, what ld.so would not find (see :mod:`envtools.loader`),
    duplicate NCCL/MPI, wrong python ABI."""
    root = ctx.prefix.root
    real_root = os.path.realpath(root)
    want = elf.SUBDIR_MACHINE.get(ctx.subdir)
    sysdirs = elf.system_library_dirs()

    def rel_of(path: str) -> str:
        return os.path.relpath(path, real_root)

    def owner_of(path: str) -> list[str]:
        rel = rel_of(path)
        if rel in ctx.owners:
            return [o.name for o in ctx.owners[rel]]
        if rel in ctx.pip_owned:
            return [f"pip:{ctx.pip_owned[rel]}"]
        return ["(untracked)"]

    def reinstall(path: str) -> str:
        who = owner_of(path)
        if who == ["(untracked)"]:
            return "remove it, or reinstall whatever put it there"
        pip = [w[4:] for w in who if w.startswith("pip:")]
        if pip:
            return f"pip install --force-reinstall {pip[0]}"
        return f"reinstall {', '.join(who)} (clone the env again, or restore the file)"

    elves: dict[str, elf.ElfInfo] = {}
    # a package file linked to the cache is checked where it is used: a library's
    # $ORIGIN is the directory it is opened in (the link's); a program's, its real one.
    # (A package's own links inside the env are checked at their targets.)
    real_dir: dict[str, str] = {}
    aliases: dict[str, str] = {}
    for fp in _elf_candidates(root, ctx.cache_links, ctx.linked_dirs):
        info = elf.read_elf(fp)
        if info is not None:
            key = real_root + fp[len(str(root)):]  # (the path it is opened by)
            elves[key] = info
            if os.path.islink(fp):
                aliases[os.path.realpath(fp)] = key
                if info.program:
                    real_dir[key] = os.path.dirname(os.path.realpath(fp))
    ctx.checked["elf_files"] = len(elves)
    linked = ctx.linked_dirs
    if linked:
        by_pkg: dict[str, list[str]] = {}
        caches = [(r.extracted_package_dir + "/", r.name) for r in ctx.prefix.records
                  if r.extracted_package_dir]
        for d, target in linked.items():
            owner = next((name for c, name in caches if target.startswith(c)), "?")
            by_pkg.setdefault(owner, []).append(d)
        names = sorted(by_pkg)
        ctx.add("linked-directories", "info",
                f"{len(linked)} directories of {len(names)} packages are links to the site's "
                f"package cache (read-only): {', '.join(names[:12])}"
                + (" ..." if len(names) > 12 else ""), names, sorted(linked)[:50],
                hint=f"pip and conda cannot remove or replace these packages' files; first "
                f"run: envtools detach {root} PACKAGE")
    for fp, info in list(elves.items()):
        rel = rel_of(fp)
        if info.damaged:
            ctx.add("elf-damaged", "error", f"{rel} is not a loadable ELF file ({info.damaged})",
                    owner_of(fp), [rel], hint=reinstall(fp))
        elif want and (info.machine, info.endian) != want:
            ctx.add("elf-arch", "error",
                    f"{rel} is built for {info.machine_name}, not {ctx.subdir}", owner_of(fp),
                    [rel], hint=f"{_for_platform(owner_of(fp), ctx.subdir)}")
        else:
            continue
        del elves[fp]  # ld.so would refuse it: not loaded, not searched further
    python = _env_python(root)
    res = loader.simulate(real_root, elves, sysdirs, python and os.path.realpath(python),
                          origins=real_dir, aliases=aliases)
    try:
        in_envlib = set(os.listdir(os.path.join(real_root, "lib")))
    except OSError:
        in_envlib = set()
    seen: set[tuple[str, str]] = set()
    plugins: dict[str, list[str]] = defaultdict(list)
    dlopened = _dlopened_libraries(elves, rel_of)
    env_names = {os.path.basename(k) for k in elves}
    for m in res.misses:
        if (m.obj, m.need) in seen:
            continue
        seen.add((m.obj, m.need))
        rel = rel_of(m.obj)
        via = "" if m.root == m.obj else f" (loaded from {rel_of(m.root)})"
        if m.kind == "plugin" or ((loader.capability(m.need) or m.need in env_names)
                                  and dlopened(m.root)):
            plugins[m.root].append(m.need)
        elif m.kind == "flavour":
            have = sorted({i.soname for i in elves.values() if i.soname in loader.MPI_FLAVOURS})
            ctx.add("elf-mpi-flavour", "info",
                    f"{rel} is built for {loader.MPI_FLAVOURS[m.need]} ({m.need}); this env's "
                    f"MPI is {', '.join(f'{loader.MPI_FLAVOURS[h]} ({h})' for h in have)}, "
                    "for which its sibling module is built", owner_of(m.obj), [rel],
                    hint="nothing to do: it is used only with that MPI")
        elif DRIVER_LIBS.match(m.need):
            ctx.add("elf-unresolved", "warning",
                    f"{rel} needs the driver library {m.need}, not found on this node{via}",
                    owner_of(m.obj), [rel],
                    hint="expected on nodes without a GPU driver; run on a GPU node")
        elif m.need in in_envlib:
            ctx.add("elf-unresolved", "warning",
                    f"{rel} needs {m.need}, which is in the env's lib/ but not on its RPATH{via}",
                    owner_of(m.obj), [rel],
                    hint="it only loads with LD_LIBRARY_PATH set; rebuild with "
                    "-Wl,-rpath,'$ORIGIN/../lib'")
        else:
            ctx.add("elf-unresolved", "error",
                    f"{rel} needs {m.need}, which is neither in the env nor on the system{via}",
                    owner_of(m.obj), [rel],
                    hint=f"install the package that provides {m.need} (conda), or the system "
                    f"library; if {rel} itself is stale: {reinstall(m.obj)}")
    for plugin, needs in plugins.items():
        rel = rel_of(plugin)
        needs = sorted(set(needs))
        what = sorted({loader.capability(n) or "" for n in needs} - {""}) or ["its feature"]
        ctx.add("elf-optional", "info",
                f"{' and '.join(what)} unavailable: {', '.join(needs)} not found "
                f"(optional plugin {rel}, loaded by its host only when wanted)",
                owner_of(plugin), [rel],
                hint=f"only on nodes with that hardware or service: install the system "
                f"package that provides {', '.join(needs)} there")
    resolved_system = {fam: {p for n, ps in res.system_hits.items() if pat.match(n) for p in ps}
                       for fam, pat in DUP_FAMILIES.items()}
    # two copies of libnccl / libmpi reachable
    for fam, pat in DUP_FAMILIES.items():
        copies = sorted({fp for fp in elves if pat.match(os.path.basename(fp))})
        if copies and resolved_system.get(fam):
            copies += sorted(resolved_system[fam])
        if len(copies) > 1:
            ours = [c for c in copies if c.startswith(real_root + os.sep)]
            rels = [rel_of(c) if c in ours else c for c in copies]
            owners = sorted({o for c in ours for o in owner_of(c)})
            ctx.add("duplicate-library", "error",
                    f"{len(copies)} copies of lib{fam} are reachable: {', '.join(rels)}",
                    owners, rels,
                    hint=f"keep one lib{fam}: uninstall the pip wheel (e.g. nvidia-{fam}-cu12) or "
                    "the conda package that brings the other")
    # compiled extensions for another python ABI
    pyver = ctx.python_version()
    if pyver:
        for fp in elves:
            m = EXT_RE.search(fp)
            if m and (int(m.group(2)), int(m.group(3))) != pyver:
                rel = rel_of(fp)
                ctx.add("python-abi", "error",
                        f"{rel} is a compiled extension for CPython {m.group(2)}.{m.group(3)}, "
                        f"but the env's python is {pyver[0]}.{pyver[1]}", owner_of(fp), [rel],
                        hint=_for_platform(owner_of(fp), f"python {pyver[0]}.{pyver[1]}"))


# ---------------------------------------------------------------- imports
def _has_pyinit(fp: str) -> bool:
    """Whether a library named like an extension module exports its ``PyInit_<name>``
    (triton ships dlopened plugins with importable names)."""
    import mmap

    stem = os.path.basename(fp).split(".", 1)[0]
    try:
        with open(fp, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return mm.find(b"PyInit_" + stem.encode() + b"\0") >= 0
    except (OSError, ValueError):
        return True  # unreadable: keep calling it an extension, as before


def _dlopened_libraries(elves: dict[str, elf.ElfInfo], rel_of):  # noqa: ANN001, ANN202
    """A predicate: whether a library is one a wheel's host dlopens at run time, as Open
    MPI does its plugins (NVSHMEM's transports, cuFile's RDMA layer, triton's MLIR
    plugins and what they link): under site-packages, not an extension module Python
    imports, and linked by nothing but such libraries. A hardware library one misses, or
    a library of the env it expects its host to have loaded already, is then the plugin's
    note, not an error. Decided only for the files asked about (a miss's root)."""
    linkers: dict[str, set[str]] = defaultdict(set)
    for fp, e in elves.items():
        for n in e.needed:
            linkers[n].add(fp)
    memo: dict[str, bool] = {}

    def dlopened(fp: str) -> bool:
        if fp in memo:
            return memo[fp]
        memo[fp] = False  # (a cycle of links: not a plugin)
        info = elves.get(fp)
        rel = rel_of(fp)
        if info is None or info.program or "/site-packages/" not in rel or (
                loader.is_extension(rel) and _has_pyinit(fp)):
            return False
        by = linkers.get(os.path.basename(fp), set()) | (
            linkers.get(info.soname, set()) if info.soname else set())
        memo[fp] = all(dlopened(b) for b in by)
        return memo[fp]

    return dlopened


def _optional_requirements(ctx: Context, rec_paths: list[str]) -> set[str]:
    """Normalized names a package's dist-info lists only under an extra (optional)."""
    from packaging.requirements import InvalidRequirement, Requirement

    out: set[str] = set()
    for rel in rec_paths:
        if not rel.endswith(".dist-info/METADATA"):
            continue
        for req_s in _read_metadata(ctx.prefix.root / rel[: -len("/METADATA")])["requires"]:
            try:
                req = Requirement(req_s)
            except InvalidRequirement:
                continue
            if req.marker is not None and "extra" in str(req.marker):
                out.add(_norm(req.name))
    return out


def _conda_modules(ctx: Context) -> tuple[dict[str, str], dict[str, list[str]]]:
    """module -> owning package, and package -> its files, for the conda packages."""
    from envtools import imports

    owner: dict[str, str] = {}
    files: dict[str, list[str]] = {}
    site_rel = _site_rel(ctx.prefix.root)
    for r in ctx.prefix.records:
        rels = [e["_path"] for e in r.paths]
        files[r.name] = rels
        if site_rel:
            for mod in sorted(imports.top_level(rels, site_rel)):
                owner.setdefault(mod, r.name)
    return owner, files


def _site_rel(root: Path) -> str | None:
    sites = sorted(root.glob("lib/python*/site-packages"))
    return str(sites[0].relative_to(root)) if sites else None


def _runs_here(ctx: Context) -> bool:
    """Can this machine run the env's binaries at all (a linux-ppc64le env validated
    on x86_64 cannot: its import test is left out, with a note)?"""
    want = elf.SUBDIR_MACHINE.get(ctx.subdir)
    here = {"x86_64": "linux-64", "ppc64le": "linux-ppc64le", "aarch64": "linux-aarch64",
            "s390x": "linux-s390x"}.get(os.uname().machine)
    return want is None or here is None or elf.SUBDIR_MACHINE.get(here) == want


def start_imports(ctx: Context) -> None:
    """Start the import smoke test of the conda packages' modules in a thread, so the
    interpreter imports while the other checks read and hash files."""
    if not ctx.imports or _env_python(ctx.prefix.root) is None or not _runs_here(ctx):
        return
    import threading

    from envtools import imports

    owner, _ = _conda_modules(ctx)
    mods = sorted(owner)
    # Two interpreters, each importing every other module in sorted order (powerai on 2
    # cores at load 1-2: 8.1 s instead of 9.1 s). Always two, whatever the load: what a
    # module finds already imported can decide whether it imports (tensorflow_probability
    # fails after tensorflow), so the split must not change from run to run.
    # ENVTOOLS_IMPORT_WORKERS=N sets another number.
    try:
        n = int(os.environ.get("ENVTOOLS_IMPORT_WORKERS", "0"))
    except ValueError:
        n = 0
    n = max(1, n) if n else (2 if len(mods) >= 8 else 1)
    shares = [share for share in (mods[i::n] for i in range(n)) if share]
    box: dict = {"runs": []}

    def work(share: list[str]) -> None:
        box["runs"].append(imports.run(_env_python(ctx.prefix.root), share,
                                       timeout=max(600.0, ctx.import_timeout),
                                       per_module=ctx.import_timeout))

    threads = [threading.Thread(target=work, args=(sh,), name="imports", daemon=True)
               for sh in shares]
    for th in threads:
        th.start()
    ctx.import_job = (threads, box, set(owner))


def check_imports(ctx: Context) -> None:
    """Import every package's top-level modules in the env's python (see
    :mod:`envtools.imports`): failures, crashes, numpy ABI mismatches, shadowed modules."""
    if not ctx.imports:
        return
    from envtools import imports

    root = ctx.prefix.root
    python = _env_python(root)
    sites = sorted(root.glob("lib/python*/site-packages"))
    if python is None or not sites:
        return
    if not _runs_here(ctx):
        ctx.add("import-skipped", "info", f"the import test was left out: the env is for "
                f"{ctx.subdir} and this machine is {os.uname().machine}", ["python"],
                hint=f"validate on a {ctx.subdir} node to import its modules")
        return
    site_rel = str(sites[0].relative_to(root))
    owner, files = _conda_modules(ctx)
    pip_files: dict[str, list[str]] = defaultdict(list)
    for rel, dist in ctx.pip_owned.items():
        pip_files[dist].append(rel)
    for dist, rels in sorted(pip_files.items()):
        for mod in sorted(imports.top_level(rels, site_rel)):
            owner[mod] = f"pip:{dist}"  # pip's copy is what python finds
    if not owner:
        return
    with task("importing modules", None):
        run = imports.Run()
        tried: set[str] = set()
        if ctx.import_job is not None:
            threads, box, tried = ctx.import_job
            for th in threads:
                th.join()
            for part in box["runs"]:
                run.outcomes.update(part.outcomes)
                run.sys_path = run.sys_path or part.sys_path
                run.unusable = run.unusable or part.unusable
        rest = sorted(set(owner) - tried)
        if rest and not run.unusable:
            more = imports.run(python, rest, timeout=max(600.0, ctx.import_timeout),
                               per_module=ctx.import_timeout)
            run.outcomes.update(more.outcomes)
            run.sys_path = run.sys_path or more.sys_path
            run.unusable = more.unusable
    if run.unusable:
        ctx.add("import-skipped", "error", f"the env's python ({os.path.relpath(python, root)}) "
                f"cannot run: {run.unusable}", ["python"], [os.path.relpath(python, root)],
                hint="reinstall python (clone the env again); no module could be imported")
        return
    ctx.checked["imports"] = len(owner)
    ctx.import_outcomes = dict(run.outcomes)
    numpy = ctx.prefix.by_name().get("numpy")

    def env_rel(path: str) -> str | None:
        """``path`` relative to the env, as python found it (a clone's file may be a link
        to its package cache: its real path is the cache's), else by its real path."""
        for p, base in ((os.path.abspath(path), os.path.abspath(root)),
                        (os.path.realpath(path), os.path.realpath(root))):
            if p.startswith(base + os.sep):
                return os.path.relpath(p, base)
        return None

    def package_of(path: str | None) -> str | None:
        rel = env_rel(path) if path else None
        if rel in ctx.owners:
            return ctx.owners[rel][0].name
        if rel in ctx.pip_owned:
            return f"pip:{ctx.pip_owned[rel]}"
        return None

    def fix(pkg: str) -> str:
        if pkg.startswith("pip:"):
            return f"pip install --force-reinstall {pkg[4:]}"
        return f"reinstall {pkg} (clone the env again, or envtools clone --add it)"

    for mod, o in sorted(run.outcomes.items()):
        pkg = owner[mod]
        if o.ok:
            where = o.file or (o.paths[0] if o.paths else None)
            if where is None:
                continue
            real = os.path.realpath(where)
            rel = env_rel(where)
            if rel is not None and rel.startswith(site_rel + "/") and \
                    rel[len(site_rel) + 1:].split("/")[0].split(".")[0] == mod:
                continue
            entry = next((e for e in run.sys_path if e and real.startswith(
                os.path.realpath(e) + os.sep)), os.path.dirname(real))
            cause, line = imports.cause_of(entry, root, sites)
            pkgs = [pkg]
            if cause == "PYTHONPATH":
                why = f"{entry} is on PYTHONPATH"
                hint = f"unset PYTHONPATH (or remove {entry} from it)"
            elif cause:
                by = ctx.owners.get(cause)
                who = by[0].name if by else (f"pip:{ctx.pip_owned[cause]}"
                                             if cause in ctx.pip_owned else "(untracked)")
                pkgs.append(who)
                why = f"{cause} ({who}) puts {entry} first ({line!r})"
                hint = f"remove {cause}" + ("" if who == "(untracked)" else
                                            f" (uninstall {who.removeprefix('pip:')})")
            elif "/.local/lib/python" in entry:
                why = f"{entry} is the user site-packages (pip install --user), which comes first"
                hint = (f"python -m pip uninstall {mod} as that user (or set PYTHONNOUSERSITE=1 "
                        "when using the env)")
            else:
                why = f"{entry} comes before site-packages on sys.path"
                hint = f"remove {entry} from sys.path (user site, sitecustomize, PYTHONPATH)"
            ctx.add("import-shadowed", "error",
                    f"import {mod} loads {where}, not {pkg}'s copy in {site_rel}: {why}",
                    pkgs, [os.path.relpath(real, root) if real.startswith(str(root))
                           else real], hint=hint)
            continue
        culprit = package_of(o.where) or pkg
        text = f"{o.kind}: {o.error}" if o.kind not in ("crash", "timeout") else o.error
        blob = f"{o.error}\n{o.stderr}"
        if o.kind == "timeout":
            ctx.add("import-timeout", "warning", f"import {mod} ({pkg}): {o.error}", [pkg],
                    hint="a busy machine? rerun with a larger --import-timeout; if it hangs, "
                    f"{fix(pkg)}")
        elif imports.NUMPY_ABI.search(blob):
            have = f"numpy {numpy.version}" if numpy else "the installed numpy"
            ctx.add("numpy-abi", "error",
                    f"import {mod} ({pkg}) fails: an extension was built against another "
                    f"numpy ABI than {have}: {text[:300]}", [pkg, "numpy"],
                    hint=f"install a {pkg} built for {have}, or the numpy {pkg} was built "
                    "for (envtools clone --add, or conda install)")
        elif o.kind == "ModuleNotFoundError" and o.missing and \
                o.missing.split(".")[0] not in owner and \
                _norm(o.missing.split(".")[0]) in _optional_requirements(ctx, files.get(pkg, [])):
            ctx.add("import-optional", "info",
                    f"import {mod} ({pkg}) needs {o.missing}, an optional dependency of "
                    f"{pkg} that is not installed", [pkg],
                    hint=f"install {o.missing.replace('_', '-')} if you use {mod} that way")
        elif o.kind == "crash":
            ctx.add("import-crash", "error", f"import {mod} ({pkg}): {o.error}",
                    [pkg], hint=f"{fix(pkg)}; the interpreter's last words: "
                    f"{o.stderr.strip().splitlines()[-1] if o.stderr.strip() else '(none)'}")
        else:
            who = culprit if culprit == pkg else f"{culprit} (where it failed)"
            ctx.add("import-error", "error", f"import {mod} ({pkg}) fails: {text[:400]}",
                    [pkg] if culprit == pkg else [pkg, culprit],
                    hint=f"{fix(culprit)}" + ("" if culprit == pkg else
                                             f"; then validate again ({who})"))


def check_interrupted(ctx: Context) -> None:
    """An ``envtools add``/``drop`` killed before it finished (envtools.txn): the env may
    be half-changed until the next add or drop rolls it back."""
    from envtools.txn import TXN, describe

    root = ctx.prefix.root
    if (root / TXN).exists():
        ctx.add("interrupted-change", "error", describe(root), paths=[str(TXN)],
                hint=f"roll it back (or finish it): envtools drop {root} (with no package)")


CHECKS = (check_interrupted, check_depends, check_cuda, check_files, check_explicit, check_pip,
          check_binaries, check_imports)


def validate(prefix: str | os.PathLike[str], full: bool = False,
             virtual_overrides: list[str] | None = None, imports: bool = True,
             import_timeout: float = 60.0) -> tuple[Context, list[Finding]]:
    """Run every check; raises EnvtoolsError (exit 2) if the env cannot be read."""
    pre = Prefix.load(prefix)
    ctx = Context(pre, virtual.resolve(virtual_overrides), full, imports=imports,
                  import_timeout=import_timeout)
    start_imports(ctx)
    for check in CHECKS:
        check(ctx)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    ctx.findings.sort(key=lambda f: (order[f.severity], f.check, f.message))
    return ctx, ctx.findings


def to_json(ctx: Context) -> dict:
    summary = {s: sum(f.severity == s for f in ctx.findings) for s in SEVERITIES}
    return {
        "schema": SCHEMA,
        "prefix": str(ctx.prefix.root),
        "exit_status": 1 if summary["error"] else 0,
        "summary": summary,
        "virtual_packages": [f"{v.name}={v.version}={v.build}" for v in ctx.virtuals],
        "checked": ctx.checked,
        "findings": [asdict(f) for f in ctx.findings],
    }


def run_validate(prefix: Path, json_out: bool = False, full: bool = False,
                 virtual_overrides: list[str] | None = None, imports: bool = True,
                 import_timeout: float = 60.0) -> int:
    """CLI body: print findings (text or JSON); return the exit status (0, 1 or 2)."""
    try:
        ctx, findings = validate(prefix, full, virtual_overrides, imports, import_timeout)
    except EnvtoolsError as e:
        if json_out:
            print(json.dumps({"schema": SCHEMA, "prefix": str(prefix), "exit_status": 2,
                              "error": e.message, "hint": e.hint}, indent=2))
        raise EnvtoolsError(e.message, e.hint, exit_code=2) from e
    doc = to_json(ctx)
    if json_out:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return doc["exit_status"]
    colors = {"error": "bold red", "warning": "yellow", "info": "cyan"}
    for f in findings:
        pk = f" [{', '.join(f.packages)}]" if f.packages else ""
        info(f"[{colors[f.severity]}]{f.severity:7}[/] {f.check:17} {f.message}{pk}")
        if f.hint:
            info(f"{'':25} hint: {f.hint}")
    s = doc["summary"]
    c = doc["checked"]
    info(
        f"{ctx.prefix.root}: {c.get('packages', 0)} packages, {c.get('files', 0)} files "
        f"({c.get('hashed', 0)} hashed), {c.get('pip_distributions', 0)} pip distributions, "
        f"{c.get('elf_files', 0)} ELF files, {c.get('imports', 0)} modules imported: "
        f"{s['error']} errors, {s['warning']} "
        f"warnings, {s['info']} notes")
    return doc["exit_status"]

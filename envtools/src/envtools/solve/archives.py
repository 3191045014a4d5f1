"""Package archives: checked against the channel's repodata, then their contents against
the path rule, before anything is linked from them.

rattler extracts a local (``file://``) package without comparing it to the sha256 the
repodata names, and links every ``info/paths.json`` entry as it stands. So envtools does
the fetching part itself, for ``install`` and ``clone --add``:

1. every record must carry a well-formed sha256 and size (a missing, zeroed or malformed
   one is an error, not "skip the check");
2. each archive's size and sha256 are compared with the record's before it is extracted
   (hashed in a thread pool: hashlib releases the GIL);
3. it is extracted into a private staging directory beside the package cache by rattler,
   which hashes the bytes it actually reads and refuses a mismatch, so an archive
   swapped after step 2 is caught as well;
4. the extracted tree and its ``paths.json`` (and a ``noarch: python`` package's entry
   points) pass :mod:`envtools.prefix.confine`'s rule, each entry has the type the tree has,
   and no package's path lies under a symlink another (or the same) package ships;
5. only then are the entries moved into the cache, replacing whatever was there (the
   cache is not trusted either: a fresh extraction is what was verified), and rattler
   links from them: it takes an existing, valid entry as it is (checked after the
   install: every package must have been linked from the entry verified here).

On any refusal nothing has been written but the staging directory, which is removed.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import stat
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlparse

from envtools.base import aio
from envtools.errors import EnvtoolsError
from envtools.prefix import confine
from envtools.prefix.conda_records import dist_of
from envtools.prefix.hashing import hash_many, sha256_file
from envtools.prefix.readonly import make_writable

#: at most this many extractions at once (each holds a decompressor's buffers)
PARALLEL_EXTRACTIONS = 8


@dataclass
class Prepared:
    """What :func:`prepare` verified: each package's cache directory, by package name,
    and how long each stage took (seconds), for ``ENVTOOLS_TIMINGS`` and the bench."""

    entries: dict[str, Path] = field(default_factory=dict)
    markers: dict[str, int] = field(default_factory=dict)  # name -> inode of index.json
    timings: dict[str, float] = field(default_factory=dict)
    archive_bytes: int = 0


def expected_digest(r) -> tuple[bytes, int]:
    """The sha256 and size the repodata promises for ``r``; an error when it does not
    promise a usable one, since envtools installs only what it can check."""
    sha, size = r.sha256, r.size
    where = f"{r.file_name} in {r.channel}"
    hint = ("re-index the channel (python -c \"import asyncio, rattler; asyncio.run("
            "rattler.index.index_fs('CHANNEL'))\"); envtools installs only packages whose "
            "sha256 and size the channel's repodata.json states")
    if not isinstance(sha, bytes) or len(sha) != 32:
        raise EnvtoolsError(f"{where}: the repodata has no valid sha256 for it", hint,
                            exit_code=1)
    if not any(sha):
        raise EnvtoolsError(f"{where}: the repodata's sha256 for it is all zeros", hint,
                            exit_code=1)
    if not isinstance(size, int) or size <= 0:
        raise EnvtoolsError(f"{where}: the repodata has no size for it", hint, exit_code=1)
    return sha, size


def local_path(url: str) -> Path | None:
    """The file a ``file://`` URL names; None for a remote URL."""
    u = urlparse(url)
    if u.scheme == "file":
        return Path(unquote(u.path))
    if not u.scheme and url.startswith("/"):
        return Path(url)
    return None


def site_packages(records) -> str | None:
    """Where a ``noarch: python`` package's ``site-packages/`` goes, from the python
    among ``records`` (records or PrefixRecords): ``lib/pythonX.Y/site-packages``."""
    for r in records:
        if r.name.normalized == "python":
            parts = str(r.version).split(".")
            if len(parts) >= 2:
                return f"lib/python{parts[0]}.{parts[1]}/site-packages"
    return None


def prepare(
    records: list, cache: Path, site: str | None = None, prefix: Path | None = None,
    existing: dict[str, str] | None = None,
) -> Prepared:
    """Verify and extract ``records`` into ``cache`` (see the module docstring).

    ``prefix``: an existing env the packages are added to (``clone --add``): nothing new
    may go through, or replace, a symlink there. ``existing``: its packages' paths (path
    -> path_type), so that the new packages are checked against the symlinks they ship.
    """
    out = Prepared()
    if not records:
        return out
    t0 = time.monotonic()
    digests = [expected_digest(r) for r in records]  # all of them, before any work
    dists = [dist_of(r) for r in records]
    cache = Path(os.path.abspath(cache))
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{cache.name}.envtools-staging-",
                                        dir=cache.parent))
    except OSError as e:
        raise EnvtoolsError(f"cannot create a directory in {cache.parent}: {e.strerror}",
                            "choose a package cache (--cache) in a directory you can "
                            "write to") from e
    old_term = _term_raises()
    try:
        archives = aio.run(_fetch(records, staging))
        out.timings["fetch"] = time.monotonic() - t0
        out.archive_bytes = _verify(records, archives, digests)
        out.timings["verify"] = time.monotonic() - t0
        aio.run(_extract(records, archives, digests, dists, staging))
        out.timings["extract"] = time.monotonic() - t0
        targets: dict[str, tuple[str, str]] = {}  # path -> (path_type, package)
        for r, dist in zip(records, dists, strict=True):
            for path, ptype in check_extracted(r, staging / dist, site).items():
                prev = targets.get(path)
                if prev and (prev[0] == "softlink") != (ptype == "softlink"):
                    raise confine.UnsafePath(
                        f"package {r.file_name}: {path!r} is a symbolic link in one package "
                        f"({prev[1] if prev[0] == 'softlink' else r.file_name}) and a file "
                        "or directory in another")
                targets[path] = (ptype, r.file_name)
        check_links(targets, existing or {})
        if prefix is not None:
            check_prefix(prefix, targets)
        out.timings["check"] = time.monotonic() - t0
        _commit(records, dists, staging, cache, out)
        out.timings["commit"] = time.monotonic() - t0
    finally:
        _rmtree(staging)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)
    return out


def _term_raises():
    """SIGTERM raises KeyboardInterrupt (as Ctrl-C does), so the staging directory is
    removed on the way out; returns the previous handler (None off the main thread)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def on_term(signum, frame):
        raise KeyboardInterrupt

    return signal.signal(signal.SIGTERM, on_term)


async def _fetch(records: list, staging: Path) -> list[Path]:
    """Each archive as a local file: a local channel's own file, a remote one downloaded
    into the staging directory (both are hashed before use)."""
    paths: list[Path | None] = [local_path(r.url) for r in records]
    remote = [i for i, p in enumerate(paths) if p is None]
    if remote:
        from rattler.networking import Client
        from rattler.package_streaming import download_to_path

        client = Client()
        dl = staging / ".downloads"
        dl.mkdir()

        async def one(i: int) -> None:
            dest = dl / confine.check_name(records[i].file_name, "package file name")
            try:
                await download_to_path(client, records[i].url, dest)
            except Exception as e:  # noqa: BLE001 - rattler raises several types
                raise EnvtoolsError(f"cannot download {records[i].url}: {e}",
                                    "check the channel URL and the network") from e
            paths[i] = dest

        await asyncio.gather(*(one(i) for i in remote))
    return [p for p in paths if p is not None]


def _verify(records: list, archives: list[Path], digests: list[tuple[bytes, int]]) -> int:
    """Compare every archive's size and sha256 with the repodata's; returns the bytes
    hashed."""
    for r, p, (_sha, size) in zip(records, archives, digests, strict=True):
        try:
            got = os.stat(p).st_size
        except OSError as e:
            raise EnvtoolsError(f"cannot read the package archive {p}: {e.strerror}",
                                "check the channel: the repodata names a file that is "
                                "not there") from e
        if got != size:
            raise EnvtoolsError(
                f"{r.file_name}: the archive is {got} bytes, the channel's repodata says "
                f"{size}; it was changed after the channel was indexed", _TAMPERED,
                exit_code=1)

    def one(p: Path) -> str | None:
        try:
            return sha256_file(p)
        except OSError:
            return None

    with ThreadPoolExecutor(min(8, 2 * (os.cpu_count() or 1))) as ex:
        hashes = list(ex.map(one, archives))
    for r, p, h, (sha, _size) in zip(records, archives, hashes, digests, strict=True):
        if h is None:
            raise EnvtoolsError(f"cannot read the package archive {p}",
                                "check its permissions")
        if h != sha.hex():
            raise EnvtoolsError(
                f"{r.file_name}: its sha256 is {h}, the channel's repodata says "
                f"{sha.hex()}; the archive was changed after the channel was indexed",
                _TAMPERED, exit_code=1)
    return sum(size for _sha, size in digests)


_TAMPERED = ("do not install it: rebuild or re-download the package, then re-index the "
             "channel if the new archive is the right one")


async def _extract(records: list, archives: list[Path], digests: list[tuple[bytes, int]],
                   dists: list[str], staging: Path) -> None:
    """Extract every archive into ``staging/<dist>``, several at once (rattler's runtime
    does the work without the GIL), rattler checking each one's sha256 again."""
    from rattler.networking import Client
    from rattler.package_streaming import download_and_extract

    client = Client()
    sem = asyncio.Semaphore(PARALLEL_EXTRACTIONS)

    async def one(r, path: Path, sha: bytes, dist: str) -> None:
        async with sem:
            try:
                await download_and_extract(client, path.as_uri(), staging / dist, sha)
            except Exception as e:  # noqa: BLE001 - rattler raises several types
                text = str(e).lower()
                if "no space left" in text or "os error 28" in text or "quota" in text:
                    raise EnvtoolsError(
                        f"cannot extract {r.file_name} into {staging}: No space left on "
                        "device", "the filesystem is full: free space for the package cache "
                        f"({staging.parent}) and the environment, or choose another place; "
                        "nothing of this run was kept", exit_code=1) from e
                await _explain_failed_extraction(r, path)
                raise EnvtoolsError(
                    f"cannot extract {r.file_name}: {e}",
                    "the archive is damaged or was changed after it was checked; "
                    "rebuild or re-download it", exit_code=1) from e

    await asyncio.gather(*(one(r, p, sha, d) for r, p, (sha, _size), d
                           in zip(records, archives, digests, dists, strict=True)))


async def _explain_failed_extraction(r, path: Path) -> None:
    """rattler refuses to extract a member through a symlink an earlier member made; say
    which entry of paths.json asked for that, when one did."""
    try:
        from rattler.package_streaming import PackageArchive

        raw = await (await PackageArchive.from_path(path)).read_file("info/paths.json")
        entries = json.loads(raw)["paths"] if raw else []
    except Exception:  # noqa: BLE001 - only an explanation; the caller raises anyway
        return
    check_entries(r.file_name, entries)
    links = {e.get("_path") for e in entries if e.get("path_type") == "softlink"}
    bad = confine.through_link([e["_path"] for e in entries], links)
    if bad:
        raise confine.UnsafePath(f"package {r.file_name}: refusing path {bad[0]!r}: it lies "
                                 f"under {bad[1]!r}, a symbolic link the package ships")


def check_entries(fn: str, entries: list) -> None:
    """Every ``paths.json`` entry is a canonical relative path (the confinement rule)."""
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise confine.UnsafePath(f"package {fn}: info/paths.json is malformed")
    confine.check_paths([e.get("_path") for e in entries], f"package {fn}")


def _tree(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (not following links): rel -> 'f', 'd', 'l' or '?'."""
    out: dict[str, str] = {}
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(f"{root}/{rel_dir}" if rel_dir else root) as it:
            for e in it:
                rel = f"{rel_dir}/{e.name}" if rel_dir else e.name
                if e.is_symlink():
                    out[rel] = "l"
                elif e.is_dir(follow_symlinks=False):
                    out[rel] = "d"
                    stack.append(rel)
                else:
                    out[rel] = "f" if e.is_file(follow_symlinks=False) else "?"
    return out


_KIND = {"hardlink": "f", "softlink": "l", "directory": "d"}
_KIND_NAME = {"f": "a file", "l": "a symbolic link", "d": "a directory", "?": "a special file",
              None: "nothing"}


def check_extracted(r, pkg: Path, site: str | None) -> dict[str, str]:
    """Check one extracted package; returns where its paths land in the prefix
    (path -> path_type), ``noarch: python`` paths and entry points mapped as rattler
    maps them."""
    fn = r.file_name
    tree = _tree(pkg)
    for meta in ("info/index.json", "info/paths.json", "info/link.json", "info/files"):
        if tree.get(meta, "f") != "f":  # (read below: never through a link)
            raise confine.UnsafePath(f"package {fn}: {meta} is not a regular file")
    try:
        index = json.loads((pkg / "info" / "index.json").read_bytes())
    except (OSError, ValueError) as e:
        raise confine.UnsafePath(f"package {fn}: no readable info/index.json") from e
    if (index.get("name"), str(index.get("version")), index.get("build")) != (
            r.name.normalized, str(r.version), str(r.build)):
        raise confine.UnsafePath(
            f"package {fn}: its info/index.json names {index.get('name')} "
            f"{index.get('version')} {index.get('build')}, not the package the repodata "
            "names")
    try:
        entries = json.loads((pkg / "info" / "paths.json").read_bytes()).get("paths")
    except FileNotFoundError:  # (very old packages: info/files, one path per line)
        try:
            entries = [{"_path": p, "path_type": "hardlink"} for p in
                       (pkg / "info" / "files").read_text().splitlines() if p]
        except OSError:
            entries = []
    except (OSError, ValueError, AttributeError) as e:
        raise confine.UnsafePath(f"package {fn}: info/paths.json is malformed") from e
    check_entries(fn, entries)
    noarch = index.get("noarch")
    noarch_python = noarch == "python" or (isinstance(noarch, dict)
                                           and noarch.get("type") == "python")
    out: dict[str, str] = {}
    for e in entries:
        path, ptype = e["_path"], e.get("path_type", "hardlink")
        want, got = _KIND.get(ptype), tree.get(path)
        if want is None:
            raise confine.UnsafePath(f"package {fn}: {path!r} has an unknown path_type "
                                     f"{ptype!r}")
        if got != want:
            raise confine.UnsafePath(f"package {fn}: {path!r} is listed as {_KIND_NAME[want]} "
                                     f"but the archive holds {_KIND_NAME[got]} there")
        out[_installed_path(path, noarch_python, site)] = ptype
    if noarch_python:
        for name in _entry_point_names(pkg, fn):
            out[f"bin/{name}"] = "hardlink"
    return out


def _installed_path(path: str, noarch_python: bool, site: str | None) -> str:
    if noarch_python and site:
        if path.startswith("site-packages/"):
            return site + path[len("site-packages"):]
        if path.startswith("python-scripts/"):
            return "bin" + path[len("python-scripts"):]
    return path


def _entry_point_names(pkg: Path, fn: str) -> list[str]:
    """The names of the scripts a ``noarch: python`` package asks the installer to write
    into ``bin/`` (``info/link.json``: ``"name = module:function"``)."""
    try:
        link = json.loads((pkg / "info" / "link.json").read_bytes())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise confine.UnsafePath(f"package {fn}: info/link.json is malformed") from e
    eps = ((link.get("noarch") or {}) if isinstance(link, dict) else {}).get("entry_points")
    names = []
    for ep in eps or []:
        name = ep.split("=", 1)[0].strip() if isinstance(ep, str) else ep
        names.append(confine.check_name(name, f"package {fn}: entry point"))
    return names


def check_links(targets: dict[str, tuple[str, str]], existing: dict[str, str]) -> None:
    """No path lies under a symlink that a package (new or already installed) ships."""
    links = {p for p, (t, _fn) in targets.items() if t == "softlink"}
    links |= {p for p, t in existing.items() if t == "softlink"}
    bad = confine.through_link(targets, links)
    if bad:
        raise confine.UnsafePath(f"package {targets[bad[0]][1]}: refusing path {bad[0]!r}: "
                                 f"it lies under {bad[1]!r}, a symbolic link a package ships")


def check_prefix(prefix: Path, targets: dict[str, tuple[str, str]]) -> None:
    """Adding to an existing env: no new path may go through, or replace, a symlink or a
    file that is there (untracked symlinks included)."""
    root = str(prefix)
    for d in sorted(confine.ancestors(targets)):
        try:
            st = os.lstat(f"{root}/{d}")
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode):
            raise confine.UnsafePath(
                f"{prefix / d} is a symbolic link or a file, and package "
                f"{next(fn for p, (_t, fn) in targets.items() if p.startswith(d + '/'))} "
                "installs files under it")
    for p, (_t, fn) in targets.items():
        try:
            st = os.lstat(f"{root}/{p}")
        except FileNotFoundError:
            continue
        if stat.S_ISLNK(st.st_mode):
            raise confine.UnsafePath(f"package {fn}: {prefix / p} is a symbolic link in the "
                                     "environment; installing would write through it")


def _commit(records: list, dists: list[str], staging: Path, cache: Path,
            out: Prepared) -> None:
    """Move the verified entries into the cache, replacing what was there unless it is
    the same, file for file (then other envs keep sharing its inodes, which is what lets
    their clones trust the cache without hashing it: see :mod:`envtools.prefix.hashing`)."""

    if cache.is_symlink():
        raise EnvtoolsError(f"the package cache {cache} is a symbolic link",
                            "give a real directory with --cache")
    if cache.is_dir():
        make_writable(cache)  # (left read-only by an earlier install)
    cache.mkdir(parents=True, exist_ok=True)
    for i, (r, dist) in enumerate(zip(records, dists, strict=True)):
        dest = cache / dist
        if dest.is_symlink() or dest.is_file():
            dest.unlink()
        elif dest.exists():
            if _same_entry(dest, staging / dist):
                out.entries[r.name.normalized] = dest
                out.markers[r.name.normalized] = os.stat(dest / "info/index.json").st_ino
                (cache / f"{dist}.lock").unlink(missing_ok=True)
                continue
            os.rename(dest, staging / f".old-{i}")  # removed with the staging directory
        os.rename(staging / dist, dest)
        (cache / f"{dist}.lock").unlink(missing_ok=True)  # (rattler's: may name another sha)
        out.entries[r.name.normalized] = dest
        out.markers[r.name.normalized] = os.stat(dest / "info" / "index.json").st_ino


def _same_entry(old: Path, new: Path) -> bool:
    """Does the cache entry ``old`` hold exactly what the verified extraction ``new``
    holds: the same entries, link targets and file contents (all hashed)?"""
    try:
        tree = _tree(old)
    except OSError:
        return False
    fresh = _tree(new)
    # (the bytecode an earlier install compiled into the entry: bytecode.compile_installed;
    # this install compiles it again, over it, and a clone links only what a record lists)
    # and conda's repodata_record.json, which install writes into every entry (again)
    tree = {rel: kind for rel, kind in tree.items() if rel in fresh or not (
        _compiled(rel, kind) or rel == "info/repodata_record.json")}
    if tree != fresh:
        return False
    files = [rel for rel, kind in tree.items() if kind == "f"]
    for rel, kind in tree.items():
        if kind == "l" and os.readlink(old / rel) != os.readlink(new / rel):
            return False
        if kind == "?":
            return False
    a = hash_many(str(old / rel) for rel in files)
    b = hash_many(str(new / rel) for rel in files)
    return all(a[str(old / rel)] is not None and a[str(old / rel)] == b[str(new / rel)]
               for rel in files)


def _compiled(rel: str, kind: str) -> bool:
    """Is this entry of a package cache directory one that install compiles into a
    noarch: python package's (``site-packages/**/__pycache__``, a directory or a pyc;
    ``python-scripts/`` likewise)?"""
    if not rel.startswith(("site-packages/", "python-scripts/")):
        return False
    if kind == "d":
        return rel.endswith("/__pycache__")
    return kind == "f" and rel.endswith(".pyc") and rel.rpartition("/")[0].endswith(
        "/__pycache__")


def check_linked(prefix: Path, prepared: Prepared) -> None:
    """After rattler's install: every verified package was linked from its verified
    entry (rattler re-fetches an entry it finds invalid; that must not have happened)."""
    if not prepared.entries:
        return
    seen: set[str] = set()
    for fp in (prefix / "conda-meta").glob("*.json"):
        if not any(fp.name.startswith(n + "-") for n in prepared.entries):
            continue  # (not a verified package's record: not read)
        try:
            data = json.loads(fp.read_bytes())
        except (OSError, ValueError):
            continue
        name = data.get("name")
        if name not in prepared.entries:
            continue
        seen.add(name)
        entry = prepared.entries[name]
        epd = data.get("extracted_package_dir")
        try:
            same = os.stat(entry / "info" / "index.json").st_ino == prepared.markers[name]
        except OSError:
            same = False
        if epd != str(entry) or not same:
            raise EnvtoolsError(
                f"{name} was linked from {epd}, not from the verified cache entry {entry}",
                "another process changed the package cache during the install; run it "
                "again", exit_code=1)
    missing = set(prepared.entries) - seen
    if missing:
        raise EnvtoolsError(f"not installed: {', '.join(sorted(missing))}",
                            "run the install again", exit_code=1)


def _rmtree(path: Path) -> None:
    if path.exists():
        for dirpath, _dirs, _files in os.walk(path):
            try:
                os.chmod(dirpath, 0o700)
            except OSError:
                pass
        shutil.rmtree(path, ignore_errors=True)

"""``envtools clone``: an exact, fast, atomic copy of an environment at a new path.

Unlike ``conda create --clone`` this never downloads: each package's files come from
the package cache kept beside the source env (reflinked, safely hardlinked, or copied)
and files that carry the install prefix are re-written from the package's own
placeholder, so the result is what installing the same packages at DEST would give, bit
for bit. Without a usable cache, files are copied from SRC and relocated from SRC's
prefix. Files no package owns (pip installs, user additions) are carried over with the
prefix rewritten. Everything happens in a temporary directory beside DEST.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from envtools import (
    bytecode,
    cachelinks,
    cachetag,
    confine,
    layers,
    linking,
    placement,
    record_index,
)
from envtools.adding import recorded_channels
from envtools.errors import EnvtoolsError
from envtools.hashing import (
    STAT_CACHE,
    entry_sha,
    file_key,
    key_holds,
    load_stat_cache,
    package_part,
    stat_key,
    store_stat_part,
)
from envtools.placement import Ctx, Item
from envtools.prefix_records import Record, write_record
from envtools.progress import info, task
from envtools.readonly import (
    EXTERNALLY_MANAGED,
    is_envtools_marker,
    is_site_only,
    read_prefix_info,
    refuse_readonly,
    write_prefix_info,
)
from envtools.relocate import looks_binary
from envtools.tempdirs import atomic_dir
from envtools.untracked import untracked

#: --link-mode values: auto (reflink, else hardlink, else a symlink per file to a cache
#: only root can change, else copy), dirs (auto, linking whole directories where a
#: package owns them: layers.py), or one method where possible (copy otherwise)
LINK_MODES = ("auto", "dirs", "reflink", "symlink", "copy")


@dataclass
class CloneReport:
    """What clone did, printed at the end so users see how their clone was made."""

    dest: Path
    packages: int = 0
    placed: dict[str, int] = field(default_factory=dict)
    from_cache: int = 0
    from_src: int = 0
    untracked: int = 0
    editable: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    added: list[str] = field(default_factory=list)
    seconds: float = 0.0
    timings: dict[str, float] = field(default_factory=dict)  # stage -> seconds since start

    def print(self) -> None:
        how = ", ".join(f"{n} {k}" for k, n in sorted(self.placed.items()) if n)
        info(
            f"cloned {self.packages} packages to {self.dest} in {self.seconds:.1f}s "
            f"({self.from_cache} packages from the package cache, {self.from_src} copied "
            f"from the source; files: {how}; {self.untracked} untracked files carried over)"
        )
        for e in self.editable:
            info(f"[yellow]editable install:[/] {e}")
        for w in self.warnings:
            info(f"[yellow]warning:[/] {w}")
        if self.added:
            info(f"added: {', '.join(self.added)}")
        if os.environ.get("ENVTOOLS_TIMINGS"):
            info("stages (s since start): " + ", ".join(
                f"{k} {v:.3f}" for k, v in self.timings.items()))


def _check_args(src: Path, dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise EnvtoolsError(
            f"destination {dest} exists and is not empty",
            "choose a new path, or remove that directory first",
        )
    if dest == src or src in dest.parents or dest in src.parents:
        raise EnvtoolsError(
            f"cannot clone {src} into {dest}: one contains the other",
            "choose a destination outside the source environment",
        )
    refuse_readonly(dest, "clone into")


def _find_cache(src: Path, records: list[Record]) -> dict[str, Path]:
    """Per package, a readable cache directory holding exactly that package, if any."""
    pinfo = read_prefix_info(src)
    roots = []
    if pinfo.get("package_cache"):
        roots.append(Path(pinfo["package_cache"]))
    found: dict[str, Path] = {}
    for r in records:
        cands = []
        epd = r.extracted_package_dir
        if epd:
            cands.append(Path(epd))
        cands += [root / r.dist for root in roots]
        for c in cands:
            idx = c / "info" / "index.json"
            try:
                with open(idx) as fh:
                    meta = json.load(fh)
            except (OSError, ValueError):
                continue
            if (meta.get("name"), str(meta.get("version")), meta.get("build")) == (
                r.name, r.version, r.build
            ) and os.access(c, os.R_OK | os.X_OK):
                # canonical: what a clone links to, and records, has no symlink on the way
                found[r.name] = Path(os.path.realpath(c))
                break
    return found


def _cache_rel(r: Record, rel: str) -> str:
    """Where an installed path lives inside the extracted package (noarch: python moves)."""
    return cachelinks.cache_rel(r.noarch_python, rel)


def _copy_untracked(ctx: Ctx, src: Path, rel: str) -> tuple[str, bool]:
    """Copy one untracked file, rewriting SRC's prefix; returns (rel, was_rewritten).

    ``rel`` comes from SRC (its ``untracked.json`` or a walk) and passed the path rule;
    its directories are made without following a link (an untracked symlink copied
    earlier cannot redirect what follows), the file is created new, never over one, and
    SRC's file is read without following a link. What is not a regular file or a
    symlink (a FIFO, a socket) is left out and reported.
    """
    s = os.path.join(src, rel)
    d = os.path.join(ctx.dest_tmp, rel)
    confine.makedirs(str(ctx.dest_tmp), rel.rpartition("/")[0])
    st = os.lstat(s)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(s)
        if target.startswith(ctx.old_prefix + "/"):
            target = ctx.new_prefix + target[len(ctx.old_prefix):]
        confine.symlink(target, d)
        return rel, False
    data = confine.read_regular(s)
    if data is None:
        raise _NotRegular(rel)
    old = ctx.old_prefix.encode()
    # Only text is rewritten: an untracked binary has no recorded placeholder, and its
    # strings may be length-prefixed (.pyc marshal data) rather than NUL-terminated, so
    # an in-place rewrite could corrupt it. It is copied as is (a .pyc is recompiled).
    if old in data and not looks_binary(data):
        confine.write_new(d, data.replace(old, ctx.new_prefix.encode()),
                          linking.writable_mode(st.st_mode))
        return rel, True
    confine.write_new(d, data, linking.writable_mode(st.st_mode))
    return rel, False


class _NotRegular(Exception):
    """An untracked entry that is neither a regular file nor a symlink."""


def _fix_pip_records(dest_tmp: Path, rewritten: set[str]) -> None:
    """Keep pip's RECORD hashes true for files whose prefix we rewrote."""
    if not rewritten:
        return
    import base64
    import csv
    import io

    for pip_record in dest_tmp.glob("lib/python*/site-packages/*.dist-info/RECORD"):
        if not confine.is_real(str(dest_tmp), str(pip_record.relative_to(dest_tmp))):
            continue  # (reached through a symlink: not this env's to rewrite)
        site = pip_record.parent.parent
        site_rel = str(site.relative_to(dest_tmp))
        text = pip_record.read_text()
        rows = list(csv.reader(io.StringIO(text)))
        changed = False
        for row in rows:
            if len(row) < 3 or not row[1]:
                continue
            rel = os.path.normpath(os.path.join(site_rel, row[0]))
            if rel in rewritten:
                data = (dest_tmp / rel).read_bytes()
                digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
                row[1] = "sha256=" + digest.decode()
                row[2] = str(len(data))
                changed = True
        if changed:
            buf = io.StringIO()
            csv.writer(buf, lineterminator="\n").writerows(rows)
            confine.replace(str(pip_record), buf.getvalue().encode(),
                            stat.S_IMODE(os.lstat(pip_record).st_mode))


def find_editables(prefix: Path) -> list[str]:
    """Editable installs: they point outside the env, so a clone still uses that source."""
    found = []
    for site in prefix.glob("lib/python*/site-packages"):
        for p in site.glob("__editable__*.pth"):
            found.append(f"{p.relative_to(prefix)} (PEP 660 editable install)")
        for p in site.glob("*.egg-link"):
            target = p.read_text().splitlines()[0] if p.stat().st_size else "?"
            found.append(f"{p.relative_to(prefix)} -> {target} (setuptools develop)")
        for p in site.glob("*.dist-info/direct_url.json"):
            try:
                du = json.loads(p.read_text())
            except (OSError, ValueError):
                continue
            if du.get("dir_info", {}).get("editable"):
                found.append(f"{p.parent.name} -> {du.get('url')} (editable)")
    return sorted(set(found))


def _add_packages(
    tmp: Path,
    dest: Path,
    specs: list[str],
    channels: list[str],
    allow_update: bool,
    virtual_overrides: list[str] | None,
) -> list[str]:
    """Solve ``specs`` against the clone (pinned unless allowed) and install into it
    (:mod:`envtools.adding`, shared with ``envtools add``)."""
    from envtools import adding
    from envtools.prefix_records import Prefix

    sol = adding.solve_added(adding.installed_records(tmp), specs, channels, allow_update,
                             virtual_overrides)
    adding.link_added(tmp, dest, sol, tmp, Prefix.load(tmp).records)
    return adding.added_names(sol)


def clone(
    src: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    add: list[str] | None = None,
    allow_update: bool = False,
    channels: list[str] | None = None,
    link_mode: str = "auto",
    use_cache: bool = True,
    virtual_overrides: list[str] | None = None,
) -> CloneReport:
    """Clone SRC to DEST (see module docstring); returns what was done."""
    t0 = time.monotonic()
    if link_mode not in LINK_MODES:
        raise EnvtoolsError(
            f"unknown --link-mode {link_mode!r}", f"use one of {', '.join(LINK_MODES)}"
        )
    srcp = Path(os.path.abspath(src))
    destp = Path(os.path.abspath(dest))
    early = (_list_plan_first(srcp) if link_mode == "dirs" and not add and use_cache
             and os.geteuid() != 0 else None)
    try:
        prefix = record_index.load_prefix(srcp)
        _check_args(srcp, destp)
        for r in prefix.records:  # (names the cache directory and the record file: one name)
            confine.check_name(r.dist, f"package record {r.path.name} of {srcp}")
        load_s = time.monotonic() - t0
        old_prefix = read_prefix_info(srcp).get("prefix") or str(srcp)
        cache = _find_cache(srcp, prefix.records) if use_cache else {}
    except BaseException:
        if early is not None:
            placement.stop_listings(early.jobs)
        raise
    report = CloneReport(dest=destp, packages=len(prefix.records))
    report.from_cache = len(cache)
    report.from_src = len(prefix.records) - len(cache)

    with atomic_dir(destp, "envtools clone", settle=bool(add)) as tmp:
        ctx = Ctx(
            dest_tmp=tmp,
            new_prefix=str(destp),
            old_prefix=old_prefix,
            src_root=str(srcp),
            euid=os.geteuid(),
            link_mode=link_mode,
            vouch_parts={k: str(srcp / STAT_CACHE / f"{package_part(r.dist)}.marshal")
                         for k, r in enumerate(prefix.records)},
            names={k: f"package {r.name} {r.version}" for k, r in enumerate(prefix.records)},
            src_links={k: (r.extracted_package_dir, r.noarch_python)
                       for k, r in enumerate(prefix.records)},
            index_key=prefix.index_key,
        )
        if link_mode == "dirs" and not add and cache and ctx.euid != 0:
            _list_planned_early(ctx, prefix.records, cache, early)
        elif early is not None:
            placement.stop_listings(early.jobs)
        # --link-mode dirs: the bytecode install compiled into a noarch: python package's
        # cache entry comes along (its directories are then complete: linked whole)
        kept_pycs: set[int] = set()
        groups = _plan(prefix.records, cache, srcp, old_prefix,
                       kept_pycs if link_mode == "dirs" and not add else None)
        report.timings["load"] = load_s
        report.timings["plan"] = time.monotonic() - t0
        if cache and link_mode in ("auto", "dirs"):
            ctx.reflink_ok = placement.probe_reflink(next(iter(cache.values())), tmp)
        elif link_mode == "symlink":
            ctx.reflink_ok = False
        # untracked files: pip installs and anything else users put there
        files, empty = untracked(srcp, lambda: {f[0] for r in prefix.records
                                                for f in r.plan_fields()})
        if cachetag.NAME in files and cachetag.is_tag(srcp / cachetag.NAME):
            files = [f for f in files if f != cachetag.NAME]  # (see envtools.cachetag)
        # the read-only env's PEP 668 and CEP 22 markers (and their dangling links in a
        # copy conda made): the clone is the user's, pip and conda may change it
        files = [f for f in files if not (f.endswith("/" + EXTERNALLY_MANAGED) and
                                          is_envtools_marker(srcp / f))
                 and not is_site_only(srcp, f)]
        confine.check_paths(files, f"the untracked files of {srcp}")
        confine.check_paths(empty, f"the empty directories of {srcp}")
        if cache and ctx.links_expected() and ctx.reflink_ok is not True and (
                link_mode == "symlink"
                or not cachelinks.probe_hardlink(next(iter(cache.values())), tmp)):
            _plan_symlinks(ctx, link_mode, prefix.records, cache, groups)
            if link_mode == "dirs" and not add:  # (--add: rattler may remove any file)
                groups = _plan_layers(ctx, prefix.records, cache, groups, files, kept_pycs)
            report.timings["links planned"] = time.monotonic() - t0
        meta = tmp / "conda-meta"
        (tmp / STAT_CACHE).mkdir(parents=True)  # (placement writes its parts there)

        # conda's link type for packages placed from the cache (symlinks where allowed)
        soft = ctx.symlink_roots if ctx.symlinks else None
        # bytecode install compiled for relocated sources in place of a pyc the package
        # ships stays in the records (bytecode.drop_compiled); the clone compiles its own
        recompile = any(not r.noarch_python and bytecode.has_compiled(r.plan_fields())
                        for r in prefix.records)

        def write_package_record(key: int, rewritten: dict[str, tuple[str, int]]) -> None:
            """conda-meta: the same record, pointing at its new link source (this runs in
            the process that placed the package's files, once they are all placed)."""
            rec = prefix.records[key]
            cdir = cache.get(rec.name)
            epd = str(cdir) if cdir else ""
            link = {"source": str(cdir) if cdir else str(srcp),
                    "type": (cachelinks.LINK_COPY if not cdir else cachelinks.LINK_SOFTLINK
                             if soft and key in soft else cachelinks.LINK_HARDLINK)}
            compiled = key not in kept_pycs and bytecode.has_compiled(rec.plan_fields())
            if not rewritten and not compiled and rec.extracted_package_dir == epd:
                if rec.link == link:
                    # unchanged (linked from the same cache): copy its bytes, unparsed
                    linking.copy(str(rec.path), str(meta / f"{rec.dist}.json"), 0o644)
                    return
                old = rec.link if isinstance(rec.link, dict) else {}
                if old.get("source") == link["source"] and isinstance(old.get("type"), int):
                    raw = confine.read_regular(str(rec.path))  # only the link type differs
                    data = raw and cachelinks.relinked_record(raw, link["source"],
                                                              old["type"], link["type"])
                    if data:
                        confine.write_new(str(meta / f"{rec.dist}.json"), data)
                        return
            data = rec.data  # ours to change: SRC's are not used after this
            if compiled:
                bytecode.drop_compiled(data)
            data["extracted_package_dir"] = epd
            data["link"] = link
            for e in (data.get("paths_data") or {}).get("paths", []) if rewritten else ():
                if e["_path"] in rewritten:
                    sha, size = rewritten[e["_path"]]
                    if e.get("prefix_placeholder"):
                        e["sha256_in_prefix"] = sha
                    else:  # made at install time (an entry point): recorded as written
                        e["sha256"], e["size_in_bytes"] = sha, size
            write_record(meta, data)

        try:
            with task("placing package files", sum(len(g[1]) for g in groups)) as advance:
                placed = placement.place_all(ctx, groups, placement.workers(tmp), advance,
                                             write_package_record)
        except FileNotFoundError as e:
            raise EnvtoolsError(
                f"{e.filename} is missing from the source environment and no package cache "
                "has it",
                f"repair the source (envtools validate {srcp}) or restore its package cache",
            ) from e
        report.placed = placed.counts
        if recompile:  # (a pyc the package ships, for a source relocated again here)
            bytecode.compile_installed(tmp, destp, noarch=False, stat_part="compiled")
        report.timings["files and records"] = time.monotonic() - t0

        rewritten: set[str] = set()
        with task("copying untracked files", len(files)) as advance:
            for rel in files:
                try:
                    if _copy_untracked(ctx, srcp, rel)[1]:
                        rewritten.add(rel)
                except _NotRegular:
                    report.warnings.append(f"{rel} is not a regular file (a FIFO, socket or "
                                           "device): not copied")
                except FileNotFoundError:
                    report.warnings.append(f"{rel} was removed from the source while it was "
                                           "cloned: not copied")
                advance(1)
        for d in empty:
            confine.makedirs(str(tmp), d)
        report.untracked = len(files)
        _fix_pip_records(tmp, rewritten)
        report.editable = find_editables(tmp)
        report.timings["untracked"] = time.monotonic() - t0

        for extra in ("history", "state", "pinned"):
            data = confine.read_regular(str(srcp / "conda-meta" / extra)) or b""
            if extra == "history":
                data += (f"==> {time.strftime('%Y-%m-%d %H:%M:%S')} <==\n"
                         f"# cmd: envtools clone {srcp} {destp}\n").encode()
            if data:
                confine.write_new(str(meta / extra), data)
        write_prefix_info(tmp, destp, cache_root_of(cache),
                          read_prefix_info(srcp).get("channels"))
        _write_clone_stat_cache(tmp, groups, srcp)
        report.timings["stat cache"] = time.monotonic() - t0

        if add:
            report.added = _add_packages(
                tmp, destp, add, channels or recorded_channels(srcp, prefix.records),
                allow_update,
                virtual_overrides,
            )
            for part in (tmp / STAT_CACHE).iterdir():  # stale now; validate re-hashes
                part.unlink()
        os.chmod(tmp, 0o755)
    report.seconds = time.monotonic() - t0
    return report


def _plan(
    records: list[Record], cache: dict[str, Path], srcp: Path, old_prefix: str,
    kept_pycs: set[int] | None = None,
) -> list[tuple[int, list[Item]]]:
    """Per package (its index in ``records``), every file with where it comes from.

    A file the installer made (an entry point: any path type a package archive does not
    have) exists only in SRC, and holds SRC's prefix without a recorded placeholder (an
    entry point's shebang): it is relocated from ``old_prefix`` as text, as installing at
    DEST would have written it. Compiled bytecode is left out (envtools.bytecode), unless
    ``kept_pycs`` is given and install compiled it into the package's cache entry (a
    noarch: python package's: the same bytes for every prefix): then it is placed from
    the cache as the package's own files are, and the package's key added to
    ``kept_pycs`` (its record keeps the ``pyc_file`` entries).
    """
    groups: list[tuple[int, list[Item]]] = []
    src_base = str(srcp) + "/"
    for key, r in enumerate(records):
        cdir = cache.get(r.name)
        base, from_cache = (src_base, False) if cdir is None else (str(cdir) + "/", True)
        fields = r.plan_fields()
        if bytecode.has_compiled(fields):
            if (kept_pycs is not None and cdir is not None and r.noarch_python
                    and _cached_pycs(r, cdir, fields)):
                kept_pycs.add(key)
                fields = [(f[0], "hardlink", *f[2:]) if f[1] == bytecode.PYC_FILE else f
                          for f in fields]
            else:
                fields = [f for f in fields if f[1] != bytecode.PYC_FILE]
        if not r.noarch_python:
            items = [(rel, base + rel, path_type, placeholder, file_mode, from_cache, sha, size)
                     for rel, path_type, placeholder, file_mode, sha, size in fields]
        else:  # site-packages/ and python-scripts/ in the cache; installer-made files in SRC
            items = [
                (rel, base + (_cache_rel(r, rel) if from_cache else rel), path_type,
                 placeholder, file_mode, from_cache, sha, size) if path_type in _IN_ARCHIVE
                else (rel, src_base + rel, path_type, placeholder or old_prefix,
                      file_mode or "text", False, sha, size)
                for rel, path_type, placeholder, file_mode, sha, size in fields]
        groups.append((key, items))
    return groups


def _cached_pycs(r: Record, cdir: Path, fields: list[tuple]) -> bool:
    """Did install compile this noarch: python package's bytecode into its cache entry
    (bytecode.compile_installed)? Told from its first pyc (one lstat); each is still
    vouched for when placed, and one missing is taken from SRC (the same bytes)."""
    first = next(f[0] for f in fields if f[1] == bytecode.PYC_FILE)
    try:
        return stat.S_ISREG(os.lstat(f"{cdir}/{_cache_rel(r, first)}").st_mode)
    except OSError:
        return False


#: path types of the files in a package archive; files of other types are made by the
#: installer (see _plan). A file the cache lacks after all is taken from SRC when
#: placing it (placement.place_or_fall_back).
_IN_ARCHIVE = frozenset({"hardlink", "softlink", "directory", None})


def _plan_symlinks(ctx: Ctx, link_mode: str, records: list[Record], cache: dict[str, Path],
                   groups: list[tuple[int, list[Item]]]) -> None:
    """Hardlinks are refused (protected_hardlinks: the cache is not ours): link to the
    cache files we may not change, in package directories only root (``auto``, ``dirs``)
    or anyone but us (``symlink``) can change, where a link is transparent (cachelinks.py).

    A link's target is the package's cache directory as _find_cache resolved it (no
    symlink on the way, checked here all the way up to /) joined with the file's path
    from its record, which placement checks against the path rule before anything is
    made; each file is vouched for by SRC's stat cache or hashed first, as for a
    hardlink or a copy (placement.check_cache_file)."""
    ctx.symlinks, ctx.hardlink_ok = True, False
    ctx.link_owner = None if link_mode == "symlink" else 0
    trusted: dict[Path, bool] = {}
    roots: dict[int, str] = {}
    for key, _items in groups:
        cdir = cache.get(records[key].name)
        if cdir is not None:
            if cdir not in trusted:
                trusted[cdir] = cachelinks.trusted_dir(cdir, ctx.link_owner, ctx.euid)
            if trusted[cdir]:
                roots[key] = str(cdir)
    ctx.symlink_roots = roots
    ctx.relocating = frozenset(str(cache[records[key].name]) for key, items in groups
                               if records[key].name in cache and any(it[3] for it in items))


def write_layer_plan(prefix: Path, records: list[Record], index_key: tuple) -> None:
    """At install: which directories a ``--link-mode dirs`` clone of this env links
    (layers.plan over every package, with the bytecode install compiled into the cache,
    no untracked file), for the records of the index whose stat key is ``index_key``.
    Planning walks every path of every package (0.1-0.5 s on powerai, before the clone
    can place anything); the env's records and cache do not change after install."""
    cache = _find_cache(prefix, records)
    kept: set[int] = set()
    groups = _plan(records, cache, prefix, str(prefix), kept)
    linkable = [k for k, r in enumerate(records) if r.name in cache]
    orphans = layers.without_bytecode(groups)  # (rel -> its file in the cache)
    bad = bytecode.uncompilable(prefix / "bin" / "python", list(orphans.values()))
    chosen = layers.plan(groups, linkable, [], _IN_ARCHIVE,
                         frozenset(rel for rel, src in orphans.items() if src in bad))
    # each directory is checked against the cache as a clone checks it (layers.verify:
    # the files and their modes, programs that must be real, libraries that climb out
    # through $ORIGIN/..), and one that fails is split into its subdirectories as
    # placement would split it: a clone then reads no ELF file of a planned directory
    # again, and a tree that failed whole (tensorflow/) arrives as many links that the
    # placing processes share, not one that one process splits alone
    relocating = frozenset(str(cache[records[k].name]) for k, items in groups
                           if records[k].name in cache and any(it[3] for it in items))
    under: dict[str, list[Item]] = {d: [] for d in chosen}
    for _key, items in groups:
        for it in items:
            d = it[0]
            while d:
                d = d.rpartition("/")[0]
                if d in under:
                    under[d].append(it)
                    break
    final: dict[str, int] = {}
    to_list: dict[str, str] = {}  # dir -> its cache directory, to be listed
    stack = [(d, f"{cache[records[k].name]}/{_cache_rel(records[k], d)}", under[d], k)
             for d, k in chosen.items()]
    while stack:
        d, src, items, k = stack.pop()
        if layers.verify(src, items, d, str(prefix), relocating) is not None:
            final[d] = k
            # (what verify saw, for a clone to compare against: only where every file
            # has the sha256 a clone's vouching needs)
            if all(it[6] for it in items if it[2] not in ("directory", "softlink")):
                to_list[d] = src
            continue
        children: dict[str, list[Item]] = {}
        for it in items:
            head, sep, _ = it[0][len(d) + 1:].partition("/")
            if sep:
                children.setdefault(head, []).append(it)
        stack.extend((f"{d}/{h}", f"{src}/{h}", c, k) for h, c in children.items())
    # and which of the files placed one by one must be real (programs that would not
    # run the same from the cache): what a clone would otherwise find out by reading
    # every program's ELF headers and the libraries it finds through $ORIGIN
    real: set[str] = set()
    for _key, items in groups:
        for rel, source, path_type, placeholder, _fm, from_cache, _sha, _size in items:
            if not from_cache or placeholder or path_type != "hardlink":
                continue
            d = rel
            while d and d not in final:
                d = d.rpartition("/")[0]
            if d:
                continue  # (in a linked directory: verify found none that must be real)
            try:
                st = os.lstat(source)
            except OSError:
                continue
            if st.st_mode & cachelinks.EXEC_BITS and cachelinks.stays_real(
                    rel, source, st, str(prefix), relocating):
                real.add(rel)
    listed = layers.split_listing(layers.finish_listing(layers.start_listing(
        list(to_list.values()))))
    listings = dict(zip(to_list, listed, strict=True)) if len(listed) == len(to_list) else {}
    layers.write_plan(prefix, index_key, layers.Plan(
        {d: records[k].dist for d, k in final.items()}, {records[k].dist for k in kept},
        frozenset(real), listings, {d: to_list[d] for d in listings}))


def _planned_at_install(ctx: Ctx, records: list[Record], kept_pycs: set[int],
                        untracked_files: list[str]) -> dict[str, int] | None:
    """The plan install wrote (write_layer_plan), when it holds for this clone: the
    records came from the index it was made for, SRC has no untracked file, the same
    packages' bytecode comes from the cache, and every package it links may be linked
    here. Its directories pass the path rule and are not shared ones; every layer is
    still checked against the cache when placed (layers.verify), and a plan naming a
    directory that is not one package's only gets files placed one by one."""
    if untracked_files or ctx.index_key is None:
        return None
    got = ctx.plan or layers.read_plan(Path(ctx.src_root), ctx.index_key)
    if got is None:
        return None
    dirs, kept, real = got.dirs, got.kept, got.real
    key_of = {r.dist: k for k, r in enumerate(records)}
    if kept != {records[k].dist for k in kept_pycs}:
        return None
    roots = ctx.symlink_roots or {}
    chosen = {d: key_of.get(dist, -1) for d, dist in dirs.items()}
    if any(k not in roots for k in chosen.values()):
        return None
    if confine.first_unsafe(list(chosen)) or any(layers.shared(d) for d in chosen):
        return None
    ctx.elf_checked, ctx.real_programs = True, real
    return chosen


@dataclass
class _Listed:
    """Listings of install's planned directories, started before the records are read
    (:func:`_list_plan_first`)."""

    plan: layers.Plan
    index_key: tuple
    jobs: list  # (placement.start_listings)
    dirs: frozenset[str]


def _list_plan_first(srcp: Path) -> _Listed | None:
    """``--link-mode dirs`` as a user: when root wrote install's plan for SRC's record
    index, start find on the cache directories it names right away, before reading
    the records (about 0.1 s on powerai, in which the second core would be idle).
    Whether they are the directories this clone links is decided once the records and
    the cache are known (:func:`_list_planned_early`); if not, nothing listed is used."""
    try:
        key = stat_key(os.stat(srcp / record_index.INDEX))
    except OSError:
        return None
    plan = layers.read_plan(srcp, key)
    if (plan is None or not plan.targets
            or not _root_wrote(srcp / layers.PLAN, os.geteuid())):
        return None
    jobs, dirs = placement.start_listings(plan.listings, plan.targets)
    return _Listed(plan, key, jobs, dirs)


def _list_planned_early(ctx: Ctx, records: list[Record], cache: dict[str, Path],
                        early: _Listed | None = None) -> None:
    """``--link-mode dirs`` as a user: read install's plan now and, when root wrote it,
    list the cache directories it links (placement.start_prechecks), so that find runs
    while this process plans and places the rest: the listings ``early`` started, when
    they are of the same plan and of exactly these cache directories. Whether the plan
    holds for this clone is decided later (:func:`_planned_at_install`); if not,
    nothing listed is used."""
    if ctx.index_key is None:
        if early is not None:
            placement.stop_listings(early.jobs)
        return
    same = early is not None and early.index_key == ctx.index_key
    if early is not None and not same:
        placement.stop_listings(early.jobs)
    plan = early.plan if same else layers.read_plan(Path(ctx.src_root), ctx.index_key)
    if plan is None:
        return
    ctx.plan = plan
    if not same and not _root_wrote(Path(ctx.src_root) / layers.PLAN, ctx.euid):
        return
    ctx.listings = plan.listings
    by_dist = {r.dist: r for r in records}
    targets: dict[str, str] = {}
    for d, dist in plan.dirs.items():
        r = by_dist.get(dist)
        where = cache.get(r.name) if r is not None else None
        if where is not None and not confine.first_unsafe([d]):
            targets[d] = f"{where}/{_cache_rel(r, d)}"
    if same:
        listed = {d: t for d, t in plan.targets.items() if d in plan.listings}
        if listed == {d: t for d, t in targets.items() if d in plan.listings}:
            ctx._listing_jobs, ctx.listing = early.jobs, early.dirs
            return
        placement.stop_listings(early.jobs)  # (other cache directories now: list those)
    placement.start_prechecks(ctx, targets)


def _root_wrote(fp: Path, euid: int) -> bool:
    """Is ``fp`` a file only root can have written (root's, no group or other write
    bit, in directories only root can change all the way up)? Then what it says about
    root's package cache is root's word, as the cache is: install's listings of the
    directories it checked can stand for that check (placement.start_prechecks)."""
    try:
        st = os.lstat(fp)
    except OSError:
        return False
    return (stat.S_ISREG(st.st_mode) and st.st_uid == 0
            and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            and cachelinks.trusted_dir(fp.parent, 0, euid))


def _plan_layers(ctx: Ctx, records: list[Record], cache: dict[str, Path],
                 groups: list[tuple[int, list[Item]]],
                 untracked_files: list[str],
                 kept_pycs: set[int] = frozenset()) -> list[tuple[int, list[Item]]]:
    """Directories that one package owns wholly become one link each (layers.py): each
    is one item, its files kept in ``ctx.layers`` in case it must be placed file by file.
    The plan is made from the records' paths, so they are checked first (as placement
    checks each chunk's): a directory link is never made from a path that is refused."""
    chosen = _planned_at_install(ctx, records, kept_pycs, untracked_files)
    if chosen is None:
        ctx.listings = None  # (install's listings go with its plan)
        for key, items in groups:
            confine.check_paths([it[0] for it in items],
                                f"package {records[key].name} {records[key].version}")
        chosen = layers.plan(groups, ctx.symlink_roots or {}, untracked_files, _IN_ARCHIVE)
    if not chosen:
        return groups
    under: dict[str, str | None] = {}  # dir -> the chosen directory holding it, if any

    def layer_of(d: str) -> str | None:
        hit = under.get(d, "")
        if hit != "":
            return hit
        hit = d if d in chosen else (layer_of(d.rpartition("/")[0]) if d else None)
        under[d] = hit
        return hit

    ctx.layers = {}
    out = []
    for key, items in groups:
        keep: list[Item] = []
        r = records[key]
        for it in items:
            d = layer_of(it[0].rpartition("/")[0])
            if d is None:
                keep.append(it)
                continue
            subs = ctx.layers.get(d)
            if subs is None:
                subs = ctx.layers[d] = []
                target = f"{ctx.symlink_roots[key]}/{_cache_rel(r, d)}"
                keep.append((d, target, layers.LAYER, None, None, True, None, 0))
            subs.append(it)
        out.append((key, [(it[0], it[1], it[2], None, None, True, None,
                           len(ctx.layers[it[0]])) if it[2] == layers.LAYER else it
                          for it in keep]))
    return out


def cache_root_of(cache: dict[str, Path]) -> Path | None:
    roots = {p.parent for p in cache.values()}
    return roots.pop() if len(roots) == 1 else None


def _write_clone_stat_cache(
    tmp: Path, groups: list[tuple[int, list[Item]]], srcp: Path
) -> None:
    """The stat cache's part for files copied unchanged from SRC, without hashing them:
    trusted only where SRC's own stat cache vouched for the file (otherwise validate
    hashes it). Files from the package cache and relocated ones (SRC's too) are in the
    parts the placement processes wrote."""
    copied = [it[0] for _key, items in groups for it in items if not it[5] and not it[3]]
    if not copied:
        return
    src_cache = load_stat_cache(srcp)
    entries: dict[str, tuple] = {}
    tmp_s, src_s = str(tmp), str(srcp)
    for rel in copied:
        sc = src_cache.get(rel)
        if sc is None:
            continue
        try:
            if key_holds(sc, os.stat(os.path.join(src_s, rel))):
                st = os.lstat(os.path.join(tmp_s, rel))
                if stat.S_ISREG(st.st_mode):
                    sha = entry_sha(sc)
                    entries[rel] = (*file_key(st), sha) if sha else file_key(st)
        except OSError:
            continue
    if entries:
        store_stat_part(tmp, "copied", entries)

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
import os
import stat
import time
from dataclasses import dataclass, field
from pathlib import Path

from envtools.base.progress import info, task
from envtools.cache import tag as cachetag
from envtools.cache.find import cache_root_of, find_cache
from envtools.errors import EnvtoolsError
from envtools.place import bytecode, cachelinks, linking, placement
from envtools.place.placement import Ctx, Item
from envtools.place.plan import (
    list_plan_first,
    list_planned_early,
    plan_files,
    plan_layers,
    plan_symlinks,
)
from envtools.place.relocate import looks_binary
from envtools.prefix import confine, record_index
from envtools.prefix.hashing import (
    STAT_CACHE,
    entry_sha,
    file_key,
    key_holds,
    load_stat_cache,
    package_part,
    store_stat_part,
)
from envtools.prefix.readonly import (
    EXTERNALLY_MANAGED,
    is_envtools_marker,
    is_site_only,
    read_prefix_info,
    refuse_readonly,
    write_prefix_info,
)
from envtools.prefix.records import Prefix, Record, write_record
from envtools.prefix.tempdirs import atomic_dir
from envtools.prefix.untracked import find_editables, untracked

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


def _add_packages(
    tmp: Path,
    dest: Path,
    specs: list[str],
    channels: list[str] | None,
    src: Path,
    src_records: list[Record],
    allow_update: bool,
    virtual_overrides: list[str] | None,
) -> list[str]:
    """Solve ``specs`` against the clone (pinned unless allowed) from ``channels``, or
    those SRC came from, and install into it (:mod:`envtools.solve.adding`, shared with
    ``envtools add``)."""
    # imported here: the solve loads py-rattler (~60 ms), which a clone without --add
    # never needs (a clone of a 20,000-file env takes a few tenths of a second)
    from envtools.solve import adding

    channels = channels or adding.recorded_channels(src, src_records)
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
    early = (list_plan_first(srcp) if link_mode == "dirs" and not add and use_cache
             and os.geteuid() != 0 else None)
    try:
        prefix = record_index.load_prefix(srcp)
        _check_args(srcp, destp)
        for r in prefix.records:  # (names the cache directory and the record file: one name)
            confine.check_name(r.dist, f"package record {r.path.name} of {srcp}")
        load_s = time.monotonic() - t0
        old_prefix = read_prefix_info(srcp).get("prefix") or str(srcp)
        cache = find_cache(srcp, prefix.records) if use_cache else {}
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
            list_planned_early(ctx, prefix.records, cache, early)
        elif early is not None:
            placement.stop_listings(early.jobs)
        # --link-mode dirs: the bytecode install compiled into a noarch: python package's
        # cache entry comes along (its directories are then complete: linked whole)
        kept_pycs: set[int] = set()
        groups = plan_files(prefix.records, cache, srcp, old_prefix,
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
            files = [f for f in files if f != cachetag.NAME]  # (see envtools.cache.tag)
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
            plan_symlinks(ctx, link_mode, prefix.records, cache, groups)
            if link_mode == "dirs" and not add:  # (--add: rattler may remove any file)
                groups = plan_layers(ctx, prefix.records, cache, groups, files, kept_pycs)
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
                tmp, destp, add, channels, srcp, prefix.records, allow_update,
                virtual_overrides,
            )
            for part in (tmp / STAT_CACHE).iterdir():  # stale now; validate re-hashes
                part.unlink()
        os.chmod(tmp, 0o755)
    report.seconds = time.monotonic() - t0
    return report


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

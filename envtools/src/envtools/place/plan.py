"""Planning a clone: where each file of each package comes from (the package cache or
the source), which are symlinked, and which directories become one link each (layers);
the plan install writes for later clones."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from envtools.cache.find import find_cache
from envtools.place import bytecode, cachelinks, layers, placement
from envtools.place.placement import Ctx, Item
from envtools.prefix import confine, record_index
from envtools.prefix.hashing import stat_key
from envtools.prefix.noarch import cache_rel
from envtools.prefix.records import Record


def plan_files(
    records: list[Record], cache: dict[str, Path], srcp: Path, old_prefix: str,
    kept_pycs: set[int] | None = None,
) -> list[tuple[int, list[Item]]]:
    """Per package (its index in ``records``), every file with where it comes from.

    A file the installer made (an entry point: any path type a package archive does not
    have) exists only in SRC, and holds SRC's prefix without a recorded placeholder (an
    entry point's shebang): it is relocated from ``old_prefix`` as text, as installing at
    DEST would have written it. Compiled bytecode is left out (envtools.place.bytecode), unless
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
                (rel, base + (cache_rel(r.noarch_python, rel) if from_cache else rel), path_type,
                 placeholder, file_mode, from_cache, sha, size) if path_type in IN_ARCHIVE
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
        return stat.S_ISREG(os.lstat(f"{cdir}/{cache_rel(r.noarch_python, first)}").st_mode)
    except OSError:
        return False


#: path types of the files in a package archive; files of other types are made by the
#: installer (see plan_files). A file the cache lacks after all is taken from SRC when
#: placing it (placement.place_or_fall_back).
IN_ARCHIVE = frozenset({"hardlink", "softlink", "directory", None})


def plan_symlinks(ctx: Ctx, link_mode: str, records: list[Record], cache: dict[str, Path],
                   groups: list[tuple[int, list[Item]]]) -> None:
    """Hardlinks are refused (protected_hardlinks: the cache is not ours): link to the
    cache files we may not change, in package directories only root (``auto``, ``dirs``)
    or anyone but us (``symlink``) can change, where a link is transparent (cachelinks.py).

    A link's target is the package's cache directory as find_cache resolved it (no
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
    cache = find_cache(prefix, records)
    kept: set[int] = set()
    groups = plan_files(records, cache, prefix, str(prefix), kept)
    linkable = [k for k, r in enumerate(records) if r.name in cache]
    orphans = layers.without_bytecode(groups)  # (rel -> its file in the cache)
    bad = bytecode.uncompilable(prefix / "bin" / "python", list(orphans.values()))
    chosen = layers.plan(groups, linkable, [], IN_ARCHIVE,
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
    stack = [(d, f"{cache[records[k].name]}/{cache_rel(records[k].noarch_python, d)}", under[d], k)
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
    (:func:`list_plan_first`)."""

    plan: layers.Plan
    index_key: tuple
    jobs: list  # (placement.start_listings)
    dirs: frozenset[str]


def list_plan_first(srcp: Path) -> _Listed | None:
    """``--link-mode dirs`` as a user: when root wrote install's plan for SRC's record
    index, start find on the cache directories it names right away, before reading
    the records (about 0.1 s on powerai, in which the second core would be idle).
    Whether they are the directories this clone links is decided once the records and
    the cache are known (:func:`list_planned_early`); if not, nothing listed is used."""
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


def list_planned_early(ctx: Ctx, records: list[Record], cache: dict[str, Path],
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
            targets[d] = f"{where}/{cache_rel(r.noarch_python, d)}"
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


def plan_layers(ctx: Ctx, records: list[Record], cache: dict[str, Path],
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
        chosen = layers.plan(groups, ctx.symlink_roots or {}, untracked_files, IN_ARCHIVE)
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
                target = f"{ctx.symlink_roots[key]}/{cache_rel(r.noarch_python, d)}"
                keep.append((d, target, layers.LAYER, None, None, True, None, 0))
            subs.append(it)
        out.append((key, [(it[0], it[1], it[2], None, None, True, None,
                           len(ctx.layers[it[0]])) if it[2] == layers.LAYER else it
                          for it in keep]))
    return out

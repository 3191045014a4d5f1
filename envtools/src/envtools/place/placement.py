"""Placing a clone's tracked files: directories, links, copies and relocated files.

The work is tens of thousands of short system calls (mkdir, stat, link) and a few
hundred files re-written with a new prefix. In one thread the kernel's share dominates
(an ext4 link costs ~5 us, a mkdir 10-25 us), and threads do not help: each
returns from its system call into a queue for the GIL. Processes do: the files are
cut into contiguous chunks of about equal cost (a package's files stay together, so
chunks touch different directories), and this process and forked children take chunks
from a shared queue until none is left, then send back what they placed. Measured
here, hardlinking 46,192 files took 0.28 s in one process and 0.155 s in two. On a
network filesystem each call is a round trip, so more processes are in flight than
there are cores.
"""

from __future__ import annotations

import errno
import hashlib
import marshal
import mmap
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from envtools.base import procs
from envtools.errors import EnvtoolsError
from envtools.place import cachelinks, layers, linking
from envtools.place.relocate import relocate_pieces
from envtools.prefix import confine
from envtools.prefix.hashing import (
    entry_sha,
    file_key,
    key_holds,
    load_part,
    load_stat_cache,
    sha256_fileobj,
    store_stat_part,
)

#: relocated binaries at least this large are mapped rather than read
MAP_AT_LEAST = 1 << 20
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # (Linux)

# how a file was placed, for the report and conda-meta "link.type"
REFLINK, HARDLINK, COPY, RELOCATED, SYMLINK = "reflink", "hardlink", "copy", "relocated", "symlink"
#: a plain package file placed as a symlink to the cache (SYMLINK is a package's own link)
CACHE_SYMLINK = "symlinks to the cache"
#: a directory placed as one link to the cache (layers.py), and the files in them
LINKED_DIR, IN_LINKED_DIR = "linked directories", "files in linked directories"

#: one tracked file: (rel, source, path_type, placeholder, file_mode, from_cache, sha256,
#: size in bytes as recorded, 0 if not)
Item = tuple
#: what placing it gave: (rel, how, sha256 if known, stat key of the new file if known,
#: stat key of the package cache file it came from when that is not the new file's own)
Placed = tuple


@dataclass
class Ctx:
    """Per-clone state; each placement process has its own copy (fork)."""

    dest_tmp: Path
    new_prefix: str
    old_prefix: str
    src_root: str
    euid: int
    link_mode: str
    reflink_ok: bool | None = None
    hardlink_ok: bool = True
    #: what a package cache file is checked against before it is used (see
    #: :func:`vouched`): per package (its key), the part of SRC's stat cache install wrote
    #: for it; SRC's whole stat cache for a package without one (a clone's SRC)
    vouch_parts: dict[int, str] | None = None
    #: per package key, "name version" (for messages)
    names: dict[int, str] | None = None
    #: the package whose files this process is placing (for messages)
    unit: int = -1
    #: per package key, SRC's record's (extracted_package_dir, noarch: python): where
    #: SRC's own links to its cache lead, if it is a non-owner's clone (_src_link_target)
    src_links: dict[int, tuple[str, bool]] | None = None
    #: place plain cache files as symlinks (hardlinks refused: see cachelinks.py) ...
    symlinks: bool = False
    #: ... for these packages: key -> its cache directory, canonical (no symlink on the
    #: way) and one that only trusted owners can change (cachelinks.trusted_dir) ...
    symlink_roots: dict[int, str] | None = None
    #: ... to files of this owner (None: any but us)
    link_owner: int | None = 0
    #: the cache directories of packages that relocate files (cachelinks.stays_real)
    relocating: frozenset[str] = frozenset()
    #: (per unit while placing: symlinks are the method for this package's files)
    unit_symlinks: bool = False
    #: directories placed as one link (layers.py): dir -> the items under it
    layers: dict[str, list] | None = None
    #: the stat key of SRC's record index, when its records came from it
    index_key: tuple | None = None
    #: the layers are install's plan, whose ELF files install checked (layers.verify)
    elf_checked: bool = False
    #: with install's plan: the package files outside its layers that must be real
    #: (cachelinks.stays_real, answered at install; see :meth:`stays_real`)
    real_programs: frozenset[str] | None = None
    #: with install's plan, written by root for root's cache: its listing of each
    #: directory it checked (layers.Plan.listings) ...
    listings: dict[str, bytes] | None = None
    #: ... and the linked directories whose cache copy lists the same now, so that
    #: layers.verify has nothing to add (:func:`start_prechecks`)
    prechecked: frozenset[str] = frozenset()
    #: the directories being listed until :func:`finish_prechecks`: each process
    #: places their links last, once the listings are in (:func:`place_deferred`)
    listing: frozenset[str] = frozenset()
    _listing_jobs: list | None = None
    #: install's plan for SRC, when it has one for these records (layers.read_plan)
    plan: layers.Plan | None = None
    _vouch: dict | None = None
    _vouch_all: dict | None = None
    _dirs_ok: dict | None = None  # (cache directories checked by cachelinks.safe_subdir)

    def stays_real(self, rel: str, source: str, st: os.stat_result) -> bool:
        """cachelinks.stays_real for a vouched-for cache file (its bytes are those
        install saw): install's answer when the plan it stored holds, else read now."""
        if self.real_programs is not None:
            return rel.endswith(".pth") or rel in self.real_programs
        return cachelinks.stays_real(rel, source, st, self.src_root, self.relocating)

    def links_expected(self) -> bool:
        """Will cache files be linked (hard or symbolic) rather than copied: not root
        (root never links), ``auto``, ``dirs`` or ``symlink`` mode, and reflinks not
        known to work. Each file is still checked (``linking.hardlink_is_safe``,
        ``cachelinks.symlink_is_safe``, and vouched for: :func:`check_cache_file`); this
        is the method, for costs and the fast loop."""
        return (self.euid != 0 and self.link_mode in ("auto", "dirs", "symlink")
                and self.reflink_ok is not True)


#: filesystems where each metadata operation is a network round trip: many in flight
#: at once is what makes them fast (NFS, Lustre, GPFS/Spectrum Scale, BeeGFS, CIFS, Ceph,
#: FUSE-based parallel filesystems)
NETWORK_FS = {"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cifs", "smb3", "ceph", "fuse",
              "fuse.glusterfs", "fuse.sshfs", "afs", "panfs", "wekafs", "9p"}


def fs_type(path: str | os.PathLike[str], mounts: str = "/proc/self/mounts") -> str:
    """The filesystem type of the mount holding ``path`` ("" when it cannot be told)."""
    path = os.path.realpath(path)
    best, kind = -1, ""
    try:
        with open(mounts) as fh:
            for line in fh:
                f = line.split()
                if len(f) < 3:
                    continue
                mnt = f[1].replace("\\040", " ")
                if (path == mnt or path.startswith(mnt.rstrip("/") + "/")) and len(mnt) > best:
                    best, kind = len(mnt), f[2]
    except OSError:
        return ""
    return kind


def workers(dest: str | os.PathLike[str]) -> int:
    """Processes placing files into ``dest`` (ENVTOOLS_WORKERS overrides).

    Local filesystem: one per core, at most 4 (the kernel work scales with cores, not
    beyond). Network filesystem: 8, since each process mostly waits for round trips.
    """
    env = os.environ.get("ENVTOOLS_WORKERS")
    if env:
        try:
            return max(1, int(env))
        except ValueError:
            raise EnvtoolsError(f"ENVTOOLS_WORKERS={env!r} is not a number",
                                "set it to a process count such as 4, or unset it") from None
    kind = fs_type(dest)
    if kind in NETWORK_FS or kind.startswith("fuse."):
        return 8
    return max(1, min(4, len(os.sched_getaffinity(0))))


def link_or_copy(ctx: Ctx, src: str, dst: str, st: os.stat_result) -> str:
    """Place an unmodified package file from the cache, the safest fast way available."""
    if ctx.link_mode in ("auto", "dirs", "reflink") and ctx.reflink_ok is not False:
        try:
            linking.reflink(src, dst, linking.writable_mode(st.st_mode))
            ctx.reflink_ok = True
            return REFLINK
        except OSError as e:
            if ctx.link_mode == "reflink":
                raise EnvtoolsError(
                    f"reflink of {src} failed: {e.strerror}",
                    "the source and destination must be on one reflink-capable filesystem "
                    "(XFS, btrfs); use --link-mode auto to fall back",
                ) from e
            if e.errno in linking.LINK_GIVE_UP or e.errno == errno.ENOTSUP:
                ctx.reflink_ok = False
    if (
        ctx.link_mode in ("auto", "dirs")
        and ctx.hardlink_ok
        and linking.hardlink_is_safe(st, ctx.euid)
    ):
        try:
            os.link(src, dst)
            return HARDLINK
        except OSError as e:
            if e.errno in linking.LINK_GIVE_UP:
                ctx.hardlink_ok = False  # protected_hardlinks, other filesystem...
            else:
                raise
    if (ctx.unit_symlinks and cachelinks.symlink_is_safe(st, ctx.euid, ctx.link_owner)
            and not ctx.stays_real(dst[len(str(ctx.dest_tmp)) + 1:], src, st)
            and _dirs_trusted(ctx, src)):
        try:
            os.symlink(src, dst)  # (EEXIST, never over anything: see place())
            return CACHE_SYMLINK
        except OSError as e:
            if e.errno not in cachelinks.SYMLINK_GIVE_UP:
                raise
            ctx.symlinks = ctx.unit_symlinks = False
    linking.copy(src, dst, linking.writable_mode(st.st_mode))
    return COPY


def _dirs_trusted(ctx: Ctx, source: str) -> bool:
    """May a symlink lead to ``source``, a file of the package being placed? Every
    directory from its package's cache directory down to it must be a real directory
    that only root or the trusted owner can change (cachelinks.safe_subdir): a link
    reads whatever is at that path later, not the inode that was checked."""
    if ctx._dirs_ok is None:
        ctx._dirs_ok = {}
    d = source.rpartition("/")[0]
    ok = ctx._dirs_ok.get(d)
    if ok is None:
        root = (ctx.symlink_roots or {}).get(ctx.unit)
        ok = root is not None and cachelinks.safe_subdir(root, d, ctx.link_owner, ctx.euid,
                                                         ctx._dirs_ok)
    return ok


def vouched(ctx: Ctx, rel: str, source: str, st: os.stat_result, sha: str | None) -> bool:
    """Does SRC's stat cache vouch that the package cache file ``source`` (stat ``st``)
    still has its package's sha256? It does when an entry for the env's file holds for
    the cache file (hashing.key_holds: hardlinked at install, the same inode) or one
    keyed by the cache file's path does (written for the cache files the env does not
    share), and holds that hash or leaves it out (the package's). See
    :mod:`envtools.prefix.hashing`: an in-place edit whose mtime was put back is caught by its
    ctime.
    """
    v = _vouch_table(ctx)
    for k in (rel, source):
        sc = v.get(k)
        if sc is not None and key_holds(sc, st):
            got = entry_sha(sc)
            return got is None or got == sha
    return False


def _vouch_table(ctx: Ctx) -> dict:
    """SRC's stat cache entries for the package being placed: its own part when install
    wrote one, else all of SRC's stat cache (loaded once per process)."""
    if ctx._vouch is None:
        ctx._vouch = {}
    table = ctx._vouch.get(ctx.unit)
    if table is None:
        part = (ctx.vouch_parts or {}).get(ctx.unit)
        table = load_part(part) if part else None
        if table is None:
            if ctx._vouch_all is None:
                ctx._vouch_all = load_stat_cache(Path(ctx.src_root))
            table = ctx._vouch_all
        ctx._vouch[ctx.unit] = table
    return table


class CacheMismatch(EnvtoolsError):
    """A package cache file no longer has the content its record names."""


def check_cache_file(ctx: Ctx, item: Item, st: os.stat_result, data=None) -> bool:
    """Before a package cache file is linked, copied or relocated: vouched for by SRC's
    stat cache, or hashed (``data``: its bytes, when they were read anyway) and equal to
    its record's sha256 and size. Returns False when the record has no sha256 to check
    against (the file is then taken from SRC); raises :class:`CacheMismatch` when the
    file does not match."""
    rel, source, _pt, _ph, _fm, _fc, sha, size = item
    if not sha:
        return False
    if vouched(ctx, rel, source, st, sha):
        return True
    if data is not None:
        got = hashlib.sha256(data).hexdigest()
    else:
        fd = confine.open_regular(source)
        if fd is None:
            got = "not a regular file"
        else:
            with os.fdopen(fd, "rb") as fh:
                got = sha256_fileobj(fh)
    if got != sha or (size and st.st_size != size and not item[3]):  # ([3]: placeholder)
        what = (ctx.names or {}).get(ctx.unit, "a package")
        raise CacheMismatch(
            f"the package cache file {source} of {what} does not match its record "
            f"(sha256 {got}, the record says {sha}): the package cache was changed after "
            "it was installed",
            "do not use that cache: ask its owner to reinstall the environment, or clone "
            "with --no-cache to copy the source's own files (then run envtools validate "
            "on the clone)", exit_code=1)
    return True


def place(ctx: Ctx, item: Item) -> Placed:
    """Create one tracked file in the clone.

    A file placed from the cache has the package's recorded hash, a relocated one the
    hash of what we wrote, and a hardlink shares the stat we already took of its source,
    so the clone's stat cache costs no extra hashing and hardly any system calls. A
    cache file is used only once :func:`check_cache_file` has vouched for it.
    """
    rel, source, path_type, placeholder, file_mode, from_cache, sha, _size = item
    dst = os.path.join(ctx.dest_tmp, rel)
    if path_type == "softlink":
        target = os.readlink(source)
        for old in (placeholder, ctx.old_prefix):
            if old and target.startswith(old):
                target = ctx.new_prefix + target[len(old):]
        confine.symlink(target, dst)  # (never followed: see envtools.prefix.confine)
        return rel, SYMLINK, None, None, None
    if path_type == "directory":
        confine.makedirs(str(ctx.dest_tmp), rel)
        return rel, "directory", None, None, None
    old = placeholder if from_cache else (ctx.old_prefix if placeholder else None)
    if not old and not from_cache:
        try:
            linking.copy(source, dst)
        except confine.UnsafePath:  # (a link: SRC's own link to its cache, or refused)
            linking.copy(_src_link_target(ctx, rel, source), dst)
        return rel, COPY, None, None, None
    if old:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        with os.fdopen(fd, "rb") as fh:
            st = os.fstat(fh.fileno())
            # a large binary is mapped, not read: its pages are in the page cache already,
            # and a fresh buffer of tens of MB costs more in page faults than the copy. The
            # map is populated in one call: faulting 12,000 pages in one by one while
            # another process links files took 2.5x as long (libpython3.11.a, 48 MB)
            mapped = file_mode == "binary" and st.st_size >= MAP_AT_LEAST
            data = (mmap.mmap(fh.fileno(), 0, mmap.MAP_SHARED | _MAP_POPULATE, mmap.PROT_READ)
                    if mapped else fh.read())
        pieces: list = []
        try:
            if from_cache and not check_cache_file(ctx, item, st, data):
                return place(ctx, _from_src(ctx, item))
            pieces = relocate_pieces(data, old, ctx.new_prefix, file_mode or "text", what=rel)
            h = hashlib.sha256()
            fd = confine.create(dst, linking.writable_mode(st.st_mode))
            try:
                os.fchmod(fd, linking.writable_mode(st.st_mode))  # whatever the umask
                for piece in pieces:
                    h.update(piece)
                    linking.write_all(fd, piece)
                key = file_key(os.fstat(fd))
            finally:
                os.close(fd)
        finally:
            if mapped:  # (the pieces are views into the map: released first)
                for piece in pieces:
                    if isinstance(piece, memoryview):
                        piece.release()
                data.close()
        return rel, RELOCATED, h.hexdigest(), key, file_key(st) if from_cache else None
    st = os.lstat(source)
    if not check_cache_file(ctx, item, st):
        return place(ctx, _from_src(ctx, item))
    try:
        how = link_or_copy(ctx, source, dst, st)
    except FileExistsError:
        raise confine.UnsafePath(f"{dst} exists already: the records list {rel!r} twice "
                                 "(or as a link and a file)") from None
    if how == CACHE_SYMLINK:  # (the new entry leads to that inode, which it left as it was)
        return rel, how, sha, file_key(st), None
    if how == HARDLINK:  # (that inode, with a new link: its key taken after it)
        return rel, how, sha, file_key(os.lstat(dst)), None
    return rel, how, sha, file_key(os.stat(dst)), file_key(st)


def _src_link_target(ctx: Ctx, rel: str, source: str) -> str:
    """SRC's file ``source`` is a symlink: a clone of a non-owner's clone copies what
    it leads to if it is that clone's own link to its package cache (the one link
    validate follows: cachelinks.link_target from SRC's record), and refuses any
    other link, as linking.copy does."""
    epd, noarch = (ctx.src_links or {}).get(ctx.unit, (None, False))
    want = cachelinks.link_target(epd, noarch, rel)
    try:
        target = os.readlink(source)
    except OSError:
        target = None
    if want is None or target != want:
        raise confine.UnsafePath(f"{source} is a symbolic link where a file was expected; "
                                 "envtools does not copy what it points to")
    return want


def _from_src(ctx: Ctx, item: Item) -> Item:
    """The same file taken from SRC's own copy instead of the package cache."""
    rel, _source, path_type, ph, fm, _from_cache, _sha, size = item
    return rel, ctx.src_root + "/" + rel, path_type, ph, fm, False, None, size


def place_or_fall_back(ctx: Ctx, item: Item) -> Placed:
    """:func:`place`, taking SRC's own file when the cache's copy is missing or unreadable."""
    try:
        return place(ctx, item)
    except (FileNotFoundError, PermissionError):
        if item[5]:
            return place(ctx, _from_src(ctx, item))
        raise


#: find processes listing the linked directories (one per core here: they run while
#: the clone prepares, and are waited for before the placing processes start)
LISTING_JOBS = 2


def start_prechecks(ctx: Ctx, targets: dict[str, str]) -> None:
    """Start listing the cache directories ``targets`` (``{dir: its cache directory}``)
    that will be linked whole, where install left its listing of them
    (:attr:`Ctx.listings`): :func:`start_listings`. Started as soon as the plan is
    known, they run while the clone prepares and places everything else."""
    if ctx.listings:
        ctx._listing_jobs, ctx.listing = start_listings(ctx.listings, targets)


def start_listings(listings: dict[str, bytes], targets: dict[str, str],
                   ) -> tuple[list[tuple[layers.Listing | None, list[str]]], frozenset[str]]:
    """find(1) over the directories of ``targets`` that ``listings`` has, in
    :data:`LISTING_JOBS` processes with about equal shares (by the length of their
    listings: about their files): the jobs, each with its directories in order, and
    the directories listed."""
    todo = sorted(((len(listings[d]), d, t) for d, t in targets.items() if d in listings),
                  reverse=True)
    shares: list[list[tuple[str, str]]] = [[] for _ in range(LISTING_JOBS)]
    loads = [0] * LISTING_JOBS
    for n, d, target in todo:
        i = loads.index(min(loads))
        shares[i].append((d, target))
        loads[i] += n
    jobs = [(layers.start_listing([t for _d, t in share]), [d for d, _t in share])
            for share in shares if share]
    return jobs, frozenset(d for _n, d, _t in todo)


def stop_listings(jobs: list[tuple[layers.Listing | None, list[str]]]) -> None:
    """Stop listings that will not be used."""
    for job, _dirs in jobs:
        if job is not None:
            job.stop()


def finish_prechecks(ctx: Ctx) -> None:
    """Wait for :func:`start_prechecks`' listings; :attr:`Ctx.prechecked` becomes the
    directories whose listing is install's, byte for byte."""
    done: set[str] = set()
    for proc, dirs in ctx._listing_jobs or []:
        if not ctx.layers or not ctx.listings or proc is None:  # (plan unused: stop)
            stop_listings([(proc, dirs)])
            continue
        n = layers.same_listings(layers.finish_listing(proc),
                                 [ctx.listings[d] for d in dirs])
        done.update(dirs[:n])
    ctx._listing_jobs = None
    ctx.prechecked = frozenset(done)
    ctx.listing = frozenset()


def _prechecked_entries(ctx: Ctx, items: list[Item]) -> dict[str, tuple]:
    """The stat cache entries of a prechecked directory's files: SRC's (install wrote
    them with the listing; the files' stats are the listed ones)."""
    vouch = _vouch_table(ctx)
    out: dict[str, tuple] = {}
    for it in items:
        if it[2] in ("directory", "softlink"):
            continue
        sc = vouch.get(it[0]) or vouch.get(it[1])
        if sc is not None and entry_sha(sc) in (None, it[6]):
            out[it[0]] = sc[:5]
    return out


def place_layer(ctx: Ctx, item: Item) -> tuple[dict[str, tuple], list[Item], int, int]:
    """Link a whole directory to the cache (layers.py) once :func:`layers.verify` says
    its cache copy holds exactly the package's files there, safe to link, and SRC's
    stat cache vouches for every one of them (as for a file linked alone).

    A directory that fails is not given up whole: it becomes a real directory, the files
    directly in it are placed one by one and each subdirectory is tried as a link of its
    own, so one program that must be real (or one relocated file) costs a symlink per
    file in its own directory only, not in all of ``tensorflow/``. What plan() checked
    holds for every subdirectory of a planned one (a single owner, no file that must be
    the clone's own, each ``.py`` with its ``.pyc``).

    Returns the stat cache entries of the linked files, the items to place one by one
    (their directories are made here), and the number of directory links and of files
    in them."""
    rel, source = item[0], item[1]
    subs = ctx.layers[rel] if ctx.layers else []
    bad = confine.first_unsafe([s[0] for s in subs])
    if bad:
        raise confine.UnsafePath(f"{(ctx.names or {}).get(ctx.unit, 'a package')}: "
                                 f"refusing path {bad[0]!r} from its record: {bad[1]}")
    base = str(ctx.dest_tmp) + "/"
    known: dict[str, tuple] = {}
    rest: list[Item] = []
    linked = files = 0
    stack = [(rel, source, subs)]
    while stack:
        d, src, items = stack.pop()
        entries = None
        if not ctx.unit_symlinks or not _dirs_trusted(ctx, src):
            pass
        elif d in ctx.prechecked:  # (root's install checked what it lists still: verify)
            entries = _prechecked_entries(ctx, items)
        else:
            entries = layers.verify(src, items, d, ctx.src_root, ctx.relocating,
                                    euid=ctx.euid, owner=ctx.link_owner,
                                    elf_checked=ctx.elf_checked, vouch=_vouch_table(ctx))
        if entries is not None:  # (every file vouched for: verify checked it)
            confine.symlink(src, base + d)
            known.update(entries)
            linked += 1
            files += len(items)
            continue
        confine.mkdir(base + d)
        children: dict[str, list[Item]] = {}
        here: list[Item] = []
        for s in items:
            head, sep, _ = s[0][len(d) + 1:].partition("/")
            (children.setdefault(head, []) if sep else here).append(s)
        for s in here:  # (a directory entry goes with the subdirectory it names)
            name = s[0][len(d) + 1:]
            if s[2] == "directory" and name in children:
                children[name].append(s)
            else:
                rest.append(s)
        stack.extend((f"{d}/{h}", f"{src}/{h}", c) for h, c in children.items())
    return known, rest, linked, files


def probe_reflink(pkg_dir: Path, tmp: Path) -> bool | None:
    """Can this cache reflink into DEST's filesystem? Tried once, on a cache file."""
    return linking.probe(pkg_dir, tmp, "reflink",
                         lambda src, dst: linking.reflink(src, dst, 0o600))


def _dirs_of(rels: list[str]) -> list[str]:
    """Every directory these files need, parents first (a prefix sorts first)."""
    return sorted(confine.ancestors(rels))


@dataclass
class Unit:
    """Some of one package's files, placed together by one process: all of them, or a
    part when a package is split across two chunks.

    ``writes_record``: this unit's process writes the package's record once its files
    are placed. True for a whole package, and for the first part of a split one that
    relocates nothing (its record is the same whatever placing gives). A split package
    with relocated files has its record written by the parent once every part is in.
    """

    key: int
    items: list[Item]
    writes_record: bool = True
    cost: int = 0


@dataclass
class Outcome:
    """What placing gave, small enough to send back through a pipe."""

    counts: dict[str, int]  # how -> files
    rewritten: dict[str, tuple[str, int]]  # relocated files: rel -> (sha256, size) written
    files: int = 0  # items placed
    #: directories to link once their listings are in (:func:`place_deferred`):
    #: (package key, item)
    deferred: list[tuple[int, Item]] = field(default_factory=list)


#: what placing costs, in hardlinks (5-7 us each on local ext4), so that each process
#: gets an equal share of the time rather than of the files. A mkdir or a new file
#: allocates an inode (2-20 links' worth, more just after many inodes were freed); a
#: relocated or copied file's bytes are also read, hashed and written, ~1-2 ns a byte:
#: libpython3.11.a (48 MB, relocated) costs as much as ~20,000 links, and splitting by
#: file count left one process with it and the other idle for a quarter of the clone.
DIR_COST, NEW_FILE_COST, BYTES_PER_COST = 4, 4, 2048


def item_cost(item: Item, hardlinks: bool) -> int:
    """The cost of placing one item (see DIR_COST), its directories aside; ``hardlinks``:
    cache files are linked (hard or symbolic links: about the same cost)."""
    _rel, _source, path_type, placeholder, _fm, from_cache, _sha, size = item
    if path_type == "directory":
        return DIR_COST
    if path_type == "softlink":
        return NEW_FILE_COST
    if path_type == layers.LAYER:  # (size: its file count; each is looked at once)
        return NEW_FILE_COST + size // 4
    if placeholder or not from_cache or not hardlinks:
        return NEW_FILE_COST + (size or 0) // BYTES_PER_COST  # (a reflink copies no data,
    return 1  # but is rare enough not to be told apart)


def split_units(groups: list[tuple[int, list[Item]]], n: int,
                hardlinks: bool = True) -> list[list[Unit]]:
    """Fill ``n`` chunks in order with about equal cost each (:func:`item_cost`; a
    directory costs DIR_COST in the chunk of the first package that needs it), splitting
    a package only at a chunk boundary."""
    seen: set[str] = set()
    costs: list[list[int]] = []
    for _key, items in groups:
        # (a plain file from the cache is a link, cost 1: told here without a call per file)
        c = [1 if hardlinks and it[5] and not it[3] and it[2] == "hardlink"
             else item_cost(it, hardlinks) for it in items]
        for rel_dir in {it[0].rpartition("/")[0] for it in items} - seen:
            seen.add(rel_dir)
            if c:  # (charged to the package's first file: it is placed after the mkdirs)
                c[0] += DIR_COST
        costs.append(c)
    total = sum(sum(c) for c in costs)
    target = max(1, -(-total // n))
    chunks: list[list[Unit]] = [[] for _ in range(n)]
    i = load = 0
    for (key, items), c in zip(groups, costs, strict=True):
        if not items:
            chunks[i].append(Unit(key, [], True))
            continue
        relocates = any(it[3] for it in items)
        pos = 0
        while pos < len(items):
            if load >= target and i < n - 1:
                i, load = i + 1, 0
            end = pos
            if i == n - 1:
                end = len(items)
            else:
                while end < len(items) and load < target:
                    load += c[end]
                    end += 1
            whole = pos == 0 and end == len(items)
            chunks[i].append(Unit(key, items[pos:end], whole or (pos == 0 and not relocates),
                                  sum(c[pos:end])))
            pos = end
    return [c for c in chunks if c]


def _hold_for_tests() -> None:
    """With ``ENVTOOLS_HOLD_FIFO`` naming a FIFO, wait until a writer opens it before
    placing anything. Why: the crash-hygiene tests must kill a clone while its placement
    processes are certainly running, and every source file is checked before it is read,
    so nothing in an env can make placement block any more."""
    fifo = os.environ.get("ENVTOOLS_HOLD_FIFO")
    if fifo:
        with open(fifo, "rb"):
            pass


def place_chunks(
    ctx: Ctx, chunks: list[list[Unit]], queue: int, advance: Callable[[int], None],
    on_unit: Callable[[int, dict[str, tuple[str, int]]], None], part: str,
) -> Outcome:
    """Place the chunks whose numbers this process takes from ``queue`` (a pipe holding
    each chunk's number once, two bytes each; empty and closed when all are taken), and
    call ``on_unit(key, rewritten)`` for each unit that writes its package's record (so
    records are written in parallel too). What it placed goes into the clone's stat
    cache as part ``part`` (its directory made by the caller).

    A chunk creates every directory its files need before its files: another process
    may be creating a shared parent at the same moment, so an existing one is fine.
    Plain cache files go through a tight loop when links are the method (no reflink, not
    root): the same rules as :func:`link_or_copy` (``linking.hardlink_is_safe``, or
    ``cachelinks.symlink_is_safe`` and not ``cachelinks.stays_real``) without its other
    per-file calls.
    """
    _hold_for_tests()
    base = str(ctx.dest_tmp) + "/"
    # the fast loop: links are the method, and not root (links_expected), so a file is
    # safe to hardlink when it has no write bit (linking.hardlink_is_safe), and to
    # symlink when it is also not ours (cachelinks.symlink_is_safe)
    fast = ctx.links_expected() and ctx.reflink_ok is False  # (no reflink to try first)
    euid, owner, exec_bits = ctx.euid, ctx.link_owner, cachelinks.EXEC_BITS
    write_bits = linking.WRITE_BITS
    counts: dict[str, int] = {}
    rewritten: dict[str, tuple[str, int]] = {}
    known: dict[str, tuple] = {}  # rel -> hashing.file_key(...)[ + (sha256,)]: hashing.py
    link, symlink, lstat = os.link, os.symlink, os.lstat
    deferred: list[tuple[int, Item]] = []
    n = links = syms = 0
    while len(claimed := os.read(queue, 2)) == 2:
        units = chunks[int.from_bytes(claimed, "little")]
        rels = [it[0] for u in units for it in u.items]
        dirs = _dirs_of(rels)
        bad = confine.first_unsafe(rels, dirs)  # (before this chunk writes anything)
        if bad:
            key = next(u.key for u in units for it in u.items if it[0] == bad[0])
            raise confine.UnsafePath(f"{(ctx.names or {}).get(key, 'a package')}: refusing "
                                     f"path {bad[0]!r} from its record: {bad[1]}")
        for d in dirs:  # (a real directory, or one made here: never a link to elsewhere)
            confine.mkdir(base + d)
        for unit in units:
            unit_rewritten: dict[str, tuple[str, int]] = {}
            ctx.unit = unit.key
            vouch = _vouch_table(ctx) if fast else None
            symlinks = ctx.unit_symlinks = bool(ctx.symlinks and ctx.symlink_roots
                                                and unit.key in ctx.symlink_roots)
            for item in unit.items:
                rel, source, path_type, placeholder, _fm, from_cache, sha, _size = item
                if (fast and from_cache and not placeholder and path_type == "hardlink"
                        and (ctx.hardlink_ok or symlinks)):
                    try:
                        st = lstat(source)
                        sc = vouch.get(rel)  # (vouched(), inlined: SRC's hardlinked file)
                        if st.st_mode & write_bits or sc is None or not key_holds(sc, st) \
                                or entry_sha(sc) not in (None, sha):
                            pass  # (not vouched for here, or writable: place() decides)
                        elif not symlinks:
                            link(source, base + rel)
                            links += 1
                            if sha:  # (it holds the package's sha256: left out; the key
                                # after the link, which changed its ctime and link count)
                                known[rel] = file_key(lstat(base + rel))
                            continue
                        elif (sha and st.st_uid != euid
                              and (owner is None or st.st_uid == owner)
                              and not rel.endswith(".pth") and not (
                                st.st_mode & exec_bits and ctx.stays_real(rel, source, st))
                              and _dirs_trusted(ctx, source)):
                            symlink(source, base + rel)
                            syms += 1
                            if sha:
                                known[rel] = file_key(st)
                            continue
                        # (otherwise ours, a program, or in a directory others may
                        # change: place() decides)
                    except OSError as e:
                        if e.errno in linking.LINK_GIVE_UP and not symlinks:
                            ctx.hardlink_ok = False
                        elif symlinks and e.errno in cachelinks.SYMLINK_GIVE_UP:
                            ctx.symlinks = ctx.unit_symlinks = symlinks = False
                if path_type != layers.LAYER:
                    _place_items(ctx, [item], counts, known, unit_rewritten)
                elif rel in ctx.listing and not any(s[3] for s in ctx.layers[rel]):
                    deferred.append((unit.key, item))  # (its record does not change)
                else:
                    _place_layer_item(ctx, item, counts, known, unit_rewritten)
            rewritten.update(unit_rewritten)
            if unit.writes_record:
                on_unit(unit.key, unit_rewritten)
            n += len(unit.items)
            advance(len(unit.items))
    if links:
        counts[HARDLINK] = counts.get(HARDLINK, 0) + links
    if syms:
        counts[CACHE_SYMLINK] = counts.get(CACHE_SYMLINK, 0) + syms
    store_stat_part(ctx.dest_tmp, part, known)
    return Outcome(counts, rewritten, n, deferred)


def _place_items(ctx: Ctx, items: list[Item], counts: dict[str, int],
                 known: dict[str, tuple], rewritten: dict[str, tuple[str, int]]) -> None:
    """Place items one by one (:func:`place_or_fall_back`), adding to what the caller
    keeps: counts by method, stat cache entries, relocated files."""
    for sub in items:
        rel, how, sha, key, cache_key = place_or_fall_back(ctx, sub)
        counts[how] = counts.get(how, 0) + 1
        if how == RELOCATED:
            rewritten[rel] = (sha, key[0])
        if sha and key:
            known[rel] = (*key, sha)
        if cache_key:  # vouches for the cache file to clones of this clone
            known[sub[1]] = cache_key


def _place_layer_item(ctx: Ctx, item: Item, counts: dict[str, int], known: dict[str, tuple],
                      rewritten: dict[str, tuple[str, int]]) -> None:
    """A directory to link whole (:func:`place_layer`), and whatever of it must be
    placed file by file."""
    entries, subs, n_linked, n_in = place_layer(ctx, item)
    known.update(entries)
    if n_linked:
        counts[LINKED_DIR] = counts.get(LINKED_DIR, 0) + n_linked
        counts[IN_LINKED_DIR] = counts.get(IN_LINKED_DIR, 0) + n_in
    _place_items(ctx, subs, counts, known, rewritten)


def place_deferred(ctx: Ctx, deferred: list[tuple[int, Item]], part: str) -> dict[str, int]:
    """Link the directories :func:`place_chunks` left for later because their listings
    were still being made: now that :func:`finish_prechecks` has them (in a child: the
    parent's verdict, :attr:`Ctx.prechecked`, sent through a pipe), each is a link
    if its listing is install's, or goes through :func:`layers.verify` (and, where that
    fails, file by file) as any other. Their files are never relocated (such a directory
    is not put aside), so no record changes. What it placed goes into stat cache part
    ``part``; returns how many of each kind it placed."""
    counts: dict[str, int] = {}
    known: dict[str, tuple] = {}
    rewritten: dict[str, tuple[str, int]] = {}
    for key, item in deferred:
        ctx.unit = key
        ctx.unit_symlinks = bool(ctx.symlinks and ctx.symlink_roots
                                 and key in ctx.symlink_roots)
        _place_layer_item(ctx, item, counts, known, rewritten)
    if rewritten:  # (plan() keeps relocated files out of every linked directory)
        raise EnvtoolsError(f"{sorted(rewritten)[0]}: a relocated file in a directory "
                            "placed late", "report this; run the clone with "
                            "--link-mode auto meanwhile")
    if deferred:
        store_stat_part(ctx.dest_tmp, part, known)
    return counts


#: chunks per placing process: the processes take chunks, biggest first, until none is
#: left, so one that is slowed (a relocation faulting in fresh pages, another user's
#: job on its core) takes fewer. Cut into one shard per process instead, the process
#: holding the python package finished up to 0.2 s after the other one.
CHUNKS_PER_WORKER = 16
#: the queue is written whole before any process reads it: it must fit in a pipe (64 KiB)
MAX_CHUNKS = 4096


def place_all(
    ctx: Ctx, groups: list[tuple[int, list[Item]]], n_workers: int,
    advance: Callable[[int], None], on_unit: Callable[[int, dict[str, tuple[str, int]]], None],
) -> Outcome:
    """Place every package's files in ``n_workers`` processes (this one and forked
    children) sharing a queue of cost-balanced chunks, calling ``on_unit(key, rewritten)``
    once per package.

    A child sends back its marshal'd :class:`Outcome`, or its error as (kind, errno,
    filename, message, hint) to be raised here again. If anything fails or is
    interrupted here, the children are killed and reaped before the error goes on, so
    the caller's clean-up never races a child still creating files.
    """
    total = sum(len(items) for _key, items in groups)
    if not os.environ.get("ENVTOOLS_WORKERS"):  # (set: exactly that many, for tests too)
        # a fork and its page faults cost ~ 1 ms: worth it from ~500 files on (a
        # directory link's files count, each is looked at: its size is their number)
        files = sum(it[7] if it[2] == layers.LAYER else 1 for _key, items in groups
                    for it in items)
        n_workers = min(n_workers, files // 512)
    n_workers = max(1, min(n_workers, total))
    chunks = split_units(groups, max(1, min(n_workers * CHUNKS_PER_WORKER, total, MAX_CHUNKS)),
                         ctx.links_expected())
    order = sorted(range(len(chunks)), key=lambda i: -sum(u.cost for u in chunks[i]))
    queue, w = os.pipe()  # (filled and closed before any fork: readers see its end)
    try:
        linking.write_all(w, b"".join(i.to_bytes(2, "little") for i in order))
    finally:
        os.close(w)
    children: list[tuple[int, int]] = []  # (pid, read end of its report pipe)
    me = os.getpid()
    # While find lists the directories to link, every process places everything else
    # and puts those directories aside; this one then tells each child what the
    # listings found, through a pipe of its own (see place_deferred).
    verdicts = [os.pipe() for _ in range(1, n_workers)] if ctx.listing else []
    try:
        for worker in range(1, n_workers):
            r, w = os.pipe()
            # no signal may reach the child before it drops the parent's handlers: it
            # would unwind through the parent's clean-up code in the child
            signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
            try:
                pid = os.fork()
                if pid == 0:  # child: place, report, and leave without running anything else
                    _child(ctx, chunks, queue, on_unit, r, w, f"placed-{worker}", me,
                           verdicts, worker - 1)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
            os.close(w)
            children.append((pid, r))
        for vr, _vw in verdicts:
            os.close(vr)
        out = place_chunks(ctx, chunks, queue, advance, on_unit, "placed-0")
        finish_prechecks(ctx)
        verdict = marshal.dumps(sorted(ctx.prechecked))
        while verdicts:
            _vr, vw = verdicts.pop()
            try:
                linking.write_all(vw, verdict)
            except OSError:
                pass  # (that child failed: its report says why)
            finally:
                os.close(vw)
        _add_counts(out.counts, place_deferred(ctx, out.deferred, "placed-0-late"))
        while children:
            pid, r = children[0]
            with os.fdopen(r, "rb") as fh:
                data = fh.read()
            _pid, wstatus = os.waitpid(pid, 0)
            children.pop(0)
            if not data:
                _raise_child_died(os.waitstatus_to_exitcode(wstatus))
            status, payload = marshal.loads(data)
            if status != "ok":
                _raise_child_error(payload)
            counts, rewritten, n = payload
            _add_counts(out.counts, counts)
            out.rewritten.update(rewritten)
            advance(n)
        recorded = {u.key for chunk in chunks for u in chunk if u.writes_record}
        for key, items in groups:  # split packages that relocate: finished here
            if key not in recorded:
                on_unit(key, {it[0]: out.rewritten[it[0]] for it in items
                              if it[0] in out.rewritten})
        return out
    finally:
        os.close(queue)
        for _vr, vw in verdicts:  # (only on failure: a child waiting gets its end)
            os.close(vw)
        for pid, r in children:  # only on failure: stop them before the caller cleans up
            try:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(r)
            except OSError:
                pass


def _add_counts(counts: dict[str, int], more: dict[str, int]) -> None:
    for how, k in more.items():
        counts[how] = counts.get(how, 0) + k


_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def _child(ctx: Ctx, chunks: list[list[Unit]], queue: int, on_unit: Callable, r: int,
           w: int, part: str, parent: int, verdicts: list[tuple[int, int]], mine: int) -> None:
    """A forked placement process: never returns (os._exit), whatever happens. It is
    killed when ``parent`` dies (even by SIGKILL, which runs no clean-up code there): a
    worker left running would go on filling a temporary directory nobody renames."""
    code = 0
    try:
        procs.die_with_parent(parent)
        for sig in _SIGNALS:  # die at once on Ctrl-C / SIGTERM: the parent cleans up
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _SIGNALS)
        os.close(r)
        for i, (vr, vw) in enumerate(verdicts):  # (only the parent writes: EOF is its)
            os.close(vw)
            if i != mine:
                os.close(vr)
        ctx._listing_jobs = None  # (the parent's to finish)
        try:
            o = place_chunks(ctx, chunks, queue, lambda n: None, on_unit, part)
            if verdicts:  # (read even with nothing put aside: a verdict over 64 KiB
                # would otherwise stop the parent in its write for ever)
                with os.fdopen(verdicts[mine][0], "rb") as fh:  # (to its writer's end)
                    ctx.prechecked = frozenset(marshal.loads(fh.read()))
                ctx.listing = frozenset()
                _add_counts(o.counts, place_deferred(ctx, o.deferred, part + "-late"))
            out = ("ok", (o.counts, o.rewritten, o.files))
        except EnvtoolsError as e:
            out = ("error", ("envtools", e.exit_code, "", e.message, e.hint))
        except OSError as e:
            out = ("error", ("os", e.errno or 0, e.filename or "", e.strerror or str(e), ""))
        except Exception as e:  # noqa: BLE001 - reported to the parent, which raises it
            out = ("error", ("other", 0, "", f"{type(e).__name__}: {e}", ""))
        linking.write_all(w, marshal.dumps(out))
    except BaseException:
        code = 1
    finally:
        os._exit(code)


def _raise_child_died(code: int) -> None:
    """A child that left no report: interrupted along with us (Ctrl-C reaches the whole
    process group), or killed (the OOM killer, an admin)."""
    if code in (-signal.SIGINT, -signal.SIGTERM):
        raise KeyboardInterrupt
    how = f"was killed by signal {-code}" if code < 0 else f"exited with status {code}"
    raise EnvtoolsError(f"a file placement process {how} without a report",
                        "run the clone again; if it repeats, set ENVTOOLS_WORKERS=1 to "
                        "place every file in the main process")


def _raise_child_error(payload) -> None:
    kind, err, filename, message, hint = payload
    if kind == "envtools":
        raise EnvtoolsError(message, hint, exit_code=err)
    if kind == "os":
        if err == errno.ENOENT:
            raise FileNotFoundError(err, message, filename or None)
        raise OSError(err, message, filename or None)
    raise RuntimeError(f"placement process failed: {message}")

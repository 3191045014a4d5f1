"""Symlinks into a package cache the user does not own: the fast clone for everyone else.

A clone is fast when it links its files to the package cache instead of copying them.
A hardlink needs no new inode, but with ``fs.protected_hardlinks=1`` (the Linux default)
the kernel lets only the file's owner, or someone who may read *and write* it, hardlink
it; so every user but the cache's owner copies, and a 46,000-file env then costs almost
what ``cp -a`` does. A symlink anyone may make.

Why such a link is safe: the link is the user's, the file it points to is not. A cache
file that has no write bit and belongs to someone else cannot be written, chmod-ed,
renamed or removed through the link by this user (the kernel checks the target's owner
and mode when the link is followed, and the link itself is all the user can remove or
replace). pip, conda and editors that replace files unlink the link and write a new file
of the user's own. Root never gets symlinks (it writes through permissions), nor does the
cache's owner (who could chmod the target): they hardlink or copy, as before.

The other direction matters as much: whoever owns the target, or may write a directory
on the way to it, can change what the clone reads long after the clone was made. So by
default only files that root owns, in a package directory that only root can change all
the way up (:func:`trusted_dir`), are linked: the site's env, which its users trust as
much as ``module load``. A colleague's env is copied, as before (its owner could change
it later); ``--link-mode symlink`` extends the links to any owner's cache, for a user who
trusts that owner with their clone.

Not every file may be a link, because a symlink is not transparent where a program asks
where a file *really* is:

* an ELF **program** (not a library): the kernel resolves its symlinks before running it,
  so ``/proc/self/exe`` and ``$ORIGIN`` in its RPATH name the cache's directory, where the
  libraries of other packages are not (python finds its prefix the same way). A program
  is linked only when it runs the same from there (:func:`runs_from_cache`: its package
  relocates nothing, and every library it and they find through ``$ORIGIN`` is found at
  the same place in its own package), else copied. A library's ``$ORIGIN`` is the
  directory it was opened in, the clone's, so libraries are always linked;
* files with the install prefix in them (relocated: written fresh anyway), and files the
  installer made (entry points: they exist only in the source env);
* ``*.pth`` files, which pip rewrites in place when it uninstalls an egg.

Directories are always the clone's own, so anything may be added, removed or replaced in
them; :func:`symlink_is_safe` is checked for every file, with the stat the placement
takes anyway. What a user gives up is in envtools/README.md (Non-owner clones).
"""

from __future__ import annotations

import errno
import json
import os
import posixpath
import stat
from pathlib import Path

from envtools.base import elf
from envtools.place import linking
from envtools.place.linking import WRITE_BITS
from envtools.prefix.noarch import cache_rel

#: conda's ``link.type`` values in a package record (conda.models.enums.LinkType)
LINK_HARDLINK, LINK_SOFTLINK, LINK_COPY = 1, 2, 3
EXEC_BITS = stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH


def symlink_is_safe(st: os.stat_result, euid: int, owner: int | None) -> bool:
    """True when this user cannot change the file a symlink would point to: it has no
    write bit, it is not ours (an owner may chmod it), and we are not root (root writes
    through permissions); and it belongs to ``owner`` (None: anyone else) so that nobody
    we do not trust can change it later."""
    return (euid != 0 and st.st_uid != euid and (owner is None or st.st_uid == owner)
            and not st.st_mode & WRITE_BITS)


def owner_ok(uid: int, owner: int | None, euid: int) -> bool:
    """May a file or directory of ``uid`` be what a link leads to: root's, or ``owner``'s
    (None: anyone's but ours)."""
    return uid == 0 or (uid != euid if owner is None else uid == owner)


def trusted_dir(path: str | os.PathLike[str], owner: int | None, euid: int) -> bool:
    """Can only root and ``owner`` (None: anyone but us) change what is found under
    ``path``? ``path`` must be canonical (a symlink on the way is refused: a link's
    target is read anew each time it is followed), and every directory from it up to /
    must belong to one of them and have no group or other write bit, unless sticky
    (/tmp: others cannot rename its entries). Directories inside a package are checked
    as they are linked into (:func:`safe_subdir`)."""
    p = os.path.abspath(path)
    while True:
        try:
            st = os.lstat(p)
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode) or not owner_ok(st.st_uid, owner, euid) or (
                st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not st.st_mode & stat.S_ISVTX):
            return False
        parent = os.path.dirname(p)
        if parent == p:
            return True
        p = parent


def safe_subdir(root: str, d: str, owner: int | None, euid: int,
                memo: dict[str, bool]) -> bool:
    """Is ``d`` a directory inside the package cache directory ``root`` (checked by
    :func:`trusted_dir`) reached through real directories only (no symlink), each
    owned as :func:`owner_ok` says and writable by nobody else? A package may ship a
    directory anyone can write (a tar entry's mode), where anyone could later replace
    the file a clone links to. ``memo`` holds the answers, so each directory costs one
    lstat per process."""
    ok = memo.get(d)
    if ok is not None:
        return ok
    if d == root:
        ok = True
    elif not d.startswith(root + "/"):
        ok = False
    else:
        ok = safe_subdir(root, d.rpartition("/")[0], owner, euid, memo)
        if ok:
            try:
                st = os.lstat(d)
                ok = (stat.S_ISDIR(st.st_mode) and owner_ok(st.st_uid, owner, euid)
                      and not st.st_mode & (stat.S_IWGRP | stat.S_IWOTH))
            except OSError:
                ok = False
    memo[d] = ok
    return ok


def link_target(extracted_package_dir: str | None, noarch_python: bool,
                rel: str) -> str | None:
    """What a clone's link for the package file or directory ``rel`` leads to: the same
    path in the package's cache directory (clone makes no other links to the cache;
    validate and detach follow no other). None without an absolute cache directory."""
    if not extracted_package_dir or not extracted_package_dir.startswith("/"):
        return None
    return f"{extracted_package_dir.rstrip('/')}/{cache_rel(noarch_python, rel)}"


def stays_real(rel: str, source: str, st: os.stat_result, src_root: str,
               relocating: frozenset[str]) -> bool:
    """Must this cache file be copied rather than linked, even where a link is safe?
    A ``.pth`` file, or an ELF program that would not run the same from the cache (see
    the module docstring); ``relocating``: the cache directories of packages with files
    that carry the install prefix."""
    if rel.endswith(".pth"):
        return True
    if not st.st_mode & EXEC_BITS or not elf.is_program(source):
        return False
    pkg = source[:len(source) - len(rel) - 1]
    return (not source.endswith("/" + rel) or pkg in relocating
            or not runs_from_cache(rel, pkg, src_root))


def runs_from_cache(rel: str, pkg: str, src_root: str) -> bool:
    """Does the program ``rel`` load the same libraries when run from its package's cache
    directory ``pkg`` (where ``$ORIGIN`` points when it is run through a symlink) as when
    run from the env ``src_root`` (whose files the clone has)? The same question for a
    library in a linked directory whose search path climbs out of it (layers.py).

    Each library it, and in turn each of those libraries, finds through a ``$ORIGIN``
    entry of its RUNPATH (or RPATH, the program's included) must be found at the same
    path in both trees, so it is the package's own; anything else is found the same way
    from both places (absolute paths, the system's directories) or not at all.
    """
    prog = _read_elf(os.path.join(pkg, rel))
    if prog is None:
        return False
    # (a DT_RPATH, unlike a DT_RUNPATH, also serves the libraries the object loads,
    # with $ORIGIN still the object's own directory)
    inherited = [] if prog.runpath else [(p, posixpath.dirname(rel) or ".")
                                         for p in prog.rpath]
    todo, seen = [rel], {rel}
    while todo:
        r = todo.pop()
        infos = [_read_elf(os.path.join(root, r)) for root in (src_root, pkg)]
        if infos[0] is None or infos[1] is None:
            return False
        for lib in infos[1].needed:
            hits = [_via_origin(root, _search_path(info, r, inherited if r != rel else []),
                                lib) for root, info in zip((src_root, pkg), infos, strict=True)]
            if hits[0] != hits[1]:
                return False
            if hits[1] is not None and hits[1] not in seen:
                seen.add(hits[1])
                todo.append(hits[1])
    return True


_ELF: dict[str, elf.ElfInfo | None] = {}


def _read_elf(path: str) -> elf.ElfInfo | None:
    """elf.read_elf, once per path and process: the programs of one package share
    their libraries (torch's test programs all load libtorch)."""
    if path not in _ELF:
        _ELF[path] = elf.read_elf(path)
    return _ELF[path]


def _search_path(info: elf.ElfInfo, rel: str, inherited: list[tuple[str, str]]
                 ) -> list[tuple[str, str]]:
    """The entries the loader searches for the libraries ``rel`` needs, each with the
    directory ``$ORIGIN`` stands for in it: its RUNPATH alone, or else its RPATH and
    then the RPATHs of those that loaded it (``inherited``)."""
    here = posixpath.dirname(rel) or "."
    if info.runpath:
        return [(p, here) for p in info.runpath]
    return [(p, here) for p in info.rpath] + inherited


def _via_origin(root: str, entries: list[tuple[str, str]], lib: str) -> str | None:
    """Where (relative to ``root``) the loader finds ``lib`` through a ``$ORIGIN``
    entry of ``entries`` (see :func:`_search_path`), or None if an absolute entry comes
    first or none has it. An entry that climbs out of the tree leads to a different
    place from each tree: a library found there is named with that place, so the two
    trees never agree on it."""
    for path, origin in entries:
        if "$ORIGIN" not in path and "${ORIGIN}" not in path:
            if os.path.isfile(os.path.join(path, lib)):
                return None
            continue
        d = posixpath.normpath(path.replace("${ORIGIN}", origin).replace("$ORIGIN", origin))
        if os.path.isfile(os.path.join(root, d, lib)):
            if d.startswith("../") or d == "..":  # (outside the tree)
                return "outside:" + os.path.normpath(os.path.join(root, d, lib))
            return posixpath.join(d, lib)
    return None


def probe_hardlink(pkg_dir: Path, tmp: Path) -> bool:
    """Will the kernel let us hardlink this cache's files into the clone? Tried once, on
    a cache file; False on EPERM (protected_hardlinks), EXDEV (another filesystem) and
    the like."""
    return linking.probe(pkg_dir, tmp, "hardlink", os.link) is True


#: how a record ends: rattler's indented form, and envtools' own (``json.dumps``)
_LINK_TAILS = ('"link": {{\n    "source": {s},\n    "type": {t}\n  }}\n}}',
               '"link": {{"source": {s}, "type": {t}}}}}')


def relinked_record(data: bytes, source: str, old_type: int, new_type: int) -> bytes | None:
    """A record's bytes with only its trailing ``"link"`` object's type changed, or None
    when the record does not end in exactly that object (then the caller parses it).

    Parsing and re-writing every record costs ~70 ms on a 46,000-file env, as much as
    linking a fifth of its files; the link object is the record's last field in both forms
    records are written in (rattler's, indented, and envtools' own, ``json.dumps``), so
    its exact bytes can be checked and replaced instead.
    """
    src = json.dumps(source)
    body = data.rstrip()
    for form in _LINK_TAILS:
        old = form.format(s=src, t=old_type).encode()
        if body.endswith(old):
            return (body[:len(body) - len(old)] + form.format(s=src, t=new_type).encode()
                    + data[len(body):])
    return None


#: errors after which no cache file will symlink either (the clone's filesystem has no
#: symlinks: vfat, some FUSE filesystems)
SYMLINK_GIVE_UP = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOSYS}

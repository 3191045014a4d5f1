"""Placing one file: reflink, hardlink (only when safe) or copy.

A hardlink shares the inode with the shared package cache, so a write through it lands
in every env linked to that file. We hardlink only files that nobody may write (no write
bit at all, as envtools install leaves the cache) and never as root, who writes through
permissions. Then an in-place write into the clone fails with EACCES instead of changing
the shared file; tools that replace files (pip, conda, editors' rename-on-save) unlink
the link and leave the shared inode alone. Files that must change (prefix placeholders)
are always written fresh. A reflink (FICLONE, on XFS/btrfs) shares blocks copy-on-write
and is always safe, so it is tried first.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
from collections.abc import Callable
from pathlib import Path

from envtools.prefix import confine

FICLONE = 0x40049409  # _IOW(0x94, 9, int), from linux/fs.h


def reflink(src: str, dst: str, mode: int) -> None:
    """Clone ``src`` to a new ``dst`` sharing blocks; raises OSError where unsupported."""
    sfd = _open_source(src)
    try:
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
        try:
            fcntl.ioctl(dfd, FICLONE, sfd)
        except OSError:
            os.close(dfd)
            os.unlink(dst)
            raise
        os.close(dfd)
    finally:
        os.close(sfd)


#: a file with none of these bits can be written by root alone
WRITE_BITS = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH


def hardlink_is_safe(st: os.stat_result, euid: int) -> bool:
    """True when nobody but root could write through a hardlink to this inode, and we
    are not root (root ignores permission bits, so its accidental writes would land)."""
    return euid != 0 and not st.st_mode & WRITE_BITS


_UMASK = os.umask(0)
os.umask(_UMASK)


def write_all(fd: int, data: bytes | memoryview) -> None:
    """``os.write`` until all of ``data`` is out: a pipe or a signal can cut one short."""
    with memoryview(data) as view:
        done, n = 0, view.nbytes
        while done < n:
            done += os.write(fd, view[done:])


def copy(src: str, dst: str, mode: int | None = None) -> os.stat_result:
    """Copy ``src`` to a new ``dst`` in the kernel; returns the source's stat.

    Leaner than shutil.copyfile (which stats both paths several times before copying):
    one open each, one fstat, then copy_file_range (sendfile across filesystems). The new
    file gets ``mode`` or, by default, the source's bits plus owner write.
    """
    fi = _open_source(src)
    try:
        st = os.fstat(fi)
        want = writable_mode(st.st_mode) if mode is None else mode
        fo = confine.create(dst, want)
        try:
            if want & _UMASK:
                os.fchmod(fo, want)
            left = st.st_size
            use_cfr = hasattr(os, "copy_file_range")
            while left > 0:
                try:
                    n = (os.copy_file_range(fi, fo, left) if use_cfr
                         else os.sendfile(fo, fi, None, left))
                except OSError as e:
                    if use_cfr and e.errno in (errno.EXDEV, errno.EINVAL, errno.ENOSYS,
                                               errno.EOPNOTSUPP):
                        use_cfr = False
                        continue
                    raise
                if n == 0:
                    break
                left -= n
        finally:
            os.close(fo)
    finally:
        os.close(fi)
    return st


def _open_source(src: str) -> int:
    """Open a file to copy it, never following a symlink: a file the records list as a
    file but that is a link (to /etc/shadow, say) is refused, not copied."""
    try:
        return os.open(src, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise confine.UnsafePath(f"{src} is a symbolic link where a file was expected; "
                                     "envtools does not copy what it points to") from None
        raise


def writable_mode(mode: int) -> int:
    """A user's own copy: the package's bits plus owner write."""
    return (stat.S_IMODE(mode) | stat.S_IWUSR) & 0o7777


#: errors after which a link of this kind will not work for any other file either
LINK_GIVE_UP = {errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTTY,
                errno.EACCES}


def probe(pkg_dir: Path, tmp: Path, kind: str, link: Callable[[str, str], object]) -> bool | None:
    """Try ``link`` (a hardlink, a reflink) once from one of a cache directory's own files
    to ``tmp``: whether it worked, or None when the directory has neither file to try."""
    dest = tmp / f".envtools-{kind}-probe"
    for cand in (pkg_dir / "info" / "index.json", pkg_dir / "info" / "paths.json"):
        try:
            link(str(cand), str(dest))
        except FileNotFoundError:
            continue
        except OSError:
            return False
        dest.unlink()
        return True
    return None

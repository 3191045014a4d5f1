"""Placing one file: reflink, hardlink (only when safe) or copy.

A hardlink shares the inode with the shared package cache, so anyone who can write the
file writes into every env linked to it. We therefore hardlink only files the cloning
user can neither write nor chmod (not the owner, not root, no group/other write bit).
A reflink (FICLONE, on XFS/btrfs) shares blocks copy-on-write and is always safe.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import stat

FICLONE = 0x40049409  # _IOW(0x94, 9, int), from linux/fs.h


def reflink(src: str, dst: str, mode: int) -> None:
    """Clone ``src`` to a new ``dst`` sharing blocks; raises OSError where unsupported."""
    sfd = os.open(src, os.O_RDONLY)
    try:
        dfd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
        try:
            fcntl.ioctl(dfd, FICLONE, sfd)
        except OSError:
            os.close(dfd)
            os.unlink(dst)
            raise
        os.close(dfd)
    finally:
        os.close(sfd)


def hardlink_is_safe(st: os.stat_result, euid: int, groups: set[int]) -> bool:
    """True when the current user could not write through a hardlink to this inode."""
    if euid == 0 or st.st_uid == euid:
        return False  # root writes anything; the owner can chmod u+w
    if st.st_mode & stat.S_IWOTH:
        return False
    if st.st_gid in groups and st.st_mode & stat.S_IWGRP:
        return False
    return True


def copy(src: str, dst: str, mode: int) -> None:
    """Plain copy (sendfile in the kernel) with the given permission bits."""
    shutil.copyfile(src, dst)
    os.chmod(dst, mode)


def writable_mode(mode: int) -> int:
    """A user's own copy: the package's bits plus owner write."""
    return (stat.S_IMODE(mode) | stat.S_IWUSR) & 0o7777


#: errors after which a link of this kind will not work for any other file either
LINK_GIVE_UP = {errno.EXDEV, errno.EPERM, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTTY,
                errno.EACCES}

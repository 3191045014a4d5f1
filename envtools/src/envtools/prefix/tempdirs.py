"""Build a directory beside its destination and rename it into place, or leave nothing.

Used by install and clone: a half-made environment at the destination would look real
to users and to ``module load``, so all work happens in ``.<name>.envtools-tmp-*`` in the
same parent (same filesystem, so the final rename is atomic) and is removed on any
failure, Ctrl-C or SIGTERM.

SIGKILL (the OOM killer, a job's time limit, ``kill -9``) runs no clean-up code, so each
temporary directory carries its owner: ``conda-meta/envtools/tmp-owner.json`` holds the
process's host, boot id, pid and start time (:mod:`envtools.base.procs`), and the process
holds an ``flock`` on it for as long as it lives (its forked workers share that lock).
A leftover is removed only when both say its owner is gone: the lock is free, and on
this host that pid no longer runs with that start time (or the machine has rebooted).
Every :func:`atomic_dir` first reclaims such leftovers in its parent directory, and
``envtools gc`` lists and removes them anywhere. A removal first renames the leftover to
``.<dest name>.envtools-trash-*`` (see :data:`TRASH_TAG`), so one killed half-way leaves a
name that the next run or gc finishes removing. A directory without an owner record
is never removed, unless it holds no file at all (a run killed between creating it and
writing the record) and is over a minute old.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import stat
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from envtools.base import procs
from envtools.base.progress import info
from envtools.errors import EnvtoolsError

#: what every temporary directory's name holds: ``.<dest name>.envtools-tmp-<random>``
TMP_TAG = ".envtools-tmp-"
#: the owner record inside a temporary directory (envtools' own conda-meta subdirectory:
#: nothing that lists an env's files or records looks there)
OWNER = Path("conda-meta") / "envtools" / "tmp-owner.json"
#: a leftover with no owner record and no files is removed only after this many seconds
#: (its maker may be between mkdtemp and writing the record)
UNOWNED_GRACE_S = 60
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


#: what a leftover is renamed to before its removal starts: removing a tree deletes the
#: owner record with the rest, so a removal killed half-way would otherwise leave files
#: without their record, which every later run must keep. A trash name says "claimed for
#: removal" by itself: whoever finds one finishes the removal.
TRASH_TAG = ".envtools-trash-"


def is_tmp_name(name: str) -> bool:
    return name.startswith(".") and (TMP_TAG in name or TRASH_TAG in name)


def is_trash_name(name: str) -> bool:
    return name.startswith(".") and TRASH_TAG in name


@contextmanager
def atomic_dir(dest: Path, what: str = "envtools", settle: bool = False) -> Iterator[Path]:
    """Yield a fresh temp dir beside ``dest``; rename it to ``dest`` if the block succeeds.

    ``what`` names the command in the owner record and in errors. ``settle``: something
    in the block (rattler's installer) may keep writing into the directory from other
    threads after it failed, so on failure removal is repeated until the directory stays
    gone.

    SIGINT and SIGTERM are held off from before the directory exists until the owner
    record is written and the block is entered, so an interrupt never leaves a
    directory nobody owns.
    """
    dest = Path(os.path.abspath(dest))
    parent = dest.parent
    tmp: Path | None = None
    lock = -1
    renamed = False
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise EnvtoolsError(f"cannot create {parent}: {e.strerror}",
                            "choose a destination in a directory you can write to",
                            exit_code=1) from e
    reclaim(parent)
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS) if _main_thread() else None

    def on_term(signum, frame):  # turn SIGTERM into the same clean-up path as Ctrl-C
        raise KeyboardInterrupt

    old_term = signal.signal(signal.SIGTERM, on_term) if _main_thread() else None
    try:
        try:
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}{TMP_TAG}", dir=parent))
            lock = _claim(tmp, what)
        except OSError as e:
            raise EnvtoolsError(
                f"cannot create a directory in {parent}: {e.strerror}",
                "choose a destination in a directory you can write to (and with free space)",
                exit_code=1,
            ) from e
        if old_mask is not None:  # a pending Ctrl-C/SIGTERM is raised here, inside the try
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
            old_mask = None
        yield tmp
        _rename_into_place(tmp, dest, what)
        renamed = True
    except BaseException:
        if old_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        if tmp is not None:
            remove_tree(tmp, settle=settle)
        raise
    finally:
        if lock >= 0:
            if renamed:
                _drop_owner(dest)
            os.close(lock)
        if old_term is not None:
            signal.signal(signal.SIGTERM, old_term)


@contextmanager
def owned_dir(parent: Path, name: str, what: str) -> Iterator[Path]:
    """Yield a temporary directory ``.<name>.envtools-tmp-*`` in ``parent`` that lives
    only as long as the block, never renamed (a staged image a job runs from): it has
    :func:`atomic_dir`'s owner record and lock, so while this process lives every
    :func:`reclaim` and ``envtools gc`` keep it, and after a SIGKILL they remove it.
    Removed when the block ends, however it ends. Dead leftovers in ``parent`` are
    reclaimed first."""
    parent = Path(os.path.abspath(parent))
    reclaim(parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}{TMP_TAG}", dir=parent))
    lock = -1
    try:
        lock = _claim(tmp, what)
        yield tmp
    finally:
        remove_tree(tmp)
        if lock >= 0:
            os.close(lock)


def _claim(tmp: Path, what: str) -> int:
    """Write the owner record and take its lock; returns the locked fd (close-on-exec:
    programs we run do not hold it, forked placement workers do)."""
    (tmp / OWNER.parent).mkdir(parents=True)
    fd = os.open(tmp / OWNER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                 | os.O_CLOEXEC, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:  # a filesystem without locks: the pid check stands alone
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        record = {**procs.identity(), "uid": os.geteuid(), "what": what,
                  "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        os.write(fd, json.dumps(record).encode())
    except BaseException:
        os.close(fd)
        raise
    return fd


def _drop_owner(dest: Path) -> None:
    """Remove the owner record from the renamed directory. It is done after the rename,
    so a kill in between leaves a complete env with one stray file rather than a
    temporary directory without an owner. Its directory may be read-only by now."""
    try:
        dfd = os.open(dest / OWNER.parent, _DIR_FLAGS)
    except OSError:
        return
    try:
        try:
            os.unlink(OWNER.name, dir_fd=dfd)
        except PermissionError:
            mode = stat.S_IMODE(os.fstat(dfd).st_mode)
            os.fchmod(dfd, mode | stat.S_IWUSR)
            try:
                os.unlink(OWNER.name, dir_fd=dfd)
            finally:
                os.fchmod(dfd, mode)
    except OSError:
        pass
    finally:
        os.close(dfd)


def _rename_into_place(tmp: Path, dest: Path, what: str) -> None:
    """rename(2) replaces an empty directory and never a non-empty one: if another run
    finished ``dest`` first, it is left exactly as it is and this one fails."""
    try:
        os.rename(tmp, dest)
    except OSError as e:
        if e.errno in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
            raise EnvtoolsError(
                f"{dest} was created by someone else while this {what} ran "
                "(another envtools run to the same destination?); it was left untouched "
                "and nothing of this run was kept",
                "choose another destination, or remove that one and run again",
                exit_code=1,
            ) from e
        raise


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


# ---------------------------------------------------------------------------- removal

def remove_tree(path: Path, settle: bool = False) -> None:
    """Remove ``path`` and everything in it, giving read-only directories a write bit
    first. Never follows a symlink and never descends into another filesystem (a mount
    inside is left, with the directories above it). With ``settle``, repeats until the
    path has stayed gone for 0.2 s (at most 10 s)."""
    deadline = time.monotonic() + 10
    while True:
        _remove_path(path)
        if not settle:
            return
        time.sleep(0.2)
        if not os.path.lexists(path) or time.monotonic() > deadline:
            return


def _remove_path(path: Path) -> None:
    try:
        pfd = os.open(path.parent, _DIR_FLAGS & ~os.O_NOFOLLOW)
    except OSError:
        return
    try:
        _remove(pfd, path.name, None)
    finally:
        os.close(pfd)


def _remove(dir_fd: int, name: str, dev: int | None) -> None:
    """Remove entry ``name`` of the directory open as ``dir_fd``, recursively."""
    try:
        os.unlink(name, dir_fd=dir_fd)
        return
    except FileNotFoundError:
        return
    except IsADirectoryError:
        pass
    except OSError as e:
        if e.errno != errno.EPERM:
            return
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return  # gone, or replaced by something that is not a directory
    try:
        st = os.fstat(fd)
        if dev is not None and st.st_dev != dev:
            return  # a mount point
        if stat.S_IMODE(st.st_mode) & 0o700 != 0o700:
            try:
                os.fchmod(fd, stat.S_IMODE(st.st_mode) | 0o700)
            except OSError:
                pass
        with os.scandir(fd) as it:
            names = [e.name for e in it]
        for n in names:
            _remove(fd, n, st.st_dev)
    finally:
        os.close(fd)
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except OSError:
        pass


# ---------------------------------------------------------------------------- leftovers

@dataclass
class Leftover:
    """A temporary directory found beside envs, and whether it may be removed."""

    path: Path
    removable: bool
    why: str
    owner: dict | None = None


def inspect(path: Path, lock: bool = False) -> tuple[Leftover, int]:
    """Judge one temporary directory (see the module docstring for the rule).

    Returns the verdict and, when ``lock`` and it is removable, the fd holding the owner
    record's lock (to be kept while removing; -1 otherwise).
    """
    try:
        st = os.lstat(path)
    except OSError as e:
        return Leftover(path, False, f"cannot be read: {e.strerror}"), -1
    if not stat.S_ISDIR(st.st_mode):
        return Leftover(path, False, "not a directory"), -1
    if st.st_uid != os.geteuid() and os.geteuid() != 0:
        return Leftover(path, False, f"belongs to uid {st.st_uid}, not to you"), -1
    if is_trash_name(path.name):
        return Leftover(path, True, "claimed for removal by an earlier run, which did not "
                        "finish it"), -1
    fd = _open_owner(path)
    if fd < 0:
        if not _has_files(path) and time.time() - st.st_mtime > UNOWNED_GRACE_S:
            return Leftover(path, True, "holds no files and no owner record (its run was "
                            "killed as it started)"), -1
        return Leftover(path, False, "has no owner record: not made by this envtools, or "
                        "its run is just starting; if you know it is a leftover, delete it "
                        "by hand"), -1
    keep = False
    try:
        try:
            record = json.loads(os.read(fd, 1 << 16) or b"null")
            if not isinstance(record, dict):
                raise ValueError
        except ValueError:
            return Leftover(path, False, "its owner record is not envtools' (unreadable)"), -1
        who = (f"{record.get('what', 'envtools')} (pid {record.get('pid')} on "
               f"{record.get('host')}, started {record.get('created', '?')})")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return Leftover(path, False, f"in use: {who} is still running", record), -1
        except OSError:
            pass  # no flock on this filesystem: the process check decides alone
        running = procs.is_running(record)
        if running is None:
            return Leftover(path, False, f"made by {who} on another host: run envtools gc "
                            "there", record), -1
        if running:
            return Leftover(path, False, f"in use: {who} is still running", record), -1
        keep = lock
        return Leftover(path, True, f"left by {who}, which is no longer running", record), (
            fd if lock else -1)
    finally:
        if not keep:
            os.close(fd)


def _open_owner(path: Path) -> int:
    """The owner record, opened without following a symlink anywhere below ``path``."""
    fds = []
    try:
        fds.append(os.open(path, _DIR_FLAGS))
        for part in OWNER.parent.parts:
            fds.append(os.open(part, _DIR_FLAGS, dir_fd=fds[-1]))
        return os.open(OWNER.name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=fds[-1])
    except OSError:
        return -1
    finally:
        for fd in fds:
            os.close(fd)


def _has_files(path: Path) -> bool:
    for _dirpath, _dirnames, filenames in os.walk(path):
        if filenames:
            return True
    return False


def find_leftovers(directory: Path) -> list[Path]:
    """Temporary directories of envtools runs in ``directory`` (or ``directory`` itself
    when it is one)."""
    directory = Path(os.path.abspath(directory))
    if is_tmp_name(directory.name):
        return [directory]
    try:
        with os.scandir(directory) as it:
            return sorted(directory / e.name for e in it
                          if is_tmp_name(e.name) and e.is_dir(follow_symlinks=False))
    except OSError:
        return []


def remove_leftover(path: Path) -> Leftover:
    """Remove ``path`` if :func:`inspect` says it may be; returns the verdict."""
    verdict, fd = inspect(path, lock=True)
    if verdict.removable:
        try:
            path = _claim_for_removal(path)
            remove_tree(path)
        finally:
            if fd >= 0:
                os.close(fd)
        if os.path.lexists(path):
            verdict.removable = False
            verdict.why += "; it could not be removed completely (a mount inside, or "\
                "permissions)"
    return verdict


def _claim_for_removal(path: Path) -> Path:
    """Rename ``path`` to a trash name beside it (atomic, same directory) while its owner
    lock is held; returns the name to remove. Already a trash name: kept. A rename that
    fails (another run claimed it first) leaves the path as it is; removal then goes on
    by the old name, which is gone or being removed."""
    if is_trash_name(path.name):
        return path
    base = path.name[1:].split(TMP_TAG, 1)[0]
    trash = path.with_name(f".{base}{TRASH_TAG}{os.urandom(4).hex()}")
    try:
        os.rename(path, trash)
    except OSError:
        return path
    return trash


def reclaim(parent: Path) -> list[Leftover]:
    """Remove the leftovers of dead runs in ``parent`` (quietly keeping everything else);
    each removal is reported. Never fails: someone else's leftover must not stop a run."""

    done = []
    for path in find_leftovers(parent):
        if path.parent != Path(os.path.abspath(parent)):
            continue
        try:
            v = remove_leftover(path)
        except OSError:
            continue
        if v.removable:
            info("removed ", f"{path}: {v.why}")
            done.append(v)
    return done


def tree_bytes(path: Path) -> int:
    """Disk space used under ``path`` (what removing it frees, hardlinks aside)."""
    total = 0
    for dirpath, _dirnames, filenames in os.walk(path):
        for n in filenames:
            try:
                total += os.lstat(os.path.join(dirpath, n)).st_blocks * 512
            except OSError:
                pass
    return total

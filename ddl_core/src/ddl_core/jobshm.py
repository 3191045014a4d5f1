"""Open MPI's shared-memory segments in a directory of the job's own, gone when it ends.

Why: every Open MPI rank's shared-memory transport (btl/sm) makes a 16 MiB file,
``/dev/shm/sm_segment.<host>.<uid>.<jobid>.<local rank>``, which memory backs. It is
removed at ``MPI_Finalize``, or by the launcher's daemon at the job's end, but not when
a rank is killed by a signal, nor when the launcher itself is killed: on a shared node
they pile up until a reboot (44 after one afternoon of tests here).

So ddlrun names a directory for each job, ``/dev/shm/ddl-job-<uid>-<token>``, and every
rank's wrapper (exitreport.py) points Open MPI's ``btl_sm_backing_directory`` at it on
its node, creating it where it does not exist yet (a remote node). Whoever uses the
directory holds a shared ``flock`` on it: ddlrun for as long as the job runs, each
wrapper for as long as its rank lives (the rank dies with its wrapper: PR_SET_PDEATHSIG).
The kernel drops a lock when its holder dies, however it dies, so a directory nobody
holds a lock on has no live process of its job on this node; whoever then gets the
exclusive lock removes it. That is done by the last wrapper of a node to end, by ddlrun
at the end, and, for what a SIGKILL left (every process of a job killed at once), by the
next ddlrun and the next job's wrappers on that node, before they start. A lock cannot go
stale the way a pid can be reused, so nothing else (pid, start time) is needed to tell
a live job from a dead one; the ``owner`` file in each directory (host, pid and time of
the process that made it) is there for people reading /dev/shm. Only directories named
with this user's uid and owned by them are ever touched, so another user's job, and a
running job of the same user, keep theirs.

A process MPI starts alone (``python train.py`` with no launcher: a singleton) leaves its
segment even when it ends well, since no launcher's daemon is there to remove it (every
one of the 71 dead segments found on the test machine was a singleton's). So
``ddl_core.init()`` gives such a process a directory of its own the same way
(:class:`Alone`), held for its life and removed at its exit, or by the next run after a
SIGKILL.

A user who chose a backing directory (``OMPI_MCA_btl_sm_backing_directory``, or
``--mca btl_sm_backing_directory`` given to mpirun, which reaches the ranks the same way)
keeps it, and nothing is done. Standard library only, and a module of the library's
lowest layer that imports nothing of the package: ddlrun's rank wrapper, which starts with
every rank, loads this file alone.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # not imported at run time: the rank wrapper's start stays short
    from collections.abc import MutableMapping

#: the job's token: from ddlrun to every rank's wrapper (forwarded like every DDL_ variable)
ENV = "DDL_JOB_SHM"
#: Open MPI's setting for where btl/sm puts its segments
MCA = "OMPI_MCA_btl_sm_backing_directory"
BASE = "/dev/shm"
PREFIX = "ddl-job-"
TOKEN_LEN = 16  # hex digits, lowercase
#: how long ddlrun waits, after its launcher ended, for the ranks on its own node to let
#: go of the directory before it leaves it to the next run (they are normally gone)
END_WAIT_S = 5.0
#: the longest a rank's wrapper waits to join the directory (see _lock_shared)
JOIN_WAIT_S = 10.0
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def job_dir(token: str, base: str = BASE) -> str:
    return os.path.join(base, f"{PREFIX}{os.geteuid()}-{token}")


def parse_token(value: str | None) -> str | None:
    """The token of DDL_JOB_SHM, or None when it is missing or not one ddlrun makes
    (checked by hand: `re` and `json` would add 30 ms to every rank's start here)."""
    if value and len(value) == TOKEN_LEN and all(c in "0123456789abcdef" for c in value):
        return value
    return None


def _open_own(path: str) -> int:
    """An fd of directory `path` (no symlink followed), refused unless this user owns it
    and no one else may write in it."""
    fd = os.open(path, _DIR_FLAGS)
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise PermissionError(errno.EPERM, "not this user's private directory", path)
    return fd


def _same(path: str, fd: int) -> bool:
    """Whether `path` still names the directory `fd` is open on (not removed, not replaced)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return False
    here = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (here.st_dev, here.st_ino)


def join(path: str) -> int:
    """Create `path` if it does not exist, and hold a shared lock on it; returns the fd
    (close it to let go). Raises OSError where it cannot be made or is not ours."""
    for _ in range(50):
        made = False
        try:
            os.mkdir(path, 0o700)
            made = True
        except FileExistsError:
            pass
        try:
            fd = _open_own(path)
        except FileNotFoundError:  # removed by the last user of a job that just ended
            continue
        try:
            _lock_shared(fd, path)
            if _same(path, fd):
                if made:
                    _write_owner(fd)
                return fd
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # it was removed meanwhile: make it again
    raise OSError(errno.EAGAIN, "the directory kept being removed", path)


def _lock_shared(fd: int, path: str) -> None:
    """A shared lock on `fd`. A remover holds the exclusive one only while it deletes, so
    this waits at most JOIN_WAIT_S (a remover stopped half-way must not hang every rank
    that starts on the node: the rank then goes without the job's directory)."""
    if not _flock_within(fd, fcntl.LOCK_SH, JOIN_WAIT_S, 0.01):
        raise OSError(errno.EAGAIN, "held by a remover for too long", path)


def _flock_within(fd: int, mode: int, wait_s: float, poll_s: float) -> bool:
    """Take flock `mode` on `fd`, trying for at most `wait_s` (flock itself has no
    timeout, and a blocking one could hang a rank for ever). True when taken."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)


def _write_owner(dir_fd: int) -> None:
    record = (f"host {os.uname().nodename}\npid {os.getpid()}\nuid {os.geteuid()}\n"
              f"created {time.strftime('%Y-%m-%dT%H:%M:%S%z')}\n")
    try:
        fd = os.open("owner", os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600, dir_fd=dir_fd)
    except OSError:
        return  # only for people to read: never a reason to fail
    with os.fdopen(fd, "w") as f:
        f.write(record)


def remove(path: str, wait_s: float = 0.0) -> bool:
    """Remove `path` if no process holds a lock on it (waiting up to `wait_s` for the
    last to let go). True when it is gone (also when it was not there)."""
    try:
        fd = _open_own(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False  # another user's, or not a directory: never touched
    try:
        if not _flock_within(fd, fcntl.LOCK_EX, wait_s, 0.05):
            return False
        if not _same(path, fd):
            return True  # someone else removed it (and maybe a new job made it again)
        _empty(fd)
        try:
            os.rmdir(path)
        except FileNotFoundError:
            pass
        return True
    finally:
        os.close(fd)  # with the lock: a joiner waiting on it sees the path gone, retries


def _empty(dir_fd: int) -> None:
    """Delete what is in the directory `dir_fd` (Open MPI's segments: plain files)."""
    for entry in os.scandir(dir_fd):
        try:
            if entry.is_dir(follow_symlinks=False):
                sub = os.open(entry.name, _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    _empty(sub)
                finally:
                    os.close(sub)
                os.rmdir(entry.name, dir_fd=dir_fd)
            else:
                os.unlink(entry.name, dir_fd=dir_fd)
        except FileNotFoundError:
            pass


def reclaim(base: str = BASE) -> list[str]:
    """Remove this user's job directories in `base` that no live process holds (what
    jobs killed with SIGKILL left); returns those removed."""
    mine = f"{PREFIX}{os.geteuid()}-"
    gone = []
    try:
        entries = [e.name for e in os.scandir(base)
                   if e.name.startswith(mine) and parse_token(e.name[len(mine):])]
    except OSError:
        return gone
    for name in entries:
        path = os.path.join(base, name)
        if remove(path):
            gone.append(path)
    return gone


def _usable(base: str) -> bool:
    try:
        return stat.S_ISDIR(os.stat(base).st_mode) and os.access(base, os.W_OK | os.X_OK)
    except OSError:
        return False


class JobShm:
    """ddlrun's side: the job's directory on this node, made and locked for the job's
    whole run (its token goes to the ranks in DDL_JOB_SHM), removed by close()."""

    def __init__(self, path: str, fd: int, token: str) -> None:
        self.path, self._fd, self.token = path, fd, token

    @classmethod
    def open(cls, environ: dict[str, str], base: str = BASE) -> JobShm | None:
        """Reclaim what dead jobs left, make this job's directory and put its token in
        `environ`; None (nothing done) where the user chose a directory or `base` is not
        usable."""
        if environ.get(MCA) or not _usable(base):
            return None
        import secrets

        token = secrets.token_hex(8)
        joined = _reclaim_and_join(token, base)
        if joined is None:
            return None
        environ[ENV] = token
        return cls(*joined, token)

    def close(self, wait_s: float = END_WAIT_S) -> bool:
        """Let go and remove the directory once no rank on this node holds it (waiting up
        to `wait_s`); what is still held then is reclaimed by the next run."""
        if self._fd < 0:
            return True
        os.close(self._fd)
        self._fd = -1
        return remove(self.path, wait_s)


def for_rank(env: dict[str, str], base: str = BASE) -> tuple[str, int] | None:
    """The wrapper's side, before it starts the rank: reclaim dead jobs' directories on
    this node, join this job's (made here on a node ddlrun does not run on) and point
    Open MPI at it in `env`. Returns (path, locked fd), or None: no token, the user's own
    setting, or no usable /dev/shm (Open MPI then uses its default, as without ddlrun)."""
    token = parse_token(env.get(ENV))
    if token is None or env.get(MCA) or not _usable(base):
        return None
    joined = _reclaim_and_join(token, base)
    if joined is not None:
        env[MCA] = joined[0]
    return joined


def _reclaim_and_join(token: str, base: str) -> tuple[str, int] | None:
    """What ddlrun and each rank's wrapper do on their node first: reclaim dead jobs'
    directories, then join (or make) this job's. None when it cannot be made."""
    reclaim(base)
    path = job_dir(token, base)
    try:
        return path, join(path)
    except OSError:
        return None


def rank_done(joined: tuple[str, int] | None) -> None:
    """The wrapper's side, after its rank ended: let go, and remove the directory if this
    was the last process of the job on this node."""
    if joined is None:
        return
    path, fd = joined
    os.close(fd)
    remove(path)


#: what a launcher sets in the processes it starts (Open MPI, PMIx, MPICH): not alone then
LAUNCHED = ("OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE")


class Alone:
    """``with Alone(os.environ): MPI_Init()`` in a process no launcher started: its segment
    goes into a directory of its own, removed at exit (atexit) or, after a SIGKILL, by the
    next run's reclaim. The setting is taken out of the environment again once MPI has
    read it, so programs this process starts do not inherit a directory it will remove.
    Does nothing under a launcher, or where the user chose a directory."""

    def __init__(self, environ: MutableMapping[str, str], base: str = BASE) -> None:
        self._environ, self._base = environ, base
        self.joined: tuple[str, int] | None = None

    def __enter__(self) -> Alone:
        env = self._environ
        if env.get(MCA) or any(k in env for k in LAUNCHED) or not _usable(self._base):
            return self
        import secrets

        reclaim(self._base)
        path = job_dir(secrets.token_hex(8), self._base)
        try:
            self.joined = (path, join(path))
        except OSError:
            return self
        env[MCA] = path
        return self

    def __exit__(self, *exc: object) -> None:
        if self.joined is None:
            return
        self._environ.pop(MCA, None)
        import atexit

        atexit.register(rank_done, self.joined)

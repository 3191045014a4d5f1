"""The node side of `ddlrun --env IMAGE`: keep a staged copy of the image, and run in it.

Run as a script on every node (`python stagenode.py keep|exec ...`, not `-m`: importing
the ddl_core package would load libddl and MPI into a process that only copies a file):

- `keep ROOT TAG SIZE SHA256 N`: receive the image's N-byte IMAGE.json, then the image, on
  stdin (ddlrun read them once from the shared filesystem and streams them to every node),
  write the image under ROOT into a directory private to the user and the job
  (`ROOT/ddl-stage-<uid>/.<TAG>-<host>.envtools-tmp-*`, the user's directory 0700), check
  it as it is written (each chunk's sha256 from IMAGE.json on every core, or the whole
  sha256 for an image sealed without them), write `IMAGE.sha256` and `IMAGE.json` beside
  it (what `envtools run` checks before mounting; its sha256 check is skipped while
  the copy's stat key is the one taken here), print `READY <path>`, and then wait until
  stdin ends: ddlrun closes it when the job is over, and a ddlrun that dies (SIGKILL
  included) closes it too, so the copy is removed in every case this process lives
  through. The directory carries envtools' owner record and lock
  (envtools.prefix.tempdirs.owned_dir), so when this process itself is killed, the next
  run on that node and `envtools gc ROOT/ddl-stage-<uid>` remove what it left. Before
  copying: ROOT must be on a node-local filesystem (a stage dir on NFS, Lustre, GPFS or
  FUSE would bring back the shared-filesystem traffic staging is there to avoid) and hold
  the image (free space is checked first; a write that fails anyway leaves nothing).
  Errors are one `ERROR <message>` line and exit status 1.
- `exec ROOT TAG ENVTOOLS -- CMD ...`: run CMD inside this node's staged copy
  (`ENVTOOLS run IMAGE -- CMD ...`, one private mount for CMD and its children). ddlrun
  makes it PRRTE's launch agent, so each node's daemon and every rank it starts share
  one mount, and Open MPI's shared memory works between them.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import queue
import signal
import socket
import stat
import sys
import threading
from collections.abc import Callable
from pathlib import Path

CHUNK = 1 << 22
IMAGE_NAME = "image.sqsh"
#: beside the staged copy: the job's Open MPI session directories on this node
#: (PRTE_MCA_prte_tmpdir_base). A daemon inside `envtools run` is in a pid namespace, so
#: it has the same small pid in every job; its session and PMIx directories, named by
#: pid, collided in the shared /tmp with what a killed job left ("The PMIx server's
#: listener thread failed to start"). Here they are the job's own, and go with the copy.
SESSION = "session"
#: beside the staged copy: its stat key when it was hashed (see run_flags)
STAT = "stat"
SESSION_ENV = "PRTE_MCA_prte_tmpdir_base"
#: what is kept free on the stage filesystem beyond the image itself
MARGIN = 16 << 20

#: filesystems a stage dir must not be on: shared between nodes (their metadata server
#: is what staging keeps the ranks away from), or FUSE (a user-space passthrough that may
#: be a network filesystem and serves metadata through one daemon)
SHARED_FS = ("nfs", "nfs4", "lustre", "gpfs", "cifs", "smb3", "smbfs", "ceph", "beegfs",
             "glusterfs", "9p", "afs", "panfs", "pvfs2", "orangefs", "wekafs", "fuse",
             "fuseblk", "gfs2", "ocfs2")


class StageError(Exception):
    """A failure with its reason and what to do (one line)."""


def user_dir(root: Path) -> Path:
    return root / f"ddl-stage-{os.geteuid()}"


def fs_type(path: Path) -> str:
    """The filesystem type of the mount holding ``path``, from /proc/self/mountinfo
    (matched by device number, so bind mounts and nested mounts name the right one)."""
    dev = os.stat(path).st_dev
    want = f"{os.major(dev)}:{os.minor(dev)}"
    try:
        with open("/proc/self/mountinfo") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return ""
    found = ""
    for line in lines:
        left, _, right = line.partition(" - ")
        fields = left.split()
        if len(fields) > 2 and fields[2] == want and right:
            found = right.split()[0]  # the last mount of that device wins
    return found


def is_shared(fstype: str) -> bool:
    base = fstype.split(".", 1)[0]
    return base in SHARED_FS


def check_root(root: Path, size: int) -> Path:
    """The user's private directory under ``root``, made (0700) and checked: root
    node-local, the directory ours and closed to others, room for ``size`` bytes."""
    if not root.is_dir():
        raise StageError(f"stage dir {root} does not exist on {socket.gethostname()}: give "
                         "--stage-dir a directory that exists on every node (node-local "
                         "disk, or /dev/shm)")
    fstype = fs_type(root)
    if is_shared(fstype):
        raise StageError(f"stage dir {root} is on a {fstype} filesystem, which is shared "
                         "or served through FUSE: staging there would send every rank's "
                         "file lookups back to its server; give --stage-dir a node-local "
                         "directory (local disk such as /tmp or /local/scratch, or /dev/shm)")
    d = user_dir(root)
    try:
        d.mkdir(mode=0o700, exist_ok=True)
    except OSError as e:
        raise StageError(f"cannot create {d}: {e.strerror}; give --stage-dir a directory "
                         "you can write to") from None
    st = os.lstat(d)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise StageError(f"{d} is not a directory private to uid {os.geteuid()} (owner "
                         f"{st.st_uid}, mode {stat.S_IMODE(st.st_mode):o}): someone else "
                         "made it; remove it, or give another --stage-dir")
    vfs = os.statvfs(d)
    free = vfs.f_bavail * vfs.f_frsize
    if free < size + MARGIN:
        raise StageError(f"stage dir {root} on {socket.gethostname()} has "
                         f"{free / 2**20:.0f} MiB free, the image needs "
                         f"{(size + MARGIN) / 2**20:.0f} MiB: free space there, or give "
                         "--stage-dir a node-local directory with room (e.g. /dev/shm)")
    return d


def read_exact(src: int, n: int) -> bytes:
    parts, left = [], n
    while left:
        data = os.read(src, left)
        if not data:
            raise StageError(f"the stream ended {left} bytes short (ddlrun stopped, or the "
                             "link to it broke)")
        parts.append(data)
        left -= len(data)
    return b"".join(parts)


def widen_pipe(fd: int) -> None:
    """Give a pipe the largest buffer an unprivileged process may (fs.pipe-max-size, 1 MiB
    by default) instead of 64 KiB: the image then moves in 1 MiB pieces, a sixteenth of
    the system calls and wake-ups. Not a pipe (ssh's socket, a file): left as it is."""
    try:
        with open("/proc/sys/fs/pipe-max-size") as fh:
            size = int(fh.read())
        fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except (OSError, ValueError, AttributeError):
        pass


def _writeback() -> Callable[[int, int, int], None]:
    """sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE): start writing a range of the
    copy to disk without waiting for it. Why: attaching a loop device to a file first
    writes back all of its dirty pages (measured: 0.35-0.4 s for a freshly written 723 MiB
    image, 0.00 s once synced), and that wait sat between staging and the job's start;
    begun chunk by chunk, the writeback runs while the rest of the image streams in. A
    no-op where libc has no sync_file_range."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.sync_file_range
    except (OSError, AttributeError):
        return lambda fd, off, n: None
    fn.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return lambda fd, off, n: fn(fd, off, n, 2) and None


def _fill(src: int, buf: bytearray, n: int) -> int:
    """Read up to ``n`` bytes from ``src`` into ``buf`` (fewer only at the end of the
    stream); how many."""
    view, got = memoryview(buf), 0
    try:
        while got < n:
            k = os.readv(src, [view[got:n]])
            if not k:
                break
            got += k
    finally:
        view.release()
    return got


#: buffers in flight beyond one per hashing thread
SPARE_BUFFERS = 2


class _Checker:
    """The sha256 check of a copy as it streams in, on threads of their own (hashlib and
    the system calls release the GIL): with the image's chunk digests (IMAGE.json's
    ``chunk_sha256``) one thread per core, each chunk checked alone, so a node checks
    at the speed of all its cores rather than one (one sha256 of the whole image is
    slower than copying it, see envtools.image.chunks); without them, one thread
    hashing the whole stream in order."""

    def __init__(self, sha256: str, chunk: int, digests: tuple[str, ...],
                 nthreads: int) -> None:
        self.sha256, self.chunk, self.digests = sha256, chunk, digests
        self.whole = None if digests else hashlib.sha256()
        if digests:  # (envtools, as the manifest reader: not importable under `exec`'s -S)
            from envtools.image.chunks import matches

            self.matches = matches
        n = nthreads if digests else 1
        self.full: queue.Queue[tuple[int, bytearray, int] | None] = queue.Queue()
        self.free: queue.Queue[bytearray] = queue.Queue()
        for _ in range(n + SPARE_BUFFERS):
            self.free.put(bytearray(chunk))
        self.bad: list[int] = []
        self.pool = [threading.Thread(target=self._work, name=f"stage-sha256-{k}",
                                      daemon=True) for k in range(n)]
        for t in self.pool:
            t.start()

    def _work(self) -> None:
        while (item := self.full.get()) is not None:
            i, buf, n = item
            with memoryview(buf) as view:
                if self.whole is not None:
                    self.whole.update(view[:n])
                elif not self.matches(self.digests, i, view[:n]):
                    self.bad.append(i)
            self.free.put(buf)
        self.full.put(None)  # (each thread passes the end on to the next)

    def close(self) -> None:
        self.full.put(None)
        for t in self.pool:
            t.join()

    def problem(self) -> str | None:
        """What is wrong with the copy (after close), or None."""
        if self.whole is not None and self.whole.hexdigest() != self.sha256:
            return (f"the staged copy's sha256 is {self.whole.hexdigest()[:16]}..., its "
                    f"IMAGE.sha256 says {self.sha256[:16]}...")
        if self.bad:
            return (f"the staged copy's {self.chunk >> 20} MiB at offset "
                    f"{min(self.bad) * self.chunk} differ from what IMAGE.json says was "
                    f"sealed (sha256 {self.sha256[:16]}...)")
        return None


def receive(dest: Path, size: int, sha256: str, src: int = 0, chunk: int = CHUNK,
            digests: tuple[str, ...] = (), nthreads: int = 1) -> None:
    """Copy exactly ``size`` bytes from fd ``src`` into ``dest``, checking them as they
    are written (:class:`_Checker`: against ``digests``, the sha256 of each ``chunk``
    bytes, on ``nthreads`` threads, else the whole ``sha256`` on one), so a node stages
    at about the speed of the slower of copying and checking rather than their sum. A
    few buffers go round between the threads: a fresh 4 MiB buffer per chunk costs its
    page faults every time (measured: copy and hash of a 723 MiB image 1.6 s with new
    buffers, 1.0 s with reused ones)."""
    check = _Checker(sha256, chunk, digests, nthreads)
    widen_pipe(src)
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                 0o600)
    left, index = size, 0
    writeback = _writeback()
    try:
        while left:
            buf = check.free.get()
            got = _fill(src, buf, min(chunk, left))
            if not got:
                raise StageError(f"the image stream ended after {size - left} of {size} "
                                 "bytes (ddlrun stopped, or the link to it broke)")
            with memoryview(buf) as whole:
                view = whole[:got]
                while view:
                    try:
                        n = os.write(fd, view)
                    except OSError as e:
                        raise StageError(f"writing the staged copy failed: {e.strerror} "
                                         "(stage dir full?); nothing was kept") from None
                    view = view[n:]
                view.release()
            check.full.put((index, buf, got))
            writeback(fd, size - left, got)
            left -= got
            index += 1
    finally:
        check.close()
        os.close(fd)
    if (why := check.problem()) is not None:
        raise StageError(f"{why}: the image was altered or truncated after it was sealed; "
                         "seal it again (envtools seal)")
    os.chmod(dest, 0o400)
    (dest.parent / f"{dest.name}.sha256").write_text(f"{sha256}  {dest.name}\n")
    (dest.parent / f"{dest.name}.{STAT}").write_text(stat_key(dest))


def chunks_of(manifest: bytes, size: int, sha256: str) -> tuple[int, tuple[str, ...]]:
    """(chunk size, chunk digests) from the image's IMAGE.json, read by envtools' own
    manifest reader; (CHUNK, ()) for an image sealed without them. A manifest that names
    another image than the one ddlrun streams is refused."""
    from envtools.errors import EnvtoolsError
    from envtools.image.manifest import parse

    try:
        m = parse(manifest, "the streamed IMAGE.json", beside=True)
    except EnvtoolsError as e:
        raise StageError(str(e)) from None
    if m.image_sha256 != sha256 or m.image_bytes != size:
        raise StageError("the streamed IMAGE.json describes another image than the one "
                         "streamed; copy the image and the files beside it together")
    return (m.chunk_bytes, m.chunk_sha256) if m.chunk_sha256 else (CHUNK, ())


def stat_key(path: Path) -> str:
    """What changes when a file is written to, renamed over or chmod-ed: its inode,
    size and ctime (set by the kernel, not by the writer)."""
    st = os.stat(path)
    return f"{st.st_ino} {st.st_size} {st.st_ctime_ns}"


def run_flags(image: Path) -> list[str]:
    """`envtools run` flags for a staged copy: --hashed-by-caller while the copy is the
    file this node checked as it was written (same stat key); after any change it is
    checked again before mounting (and an altered copy is refused)."""
    try:
        same = (image.parent / f"{image.name}.{STAT}").read_text() == stat_key(image)
    except OSError:
        same = False
    return ["--hashed-by-caller"] if same else []


def keep(root: Path, tag: str, size: int, sha256: str, manifest: int) -> int:
    from envtools.image.chunks import threads
    from envtools.prefix.tempdirs import owned_dir

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(s, stop)
    out = sys.stdout
    try:
        d = check_root(root, size)
        with owned_dir(d, f"{tag}-{socket.gethostname()}", "ddlrun --env") as tmp:
            image = tmp / IMAGE_NAME
            data = read_exact(0, manifest)
            chunk, digests = chunks_of(data, size, sha256)
            receive(image, size, sha256, chunk=chunk, digests=digests, nthreads=threads())
            (tmp / f"{IMAGE_NAME}.json").write_bytes(data)
            (tmp / SESSION).mkdir(mode=0o700)
            print(f"READY {image}", file=out, flush=True)
            while os.read(0, CHUNK):  # until ddlrun closes the stream (or dies)
                pass
    except StageError as e:
        print(f"ERROR {e}", file=out, flush=True)
        return 1
    except OSError as e:
        print(f"ERROR staging on {socket.gethostname()} failed: {e}", file=out, flush=True)
        return 1
    return 0


def staged_image(root: Path, tag: str) -> Path:
    """This node's staged copy for job ``tag`` (what `keep` printed)."""
    prefix = f".{tag}-{socket.gethostname()}.envtools-tmp-"
    found = sorted(p for p in user_dir(root).glob(prefix + "*") if (p / IMAGE_NAME).is_file())
    if len(found) != 1:
        raise StageError(f"no staged image for job {tag} on {socket.gethostname()} under "
                         f"{user_dir(root)} ({len(found)} found)")
    return found[0] / IMAGE_NAME


def main(argv: list[str]) -> int:
    if len(argv) == 6 and argv[0] == "keep":
        return keep(Path(argv[1]), argv[2], int(argv[3]), argv[4], int(argv[5]))
    if len(argv) >= 6 and argv[0] == "exec" and argv[4] == "--":
        try:
            image = staged_image(Path(argv[1]), argv[2])
        except StageError as e:
            print(f"ddlrun --env: {e}", file=sys.stderr)
            return 1
        cmd = [argv[3], "run", *run_flags(image), str(image), "--", *argv[5:]]
        os.environ[SESSION_ENV] = str(image.parent / SESSION)
        try:
            os.execv(cmd[0], cmd)
        except OSError as e:
            print(f"ddlrun --env: cannot run {cmd[0]}: {e.strerror}", file=sys.stderr)
            return 127
    print("usage: stagenode.py keep ROOT TAG SIZE SHA256 MANIFEST_BYTES | "
          "exec ROOT TAG ENVTOOLS -- CMD ...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

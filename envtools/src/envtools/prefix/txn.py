"""Changing an env in place as one transaction: it ends as it was, or with every change.

``envtools add`` and ``drop`` change an env users already work in, so a failed solve,
Ctrl-C, SIGKILL or a full disk must not leave it half-changed. Everything that can fail
slowly (solving, fetching, extracting, linking) happens in a staging directory inside
the env's own ``conda-meta/envtools/txn/`` (same filesystem, so files move by rename,
and nothing that lists an env's files looks there). Then the change is committed:

1. the journal (``journal.json``: the files to move out, the files to move in, the
   directories to make) is written and synced;
2. each file that goes (a dropped package's, or one a new file replaces) is renamed into
   ``backup/``; each new file is renamed from ``stage/`` into place;
3. the journal is marked committed, and the transaction directory removed.

Only renames touch the env, so a full disk fails before step 1 or, at worst, making a
directory in step 2, which is undone. Ctrl-C and SIGTERM are held off during steps 1-3
(a fraction of a second). After SIGKILL the next ``add`` or ``drop`` finds the directory:
an uncommitted journal is undone file by file (each step is checked, so undoing twice is
harmless) and reported as "rolled back"; a committed one is finished. The env's
``conda-meta`` directory is ``flock``-ed for the whole run, so two changes never
interleave and a live run's directory is never taken for a leftover.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import signal
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from envtools.base.progress import info
from envtools.errors import EnvtoolsError
from envtools.prefix import confine

TXN = Path("conda-meta") / "envtools" / "txn"
_SIGNALS = {signal.SIGINT, signal.SIGTERM}


class Txn:
    """One change of ``prefix``: stage into :attr:`stage`, then :meth:`commit`."""

    def __init__(self, prefix: Path, what: str) -> None:
        self.prefix = prefix
        self.what = what
        self.root = prefix / TXN
        self.stage = self.root / "stage"
        self.backup = self.root / "backup"
        self.journal = self.root / "journal.json"
        self.committed = False
        self.keep = False  # an undo that failed: the next run must finish it

    def begin(self) -> None:
        self.root.mkdir(parents=True)
        self.stage.mkdir()
        self.backup.mkdir()
        _write_json(self.root / "owner.json", {
            "what": self.what, "pid": os.getpid(), "host": socket.gethostname(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")})

    def commit(self, out: list[str], into: list[str], dirs: list[str]) -> None:
        """Move ``out`` (env paths) into the backup, ``into`` (stage paths) into the env,
        making ``dirs`` first (parents before children); undone on any failure."""
        for rel in (*out, *into, *dirs):  # (conda-meta/ is ours to change here)
            why = confine.unsafe_reason("x/" + rel if rel.startswith("conda-meta/") else rel)
            if why:
                raise confine.UnsafePath(f"the change to {self.prefix}: refusing path "
                                         f"{rel!r}: {why}")
        journal = {"what": self.what, "state": "commit", "out": out, "in": into,
                   "dirs": dirs}
        _hold_for_tests("staged")
        old = _hold_signals()
        try:
            _write_json(self.journal, journal)
            try:
                _apply(self.prefix, self.stage, self.backup, out, into, dirs)
                journal["state"] = "committed"
                _write_json(self.journal, journal)
                self.committed = True
            except BaseException:
                try:
                    undo(self.prefix, self.root, journal)
                except BaseException:
                    self.keep = True
                    raise
                raise
        finally:
            _release_signals(old)

    def finish(self) -> None:
        """Remove the transaction directory (the backup with it)."""
        if self.keep:
            return
        _rmtree(self.root)


def _apply(prefix: Path, stage: Path, backup: Path, out: list[str], into: list[str],
           dirs: list[str]) -> None:
    root, st, bk = str(prefix), str(stage), str(backup)
    for rel in out:
        parent = rel.rpartition("/")[0]
        if parent:
            os.makedirs(f"{bk}/{parent}", exist_ok=True)
        os.rename(f"{root}/{rel}", f"{bk}/{rel}")
    for d in dirs:
        os.mkdir(f"{root}/{d}")
    _hold_for_tests("commit")
    for rel in into:
        os.rename(f"{st}/{rel}", f"{root}/{rel}")


def undo(prefix: Path, root: Path, journal: dict) -> None:
    """Put back what an uncommitted journal moved; each step checks it was done first."""
    env, st, bk = str(prefix), str(root / "stage"), str(root / "backup")
    for rel in reversed(journal.get("in") or []):
        if os.path.lexists(f"{env}/{rel}") and not os.path.lexists(f"{st}/{rel}"):
            os.rename(f"{env}/{rel}", f"{st}/{rel}")
    for d in reversed(journal.get("dirs") or []):
        try:
            os.rmdir(f"{env}/{d}")
        except OSError:
            pass
    for rel in reversed(journal.get("out") or []):
        if os.path.lexists(f"{bk}/{rel}") and not os.path.lexists(f"{env}/{rel}"):
            os.rename(f"{bk}/{rel}", f"{env}/{rel}")


def describe(prefix: Path) -> str:
    """What a leftover transaction directory says about the run that left it."""
    owner = _read_json(prefix / TXN / "owner.json") or {}
    journal = _read_json(prefix / TXN / "journal.json") or {}
    state = {"commit": "stopped while committing", "committed": "stopped after committing"
             }.get(journal.get("state", ""), "stopped before committing")
    return (f"`{owner.get('what', 'envtools add/drop')}` (pid {owner.get('pid', '?')} on "
            f"{owner.get('host', '?')}, started {owner.get('started', '?')}) was {state}")


def recover(prefix: Path) -> str | None:
    """Finish or undo what a killed run left (the caller holds the lock); says what."""
    root = prefix / TXN
    if not root.exists():
        return None
    owner = _read_json(root / "owner.json") or {}
    journal = _read_json(root / "journal.json")
    who = (f"`{owner.get('what', 'envtools')}` (pid {owner.get('pid', '?')} on "
           f"{owner.get('host', '?')}, started {owner.get('started', '?')})")
    if journal and journal.get("state") == "committed":
        _rmtree(root)
        return f"finished {who}, which was stopped after its change was made"
    if journal:
        undo(prefix, root, journal)
    _rmtree(root)
    return f"rolled back {who}, which was stopped before it finished: {prefix} is as it was"


@contextmanager
def changing(prefix: Path, what: str) -> Iterator[Txn]:
    """Lock ``prefix``, recover what a killed run left, and yield a fresh transaction;
    on any failure or interrupt before its commit, the env is left as it was."""
    fd = _lock(prefix)
    try:
        msg = recover(prefix)
        if msg:
            info(msg)
        t = Txn(prefix, what)
        old_term = signal.getsignal(signal.SIGTERM) if _main_thread() else None
        if old_term is not None:
            signal.signal(signal.SIGTERM, _term_to_interrupt)
        try:
            t.begin()
            yield t
        finally:
            if old_term is not None:
                signal.signal(signal.SIGTERM, old_term)
            old = _hold_signals()
            try:
                t.finish()  # (committed: the backup; else the stage: nothing reached the env)
            finally:
                _release_signals(old)
    finally:
        os.close(fd)


def _lock(prefix: Path) -> int:
    meta = prefix / "conda-meta"
    try:
        fd = os.open(meta, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise EnvtoolsError(f"{prefix} is not a conda environment (no conda-meta/)",
                            "give the path of an environment (one made by envtools clone)"
                            ) from e
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            owner = _read_json(prefix / TXN / "owner.json") or {}
            raise EnvtoolsError(
                f"another envtools command is changing {prefix}"
                + (f": `{owner['what']}` (pid {owner.get('pid')})" if "what" in owner else ""),
                "wait for it to finish, then run this again") from e
        raise
    return fd


def _hold_for_tests(point: str) -> None:
    """With ``ENVTOOLS_TXN_HOLD=POINT:FIFO``, wait at POINT (``staged``: all staged, before
    the commit; ``commit``: half-way through it) until a writer opens FIFO. Why: the tests
    must interrupt or kill a change at a known step."""
    want, _, fifo = os.environ.get("ENVTOOLS_TXN_HOLD", "").partition(":")
    if want == point and fifo:
        with open(fifo, "rb"):
            pass


def _term_to_interrupt(signum, frame):
    raise KeyboardInterrupt


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def _hold_signals():
    """Hold off Ctrl-C and SIGTERM: Python handlers that only note them. (A signal mask
    would not do: the process's signals also go to py-rattler's runtime threads, and
    Python's handler then raises in the main thread anyway.) Returns what to restore."""
    if not _main_thread():
        return None
    noted: list[int] = []
    old = {s: signal.signal(s, lambda signum, frame: noted.append(signum)) for s in _SIGNALS}
    return old, noted


def _release_signals(held) -> None:
    """Restore the handlers; a Ctrl-C or SIGTERM that came while a commit ran is dropped
    (the change is made, or undone, by then, and the command finishes as it would have)."""
    if held is None:
        return
    old, noted = held
    for s, h in old.items():
        signal.signal(s, h)
    if noted:
        info("(an interrupt came during the commit: it was held off until the commit was done)")


def _write_json(fp: Path, data: dict) -> None:
    tmp = fp.with_name(fp.name + ".new")
    with open(tmp, "w") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, fp)


def _read_json(fp: Path) -> dict | None:
    try:
        with open(fp) as fh:
            data = json.load(fh)
        return data if isinstance(data, dict) else None
    except (OSError, ValueError):
        return None


def _rmtree(path: Path) -> None:
    if not path.exists():
        return

    def onerror(fn, p, exc):  # a read-only directory rattler made: make it writable
        try:
            os.chmod(os.path.dirname(p), 0o700)
            fn(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=onerror)

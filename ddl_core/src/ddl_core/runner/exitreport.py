"""Every rank's exit status, so that ddlrun's own exit status tells whether the job failed.

Launchers do not agree on a job's exit status: plain mpirun returns the status of the
first rank that failed (128+signal for a signal), but `mpirun --runtime-options
recoverable` returns 0 for a job whose ranks died by SIGKILL and SIGSEGV, and srun and
jsrun have their own rules. So ddlrun starts each rank through this file, run as a script
(`python exitreport.py cmd args...`, not `-m`: the package would load libddl and MPI into
a process that only waits):

- it runs the rank's command as its child (same environment, stdin, stdout, stderr; the
  child is killed if this parent dies, so a launcher's SIGKILL reaches it too), passes on
  the signals a launcher sends, waits, and
- sends `<token> <rank> exit <code>` or `<token> <rank> signal <number>` to ddlrun's
  collector over TCP (the addresses, port and token are in DDL_EXIT_REPORT, which ddlrun
  forwards like the other DDL_ variables), with ` lost` appended when the rank said it
  failed only because a peer was lost (ddl_core writes that into the pipe named by
  DDL_EXIT_NOTE_FD when it dies of an unhandled PeerLostError), and ` host=<name>` and
  ` job=<n>` (its Open MPI job: 1 for the ranks ddlrun launched, 2 and on for ranks the
  job spawned later), then
- ends the way the child ended (the same exit code, or the same signal), so the launcher
  sees what it would have seen without it. Under `ddlrun --elastic` (DDL_ELASTIC=1) a rank
  that failed ends by SIGKILL instead: Open MPI's fault tolerance treats a killed process
  as a failure the survivors recover from, but a non-zero exit as the whole job's abort
  (seen here: the survivors then never learn of it and the job hangs). ddlrun has the
  real status from the report. Under --elastic the wrapper also sends `<token> <rank>
  start <pid> host=... job=...` when its rank starts, so ddlrun knows where every rank
  runs (a host that dies sends no end report).

The collector (ddlrun's side) keeps the reports in the order they arrive, and
`job_status()` turns them into ddlrun's exit status: the status of the first rank that
failed on its own (its exit code, or 128+signal for a signal); if every failed rank failed
only because a peer was lost, the first of those; else the launcher's own status. The
"on its own" matters: a rank that calls sys.exit(3) makes its peers fail within
milliseconds, which may be before its own exit is seen.

Without DDL_EXIT_REPORT (a command copied from `ddlrun --dry-run`) the wrapper only runs
the command and passes its status on.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from types import ModuleType

ENV = "DDL_EXIT_REPORT"
ELASTIC_ENV = "DDL_ELASTIC"
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,252}")
NOTE_ENV = "DDL_EXIT_NOTE_FD"
RANK_VARS = ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID",
             "JSM_NAMESPACE_RANK")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
             signal.SIGUSR2, signal.SIGCONT, signal.SIGALRM)
CONNECT_S = 2.0


class Report:
    """One rank's end: `kind` "exit" (number = its exit code) or "signal"; `lost`: it
    failed only because a peer was lost (PeerLostError). A plain class: the wrapper starts
    with every rank, so it imports nothing it can do without (dataclasses, secrets)."""

    __slots__ = ("rank", "kind", "number", "lost", "host", "job")

    def __init__(self, rank: int, kind: str, number: int, lost: bool = False,
                 host: str = "", job: int = 1) -> None:
        self.rank, self.kind, self.number, self.lost = rank, kind, number, lost
        self.host, self.job = host, job

    def _key(self) -> tuple[int, str, int, bool, str, int]:
        return (self.rank, self.kind, self.number, self.lost, self.host, self.job)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Report) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        return f"Report{self._key()}"

    @property
    def failed(self) -> bool:
        return self.kind == "signal" or (self.kind == "exit" and self.number != 0)

    @property
    def name(self) -> str:
        """How ddlrun names the rank: its launch rank, or its rank in a later spawn."""
        return f"rank {self.rank}" if self.job <= 1 else \
            f"spawned rank {self.rank} (job {self.job})"

    @property
    def status(self) -> int:
        """As a shell reports it: the exit code, or 128 + the signal."""
        return 128 + self.number if self.kind == "signal" else self.number

    def describe(self) -> str:
        if self.kind == "signal":
            try:
                name = signal.Signals(self.number).name
            except ValueError:
                name = f"signal {self.number}"
            return f"was killed by signal {self.number} ({name})"
        return f"exited with status {self.number}" + (" (a peer was lost)" if self.lost else "")


def recv_line(conn: socket.socket, limit: int, timeout: float = 2.0) -> bytes:
    """What a peer sends up to its first newline (at most about ``limit`` bytes, or less if
    it closes first), waiting ``timeout`` s per read: the one-line requests ddlrun's
    sockets take (rank reports here, host-update watchers in discovery). OSError on a
    timeout or a broken connection."""
    conn.settimeout(timeout)
    data = b""
    while b"\n" not in data and len(data) < limit:
        chunk = conn.recv(limit)
        if not chunk:
            break
        data += chunk
    return data


class Collector:
    """ddlrun's end: a TCP listener that records one report per connection."""

    def __init__(self, addresses: list[str]) -> None:
        import secrets
        import threading

        self.token = secrets.token_hex(16)
        self.reports: list[Report] = []
        self._lock = threading.Lock()
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("0.0.0.0", 0))
        self._sock.listen(256)
        self.port = self._sock.getsockname()[1]
        self.addresses = addresses
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._serve, name="ddlrun-exit-reports",
                                        daemon=True)
        self._thread.start()

    @property
    def env_value(self) -> str:
        return f"{','.join(self.addresses)}:{self.port}:{self.token}"

    def _serve(self) -> None:
        """Accept and read reports until close() says stop; then read what is still
        queued and end (every wrapper has sent its report before it exits, so once the
        launcher has exited, all of them are read or in the listening socket's queue)."""
        import select

        stopping = False
        while True:
            ready, _, _ = select.select([self._sock, self._wake_r], [], [],
                                        0 if stopping else None)
            if self._wake_r in ready:
                os.read(self._wake_r, 64)
                stopping = True
            if self._sock in ready:
                try:
                    conn, _ = self._sock.accept()
                except OSError:
                    return
                self._read(conn)
            elif stopping:
                return

    def snapshot(self) -> list[Report]:
        """The reports so far (the collector goes on reading)."""
        with self._lock:
            return list(self.reports)

    def _read(self, conn: socket.socket) -> None:
        """One line `<token> <rank> exit|signal|start <number> [lost] [host=H] [job=N]`;
        anything else is dropped."""
        import hmac

        try:
            data = recv_line(conn, 256)
        except OSError:
            return
        finally:
            conn.close()
        parts = data.decode("ascii", "replace").split()
        if (not 4 <= len(parts) <= 7 or not hmac.compare_digest(parts[0], self.token)
                or parts[2] not in ("exit", "signal", "start")):
            return
        lost, host, job = False, "", 1
        for extra in parts[4:]:
            key, eq, value = extra.partition("=")
            if extra == "lost":
                lost = True
            elif eq and key == "host" and _HOST.fullmatch(value):
                host = value
            elif eq and key == "job" and value.isdigit() and len(value) < 10:
                job = int(value)
            else:
                return
        try:
            rank, number = int(parts[1]), int(parts[3])
        except ValueError:
            return
        with self._lock:
            self.reports.append(Report(rank, parts[2], number, lost, host, job))

    def close(self) -> list[Report]:
        """Read what is still queued, stop listening; the reports in arrival order."""
        os.write(self._wake_w, b"x")
        self._thread.join(timeout=10)
        self._sock.close()
        os.close(self._wake_r)
        os.close(self._wake_w)
        with self._lock:
            return list(self.reports)


def job_status(reports: list[Report], launcher_status: int) -> tuple[int, str | None]:
    """ddlrun's exit status and, when a rank failed, a line saying which ranks did."""
    failed = [r for r in reports if r.failed]
    if not failed:
        return launcher_status, None
    first = next((r for r in failed if not r.lost), failed[0])
    others = [r for r in failed if r is not first]
    line = f"ddlrun: {first.name} {first.describe()}"
    if others:
        by_what: dict[str, list[str]] = {}
        for r in others:
            by_what.setdefault(r.describe(), []).append(str(r.rank) if r.job <= 1 else
                                                        f"{r.rank} of job {r.job}")
        rest = "; ".join(f"rank{'s' if len(v) > 1 else ''} {','.join(sorted(v))} {k}"
                         for k, v in by_what.items())
        line += f"; {rest}"
    return first.status, line + f"; exit status {first.status}"


# -- the rank's side ------------------------------------------------------------------------

def _rank() -> int:
    for name in RANK_VARS:
        value = os.environ.get(name, "")
        if value.isdigit():
            return int(value)
    return -1


def _job() -> int:
    """The rank's Open MPI job number (PMIX_NAMESPACE ends in @<job>): 1 for the launch,
    more for ranks spawned later; 1 where it is not told."""
    tail = os.environ.get("PMIX_NAMESPACE", "").rpartition("@")[2]
    return int(tail) if tail.isdigit() and len(tail) < 10 else 1


def _where() -> str:
    host = socket.gethostname()
    return f" host={host}" if _HOST.fullmatch(host) else ""


def _job_shm() -> ModuleType | None:
    """ddl_core/jobshm.py, loaded by its own name from the package's directory: this runs
    as a script, and importing the package would load libddl and MPI into a process that
    only waits. None when ddlrun set no job directory."""
    if not os.environ.get("DDL_JOB_SHM"):
        return None
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        import jobshm  # type: ignore[import-not-found]
    except ImportError:
        return None
    finally:
        del sys.path[0]
    return jobshm


def _die_with_parent() -> None:
    """In the child: be killed when this wrapper dies (prctl PR_SET_PDEATHSIG), so a
    launcher that SIGKILLs the wrapper also ends the rank."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _send(report: Report, value: str) -> bool:
    """Report to the first of the collector's addresses that answers."""
    addrs, port, token = (value.rsplit(":", 2) + ["", ""])[:3]
    line = (f"{token} {report.rank} {report.kind} {report.number}"
            + (" lost" if report.lost else "") + _where() + f" job={report.job}\n").encode()
    for addr in filter(None, addrs.split(",")):
        try:
            with socket.create_connection((addr, int(port)), timeout=CONNECT_S) as s:
                s.sendall(line)
            return True
        except (OSError, ValueError):
            continue
    return False


def _end_like(returncode: int) -> None:
    """Exit as the child did: its code, or its signal (128+signal if it cannot be raised)."""
    sys.stdout.flush()
    sys.stderr.flush()
    if returncode >= 0:
        os._exit(returncode)
    sig = -returncode
    try:
        import resource

        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the child dumped core already
    except (ImportError, OSError, ValueError):
        pass
    try:
        if sig not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(sig, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
        os.kill(os.getpid(), sig)
    except (OSError, ValueError):
        pass
    os._exit(128 + sig)


def main(argv: list[str]) -> None:
    if argv and argv[0] == "--":
        argv = argv[1:]
    if not argv:
        print("exitreport.py: no command given", file=sys.stderr)
        os._exit(2)
    note_r, note_w = os.pipe()
    value = os.environ.get(ENV)
    elastic = os.environ.get(ELASTIC_ENV) == "1"
    env = dict(os.environ, **{NOTE_ENV: str(note_w)})
    shm = _job_shm()
    joined = shm.for_rank(env) if shm else None  # Open MPI's segments in the job's dir
    try:
        child = subprocess.Popen(argv, env=env, pass_fds=(note_w,),
                                 preexec_fn=_die_with_parent)  # noqa: PLW1509
    except OSError as e:
        print(f"ddlrun: cannot run {argv[0]}: {e.strerror}", file=sys.stderr)
        returncode = 127
    else:
        for sig in FORWARDED:
            signal.signal(sig, lambda s, _f: child.send_signal(s))
        if elastic and value:
            _send(Report(_rank(), "start", child.pid, job=_job()), value)
        returncode = child.wait()
        for sig in FORWARDED:
            signal.signal(sig, signal.SIG_IGN if sig != signal.SIGCONT else signal.SIG_DFL)
    os.close(note_w)
    os.set_blocking(note_r, False)  # a forked grandchild may still hold the write end
    try:
        note = os.read(note_r, 64)
    except BlockingIOError:
        note = b""
    if value:
        report = (Report(_rank(), "signal", -returncode, job=_job()) if returncode < 0
                  else Report(_rank(), "exit", returncode, b"lost" in note, job=_job()))
        if not _send(report, value):
            print(f"ddlrun: rank {report.rank} could not report its exit status to ddlrun",
                  file=sys.stderr)
    # after the report: once a rank has failed, srun (--kill-on-bad-exit) may SIGKILL this
    # wrapper at any moment, and a report lost is a failure ddlrun cannot name, while a
    # directory left behind is reclaimed by the next job on this node
    if shm:
        shm.rank_done(joined)  # the last rank of the job on this node removes the dir
    if elastic and returncode != 0:
        _end_like(-signal.SIGKILL)  # a failure the survivors recover from (see above)
    _end_like(returncode)


if __name__ == "__main__":
    main(sys.argv[1:])

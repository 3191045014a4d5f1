"""Elastic jobs' hosts: the host-discovery script, polled, and what ddlrun tells the ranks.

`ddlrun --elastic --host-discovery-script S` runs S (no arguments) every
--discovery-interval seconds, as Horovod's elastic driver does. S prints the hosts that
are usable now, one `host:slots` (or `host`: --slots-per-host slots) a line. A run that
exits non-zero, outlives --discovery-timeout, or prints a line that is not `host[:slots]`
changes nothing: the update is skipped with one warning on ddlrun's stderr (repeated only
when the reason changes), and the job goes on with the hosts it has. Only the first run,
before launch, must succeed: without hosts there is nothing to start.

The channel to the ranks (the contract elastic Horovod and ddl_core's own reset build on;
the rank's side is ddl_core.hostupdates):
- ddlrun listens on TCP; DDL_HOST_UPDATES=`<addr>,<addr>...:<port>:<token>` (the form of
  DDL_EXIT_REPORT) is forwarded to every rank, with DDL_ELASTIC=1, DDL_MIN_NP, DDL_MAX_NP
  (0: unbounded) and DDL_ELASTIC_COMMAND (the rank's command, JSON, for spawning more).
- A rank connects and sends `<token> watch\\n`. ddlrun answers at once with the current
  state and again on every change, one JSON object a line:
  `{"generation": g, "time": t, "hosts": {"h": slots, ...}, "added": [...],
    "removed": [...], "spawn": [["h", n], ...], "running": {"h": n, ...}}`
  `generation` grows by one per change; `added`/`removed` are the hosts changed since the
  previous generation (Horovod's HostUpdateResult: added, removed, or both); `spawn` is how
  many new ranks to start on which host now (slots the script reports minus the ranks
  running there, at most --max-np in all), `running` the ranks ddlrun knows run where.
- What the ranks do with it (at their next reset, agreed through rank 0, as Horovod's
  check_host_updates does): ranks on a host in `removed` leave (exit 0); the others shrink
  their world without them; when `spawn` is not empty they spawn those ranks
  (ddl_core.hostupdates.spawn: MPI_Comm_spawn with the PMIX_HOST/PMIX_ADD_HOST info keys) and
  merge them into the new world. A spawn ddlrun announced counts as running on its host
  (so a later generation does not announce it again) until its ranks' start reports arrive
  or SPAWN_WAIT_S passes.
Nothing here starts a rank: the ranks spawn, so the new ones join the survivors' MPI job.
"""

from __future__ import annotations

import json
import os
import re
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable

from .exitreport import recv_line
from .hosts import HOST_RE

ENV = "DDL_HOST_UPDATES"
#: how long a spawn ddlrun announced counts as running before its ranks report
SPAWN_WAIT_S = 60.0
_LINE = re.compile(r"^\s*([^\s:]+)(?::(\d+))?\s*$")


class DiscoveryError(Exception):
    """One run of the discovery script gave nothing usable; the message says why."""


def parse_discovery(text: str, slots_per_host: int) -> dict[str, int]:
    """`host[:slots]` lines -> {host: slots}, in order; a bad line is a DiscoveryError
    naming it (the whole output is then not used: half a host list is a wrong one)."""
    hosts: dict[str, int] = {}
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _LINE.match(line)
        if not m or not HOST_RE.match(m.group(1)) or (m.group(2) and int(m.group(2)) < 1):
            raise DiscoveryError(f"line {i} {line.strip()[:80]!r} is not host[:slots] "
                                 "(slots a positive number)")
        hosts[m.group(1)] = hosts.get(m.group(1), 0) + int(m.group(2) or slots_per_host)
    return hosts


def run_discovery(script: str, timeout_s: float, slots_per_host: int) -> dict[str, int]:
    """Run the script once; its hosts, or DiscoveryError (fails, hangs, prints garbage)."""
    try:
        proc = subprocess.Popen([script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    except OSError as e:
        raise DiscoveryError(f"cannot run {script}: {e.strerror}") from None
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        try:  # its whole process group: a shell's children hold the pipes open
            os.killpg(proc.pid, 9)
        except OSError:
            proc.kill()
        proc.communicate()
        raise DiscoveryError(f"{script} did not finish within {timeout_s:g} s "
                             "(--discovery-timeout)") from None
    if proc.returncode != 0:
        tail = err.decode(errors="replace").strip().splitlines()[-1:] or [""]
        raise DiscoveryError(f"{script} exited with status {proc.returncode}"
                             + (f": {tail[0][:200]}" if tail[0] else ""))
    try:
        text = out.decode("utf-8")
    except UnicodeDecodeError:
        raise DiscoveryError(f"{script} printed bytes that are not UTF-8 text") from None
    hosts = parse_discovery(text, slots_per_host)
    if not hosts:
        raise DiscoveryError(f"{script} printed no host")
    return hosts


class HostUpdates:
    """ddlrun's side of the channel: the state, the TCP listener, the subscribers."""

    def __init__(self, addresses: list[str], hosts: dict[str, int], max_np: int | None,
                 running: dict[str, int]) -> None:
        import secrets

        self.token = secrets.token_hex(16)
        self.addresses = addresses
        self.max_np = max_np
        self.hosts = dict(hosts)
        self.generation = 0
        self._state: dict[str, object] = {}
        self._running = dict(running)  # from placement until start reports arrive
        self._pending: list[tuple[str, int, float]] = []  # spawns announced, not seen yet
        self._lock = threading.Lock()
        self._subs: list[socket.socket] = []
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.bind(("0.0.0.0", 0))
        self._sock.listen(256)
        self.port = self._sock.getsockname()[1]
        self._closed = False
        self._publish([], [])
        self._thread = threading.Thread(target=self._serve, name="ddlrun-host-updates",
                                        daemon=True)
        self._thread.start()

    @property
    def env_value(self) -> str:
        return f"{','.join(self.addresses)}:{self.port}:{self.token}"

    def state(self) -> dict[str, object]:
        with self._lock:
            return dict(self._state)

    def set_running(self, running: dict[str, int]) -> None:
        """Where ranks run now (ddlrun's reports); pending spawns seen there are settled."""
        with self._lock:
            now = time.monotonic()
            left = []
            for host, n, t in self._pending:
                if now - t < SPAWN_WAIT_S and running.get(host, 0) < \
                        self._running.get(host, 0) + n:
                    left.append((host, n, t))
            self._pending = left
            self._running = dict(running)

    def update(self, hosts: dict[str, int]) -> bool:
        """A new discovery result; publish a new generation when anything changed (the
        hosts, or ranks to spawn). True when it did."""
        with self._lock:
            added = [h for h in hosts if h not in self.hosts]
            removed = [h for h in self.hosts if h not in hosts]
            changed = added or removed or hosts != self.hosts
            self.hosts = dict(hosts)
            spawn = self._spawn_plan()
            if not changed and not spawn:
                return False
            self._publish(added, removed)
            return True

    def _spawn_plan(self) -> list[list[object]]:
        running = dict(self._running)
        for host, n, _ in self._pending:
            running[host] = running.get(host, 0) + n
        room = None if self.max_np is None else self.max_np - sum(running.values())
        plan: list[list[object]] = []
        for host, slots in self.hosts.items():
            n = slots - running.get(host, 0)
            if room is not None:
                n = min(n, room)
            if n > 0:
                plan.append([host, n])
                if room is not None:
                    room -= n
        return plan

    def _publish(self, added: list[str], removed: list[str]) -> None:
        spawn = self._spawn_plan() if self.generation or added else []
        self.generation += 1
        now = time.monotonic()
        for host, n in spawn:
            self._pending.append((str(host), int(str(n)), now))
        self._state = {"generation": self.generation, "time": time.time(),
                       "hosts": dict(self.hosts), "added": added, "removed": removed,
                       "spawn": spawn, "running": dict(self._running)}
        line = (json.dumps(self._state, sort_keys=True) + "\n").encode()
        for s in list(self._subs):
            try:
                s.sendall(line)
            except OSError:
                self._subs.remove(s)
                s.close()

    def _serve(self) -> None:
        import hmac

        while not self._closed:
            try:
                ready, _, _ = select.select([self._sock], [], [], 0.5)
            except (OSError, ValueError):
                return
            if not ready:
                continue
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            try:
                data = recv_line(conn, 128)
            except OSError:
                conn.close()
                continue
            parts = data.decode("ascii", "replace").split()
            if len(parts) != 2 or parts[1] != "watch" or \
                    not hmac.compare_digest(parts[0], self.token):
                conn.close()
                continue
            with self._lock:
                try:
                    conn.sendall((json.dumps(self._state, sort_keys=True) + "\n").encode())
                    self._subs.append(conn)
                except OSError:
                    conn.close()

    def close(self) -> None:
        self._closed = True
        self._sock.close()
        self._thread.join(timeout=5)
        with self._lock:
            for s in self._subs:
                s.close()
            self._subs.clear()


class Poller:
    """Runs the discovery script every `interval_s` on a thread, into a HostUpdates;
    a failed run is skipped with a warning (said again only when the reason changes)."""

    def __init__(self, script: str, interval_s: float, timeout_s: float, slots_per_host: int,
                 updates: HostUpdates, running: Callable[[], dict[str, int]]) -> None:
        self.script, self.interval_s, self.timeout_s = script, interval_s, timeout_s
        self.slots_per_host, self.updates, self.running = slots_per_host, updates, running
        self._stop = threading.Event()
        self._last_error: str | None = None
        self._thread = threading.Thread(target=self._loop, name="ddlrun-discovery",
                                        daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.updates.set_running(self.running())
            try:
                hosts = run_discovery(self.script, self.timeout_s, self.slots_per_host)
            except DiscoveryError as e:
                if str(e) != self._last_error:
                    print(f"ddlrun: warning: host discovery skipped: {e}; the job keeps its "
                          "hosts", file=sys.stderr, flush=True)
                self._last_error = str(e)
                continue
            self._last_error = None
            before = self.updates.hosts
            if self.updates.update(hosts):
                st = self.updates.state()
                print(f"ddlrun: hosts now {','.join(f'{h}:{n}' for h, n in hosts.items())}"
                      f" (generation {st['generation']}"
                      + (f", was {','.join(f'{h}:{n}' for h, n in before.items())}" if
                         before != hosts else "")
                      + (f", spawn {st['spawn']}" if st["spawn"] else "") + ")",
                      file=sys.stderr, flush=True)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.timeout_s + 5)

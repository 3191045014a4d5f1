"""The rank's side of `ddlrun --host-discovery-script`: which hosts the job has now, and
growing onto new ones.

ddlrun (ddl_core.runner.discovery, which documents the channel) polls the discovery script
and tells every rank each change through a TCP connection named by DDL_HOST_UPDATES. A
rank reads it without waiting (`HostWatch.latest()`, a non-blocking read: cheap enough
for every commit), and the job acts on it at its next reset, agreed through rank 0 (as
elastic Horovod's check_host_updates does), so that every rank acts on the same
generation:

    watch = HostWatch.from_env()           # None outside an elastic ddlrun job
    state = watch.latest()                 # generation, hosts, added, removed, spawn
    ...                                    # rank 0's state broadcast; then, at the reset:
    world = spawn(world, state["spawn"])   # survivors + new ranks, one intracommunicator

New ranks start the rank's own command (DDL_ELASTIC_COMMAND, through ddlrun's wrapper, so
ddlrun sees them start and end) and call `join()` first: it returns the same merged
communicator on their side. Both sides are mpi4py communicators (MPI_Comm_spawn and
MPI_Intercomm_merge; the survivors low, the new ranks high); ddl_core.replace_world()
(or ddl_core.init(comm=...) on the new ranks) makes it the world. mpi4py is imported only
by spawn() and join().

Open MPI 5.0 notes, seen here: the intercommunicators are disconnected once merged, and
the merged communicator must be freed before MPI_Finalize (else Finalize crashes in its
dynamic-process clean-up, opal_net_get_hostname).
"""

from __future__ import annotations

import json
import os
import socket
from typing import Any

ENV = "DDL_HOST_UPDATES"
COMMAND_ENV = "DDL_ELASTIC_COMMAND"


class HostWatch:
    """A subscription to ddlrun's host updates; `latest()` never blocks."""

    def __init__(self, value: str) -> None:
        addrs, port, token = (value.rsplit(":", 2) + ["", ""])[:3]
        if not port.isdigit() or not token:
            raise ValueError(f"{ENV}={value!r} is not <addresses>:<port>:<token>")
        self._sock: socket.socket | None = None
        last: OSError | None = None
        for addr in filter(None, addrs.split(",")):
            try:
                self._sock = socket.create_connection((addr, int(port)), timeout=5)
                break
            except OSError as e:
                last = e
        if self._sock is None:
            raise OSError(f"cannot reach ddlrun's host updates at {addrs}:{port}: {last}")
        self._sock.sendall(f"{token} watch\n".encode())
        self._buf = b""
        self._state: dict[str, Any] | None = None
        self._sock.settimeout(5)
        self._read(block=True)  # ddlrun answers with the current state at once
        if self._sock is None or self._state is None:
            self.close()
            raise OSError(f"ddlrun's host updates at {addrs}:{port} sent no state (a token "
                          f"not this job's in {ENV}?)")
        self._sock.setblocking(False)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> HostWatch | None:
        value = (environ if environ is not None else os.environ).get(ENV)
        return cls(value) if value else None

    def _read(self, block: bool = False) -> None:
        assert self._sock is not None
        while True:
            try:
                chunk = self._sock.recv(65536)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                chunk = b""
            if not chunk:  # ddlrun has gone: no more updates, keep the last state
                self._sock.close()
                self._sock = None
                return
            self._buf += chunk
            *lines, self._buf = self._buf.split(b"\n")
            for line in lines:
                try:
                    state = json.loads(line)
                except ValueError:
                    continue
                if isinstance(state, dict) and isinstance(state.get("generation"), int):
                    self._state = state
            if block and self._state is not None:
                return

    def latest(self) -> dict[str, Any] | None:
        """The newest state ddlrun sent (see ddl_core.runner.discovery for its keys)."""
        if self._sock is not None:
            self._read()
        return self._state

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _command(environ: dict[str, str] | None = None) -> list[str]:
    text = (environ if environ is not None else os.environ).get(COMMAND_ENV, "")
    try:
        cmd = json.loads(text)
    except ValueError:
        cmd = None
    if not isinstance(cmd, list) or not cmd or not all(isinstance(a, str) for a in cmd):
        raise RuntimeError(f"{COMMAND_ENV} is not set to the rank's command (JSON list): "
                           "spawn() runs under ddlrun --elastic only")
    return cmd


def spawn(comm: Any, where: list[list[Any]], known_hosts: set[str] | None = None,
          root: int = 0) -> Any:
    """Start `n` new ranks on each `[host, n]` of `where` and merge them with `comm`
    (collective over `comm`; an mpi4py intracommunicator): the merged intracommunicator,
    `comm`'s ranks first. A host not in `known_hosts` (the hosts the job was launched on)
    is added to Open MPI's virtual machine first (the PMIX_ADD_HOST info key, Open MPI's
    `add-host`); PMIX_HOST places the ranks."""
    from mpi4py import MPI

    cmd = _command()
    hosts = ",".join(f"{h}:{int(n)}" for h, n in where)
    info = MPI.Info.Create()
    info.Set("PMIX_HOST", hosts)
    # ddlrun's plan is the authority on slots: Open MPI still counts a dead rank's slot as
    # taken, and refuses a host it knows as full ("already filled") without this
    info.Set("PMIX_MAPBY", "slot:OVERSUBSCRIBE")
    new = [f"{h}:{int(n)}" for h, n in where if known_hosts is not None and h not in known_hosts]
    if new:
        info.Set("PMIX_ADD_HOST", ",".join(new))
    try:
        inter = comm.Spawn(cmd[0], cmd[1:], maxprocs=sum(int(n) for _, n in where),
                           info=info, root=root)
    finally:
        info.Free()
    merged = inter.Merge(high=False)
    inter.Disconnect()
    return merged


def join() -> Any:
    """In a rank started by spawn(): the merged intracommunicator (the spawners first);
    None in a rank ddlrun launched."""
    from mpi4py import MPI

    parent = MPI.Comm.Get_parent()
    if parent == MPI.COMM_NULL:
        return None
    merged = parent.Merge(high=True)
    parent.Disconnect()
    return merged

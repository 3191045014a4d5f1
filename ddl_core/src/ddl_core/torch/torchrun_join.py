"""Make the processes that torchrun started one MPI job, before libddl's MPI_Init.

torchrun (or any launcher that gives a TCPStore, RANK and WORLD_SIZE but no MPI) starts
processes that MPI_Init would make singletons of size 1, and Open MPI 5 cannot join
singletons: MPI_Comm_connect/accept fails between them (MPI_ERR_INTERN: connect/accept
publishes through a PMIx server, and a singleton has none), and pointing a singleton at a
PRRTE DVM (PMIX_SERVER_URI41) does not help either, the server closes the connection of
any client whose namespace it did not launch.

So the job is made by the runtime that makes every Open MPI job. Rank 0 runs mpirun with
one stand-in per rank (_standin.py) on the ranks' hosts, in RANK order; mpirun's PMIx
server registers a job of WORLD_SIZE ranks. Each stand-in passes its identity (PMIX_RANK,
PMIX_NAMESPACE, the local server's URI, Open MPI's per-rank variables) to the torchrun
process of its rank through a private directory on their host, whose name rank 0 sends
through torchrun's store; that process takes the identity over before MPI_Init (PMIx lets
a registered rank connect more than once, as a process and its fork do). MPI_Init then
gives MPI_COMM_WORLD of the whole job, in torchrun's RANK order, with shared memory
between the ranks of a host as under mpirun, so libddl needs nothing different.

Lifetime: each stand-in waits while its rank's process lives (pid and start time), so
mpirun ends when the job's last process has ended, however it ended (a SIGKILL of the
whole group too: nothing of this job outlives its processes by more than 0.2 s). Each
job has its own mpirun (its own PMIx namespace and session directory) and its own
directory with a random name, so two jobs on a host, or a torchrun restart (whose
workers start with new ranks and a new store prefix), never see each other's.
"""

from __future__ import annotations

import atexit
import os
import secrets
import shlex
import socket
import subprocess
import sys
import tempfile
import threading
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, NoReturn

from .. import jobshm
from ..settings import env_number
from . import _standin

_BASE = "ddl_mpi_job/"
KEY = _BASE  # (this attempt's prefix: set by join)
STANDIN = Path(_standin.__file__)


class JoinError(RuntimeError):
    """The torchrun processes could not be made one MPI job (the cause and the fix)."""


def wanted(size: int) -> bool:
    """Whether this process must join the others before MPI_Init: more than one rank, no
    MPI launcher around it, and libddl (hence MPI) not initialised yet. One rank needs
    nothing: a singleton is the whole job."""
    from _ddl_core_torch_plugin import under_mpi

    from ddl_core import _ddl

    return size > 1 and not under_mpi() and not _ddl.initialized()


def join(store: Any, rank: int, size: int, timeout: timedelta | None = None) -> None:
    """Join the job (collective over the `size` ranks sharing `store`); on return this
    process's environment names its rank in one MPI job and MPI_Init may run. Raises
    JoinError on every rank if the job cannot be made."""
    global KEY
    # torchrun's agent store outlives a restart: each attempt's keys apart, or a restarted
    # rank could read the last attempt's directory before rank 0 has written the new one
    KEY = (f"{_BASE}{os.environ.get('TORCHELASTIC_RUN_ID', '')}/"
           f"{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/")
    wait_s = timeout.total_seconds() if timeout else 600.0
    wait_s = min(wait_s, env_number("DDL_TORCHRUN_JOIN_TIMEOUT", 1, 86400, 600))
    store.set(f"{KEY}host/{rank}", f"{socket.gethostname()} {len(os.sched_getaffinity(0))}")
    if rank == 0:
        _launch(store, size, wait_s)
    path = _wait_key(store, "dir", wait_s).decode()
    _standin.private_dir(path)
    _write_atomic(Path(path) / f"pid.{rank}", f"{os.getpid()} {_standin.start_time(os.getpid())}")
    env_file = Path(path) / f"env.{rank}"
    deadline = time.monotonic() + wait_s
    try:
        while not env_file.exists():
            _raise_if_failed(store)
            if time.monotonic() > deadline:
                raise JoinError(f"rank {rank}: mpirun's stand-in of this rank did not start "
                                f"on {socket.gethostname()} within {wait_s:g} s (see rank 0's "
                                "error, or set DDL_TORCHRUN_JOIN_TIMEOUT)")
            time.sleep(0.02)
    except BaseException:
        _standin.remove(path, str(rank))  # (no stand-in will: leave nothing)
        raise
    for line in env_file.read_text().splitlines():
        name, _, value = line.partition("=")
        if name == _standin.CPUS:
            bind(value)
        else:
            os.environ[name] = value
    _share_memory_dir(_wait_key(store, "shm", wait_s).decode())
    store.add(f"{KEY}joined", 1)


def _share_memory_dir(token: str) -> None:
    """Open MPI's shared-memory segments of this job in a directory of its own on each
    host (ddl_core.jobshm, as ddlrun's jobs): torchrun's workers are not mpirun's
    processes, so nothing removed their segments from /dev/shm when a worker was killed
    (an elastic restart, a SIGKILL of the group). Each worker holds the directory while it
    lives; the last to exit removes it, and after a SIGKILL the next run reclaims it."""
    env = {jobshm.ENV: token, **({jobshm.MCA: os.environ[jobshm.MCA]}
                                  if jobshm.MCA in os.environ else {})}
    joined = jobshm.for_rank(env)
    if joined is not None:
        os.environ[jobshm.MCA] = joined[0]
        atexit.register(jobshm.rank_done, joined)


def bind(cpus_text: str) -> None:
    """Take the cores mpirun bound this rank's stand-in to (its default: a core per rank
    for 2 ranks a host, as under ddlrun), on every thread this process has so far; later
    threads inherit it. Why: the 2-rank DDP example ran at 0.3x the images/s unbound
    (ranks and their threads migrating between the cores). Left alone where the process
    was already confined to fewer cores (numactl, taskset, a launcher's own binding)."""
    if not cpus_text or not hasattr(os, "sched_setaffinity"):
        return
    cpus = {int(c) for c in cpus_text.split(",")}
    have = os.sched_getaffinity(0)
    if not cpus < have:
        return
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        try:
            os.sched_setaffinity(tid, cpus)
        except OSError:
            pass  # (a thread that has just ended)


def _launch(store: Any, size: int, wait_s: float) -> None:
    """Rank 0: start mpirun with the stand-ins on the ranks' hosts, in RANK order."""
    from ddl_core.launchenv import NOT_FOUND, find_mpirun, launch_environ

    rows = [_wait_key(store, f"host/{r}", wait_s).decode().rsplit(" ", 1) for r in range(size)]
    hosts = [h for h, _ in rows]
    spec = host_spec(hosts)
    cores = {h: int(n) for h, n in rows}
    # mpirun's default binding (a core per rank for up to 2 ranks a host, else a package)
    # unless a host has more ranks than cores, which mpirun would refuse to bind
    binding = ([] if all(hosts.count(h) <= n for h, n in cores.items())
               else ["--bind-to", "none"])
    path = os.path.join(tempfile.gettempdir(), f"ddl-torchrun-{os.getuid()}-{secrets.token_hex(8)}")
    mpirun = find_mpirun()
    if mpirun is None:
        _fail(store, f"the ddl backend under torchrun needs Open MPI's mpirun: {NOT_FOUND}")
    cmd = [mpirun, "-n", str(size), "--host", spec, "--map-by", "slot", *binding,
           *shlex.split(os.environ.get("DDL_TORCHRUN_MPIRUN_ARGS", "")),
           sys.executable, "-S", str(STANDIN), path, str(wait_s)]
    log = tempfile.TemporaryFile(mode="w+")
    env = launch_environ(dict(os.environ))
    # torchrun's per-worker variables are this rank's, not the stand-ins'
    for name in ("RANK", "LOCAL_RANK", "GROUP_RANK", "ROLE_RANK"):
        env.pop(name, None)
    try:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
    except OSError as exc:
        _fail(store, f"cannot run {mpirun}: {exc}")
    threading.Thread(target=_watch, args=(proc, log, store, cmd), daemon=True,
                     name="ddl-torchrun-mpirun").start()
    store.set(f"{KEY}shm", secrets.token_hex(jobshm.TOKEN_LEN // 2))
    store.set(f"{KEY}dir", path)


def host_spec(hosts: list[str]) -> str:
    """mpirun's --host for ranks on these hosts (one per rank, in RANK order): runs of one
    host, so that --map-by slot gives rank r to hosts[r]. torchrun numbers the workers of a
    node contiguously; a host in two separate runs could not keep RANK order."""
    runs: list[list[Any]] = []
    for h in hosts:
        if runs and runs[-1][0] == h:
            runs[-1][1] += 1
        elif any(r[0] == h for r in runs):
            raise JoinError(f"the ranks of host {h} are not contiguous ({hosts}): the ddl "
                            "backend under torchrun needs each node's ranks numbered in one "
                            "run, as torchrun numbers them")
        else:
            runs.append([h, 1])
    return ",".join(f"{h}:{n}" for h, n in runs)


def _watch(proc: subprocess.Popen[bytes], log: Any, store: Any, cmd: list[str]) -> None:
    """Reap mpirun; if it ends before every rank has joined, tell them why (its output)."""
    rc = proc.wait()
    try:
        joined = int(store.add(f"{KEY}joined", 0))
        size = int(cmd[2])
        if joined < size:
            log.seek(0)
            tail = log.read()[-3000:]
            store.set(f"{KEY}error", f"mpirun (which makes the torchrun processes one MPI job) "
                      f"exited with status {rc} before all ranks had joined: "
                      f"{shlex.join(cmd)}\n{tail}")
    except Exception:  # noqa: BLE001 - the store is gone with the job: nothing to tell
        pass
    finally:
        log.close()


def _fail(store: Any, message: str) -> NoReturn:
    store.set(f"{KEY}error", message)
    raise JoinError(message)


def _raise_if_failed(store: Any) -> None:
    if store.check([f"{KEY}error"]):
        raise JoinError(store.get(f"{KEY}error").decode())


def _wait_key(store: Any, name: str, wait_s: float) -> bytes:
    """A store value, polled so that rank 0's error (set instead) ends the wait at once."""
    deadline = time.monotonic() + wait_s
    while not store.check([KEY + name]):
        _raise_if_failed(store)
        if time.monotonic() > deadline:
            raise JoinError(f"the ddl backend's torchrun join: no {name!r} from rank 0 "
                            f"within {wait_s:g} s")
        time.sleep(0.01)
    return store.get(KEY + name)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name("." + path.name)
    tmp.write_text(text)
    os.replace(tmp, path)

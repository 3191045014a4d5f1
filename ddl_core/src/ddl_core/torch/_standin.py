"""The stand-in that mpirun starts for one rank of a torchrun job (see torchrun_join.py).

Run as a script with the standard library only (`python -S _standin.py DIR`): it must start
in milliseconds and must not import torch or libddl. mpirun's PMIx server has registered
this process's rank; the stand-in hands that identity (its PMIX_*, OMPI_*, PRTE_*, OPAL_*
variables, and the cores mpirun bound it to) to the torchrun process of the same rank on
this host, which connects to the
server as that rank before its MPI_Init. Then it waits while that process lives, so the
job (and mpirun) ends when the last rank's process ends, whatever ends it: a stand-in never
outlives its rank by more than a poll interval.

Files, all in DIR (made private to this user, 0700): `pid.RANK` (written by the torchrun
process: its pid and start time), `env.RANK` (written here, renamed into place whole).
"""

from __future__ import annotations

import os
import signal
import stat
import sys
import time

PREFIXES = ("PMIX_", "OMPI_", "PRTE_", "OPAL_")
CPUS = "DDL_STANDIN_CPUS"
POLL_S = 0.2


def private_dir(path: str) -> None:
    """Make DIR (0700) or accept it only if it is a real directory of this user that no one
    else can write: another user's directory there could feed this rank a false identity."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    st = os.lstat(path)
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid()
            or st.st_mode & (stat.S_IWGRP | stat.S_IWOTH)):
        raise SystemExit(f"ddl stand-in: {path} is not a private directory of this user")


def start_time(pid: int) -> str | None:
    """The process's start time (field 22 of /proc/PID/stat), so a recycled pid is not
    taken for the rank's process; None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def main(argv: list[str]) -> int:
    path = argv[1]
    rank = os.environ["PMIX_RANK"]
    wait_s = float(argv[2]) if len(argv) > 2 else 600.0
    private_dir(path)
    pid_file = os.path.join(path, f"pid.{rank}")
    deadline = time.monotonic() + wait_s
    while not os.path.exists(pid_file):
        if time.monotonic() > deadline:
            print(f"ddl stand-in of rank {rank}: its torchrun process did not appear within "
                  f"{wait_s:g} s", file=sys.stderr)
            return 1
        time.sleep(0.02)
    with open(pid_file) as f:
        pid_text, started = f.read().split()
    pid = int(pid_text)
    env = "".join(f"{k}={v}\n" for k, v in os.environ.items()
                  if k.startswith(PREFIXES) and "\n" not in v)
    # the cores mpirun bound this rank to, which its process takes too (see torchrun_join)
    env += CPUS + "=" + ",".join(str(c) for c in sorted(os.sched_getaffinity(0))) + "\n"
    tmp = os.path.join(path, f".env.{rank}")
    # mpirun ends its stand-ins with SIGTERM (torchrun stopping rank 0's process group):
    # the files go with them all the same
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _exit_on_signal)
    try:
        with open(tmp, "w") as f:
            f.write(env)
        os.rename(tmp, os.path.join(path, f"env.{rank}"))
        while start_time(pid) == started:
            time.sleep(POLL_S)
    finally:
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(sig, signal.SIG_IGN)  # (a second SIGTERM must not cut this short)
        remove(path, rank)
    return 0


def _exit_on_signal(signum: int, frame: object) -> None:  # noqa: ARG001
    raise SystemExit(128 + signum)


def remove(path: str, rank: str) -> None:
    """This rank's files, and the directory once it is empty (the last rank on the host)."""
    for name in (f"pid.{rank}", f".pid.{rank}", f"env.{rank}", f".env.{rank}"):
        try:
            os.unlink(os.path.join(path, name))
        except OSError:
            pass
    try:
        os.rmdir(path)
    except OSError:
        pass


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""The host check before a launch: does each host answer, and what does it hold.

Why: mpirun given a host it cannot reach waits on ssh and its daemons for minutes, and
then says little about which host was at fault. Here every host is asked once, in
parallel and within seconds, the way mpirun will reach it (ssh, or the --launch-agent
command that replaces ssh), and answers with its GPUs (ranks per host by default) and
its CPUs (so a rankfile's slots wrap around the cores the host has).
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import shlex
import shutil
import socket
import subprocess
from collections.abc import Callable
from dataclasses import dataclass

from .hosts import LaunchError, is_local

# Run on each host; prints `nvidia-smi -L`'s lines and its online CPUs.
PROBE = "nvidia-smi -L 2>/dev/null; echo DDL_CPUS $(getconf _NPROCESSORS_ONLN 2>/dev/null); true"


@dataclass(frozen=True)
class HostInfo:
    """What a host check found: its GPUs (0 where none or no driver), its CPUs (None
    where the host did not say)."""

    gpus: int
    cpus: int | None = None


def read_probe(output: str) -> HostInfo:
    gpus = sum(1 for line in output.splitlines() if line.startswith("GPU "))
    m = re.search(r"^DDL_CPUS (\d+)\s*$", output, re.M)
    return HostInfo(gpus, int(m.group(1)) if m and int(m.group(1)) > 0 else None)


def local_gpus() -> int:
    """GPUs on this machine (`nvidia-smi -L`), 0 where there is none or no driver."""
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=15).stdout
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return read_probe(out).gpus


def agent_argv(agent: str) -> list[str]:
    """The launch agent as an argv, checked: its first word must be a program here."""
    argv = shlex.split(agent)
    if not argv or not shutil.which(argv[0]):
        raise LaunchError(f"--launch-agent {agent!r}: no such program (give the path of an "
                          "executable called as `AGENT HOST COMMAND`, as ssh is)")
    return argv


def _resolve(host: str, timeout: float) -> None:
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        pool.submit(socket.getaddrinfo, host, None).result(timeout=timeout)
    except concurrent.futures.TimeoutError:
        raise LaunchError(f"host {host}: its name did not resolve within {timeout:.0f} s "
                          "(DNS unreachable?)") from None
    except socket.gaierror as e:
        raise LaunchError(f"host {host}: unknown host, its name does not resolve ({e.strerror})"
                          ": check the spelling, or add it to /etc/hosts") from None
    finally:
        pool.shutdown(wait=False)


def probe_host(host: str, timeout: float = 8.0, agent: str | None = None) -> HostInfo:
    """Check that `host` answers, within seconds, as mpirun will reach it: through
    `agent` (called as `AGENT HOST COMMAND`; the agent knows how the name is reached, so
    it is not resolved here), else over ssh after resolving the name."""
    if is_local(host):
        return HostInfo(local_gpus(), os.cpu_count())
    if agent:
        cmd, how = [*agent_argv(agent), host, PROBE], f"through the launch agent {agent}"
    else:
        _resolve(host, timeout)
        ssh = shutil.which("ssh")
        if not ssh:
            return HostInfo(0)  # the launcher has its own way in (a resource manager)
        cmd = [ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout) - 2)}",
               "-o", "StrictHostKeyChecking=accept-new", host, PROBE]
        how = "over ssh"
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise LaunchError(f"host {host}: no answer {how} within {timeout:.0f} s (down, or a "
                          "firewall?)") from None
    if proc.returncode != 0:
        err = proc.stderr.strip().splitlines()
        need = "mpirun needs passwordless ssh to every host" if not agent else \
            "mpirun starts its daemons through it"
        raise LaunchError(f"host {host}: not reachable {how} ({err[-1] if err else 'exit '}"
                          f"{'' if err else proc.returncode}); {need}")
    return read_probe(proc.stdout)


def check_hosts(hosts: list[str], probe: Callable[[str], HostInfo] = probe_host,
                workers: int = 32) -> dict[str, HostInfo]:
    """Probe every host in parallel (a 954-node list takes seconds, not minutes); the
    first failure, in host order, is raised."""
    uniq = list(dict.fromkeys(hosts))
    with concurrent.futures.ThreadPoolExecutor(min(workers, max(1, len(uniq)))) as pool:
        futs = {h: pool.submit(probe, h) for h in uniq}
        errors = []
        found = {}
        for h, f in futs.items():
            try:
                found[h] = f.result()
            except LaunchError as e:
                errors.append(str(e))
    if errors:
        more = f" (and {len(errors) - 1} more host(s) failed)" if len(errors) > 1 else ""
        raise LaunchError(errors[0] + more)
    return found

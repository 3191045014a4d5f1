"""Host names as ddlrun takes them: -H lists, hostfiles, and which names mean this machine.

The bottom of runner/: every other module here may import it, it imports none of them.
Names are checked against HOST_RE before anything uses them, so no host name from a
command line, a hostfile or a Slurm host list reaches a shell or a launcher unchecked.
"""

from __future__ import annotations

import re
import socket
from dataclasses import dataclass
from pathlib import Path

HOST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-]{0,252})?$")
LOCAL_NAMES = {"localhost", "127.0.0.1", "::1"}


class LaunchError(Exception):
    """A launch that cannot work, with the reason and the fix."""


@dataclass
class Host:
    name: str
    slots: int | None = None


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


def is_local(host: str) -> bool:
    return host in LOCAL_NAMES or host in {socket.gethostname(), socket.getfqdn()}

"""This host's IPv4 addresses, for the TCP endpoints that ranks on other hosts must reach
(torch's store on rank 0, ddlrun's exit-status collector).

Which address a peer can use is not knowable here (several interfaces, network
namespaces, the same docker bridge address on every host), so callers publish all of them,
the resolvable ones first and loopback last, and peers try each in turn.
"""

from __future__ import annotations

import socket


def local_addresses() -> list[str]:
    """This host's IPv4 addresses, the resolvable ones first, loopback last."""
    addrs: list[str] = []
    try:
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            addrs.append(str(info[4][0]))
    except OSError:
        pass
    try:  # every local address, also in network namespaces without a hosts entry
        with open("/proc/net/fib_trie") as fh:
            lines = fh.read().splitlines()
        for prev, line in zip(lines, lines[1:], strict=False):
            if "/32 host LOCAL" in line:
                addrs.append(prev.split()[-1])
    except OSError:
        pass
    seen = [a for i, a in enumerate(addrs) if a not in addrs[:i] and not a.startswith("127.")]
    return seen + ["127.0.0.1"]

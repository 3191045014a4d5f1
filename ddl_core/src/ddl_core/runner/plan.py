"""A launch plan: what ddlrun was asked for, and the placement decided from it.

Placement is decided here, once, for every launcher: consecutive ranks share a host
(rank r on host r // ranks per host), so DDL's rank grid (ranks per host x hosts
[x racks]) matches where ranks really run. The launcher modules turn a plan into an
argv; nothing here touches the network.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .hosts import Host, LaunchError, parse_hostfile

if TYPE_CHECKING:
    from .slurmalloc import Allocation

# What ranks on other hosts need to find the same Python and libraries.
FORWARDED_ALWAYS = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "VIRTUAL_ENV", "CONDA_PREFIX")


@dataclass
class Plan:
    command: list[str]
    np: int | None = None
    hosts: list[Host] = field(default_factory=list)
    hostfile: str | None = None
    topology: str | None = None
    forward: list[str] = field(default_factory=list)  # -x VAR or VAR=value
    extra: list[str] = field(default_factory=list)  # passed to the launcher as they are
    accelerators: int | None = None  # ranks per host
    racks: int | None = None  # hosts are grouped into this many racks, consecutively
    # the command mpirun reaches the hosts with instead of ssh (--launch-agent)
    launch_agent: str | None = None
    allocation: Allocation | None = None  # the Slurm allocation ddlrun runs in
    oversubscribe: bool = False  # more ranks than the hosts' slots: spread them evenly
    # (host, ranks) in rank order, decided by place(); None: leave it to the launcher
    placement: list[tuple[str, int]] | None = None
    # CPUs per host where the host check found them: a rankfile's slots wrap around them
    host_cpus: dict[str, int] = field(default_factory=dict)
    # ddlrun --elastic: survivors of a lost rank go on (ULFM; srun --no-kill)
    elastic: bool = False


def plan_hosts(plan: Plan) -> list[Host]:
    """The hosts of -H, else of the hostfile, else none."""
    return plan.hosts or (parse_hostfile(plan.hostfile) if plan.hostfile else [])


def total_slots(plan: Plan) -> int | None:
    hosts = plan_hosts(plan)
    if not hosts or any(h.slots is None for h in hosts):
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


def place(plan: Plan, gpus: dict[str, int] | None = None) -> list[tuple[str, int]]:
    """(host, ranks) in rank order: consecutive ranks share a host.

    Ranks per host: --accelerators, else the GPUs found on the host, else its slots, else
    -n spread evenly (block), else 1. -n then takes the first ranks in that order."""
    hosts = plan_hosts(plan)
    if not hosts:
        return []
    gpus = gpus or {}
    per: list[int] = []
    for h in hosts:
        if plan.accelerators:
            per.append(plan.accelerators)
        elif gpus.get(h.name):
            per.append(gpus[h.name])
        elif h.slots:
            per.append(h.slots)
        elif plan.np:
            per.append(-(-plan.np // len(hosts)))
        else:
            per.append(1)
    if plan.accelerators is not None and plan.accelerators < 1:
        raise LaunchError(f"--accelerators {plan.accelerators}: at least 1 rank per host")
    total = sum(per)
    np_ = plan.np or total
    if np_ > total and plan.oversubscribe:
        per = [max(p, -(-np_ // len(hosts))) for p in per]
        total = sum(per)
    if np_ > total:
        raise LaunchError(f"-n {np_} ranks, but the hosts hold {total} "
                          f"({', '.join(f'{h.name}:{p}' for h, p in zip(hosts, per, strict=True))})"
                          ": raise --accelerators or the slots, lower -n, or add "
                          "--oversubscribe")
    out, left = [], np_
    for h, p in zip(hosts, per, strict=True):
        if left <= 0:
            break
        out.append((h.name, min(p, left)))
        left -= p
    return out


def grid_for(placement: list[tuple[str, int]], racks: int | None) -> str | None:
    """The DDL_TOPOLOGY grid (innermost first) a placement makes, or None where hosts
    hold different numbers of ranks (libddl then runs flat)."""
    counts = {n for _, n in placement}
    if len(counts) != 1:
        if racks:
            raise LaunchError("--racks needs the same number of ranks on every host: "
                              f"the placement is {placement}")
        return None
    r, h = counts.pop(), len(placement)
    if not racks:
        return f"{r}x{h}"
    if racks < 1 or h % racks:
        raise LaunchError(f"--racks {racks}: {h} hosts cannot be split into {racks} racks of "
                          "equal size (hosts are grouped in the order given)")
    return f"{r}x{h // racks}x{racks}"

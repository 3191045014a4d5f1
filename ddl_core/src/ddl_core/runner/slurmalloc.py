"""The Slurm allocation ddlrun runs in: its nodes and how many tasks each holds.

Why: inside `salloc` or an `sbatch` script, Slurm has already decided where the job
runs, and says so in the environment (SLURM_JOB_NODELIST as a compressed host list,
SLURM_TASKS_PER_NODE as run-length counts). ddlrun reads the layout from there, so the
ranks, the placement and the topology come from the allocation with no -H or -n.

Formats, as Slurm documents them (and `scontrol show hostnames` expands them):
  host lists   node[1-3,5]  ->  node1 node2 node3 node5; zero padding kept (n[08-10]);
               several bracket groups in one name multiply (r[1-2]n[1-2] -> 4 hosts);
               names are separated by commas outside brackets.
  task counts  2(x3),1      ->  2 2 2 1
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .hosts import HOST_RE, LaunchError

_COUNT = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


@dataclass
class Allocation:
    job_id: str
    nodes: list[tuple[str, int]]  # (node, tasks) in Slurm's order

    @property
    def ntasks(self) -> int:
        return sum(n for _, n in self.nodes)


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise ValueError("'[' without ']'")
    out.append("".join(cur))
    return [s for s in (x.strip() for x in out) if s]


def _range(item: str) -> list[str]:
    lo, dash, hi = item.partition("-")
    if not lo.isdigit() or (dash and not hi.isdigit()):
        raise ValueError(f"{item!r} is not a number or a range of numbers")
    if not dash:
        return [lo]
    a, b = int(lo), int(hi)
    if b < a:
        raise ValueError(f"range {item!r} runs backwards")
    if b - a >= 100000:
        raise ValueError(f"range {item!r} is too large")
    width = len(lo) if lo.startswith("0") and len(lo) > 1 else 0
    return [str(i).zfill(width) for i in range(a, b + 1)]


def expand_hostlist(text: str) -> list[str]:
    """'node[1-3,5],gpu01' -> ['node1', 'node2', 'node3', 'node5', 'gpu01']."""
    hosts: list[str] = []
    try:
        for part in _split_top(text):
            names = [""]
            for lit, body in re.findall(r"([^\[]*)(?:\[([^\]]*)\])?", part):
                choices = [lit]
                if body:
                    choices = [lit + v for item in body.split(",") for v in _range(item.strip())]
                names = [n + c for n in names for c in choices]
            hosts.extend(names)
    except ValueError as e:
        raise LaunchError(f"cannot read the Slurm host list {text!r}: {e}") from None
    bad = [h for h in hosts if not HOST_RE.match(h)]
    if bad:
        raise LaunchError(f"the Slurm host list {text!r} holds {bad[0]!r}, which is not a "
                          "valid host name")
    return hosts


def expand_counts(text: str) -> list[int]:
    """'2(x3),1' -> [2, 2, 2, 1] (SLURM_TASKS_PER_NODE, SLURM_JOB_CPUS_PER_NODE)."""
    out: list[int] = []
    for item in filter(None, (s.strip() for s in text.split(","))):
        m = _COUNT.match(item)
        if not m:
            raise LaunchError(f"cannot read the Slurm task counts {text!r}: {item!r} is not "
                              "N or N(xM)")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out


def in_allocation(environ: dict[str, str]) -> bool:
    return bool(environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID"))


def allocation(environ: dict[str, str]) -> Allocation:
    """The allocation this process runs in, from Slurm's environment variables."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        raise LaunchError("not inside a Slurm allocation (SLURM_JOB_ID is not set): run "
                          "ddlrun inside `salloc -N 2 -n 8 ddlrun ...` or an sbatch script, "
                          "or use --launcher mpirun")
    nodelist = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    if not nodelist:
        raise LaunchError(f"Slurm job {job}: SLURM_JOB_NODELIST is not set, so the "
                          "allocation's nodes are unknown (run ddlrun from the job's own "
                          "shell or batch script, not from a stripped environment)")
    nodes = expand_hostlist(nodelist)
    counts_text = environ.get("SLURM_TASKS_PER_NODE") or environ.get("SLURM_JOB_CPUS_PER_NODE")
    counts = expand_counts(counts_text) if counts_text else [1] * len(nodes)
    if len(counts) != len(nodes):
        raise LaunchError(f"Slurm job {job}: SLURM_TASKS_PER_NODE={counts_text!r} gives "
                          f"{len(counts)} counts for {len(nodes)} nodes ({nodelist})")
    return Allocation(job_id=job, nodes=list(zip(nodes, counts, strict=True)))

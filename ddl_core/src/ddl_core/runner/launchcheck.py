"""What ddlrun refuses before it launches anything: impossible sizes and bad DDL_* values.

Why here and not in the ranks: a job of 0 or -1 ranks, a grid that does not multiply to
the number of ranks, or a DDL_TIMEOUT of "nan" fails every rank later (or, worse, runs:
`-n 0` used to start one rank and exit 0); refused here it costs nothing and says which
option to fix. Numbers are read by libddl's own rule (ddl_core.settings), so what ddlrun
accepts is what every rank accepts. Errors are argparse-style usage errors: exit 2.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping

from .. import _ddl
from ..settings import check, number
from .hosts import LaunchError
from .plan import Plan, env_to_forward, total_slots

MAX_RANKS = 1 << 24


def count_type(option: str, lo: int = 1, hi: int = MAX_RANKS) -> Callable[[str], int]:
    """An argparse `type` for a count option: an integer in [lo, hi], else a usage error
    naming the option and the range."""

    def parse(text: str) -> int:
        try:
            return int(number(option, text, lo, hi, integer=True))
        except _ddl.InvalidArgumentError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = option  # argparse names the type in some messages
    return parse


def launched_ranks(plan: Plan, launcher: str) -> int | None:
    """How many ranks this plan starts, where ddlrun decides it (None: the resource
    manager's allocation does)."""
    if plan.np:
        return plan.np
    if plan.placement:
        return sum(n for _, n in plan.placement)
    if launcher == "mpirun" and not plan.hosts and not plan.hostfile:
        return 1
    return total_slots(plan)


def forwarded_settings(plan: Plan, environ: Mapping[str, str]) -> dict[str, str]:
    """The DDL_* values every rank will see: -x VAR=value, --topology, then ddlrun's own
    environment."""
    out = {}
    for name, value in env_to_forward(plan, environ):
        if not name.startswith("DDL_"):
            continue
        if value is None:
            value = environ.get(name)
        if value is not None:
            out[name] = value
    return out


def check_plan(plan: Plan, launcher: str, environ: Mapping[str, str]) -> None:
    """Raise LaunchError for a bad DDL_* value or a grid that does not fit the ranks."""
    settings = forwarded_settings(plan, environ)
    for name in sorted(settings):
        try:
            check(name, settings[name])
        except _ddl.InvalidArgumentError as e:
            origin = "--topology" if name == "DDL_TOPOLOGY" and plan.topology else \
                "-x" if any(f.partition("=")[0] == name for f in plan.forward) else \
                "ddlrun's environment"
            raise LaunchError(f"{e} (from {origin})") from None
    grid = settings.get("DDL_TOPOLOGY")
    ranks = launched_ranks(plan, launcher)
    if not grid or ranks is None:  # set but empty: unset, as libddl reads it
        return
    want = int(check("DDL_TOPOLOGY", grid) or 0)
    if want != ranks:
        given = f"--topology {grid}" if plan.topology else f"DDL_TOPOLOGY={grid}"
        how = (f"-n {ranks}" if plan.np else "from the hosts' slots" if plan.hosts or
               plan.hostfile else "the default without -n or hosts")
        raise LaunchError(f"{given} describes {want} ranks but ddlrun starts {ranks} ({how}): "
                          f"make the levels multiply to the number of ranks, or give -n {want}")

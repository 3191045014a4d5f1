"""A change (envtools add or drop) that did not finish: the env is half-changed until it
is recovered."""

from __future__ import annotations

from envtools.prefix.txn import TXN, describe
from envtools.validate.findings import Context


def check_interrupted(ctx: Context) -> None:
    """An ``envtools add``/``drop`` killed before it finished (envtools.prefix.txn): the env may
    be half-changed until the next add or drop rolls it back."""

    root = ctx.prefix.root
    if (root / TXN).exists():
        ctx.add("interrupted-change", "error", describe(root), paths=[str(TXN)],
                hint=f"roll it back (or finish it): envtools drop {root} (with no package)")

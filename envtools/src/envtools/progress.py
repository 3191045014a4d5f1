"""Rich progress on stderr, so long work shows it while stdout stays clean for --json."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)

console = Console(stderr=True)


def _quiet() -> bool:
    return not sys.stderr.isatty()


@contextmanager
def task(description: str, total: int | None) -> Iterator[callable]:
    """Yield an ``advance(n=1)`` callable backed by a progress bar (silent when not a tty)."""
    if _quiet():
        yield lambda n=1: None
        return
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as prog:
        tid = prog.add_task(description, total=total)
        yield lambda n=1: prog.advance(tid, n)


def info(msg: str) -> None:
    console.print(msg, highlight=False, soft_wrap=True)

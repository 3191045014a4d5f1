"""Progress and messages on stderr, so long work shows it while stdout stays clean for --json.

rich is imported only when a person is watching (stderr is a terminal): it costs ~25 ms
to import, a tenth of a whole clone. Piped or logged, messages go out as plain lines
with our few markup tags stripped, which is what rich would print there too.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from envtools.errors import EnvtoolsError

# the only markup envtools writes: [bold], [bold red], [yellow], [red], [green], [/] ...
_TAGS = re.compile(r"\[/?(?:bold|dim|italic|red|green|yellow|blue|cyan|magenta| )*\]")
_console: Any = None


def get_console() -> Any:
    """The shared rich Console on stderr (created, and rich imported, on first use)."""
    global _console
    if _console is None:
        from rich.console import Console

        _console = Console(stderr=True)
    return _console


def _quiet() -> bool:
    return not sys.stderr.isatty()


@contextmanager
def task(description: str, total: int | None) -> Iterator[callable]:
    """Yield an ``advance(n=1)`` callable backed by a progress bar (silent when not a tty)."""
    if _quiet():
        yield lambda n=1: None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=get_console(),
        transient=True,
    ) as prog:
        tid = prog.add_task(description, total=total)
        yield lambda n=1: prog.advance(tid, n)


def info(msg: str, text: str = "") -> None:
    """One message for the person running the command: ``msg`` with markup, then ``text``
    printed as it is (paths and names from data may hold anything, brackets included)."""
    if _quiet():
        sys.stderr.write(_TAGS.sub("", msg) + text + "\n")
        sys.stderr.flush()
        return
    if text:
        from rich.markup import escape

        msg += escape(text)
    try:
        get_console().print(msg, highlight=False, soft_wrap=True)
    except Exception:  # noqa: BLE001 - a path with "[/x]" in it is not markup: print plain
        sys.stderr.write(_TAGS.sub("", msg) + "\n")
        sys.stderr.flush()


def report_error(e: EnvtoolsError) -> int:
    """One error line and its hint (printed as text: they may quote paths and data);
    returns the exit status the error carries."""
    info("[bold red]error:[/] ", e.message)
    if e.hint:
        info("[bold]hint:[/] ", e.hint)
    return e.exit_code


def exit_flushed(code: int) -> None:
    """Flush and leave without interpreter finalization.

    py-rattler's runtime threads can abort the process while Python finalizes after a
    solve/install ("PyGILState_Release ... must be current"), turning a finished,
    successful command into exit -6. All our work is done and flushed by now.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

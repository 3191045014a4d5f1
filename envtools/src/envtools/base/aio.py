"""Running py-rattler's coroutines.

py-rattler's work runs on Rust threads that hand each result back to the Python event
loop with ``call_soon_threadsafe``. When one of several concurrent tasks fails (a full
disk, a damaged archive), the awaited coroutine raises at once while the others are still
running; ``asyncio.run`` then closes the loop, and each late result makes its Rust thread
print a "RuntimeError: Event loop is closed" traceback next to envtools' one error line.
So the loop is closed only after a success: after a failure it is left open (it holds
nothing but a self-pipe) so that late results land in it unnoticed.

asyncio is imported when a coroutine is run, not with this module: a clone imports
``adding`` (for ``--add``) and would otherwise pay ~30 ms of start-up for nothing.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    import asyncio

T = TypeVar("T")


def run(coro: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(coro)``, except that a failure leaves the loop open (see above)."""
    import asyncio

    loop = asyncio.new_event_loop()
    ok = False
    try:
        result = loop.run_until_complete(coro)
        ok = True
        return result
    finally:
        try:
            _finish(loop)
        finally:
            if ok:
                loop.close()


def _finish(loop: asyncio.AbstractEventLoop) -> None:
    """As asyncio.run ends: cancel the Python tasks still pending (a failed gather leaves
    its other tasks running) and let them unwind, then close the async generators."""
    import asyncio

    tasks = asyncio.all_tasks(loop)
    for task in tasks:
        task.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
    loop.run_until_complete(loop.shutdown_asyncgens())

"""Completing torch futures from DDL handles.

torch.distributed (DDP's reducer, comm hooks, `Work.get_future()`) wants a
`torch.futures.Future` that becomes ready when a collective finishes; libddl signals
completion through a request that must be waited on. One daemon thread per process waits
on the requests in submission order (libddl's progress thread also runs them in that
order, so nothing behind a finished request waits for a slower one) and completes the
futures; the training thread never blocks on communication it has not asked for.

Only this thread waits on a request: two threads waiting on one libddl request would race
on freeing it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch

_Item = tuple[Sequence[Any], "torch.futures.Future[Any]", Any, "Callable[[], None] | None"]


class Completer:
    """Waits on DDL handles in FIFO order and completes the matching torch futures."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ddl-completer",
                                                daemon=True)
                self._thread.start()

    def submit(self, handles: Sequence[Any], value: Any,
               post: Callable[[], None] | None = None) -> torch.futures.Future[Any]:
        """A future that gets `value` once every handle is done and `post()` has run
        (post copies results back into tensors that could not be used in place)."""
        fut: torch.futures.Future[Any] = torch.futures.Future()
        if not handles:
            if post is not None:
                post()
            fut.set_result(value)
            return fut
        self._start()
        self._q.put((handles, fut, value, post))
        return fut

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            handles, fut, value, post = item
            try:
                for h in handles:
                    h.wait()
                if post is not None:
                    post()
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits
                fut.set_exception(exc)
                continue
            fut.set_result(value)


COMPLETER = Completer()


def completed(value: Any) -> torch.futures.Future[Any]:
    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(value)
    return fut

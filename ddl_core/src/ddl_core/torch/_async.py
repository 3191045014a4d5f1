"""Completing torch futures from DDL handles.

torch.distributed (DDP's reducer, comm hooks, `Work.get_future()`) wants a
`torch.futures.Future` that becomes ready when a collective finishes; libddl signals
completion through a request that must be waited on. One daemon thread per process waits
on the requests in submission order (libddl's progress thread also runs them in that
order, so nothing behind a finished request waits for a slower one) and completes the
futures; the training thread never blocks on communication it has not asked for.

A failed collective must fail its future for C++ too. `Future.set_exception()` from Python
does not: it stores the exception as the future's *value* and raises it only when Python
unwraps it, so DDP's reducer, which reads the value in C++, took the exception object for
its gradient tensors and crashed (a segfault in Reducer::finalize_backward). So every
future handed out is the child of a private one, made with `then()`: the callback returns
the value or raises the error, and a callback that raises is how torch marks a future as
failed in C++ (`value()` throws; DDP's backward raises RuntimeError). The original
DDLError is kept in an Outcome so that `Work.wait()` and `Work.exception()` give it back
unchanged.

Only this thread waits on a request: two threads waiting on one libddl request would race
on freeing it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Sequence
from typing import Any

import torch


class Outcome:
    """How a collective ended: set once by the completer, read by DDLWork."""

    __slots__ = ("done", "error")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.error: BaseException | None = None


_Item = tuple[Sequence[Any], "torch.futures.Future[Any]", Any, "Callable[[], None] | None",
              Outcome]


def _unwrap(fut: torch.futures.Future[Any]) -> Any:
    error, value = fut.value()
    if error is not None:
        raise error
    return value


def _pair() -> tuple[torch.futures.Future[Any], torch.futures.Future[Any]]:
    """(the future the completer sets, the one handed out: it fails in C++ on error)."""
    inner: torch.futures.Future[Any] = torch.futures.Future()
    return inner, inner.then(_unwrap)


class Completer:
    """Waits on DDL handles in FIFO order and completes the matching torch futures."""

    def __init__(self) -> None:
        self._q: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending = 0  # submitted with handles, not finished yet
        self._idle = threading.Condition()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="ddl-completer",
                                                daemon=True)
                self._thread.start()

    def submit(self, handles: Sequence[Any], value: Any,
               post: Callable[[], None] | None = None
               ) -> tuple[torch.futures.Future[Any], Outcome]:
        """A future that gets `value` once every handle is done and `post()` has run
        (post copies results back into tensors that could not be used in place), or fails
        with the first error; and the Outcome that records it."""
        inner, fut = _pair()
        outcome = Outcome()
        if not handles:
            _finish(inner, outcome, value, post)
            return fut, outcome
        self._start()
        with self._idle:
            self._pending += 1
        self._q.put((handles, inner, value, post, outcome))
        return fut, outcome

    def busy(self) -> bool:
        """Whether work submitted here has not finished yet (a plain read: the count only
        goes up on the submitting thread, so a caller sees its own submissions)."""
        return self._pending > 0

    def drain(self) -> None:
        """Wait until everything submitted so far has finished (a blocking collective that
        runs on the calling thread goes after the queued ones, as torch orders a group's
        operations)."""
        with self._idle:
            while self._pending:
                self._idle.wait()

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            handles, inner, value, post, outcome = item
            _finish(inner, outcome, value, post, handles)
            with self._idle:
                self._pending -= 1
                if not self._pending:
                    self._idle.notify_all()


def _finish(inner: torch.futures.Future[Any], outcome: Outcome, value: Any,
            post: Callable[[], None] | None, handles: Sequence[Any] = ()) -> None:
    try:
        for h in handles:
            h.wait()
        if post is not None:
            post()
    except Exception as exc:  # noqa: BLE001 - handed to whoever waits
        outcome.error = exc
        inner.set_result((exc, None))
    else:
        inner.set_result((None, value))
    # Only now: set_result ran the then() callback, so the future handed out is complete
    # too when Work.wait() returns (its callers may look at get_future().done()).
    outcome.done.set()


COMPLETER = Completer()


def when_done(handle: Any, value: Any, post: Callable[[], None] | None = None
              ) -> tuple[torch.futures.Future[Any], Outcome]:
    """As Completer.submit for one handle that reports its own completion
    (add_done_callback: libddl's isend/irecv): outside the FIFO, so a receive that waits
    for its sender never holds up the collectives queued after it."""
    inner, fut = _pair()
    outcome = Outcome()
    handle.add_done_callback(lambda h: _finish(inner, outcome, value, post, (h,)))
    return fut, outcome


DONE = Outcome()
DONE.done.set()  # (shared by every Work that finished without error inside its call)


def completed(value: Any) -> tuple[torch.futures.Future[Any], Outcome]:
    """An already successful future (work that finished inside the call: nothing can fail
    any more, so no error pair to unwrap)."""
    fut: torch.futures.Future[Any] = torch.futures.Future()
    fut.set_result(value)
    return fut, DONE


def completed_on(stream: Any, value: Any) -> torch.futures.Future[Any]:
    """A successful future for work enqueued on a CUDA `stream`: a CUDA-aware future, set
    as if on that stream, so that whoever waits on it, or runs a callback after it (DDP's
    reducer), waits for the stream to get there, as with ProcessGroupNCCL's futures,
    without blocking the host."""
    fut: torch.futures.Future[Any] = torch.futures.Future(devices=[stream.device])
    with torch.cuda.stream(stream):
        fut.set_result(value)
    return fut

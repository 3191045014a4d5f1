"""What a non-blocking call returns: Handle (a collective on a communicator's queue),
P2PHandle (an isend/irecv), each a thin owner of libddl's request that keeps the user's
buffers alive until it finishes, as mpi4py's Request does.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from . import timeline
from ._buffers import as_buffer


class Handle:
    """An asynchronous collective: `wait()` returns its result, `test()` polls."""

    __slots__ = ("_req", "_result", "_keep", "_tl")

    def __init__(self, req: Any, result: Any, keep: Any) -> None:
        self._req = req
        self._result = result
        self._keep = keep  # the user's objects stay alive as long as the request
        self._tl: tuple[str, str, int] | None = None  # (row, kind, bytes) for the timeline

    def test(self) -> bool:
        done = self._req.test()
        if done and self._tl is not None:
            self._trace()
        return done

    def wait(self) -> Any:
        # (libddl's wait negotiates what is queued at once, on this thread when no other
        # is at it, rather than waiting out the cycle time for more to fuse: a 1 MiB
        # request waited 1 ms for nothing; requests submitted together still fuse.)
        self._req.wait()
        if self._tl is not None:
            self._trace()
        return self._result

    def _trace(self) -> None:
        tl, self._tl = self._tl, None  # (once, whichever of several waiters gets here)
        if tl is None:
            return
        row, kind, nbytes = tl
        timing = getattr(self._req, "timing", None)
        if timing is not None:
            timeline.request(row, kind, nbytes, timing())

    synchronize = wait
    poll = test


def traced(h: Handle, kind: str, name: str | None, buf: Any) -> Handle:
    """Mark h for the timeline (DDL_TIMELINE, ddl_core.timeline) when one is open."""
    if timeline.active:
        h._tl = (name or kind, kind, memoryview(buf).nbytes if buf is not None else 0)
    return h


class _Done:
    """The request of a GPU collective: already enqueued on its stream (NCCL) or finished
    (staged) when the call returned, so test() and wait() have nothing left to wait for."""

    def test(self) -> bool:
        return True

    def wait(self) -> None:
        return None


DONE = _Done()


def matching(on_gpu: bool, name: str | None, shape: Any) -> dict[str, Any]:
    """The matching keywords of a queued request (see Comm.allreduce_async); GPU arrays
    run at once in call order, so a name (which promises any order) cannot apply to them."""
    if name is not None or shape is not None:
        if on_gpu:
            raise ValueError("named asynchronous requests take host memory; a GPU array "
                             "runs at once, in call order: drop name= (and shape=)")
        if name is not None and not isinstance(name, str):
            raise TypeError(f"name must be a str, not {type(name).__name__}")
        return {"name": name or None, "shape": None if shape is None else tuple(shape)}
    return {}


class Gathered(Handle):
    """An allgatherv: the result is built from libddl's buffer once the request is done.
    rows_only: x's rows hold no elements, and one byte per row travelled instead (the
    element counts alone cannot say how many rows each rank had)."""

    __slots__ = ("_like", "_rows_only")

    def __init__(self, req: Any, x: Any, rows_only: bool = False) -> None:
        super().__init__(req, None, x)
        self._like = x
        self._rows_only = rows_only

    def wait(self) -> Any:
        self._req.wait()
        if self._tl is not None:
            self._trace()
        if self._result is None:
            data, counts = self._req.gathered()
            self._result = (_empty_rows(self._like, sum(counts)) if self._rows_only
                            else _from_bytes(self._like, data, sum(counts)))
        return self._result


def _empty_rows(like: Any, rows: int) -> Any:
    """`rows` rows shaped like like's, which hold no elements, of like's kind and dtype."""
    shape = (rows, *tuple(like.shape)[1:])
    if type(like).__module__.startswith("torch"):
        import torch

        return torch.empty(shape, dtype=like.dtype)
    return np.empty(shape, dtype=like.dtype)


def _from_bytes(like: Any, data: bytearray, count: int) -> Any:
    """`count` elements of like's dtype from `data`, shaped (-1, *like.shape[1:])."""
    shape = tuple(getattr(like, "shape", ()) or ())
    rows = (-1, *shape[1:]) if shape else (-1,)
    if type(like).__module__.startswith("torch"):
        import torch

        t = torch.frombuffer(data, dtype=like.dtype) if count else torch.empty(0, dtype=like.dtype)
        return t.reshape(rows)
    buf, _ = as_buffer(like)
    dtype = like.dtype if isinstance(like, np.ndarray) else np.asarray(buf).dtype
    return np.frombuffer(data, dtype=dtype, count=count).reshape(rows)


class P2PHandle:
    """An isend/irecv in flight (libddl's request): wait() returns its result (recv: out)
    or raises its error; test() says whether it finished (and makes its progress)."""

    __slots__ = ("_req", "_result")

    def __init__(self, req: Any, result: Any) -> None:
        self._req = req  # keeps the buffer alive until the transfer is done
        self._result = result

    def test(self) -> bool:
        return self._req.test()

    def wait(self) -> Any:
        self._req.wait()
        return self._result

    def add_done_callback(self, fn: Any) -> None:
        """Call fn(self) once the transfer has finished, from the one thread that then
        makes its progress (_WATCHER): how torch futures complete with nobody waiting.
        After this, only fn's wait() may touch the handle (a request has one waiter)."""
        _WATCHER.add(self, fn)


class _Watcher:
    """A daemon thread that makes the progress of the point-to-point requests whose owners
    asked to be told when they finish (libddl's isend/irecv have no thread of their own),
    testing each in turn and pausing when none moved (20 us, doubling to 1 ms)."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._items: list[tuple[P2PHandle, Any]] = []
        self._thread: threading.Thread | None = None

    def add(self, h: P2PHandle, fn: Any) -> None:
        with self._cond:
            self._items.append((h, fn))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="ddl-p2p-watcher",
                                                daemon=True)
                self._thread.start()
            self._cond.notify()

    def _run(self) -> None:
        pause = 20e-6
        while True:
            with self._cond:
                while not self._items:
                    self._cond.wait()
                items = list(self._items)
            finished = []
            for h, fn in items:
                try:
                    done = h.test()
                except Exception:  # noqa: BLE001 - failed: fn's wait() raises it again
                    done = True
                if done:
                    finished.append((h, fn))
            if finished:
                with self._cond:
                    for item in finished:
                        self._items.remove(item)
                for h, fn in finished:
                    fn(h)
                pause = 20e-6
            else:
                time.sleep(pause)
                pause = min(pause * 2, 1e-3)


_WATCHER = _Watcher()

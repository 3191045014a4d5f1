"""Horovod's background negotiation for one process set, on a libddl communicator.

Written when libddl's asynchronous, name-matched requests ran on the world communicator
only (libddl now has a queue per communicator, which could carry this; not yet switched):
a process set (a sub-communicator) gets what Horovod's background thread gives each of
its process sets: one thread per set, on every member, that repeatedly (a "round")

1. gathers every member's queued requests (key, what must agree, per-rank details) and
   its flags (joined, stopping) with two small blocking collectives on the set's
   communicator;
2. runs, in the order of the lowest member's queue, the requests that every member that
   has not joined has queued: a request runs when all have it, whatever order they
   submitted it in (named requests match by name, unnamed ones by their order);
3. fails, on every member, a request whose members disagree on it (dtype, shape, op,
   root: MismatchError), and a request some member has not submitted within DDL_TIMEOUT
   (DDLTimeoutError naming those ranks) on the members that have.

A member that called join() has queued nothing but takes part in every request the
others run, with zeros (allreduce), no rows (allgather, alltoall) or a discarded
buffer (broadcast), as Horovod's join does; join() returns once every member joined.
Data moves with libddl's blocking collectives on the communicator (host buffers), so a
set's traffic never meets another set's or the world's asynchronous requests.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from typing import Any

import numpy as np

import ddl_core
from ddl_core import timeline

# Kinds of request: what a member that has joined does for each (see _zeros).
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, BARRIER = ("allreduce", "allgather", "broadcast",
                                                      "alltoall", "barrier")
# Rounds are collective: a request waits for the slowest member's next round, so pauses
# start short after activity (the next request of a loop comes soon) and grow while the
# set stays idle (then at most 200 rounds a second, each one small allgather).
_IDLE_MIN_S = 50e-6   # the first pause once nothing is queued anywhere
_IDLE_MAX_S = 0.005   # the longest pause while no member has anything queued
_BUSY_S = 100e-6      # the pause while some member waits for the others
_SLOT = 1024          # bytes per member of a round's first exchange


def _timeout_s() -> float:
    try:
        return float(os.environ.get("DDL_TIMEOUT", "300"))
    except ValueError:
        return 300.0


class Request:
    """One queued collective: `key` matches it across members, `sig` must be equal on
    every member (kind first), `info` is this rank's part that may differ (allgather:
    rows; alltoall: splits). `x` is this rank's numpy array; run() fills `result`."""

    __slots__ = ("key", "sig", "info", "x", "result", "error", "done", "submitted", "label")

    def __init__(self, key: str, sig: tuple, info: Any, x: np.ndarray | None,
                 label: str) -> None:
        self.key, self.sig, self.info, self.x, self.label = key, sig, info, x, label
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.submitted = time.monotonic()

    def wait(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result

    def test(self) -> bool:
        return self.done.is_set()

    def finish(self, result: Any = None, error: BaseException | None = None) -> None:
        self.result, self.error = result, error
        self.done.set()


def _describe(sig: tuple, info: Any) -> str:
    kind = sig[0]
    if kind == BARRIER:
        return "barrier"
    text = f"{sig[1]} {tuple(sig[2]) if kind != ALLGATHER else ('*', *sig[2])}"
    if kind == ALLREDUCE:
        text += f" op {sig[3]}"
    elif kind == BROADCAST:
        text += f" root {sig[3]}"
    elif kind == ALLTOALL:
        text += f" splits {info}"
    return text


class Engine:
    """The negotiation thread of one process set on this rank (a member of it)."""

    def __init__(self, comm: Any, set_id: int) -> None:
        self.comm = comm
        self.set_id = set_id
        self.members: list[int] = list(comm.members)
        self._cv = threading.Condition()
        self._queue: dict[str, Request] = {}
        self._unnamed = 0
        self._stopping = False
        self._joined = False
        self._join_done: threading.Event | None = None
        self._last_joined = -1
        self._failure: BaseException | None = None
        self._join_error: BaseException | None = None
        self._thread = threading.Thread(target=self._loop, daemon=True,
                                        name=f"horovod-ddl-set{set_id}")
        self._thread.start()

    # -- the caller's side --------------------------------------------------------------

    def submit(self, name: str | None, sig: tuple, info: Any, x: np.ndarray | None,
               label: str) -> Request:
        """Queue a request; a name already in flight is a ValueError (as Horovod's
        enqueue raises). `label` is Horovod's name, for messages and the timeline."""
        with self._cv:
            if self._failure is not None:
                raise ddl_core.DDLError(f"process set {self.members}: its negotiation failed "
                                        f"earlier: {self._failure}")
            if self._stopping:
                raise ValueError(f"process set {self.members} was removed or shut down")
            if name is None:
                key = f"#{self._unnamed}"
                self._unnamed += 1
            else:
                key = name
                if key in self._queue:
                    raise ValueError(f"a collective named {name!r} is already in flight on "
                                     f"process set {self.members}: wait for it first")
            req = Request(key, sig, info, x, label)
            self._queue[key] = req
            timeline.event(label, f"NEGOTIATE_{sig[0].upper()}", "B",
                           bytes=0 if x is None else x.nbytes)
            self._cv.notify()
        return req

    def join(self) -> int:
        """Take part with zeros in what the others still run until every member has
        joined; returns the world rank of the member that joined last."""
        done = threading.Event()
        with self._cv:
            if self._stopping or not self._thread.is_alive():
                raise self._failure or ValueError(
                    f"process set {self.members} was removed or shut down")
            self._join_done = done
            self._joined = True
            self._last_joined = -1
            self._cv.notify()
        done.wait()
        if self._last_joined < 0:  # the thread ended (a failure, a removal) instead
            raise self._join_error or ddl_core.DDLError(
                f"join on process set {self.members} ended without every member joining")
        return self._last_joined

    def stop(self) -> None:
        """The thread ends at the next round, on every member (one member stopping ends
        the set everywhere)."""
        with self._cv:
            self._stopping = True
            self._cv.notify()
        self._thread.join()

    # -- the thread -------------------------------------------------------------------------

    def _exchange(self, msg: bytes) -> list[Any]:
        """Every member's message: one fixed-size allgather of a slot holding the length
        and, when it fits, the message itself; an allgatherv of the full messages only
        in rounds where some member's does not fit (many requests queued at once)."""
        c = self.comm
        n = len(msg)
        slot = np.zeros(_SLOT, dtype=np.uint8)
        slot[:8] = np.frombuffer(np.int64(n).tobytes(), dtype=np.uint8)
        if n <= _SLOT - 8:
            slot[8:8 + n] = np.frombuffer(msg, dtype=np.uint8)
        slots = ddl_core.allgather(slot, comm=c).reshape(-1, _SLOT)
        lens = [int(v) for v in slots[:, :8].copy().view(np.int64).reshape(-1)]
        if max(lens) <= _SLOT - 8:
            return [pickle.loads(slots[i, 8:8 + k].tobytes()) for i, k in enumerate(lens)]
        data = ddl_core.allgatherv(np.frombuffer(msg, dtype=np.uint8),
                                   counts=np.array(lens, dtype=np.int64), comm=c)
        out, off = [], 0
        for k in lens:
            out.append(pickle.loads(data[off: off + k].tobytes()))
            off += k
        return out

    def _loop(self) -> None:
        pause = 0.0
        join_round: dict[int, int] = {}
        rnd = 0
        while True:
            with self._cv:
                if pause > 0:
                    self._cv.wait(pause)
                offered = [(r.key, r.sig, r.info) for r in self._queue.values()]
                flags = (self._joined, self._stopping)
            try:
                views = self._exchange(pickle.dumps((flags, offered)))
            except BaseException as exc:  # noqa: BLE001 - fail every waiter, then stop
                self._fail_all(exc)
                return
            rnd += 1
            joined = [v[0][0] for v in views]
            leaving = [self.members[i] for i, v in enumerate(views) if v[0][1]]
            if leaving:
                # One member leaving (remove_process_set, shutdown, exit) ends the set on
                # every member at this round, so none waits for a member that is gone.
                self._fail_all(ValueError(f"process set {self.members} was removed or shut "
                                          f"down (on rank(s) {leaving}) before this "
                                          "collective ran"))
                return
            for i, j in enumerate(joined):
                if j:
                    join_round.setdefault(i, rnd)
                else:
                    join_round.pop(i, None)
            if all(joined):
                last = max(join_round.items(), key=lambda kv: (kv[1], kv[0]))[0]
                with self._cv:
                    self._joined = False
                    self._last_joined = self.members[last]
                    done, self._join_done = self._join_done, None
                join_round.clear()
                if done is not None:
                    done.set()
            ran = self._run_ready(views, joined)
            anyone_waiting = any(v[1] for v in views)
            pause = 0.0 if ran else (_BUSY_S if anyone_waiting else
                                     min(_IDLE_MAX_S, max(pause * 2, _IDLE_MIN_S)))

    def _fail_all(self, exc: BaseException) -> None:
        """The thread ends: every waiter gets `exc`; later submissions are refused (a
        ValueError after a removal or shutdown, the error itself after a failure)."""
        with self._cv:
            if not isinstance(exc, ValueError):
                self._failure = exc
            self._stopping = True
            pending = list(self._queue.values())
            self._queue.clear()
            done, self._join_done = self._join_done, None
            self._join_error = exc
        for r in pending:
            r.finish(error=exc)
        if done is not None:
            done.set()

    def _run_ready(self, views: list[Any], joined: list[bool]) -> bool:
        active = [i for i, j in enumerate(joined) if not j]
        if not active:
            return False
        offers = [{k: (s, inf) for k, s, inf in v[1]} for v in views]
        me = self.comm.rank
        ran = False
        now = time.monotonic()
        first = offers[active[0]]
        for key in list(first):
            if not all(key in offers[i] for i in active):
                continue
            ran = True
            sigs = [offers[i][key][0] if i in active else None for i in range(len(views))]
            infos = [offers[i][key][1] if i in active else None for i in range(len(views))]
            with self._cv:
                req = self._queue.pop(key, None)
            ref = next(s for s in sigs if s is not None)
            if any(s is not None and s != ref for s in sigs):
                detail = "; ".join(f"rank {self.members[i]}: {_describe(s, infos[i])}"
                                   for i, s in enumerate(sigs) if s is not None)
                if req is not None:
                    req.finish(error=ddl_core.MismatchError(
                        f"{req.label}: the ranks of process set {self.members} disagree on "
                        f"it ({detail}); every rank must submit the same dtype, shape and "
                        "op under one name"))
                continue
            try:
                if req is not None:
                    timeline.event(req.label, f"NEGOTIATE_{ref[0].upper()}", "E")
                    timeline.event(req.label, ref[0].upper(), "B",
                                   bytes=0 if req.x is None else req.x.nbytes,
                                   process_set=self.set_id)
                out = self._execute(ref, infos, req, me)
                if req is not None:
                    timeline.event(req.label, ref[0].upper(), "E")
                    req.finish(out)
            except BaseException as exc:  # noqa: BLE001 - the waiter gets it
                if req is not None:
                    req.finish(error=exc)
                else:
                    self._fail_all(exc)
                    return True
        # Requests some member has not submitted within the timeout: fail them here.
        limit = _timeout_s()
        with self._cv:
            stale = [r for r in self._queue.values() if now - r.submitted > limit]
            for r in stale:
                del self._queue[r.key]
        for r in stale:
            missing = [self.members[i] for i in active if r.key not in offers[i]]
            r.finish(error=ddl_core.DDLTimeoutError(
                f"{r.label}: rank(s) {missing} of process set {self.members} did not submit "
                f"it within DDL_TIMEOUT={limit:g} s (a rank that stopped early, or names "
                "that differ between ranks)"))
        return ran

    def _execute(self, sig: tuple, infos: list[Any], req: Request | None, me: int) -> Any:
        c = self.comm
        kind = sig[0]
        if kind == BARRIER:
            c.barrier()
            return None
        dtype, shape = np.dtype(sig[1]), tuple(sig[2])
        if kind == ALLREDUCE:
            x = req.x if req is not None else np.zeros(shape, dtype=dtype)
            ddl_core.allreduce(x.reshape(-1), sig[3], out=x.reshape(-1), comm=c)
            return x
        if kind == BROADCAST:
            x = req.x if req is not None else np.zeros(shape, dtype=dtype)
            ddl_core.broadcast(x.reshape(-1), self.members.index(sig[3]), comm=c)
            return x
        row = int(np.prod(shape)) if shape else 1
        if kind == ALLGATHER:
            rows = [0 if r is None else int(r) for r in infos]
            x = req.x if req is not None else np.zeros((0, *shape), dtype=dtype)
            counts = np.array([r * row for r in rows], dtype=np.int64)
            flat = ddl_core.allgatherv(np.ascontiguousarray(x).reshape(-1), counts=counts,
                                       comm=c)
            return flat.reshape(-1, *shape), rows
        if kind == ALLTOALL:
            n = len(infos)
            splits = [[0] * n if s is None else list(s) for s in infos]
            x = req.x if req is not None else np.zeros((0, *shape), dtype=dtype)
            flat = ddl_core.alltoallv(np.ascontiguousarray(x).reshape(-1),
                                      np.array(splits[me], dtype=np.int64) * row, comm=c)
            received = [splits[j][me] for j in range(n)]
            return flat.reshape(-1, *shape), received
        raise ValueError(f"unknown request kind {kind!r}")


"""A timeline of every collective: Chrome-trace JSON (chrome://tracing, Perfetto), the
file Horovod users debug stalls with.

    DDL_TIMELINE=/tmp/tl.json ddlrun -n 4 python train.py        # ddl_core users
    HOROVOD_TIMELINE=/tmp/tl.json horovodrun -np 4 python train.py  # horovod-ddl
    ddl_core.timeline.start("/tmp/tl.json") ... ddl_core.timeline.stop()

Rank 0 writes the file, as Horovod's coordinator does; a path holding "{rank}" gives
every rank its own. As in Horovod's timeline, each tensor (collective name) is one row
("process") and its phases are nested spans with their sizes in args: QUEUE (submitted,
waiting for every rank: the negotiation), then the collective itself (ALLREDUCE,
ALLGATHER, ...) and, for libddl's asynchronous requests, the fused buffer it ran in and
the phases of each topology level it crossed. Writing is buffered and costs a dict and a
list append per event; the file is valid JSON once stop() (or exit) closed it.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_lock = threading.Lock()
_state: dict[str, Any] = {"f": None, "pids": {}, "t0": 0, "buf": [], "path": None}
active = False


def _rank() -> int:
    for var in ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if os.environ.get(var, "").isdigit():
            return int(os.environ[var])
    return 0


def start(path: str, mark_cycles: bool = False) -> None:  # noqa: ARG001 - Horovod's signature
    """Start writing the timeline to `path` (rank 0 only unless the path holds "{rank}");
    a timeline already open is closed first."""
    global active
    stop()
    rank = _rank()
    if "{rank}" in path:
        path = path.replace("{rank}", str(rank))
    elif rank != 0:
        return
    f = open(path, "w", encoding="utf-8")  # noqa: SIM115 - kept open until stop()
    f.write("[\n")
    with _lock:
        _state.update(f=f, pids={}, t0=time.perf_counter_ns(), buf=[], path=path)
        active = True


def record(on: bool) -> None:
    """Pause (False) or resume (True) recording into the open timeline without closing
    it (what the timeline's cost is measured with: python -m ddl_core.bench ddp
    --timeline)."""
    global active
    with _lock:
        active = bool(on) and _state["f"] is not None


def _pid(name: str) -> int:
    pids = _state["pids"]
    pid = pids.get(name)
    if pid is None:
        pid = pids[name] = len(pids) + 1
        _state["buf"].append({"name": "process_name", "ph": "M", "pid": pid,
                              "args": {"name": name}})
        _state["buf"].append({"name": "process_sort_index", "ph": "M", "pid": pid,
                              "args": {"sort_index": pid}})
    return pid


def event(tensor: str, phase: str, ph: str, ts_ns: int | None = None, **args: Any) -> None:
    """One begin ("B") or end ("E") of `phase` on `tensor`'s row; args (sizes, ranks)
    show when the span is clicked. ts_ns: a time.perf_counter_ns() value (default now)."""
    if not active:
        return
    ts = (time.perf_counter_ns() if ts_ns is None else ts_ns)
    with _lock:
        if _state["f"] is None:
            return
        ev = {"name": phase, "ph": ph, "ts": (ts - _state["t0"]) / 1000.0,
              "pid": _pid(tensor), "tid": 0}
        if args:
            ev["args"] = args
        buf = _state["buf"]
        buf.append(ev)
        if len(buf) >= 4096:
            _flush()


def span(tensor: str, phase: str, begin_ns: int, end_ns: int, **args: Any) -> None:
    """A complete span ("X") of `phase` from begin_ns to end_ns (perf_counter_ns)."""
    if not active:
        return
    with _lock:
        if _state["f"] is None:
            return
        ev = {"name": phase, "ph": "X", "ts": (begin_ns - _state["t0"]) / 1000.0,
              "dur": max(0, end_ns - begin_ns) / 1000.0, "pid": _pid(tensor), "tid": 0}
        if args:
            ev["args"] = args
        _state["buf"].append(ev)


plan_fn: Any = None  # ddl_core.plan, set by ddl_core.init: the algorithm of each level
_plans: dict[int, Any] = {}


def request(tensor: str, kind: str, nbytes: int, timing: tuple) -> None:
    """The spans of one finished libddl request on `tensor`'s row, from its timing
    (Request.timing(): CLOCK_MONOTONIC seconds, the clock of time.perf_counter_ns):
    NEGOTIATE_<KIND> until every rank had it, then <KIND> holding QUEUE (behind earlier
    requests of its batch) and DDL_<KIND> (the collective: fused with how many, the
    fusion buffer's bytes and, for allreduces, the algorithm of each topology level)."""
    if not active:
        return
    sub, neg, start_, end, fused, fbytes = timing
    ns = [int(t * 1e9) for t in (sub, neg, start_, end)]
    if ns[1] <= 0 or ns[2] <= 0:
        return
    k = kind.upper()
    args: dict[str, Any] = {"fused": fused, "fused_bytes": fbytes}
    if kind == "allreduce" and plan_fn is not None:
        levels = _plans.get(fbytes)
        if levels is None:
            try:
                levels = _plans[fbytes] = list(plan_fn(fbytes)[0])
            except Exception:  # noqa: BLE001 - the plan is informative only
                levels = _plans[fbytes] = []
        args["levels"] = levels
    span(tensor, f"NEGOTIATE_{k}", ns[0], ns[1], bytes=nbytes)
    span(tensor, k, ns[1], ns[3], bytes=nbytes)
    span(tensor, "QUEUE", ns[1], ns[2])
    span(tensor, f"DDL_{k}", ns[2], ns[3], **args)


@contextmanager
def timed(tensor: str, phase: str, **args: Any) -> Iterator[None]:
    """A span of `phase` on `tensor`'s row around a blocking call (no-op when closed)."""
    if not active:
        yield
        return
    t0 = time.perf_counter_ns()
    try:
        yield
    finally:
        span(tensor, phase, t0, time.perf_counter_ns(), **args)


def _flush() -> None:
    f, buf = _state["f"], _state["buf"]
    if f is not None and buf:
        f.write("".join(json.dumps(ev) + ",\n" for ev in buf))
    _state["buf"] = []


def stop() -> None:
    """Close the timeline: the file becomes a complete JSON array."""
    global active
    with _lock:
        f = _state["f"]
        if f is None:
            return
        active = False
        _flush()
        f.write(json.dumps({"name": "timeline end", "ph": "i", "s": "g",
                            "ts": (time.perf_counter_ns() - _state["t0"]) / 1000.0,
                            "pid": 0, "tid": 0}) + "\n]\n")
        f.close()
        _state["f"] = None


def start_from_env(var: str = "DDL_TIMELINE") -> None:
    """Start the timeline named by `var` if it is set and none is open."""
    path = os.environ.get(var)
    if path and not active:
        start(path)


atexit.register(stop)

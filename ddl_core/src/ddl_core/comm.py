"""Communicators and the collectives of libddl 2, in mpi4py's spirit.

    world = ddl.comm_world()
    half = world.split(world.rank % 2)          # a Comm, or None for color=None
    y = ddl.allreduce(x, comm=half)
    blocks = ddl.alltoall(x, comm=half)         # block i of flat x goes to rank i

Every collective is collective over its communicator only: its members must call it, the
others need not. A count, dtype, op or root that differs between members raises
MismatchError on every member (and nowhere else) before data moves; a member that never
arrives raises DDLTimeoutError after the communicator's timeout (set_timeout). Using a
freed communicator is InvalidArgumentError before anything moves. Host buffers (numpy,
torch CPU tensors, buffer-protocol objects) only for the calls added in libddl 2.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from . import _cuda, _ddl
from ._buffers import _NP_CODE, BF16_CODE, DTYPES, as_buffer, empty_like, op_code
from ._ddl import InvalidArgumentError

# The kinds py_comm_op (pymodule.c) dispatches on.
(K_ALLREDUCE, K_BROADCAST, K_ALLGATHER, K_REDUCE_SCATTER, K_BARRIER, K_ALLTOALL, K_ALLTOALLV,
 K_ALLGATHERV, K_GATHER, K_SCATTER, K_REDUCE, K_SEND, K_RECV) = range(13)


class Comm:
    """A group of ranks (libddl's ddl_comm_t). `rank` and `size` are this rank's place in
    it and its member count; `members` the world ranks of its members, in order."""

    def __init__(self, handle: int, world: bool = False) -> None:
        self._h: int | None = handle
        self._world = world
        self.rank, self.size, self.members = _ddl.comm_info(handle)

    def __repr__(self) -> str:
        state = "freed" if self._h is None else f"rank {self.rank} of {self.size}"
        return f"<ddl_core.Comm {state}, world ranks {list(self.members)}>"

    @property
    def handle(self) -> int:
        """The live handle; InvalidArgumentError once freed."""
        if self._h is None:
            raise InvalidArgumentError("this communicator was freed (Comm.free()): use a live one")
        return self._h

    @property
    def is_world(self) -> bool:
        return self._world

    @property
    def topology(self) -> tuple[int, ...]:
        """This communicator's own grid, innermost level first: the job's grid restricted
        to its members (what its algorithm choice and cost model work on)."""
        return _ddl.comm_topology(self.handle)

    def split(self, color: int | None, key: int = 0) -> Comm | None:
        """Collective over this communicator: ranks with the same color form one new
        communicator ordered by (key, rank); color None takes no part and gets None."""
        if color is not None and (not isinstance(color, int) or color < 0):
            raise InvalidArgumentError(f"split: color must be an int >= 0 or None, not {color!r}")
        h = _ddl.comm_split(self.handle, -1 if color is None else int(color), int(key))
        return None if h is None else Comm(h)

    def create(self, ranks: Any) -> Comm | None:
        """Collective over this communicator: a communicator of `ranks` (ranks of this one,
        the same list everywhere, in that order); None on the ranks not listed."""
        h = _ddl.comm_create(self.handle, [int(r) for r in ranks])
        return None if h is None else Comm(h)

    def set_timeout(self, seconds: float | None) -> None:
        """This communicator's timeout (None or 0: the thread's, else DDL_TIMEOUT)."""
        _ddl.comm_set_timeout(self.handle, 0.0 if seconds is None else float(seconds))

    def free(self) -> None:
        """Release the communicator (local). Later use raises InvalidArgumentError."""
        if self._world:
            raise InvalidArgumentError("the world communicator cannot be freed (finalize() does)")
        _ddl.comm_free(self.handle)
        self._h = None

    def barrier(self) -> None:
        _ddl.comm_op(K_BARRIER, self.handle, None, None, 0, 0, 0, 0, 0, None, None)


_world: Comm | None = None


def comm_world() -> Comm:
    """The world communicator (every rank), after init()."""
    global _world
    if _world is None:
        _world = Comm(_ddl.comm_world(), world=True)
    return _world


def _reset() -> None:
    """finalize() drops the cached world communicator."""
    global _world
    _world = None


def resolve(comm: Comm | None) -> Comm:
    return comm_world() if comm is None else comm


def _host(x: Any, fn: str) -> tuple[Any, int]:
    if _cuda.device_array(x) is not None:
        raise InvalidArgumentError(
            f"{fn}: GPU buffers are not supported by this call yet; pass host memory "
            "(e.g. x.cpu() or a numpy array)")
    return as_buffer(x)


def _n(x: Any) -> int:
    """Elements of x (its buffer's bytes over the element size)."""
    mv = memoryview(x)
    return mv.nbytes // mv.itemsize


def _check_out(out: Any, code: int, need: int, fn: str) -> Any:
    rbuf, rcode = _host(out, fn)
    if rcode != code:
        raise TypeError(f"{fn}: out has dtype {DTYPES[rcode]} but the input {DTYPES[code]}")
    if _n(rbuf) != need:
        raise ValueError(f"{fn}: out must hold {need} elements, not {_n(rbuf)}")
    return rbuf


def _flat_like(x: Any, buf: Any, n: int) -> tuple[Any, Any]:
    return empty_like(x, buf, (n,))


def comm_allreduce(c: Comm, x: Any, op: str, out: Any) -> Any:
    o = op_code(op)
    buf, code = _host(x, "allreduce")
    if out is None:
        res, rbuf = empty_like(x, buf)
    elif out is x:
        res, rbuf = x, buf
    else:
        res, rbuf = out, _check_out(out, code, _n(buf), "allreduce")
    _ddl.comm_op(K_ALLREDUCE, c.handle, None if res is x else buf, rbuf, _n(buf), code, o, 0, 0,
                 None, None)
    return res


def comm_broadcast(c: Comm, x: Any, root: int) -> Any:
    buf, code = _host(x, "broadcast")
    _ddl.comm_op(K_BROADCAST, c.handle, None, buf, _n(buf), code, 0, root, 0, None, None)
    return x


def comm_allgather(c: Comm, x: Any, out: Any) -> Any:
    buf, code = _host(x, "allgather")
    n = _n(buf)
    if out is None:
        shape = tuple(getattr(x, "shape", ()) or ())
        res, rbuf = empty_like(x, buf, (c.size * shape[0], *shape[1:]) if shape else (c.size,))
    else:
        res, rbuf = out, _check_out(out, code, n * c.size, "allgather")
    _ddl.comm_op(K_ALLGATHER, c.handle, buf, rbuf, n, code, 0, 0, 0, None, None)
    return res


def comm_reduce_scatter(c: Comm, x: Any, op: str, out: Any) -> Any:
    o = op_code(op)
    buf, code = _host(x, "reduce_scatter")
    n = _n(buf)
    if n % c.size:
        raise ValueError(f"reduce_scatter: {n} elements do not split over {c.size} ranks")
    if out is None:
        shape = tuple(getattr(x, "shape", ()) or ())
        sh = (shape[0] // c.size, *shape[1:]) if shape and shape[0] % c.size == 0 else (
            n // c.size,)
        res, rbuf = empty_like(x, buf, sh)
    else:
        res, rbuf = out, _check_out(out, code, n // c.size, "reduce_scatter")
    _ddl.comm_op(K_REDUCE_SCATTER, c.handle, buf, rbuf, n // c.size, code, o, 0, 0, None, None)
    return res


def alltoall(x: Any, out: Any = None, *, comm: Comm | None = None) -> Any:
    """Block i of flat x (size() equal blocks) goes to rank i; returns the blocks that
    arrived, block j from rank j, flat (or into `out`)."""
    c = resolve(comm)
    buf, code = _host(x, "alltoall")
    n = _n(buf)
    if n % c.size:
        raise ValueError(f"alltoall: {n} elements do not split into {c.size} equal blocks")
    if out is None:
        res, rbuf = _flat_like(x, buf, n)
    else:
        res, rbuf = out, _check_out(out, code, n, "alltoall")
    _ddl.comm_op(K_ALLTOALL, c.handle, buf, rbuf, n // c.size, code, 0, 0, 0, None, None)
    return res


def _counts(counts: Any, c: Comm, fn: str) -> np.ndarray:
    arr = np.asarray(counts)
    if arr.shape != (c.size,) or arr.dtype.kind not in "iu" or (arr < 0).any():
        raise ValueError(f"{fn}: give {c.size} non-negative integer counts, one per rank")
    return np.ascontiguousarray(arr, dtype=np.uint64)


def alltoallv(x: Any, send_counts: Any, *, comm: Comm | None = None) -> Any:
    """send_counts[i] consecutive elements of flat x go to rank i; returns what arrived
    from every rank, in rank order, flat."""
    c = resolve(comm)
    buf, code = _host(x, "alltoallv")
    sc = _counts(send_counts, c, "alltoallv")
    if int(sc.sum()) != _n(buf):
        raise ValueError(f"alltoallv: the send counts add up to {int(sc.sum())} but x holds "
                         f"{_n(buf)} elements")
    rc = np.empty(c.size, dtype=np.int64)
    _ddl.comm_op(K_ALLTOALL, c.handle, sc.view(np.int64), rc, 1, DTYPES.index("int64"), 0, 0, 0,
                 None, None)
    rc = rc.astype(np.uint64)
    res, rbuf = _flat_like(x, buf, int(rc.sum()))
    _ddl.comm_op(K_ALLTOALLV, c.handle, buf, rbuf, 0, code, 0, 0, 0, sc, rc)
    return res


def allgatherv(x: Any, counts: Any = None, out: Any = None, *,
               comm: Comm | None = None) -> Any:
    """Every rank's x (any number of elements each), flat, in rank order. `counts` (every
    rank's element count, the same list everywhere) saves the exchange that learns them,
    and then `out` may receive the result; wrong counts raise MismatchError everywhere."""
    c = resolve(comm)
    buf, code = _host(x, "allgatherv")
    n = _n(buf)
    if counts is None:
        got = np.empty(c.size, dtype=np.int64)
        _ddl.comm_op(K_ALLGATHER, c.handle, np.array([n], dtype=np.int64), got, 1,
                     DTYPES.index("int64"), 0, 0, 0, None, None)
        counts = got
    rc = _counts(counts, c, "allgatherv")
    total = int(rc.sum())
    res, rbuf = (_flat_like(x, buf, total) if out is None
                 else (out, _check_out(out, code, total, "allgatherv")))
    _ddl.comm_op(K_ALLGATHERV, c.handle, buf, rbuf, n, code, 0, 0, 0, None, rc)
    return res


def _root(root: int, c: Comm, fn: str) -> int:
    if not isinstance(root, (int, np.integer)) or not 0 <= int(root) < c.size:
        raise InvalidArgumentError(f"{fn}: root {root!r} is not a rank of the communicator "
                                   f"(0..{c.size - 1})")
    return int(root)


def gather(x: Any, root: int = 0, out: Any = None, *, comm: Comm | None = None) -> Any:
    """Every rank's x (same count) concatenated in rank order on `root` (into `out` if
    given there); None elsewhere."""
    c = resolve(comm)
    r = _root(root, c, "gather")
    buf, code = _host(x, "gather")
    n = _n(buf)
    res = rbuf = None
    if c.rank == r:
        res, rbuf = (_flat_like(x, buf, n * c.size) if out is None
                     else (out, _check_out(out, code, n * c.size, "gather")))
    _ddl.comm_op(K_GATHER, c.handle, buf, rbuf, n, code, 0, r, 0, None, None)
    return res


def scatter(x: Any, root: int = 0, out: Any = None, *, count: int | None = None,
            comm: Comm | None = None) -> Any:
    """Rank i receives block i (`count` elements) of root's flat x. count defaults to
    x's elements / size() on every rank, so non-roots pass an array shaped like root's
    (its contents are ignored) or give count; counts that differ raise MismatchError."""
    c = resolve(comm)
    r = _root(root, c, "scatter")
    buf, code = _host(x, "scatter")
    n = _n(buf)
    if count is None:
        if n % c.size:
            raise ValueError(f"scatter: {n} elements do not split into {c.size} blocks")
        count = n // c.size
    if c.rank == r and n != count * c.size:
        raise ValueError(f"scatter: root's x must hold size ({c.size}) x {count} elements, "
                         f"not {n}")
    res, rbuf = (_flat_like(x, buf, int(count)) if out is None
                 else (out, _check_out(out, code, int(count), "scatter")))
    _ddl.comm_op(K_SCATTER, c.handle, buf if c.rank == r else None, rbuf, int(count), code, 0,
                 r, 0, None, None)
    return res


def reduce(x: Any, op: str = "sum", root: int = 0, out: Any = None, *,
           comm: Comm | None = None) -> Any:
    """The reduction of every rank's x on `root` (into `out` if given there); None
    elsewhere. Same rules as allreduce (16-bit floats reduced in float32, avg, bitwise
    ops on integers)."""
    c = resolve(comm)
    o = op_code(op)
    r = _root(root, c, "reduce")
    buf, code = _host(x, "reduce")
    res = rbuf = None
    if c.rank == r:
        res, rbuf = (empty_like(x, buf) if out is None
                     else (out, _check_out(out, code, _n(buf), "reduce")))
    _ddl.comm_op(K_REDUCE, c.handle, buf, rbuf, _n(buf), code, o, r, 0, None, None)
    return res


def _peer(peer: int, c: Comm, fn: str) -> int:
    if not isinstance(peer, (int, np.integer)) or not 0 <= int(peer) < c.size:
        raise InvalidArgumentError(f"{fn}: peer {peer!r} is not a rank of the communicator "
                                   f"(0..{c.size - 1})")
    return int(peer)


def _np_fast(x: Any, peer: Any, tag: Any, c: Comm) -> int:
    """x's dtype code when x is a contiguous numpy array of a dtype the buffer protocol
    carries and peer/tag are plain in-range ints, else -1 (the general path, which checks
    each and names what is wrong). Point-to-point latency is mostly this layer."""
    if (type(x) is np.ndarray and type(peer) is int and type(tag) is int
            and 0 <= peer < c.size and x.flags.c_contiguous):
        code = _NP_CODE.get(x.dtype, -1)
        return -1 if code == BF16_CODE else code  # bfloat16 goes through as_buffer's uint16 view
    return -1


def send(x: Any, dest: int, tag: int = 0, *, comm: Comm | None = None) -> None:
    """Send x to `dest`; returns once x may be reused."""
    c = _world if comm is None and _world is not None else resolve(comm)
    if _ddl.p2p_fast(K_SEND, c.handle, x, dest, tag):  # (a plain case, checked in C)
        return
    d = _peer(dest, c, "send")
    buf, code = _host(x, "send")
    _ddl.comm_op(K_SEND, c.handle, buf, None, _n(buf), code, 0, d, int(tag), None, None)


def recv(out: Any, source: int, tag: int = 0, *, comm: Comm | None = None) -> Any:
    """Receive into `out` from `source`: the message must have exactly out's size (else
    MismatchError naming both sizes; the message is consumed). Returns out."""
    c = _world if comm is None and _world is not None else resolve(comm)
    if _ddl.p2p_fast(K_RECV, c.handle, out, source, tag):
        return out
    s = _peer(source, c, "recv")
    buf, code = _host(out, "recv")
    _ddl.comm_op(K_RECV, c.handle, None, buf, _n(buf), code, 0, s, int(tag), None, None)
    return out


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


def isend(x: Any, dest: int, tag: int = 0, *, comm: Comm | None = None) -> P2PHandle:
    """send() without blocking (x must stay untouched until wait())."""
    c = _world if comm is None and _world is not None else resolve(comm)
    code = _np_fast(x, dest, tag, c)
    if code >= 0:
        return P2PHandle(_ddl.p2p(True, c.handle, x, code, dest, tag), None)
    d = _peer(dest, c, "isend")
    buf, code = _host(x, "isend")
    return P2PHandle(_ddl.p2p(True, c.handle, buf, code, d, int(tag)), None)


def irecv(out: Any, source: int, tag: int = 0, *, comm: Comm | None = None) -> P2PHandle:
    """recv() without blocking; wait() returns out."""
    c = _world if comm is None and _world is not None else resolve(comm)
    code = _np_fast(out, source, tag, c)
    if code >= 0:
        return P2PHandle(_ddl.p2p(False, c.handle, out, code, source, tag), out)
    s = _peer(source, c, "irecv")
    buf, code = _host(out, "irecv")
    return P2PHandle(_ddl.p2p(False, c.handle, buf, code, s, int(tag)), out)

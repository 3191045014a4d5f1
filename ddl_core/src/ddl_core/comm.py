"""Communicators and their collectives, in mpi4py's spirit: the world is one of them.

    world = ddl.comm_world()
    half = world.split(world.rank % 2)          # a Comm, or None for color=None
    y = half.allreduce(x)                       # = ddl.allreduce(x, comm=half)
    blocks = half.alltoall(x)                   # block i of x goes to rank i

Every collective is a method of Comm, written here once; ddl_core's module-level calls
(ddl.allreduce, ...) are calls on comm_world(). A collective is collective over its
communicator only: its members must call it, the others need not. A count, dtype, op or
root that differs between members raises MismatchError on every member (and nowhere else)
before data moves; a member that never arrives raises DDLTimeoutError after the
communicator's timeout (set_timeout). Using a freed communicator is InvalidArgumentError
before anything moves.

Buffers: numpy arrays (bfloat16 through ml_dtypes), torch CPU tensors, buffer-protocol
objects. GPU arrays take libddl's device path in allreduce, broadcast, allgather and
reduce_scatter (and their *_async) on the world; elsewhere they are refused with what to
pass instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import _cuda, _ddl
from ._buffers import (
    _NP_CODE,
    BF16_CODE,
    DTYPE_CODE,
    OP_CODE,
    as_buffer,
    check_out,
    count,
    empty_like,
    gather_shape,
    op_code,
    rank_counts,
    result,
    scatter_shape,
)
from ._ddl import InvalidArgumentError
from .requests import DONE, Gathered, Handle, P2PHandle, matching, traced

INT64 = DTYPE_CODE["int64"]
_count = count  # (Comm.scatter's count= keyword shadows the helper there)


def _host(x: Any, fn: str) -> tuple[Any, int]:
    """as_buffer for a call without a device path: a GPU array is refused with what to
    pass instead."""
    if _cuda.device_array(x) is not None:
        raise InvalidArgumentError(
            f"{fn}: GPU buffers are not supported by this call yet; pass host memory "
            "(e.g. x.cpu() or a numpy array)")
    return as_buffer(x)


def _dev_result(x: Any, d: _cuda.DeviceArray, out: Any,
                shape: tuple[int, ...] | None = None) -> tuple[Any, _cuda.DeviceArray]:
    """The result object and its DeviceArray for a GPU input: `out` (on the GPU, same
    dtype), x itself for out=x, or a new array like x (shaped `shape`)."""
    if out is x:
        return x, d
    if out is None:
        out = _cuda.empty_like(x, d, shape)
    r = _cuda.device_array(out)
    if r is None:
        raise TypeError("the input is in GPU memory but out is not: pass a GPU array as out")
    if r.code != d.code:
        raise TypeError(f"out has dtype {r.dtype} but the input {d.dtype}")
    return out, r


def _rank(r: Any, size: int, what: str, fn: str) -> int:
    """A root or peer, checked to be a rank of a communicator of `size` members."""
    if not isinstance(r, (int, np.integer)) or not 0 <= int(r) < size:
        raise InvalidArgumentError(f"{fn}: {what} {r!r} is not a rank of the communicator "
                                   f"(0..{size - 1})")
    return int(r)


class Comm:
    """A group of ranks (libddl's ddl_comm_t). `rank` and `size` are this rank's place in
    it and its member count; `members` the world ranks of its members, in order."""

    __slots__ = ("_h", "_world", "rank", "size", "members")

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

    # ---- making and releasing communicators ----------------------------------------

    def split(self, color: int | None, key: int = 0) -> Comm | None:
        """Collective over this communicator: ranks with the same color form one new
        communicator ordered by (key, rank); color None takes no part and gets None."""
        if color is not None and (not isinstance(color, int) or color < 0):
            raise InvalidArgumentError(f"split: color must be an int >= 0 or None, not {color!r}")
        h = _ddl.comm_split(self.handle, _ddl.UNDEFINED if color is None else int(color), int(key))
        return None if h is None else Comm(h)

    def create(self, ranks: Any) -> Comm | None:
        """Collective over this communicator: a communicator of `ranks` (ranks of this one,
        the same list everywhere, in that order); None on the ranks not listed."""
        h = _ddl.comm_create(self.handle, [int(r) for r in ranks])
        return None if h is None else Comm(h)

    def create_group(self, ranks: Any) -> Comm:
        """A communicator of `ranks` (ranks of this one, in that order), made by its members
        only: each member calls it with the same list, the other ranks do not call it
        (MPI_Comm_create_group; torch's new_group(use_local_synchronization=True))."""
        return Comm(_ddl.comm_create_group(self.handle, [int(r) for r in ranks]))

    def shrink(self) -> Comm:
        """Fault-tolerant mode: the survivors' communicator, collective over the survivors
        (each calls it, typically after a ProcessFailedError). Built fresh (its own grid,
        plans, asynchronous engine, names) and agreed by every survivor; ranks keep their
        order. This communicator stays failed: free it when done (unless it is the world)."""
        return Comm(_ddl.comm_shrink(self.handle))

    @property
    def failed_ranks(self) -> tuple[int, ...]:
        """The members (ranks of this communicator) known to have failed; () while none."""
        return _ddl.comm_failed_ranks(self.handle)

    def set_timeout(self, seconds: float | None) -> None:
        """This communicator's timeout (None or 0: the thread's, else DDL_TIMEOUT)."""
        _ddl.comm_set_timeout(self.handle, 0.0 if seconds is None else float(seconds))

    def free(self) -> None:
        """Release the communicator (local). Later use raises InvalidArgumentError."""
        if self._world:
            raise InvalidArgumentError("the world communicator cannot be freed (finalize() does)")
        _ddl.comm_free(self.handle)
        self._h = None

    # ---- what every collective checks ----------------------------------------------

    def _device(self, x: Any, fn: str) -> _cuda.DeviceArray | None:
        """x's DeviceArray when it lives in GPU memory (None: host memory); the device
        path is the world's, so a communicator's call refuses GPU arrays."""
        d = _cuda.device_array(x)
        if d is not None and not self._world:
            raise InvalidArgumentError(
                f"{fn}: GPU arrays run on the world communicator only (libddl 2.1); give "
                "host memory on a communicator")
        return d

    def _queue(self, on_gpu: bool, name: str | None, shape: Any) -> dict[str, Any]:
        """The matching keywords of a request (name=, shape=); it goes to this
        communicator's queue."""
        return {} if name is None and shape is None else matching(on_gpu, name, shape)

    # ---- blocking collectives ------------------------------------------------------

    def allreduce(self, x: Any, op: str = "sum", out: Any = None) -> Any:
        """Reduce x over the members; the result goes to `out` (a new array if None;
        `out=x` works in place) and is returned. op: sum, avg, min, max, prod, and band,
        bor, bxor on integers (16-bit floats are reduced in float32)."""
        o = OP_CODE.get(op)
        if o is None:
            o = op_code(op)
        # Fast path, numpy in and out: the C binding checks contiguity and sizes itself.
        if self._world and type(x) is np.ndarray and (out is None or type(out) is np.ndarray):
            code = _NP_CODE.get(x.dtype)
            if code is not None and code != BF16_CODE:
                if out is None:
                    out = np.empty_like(x)
                elif out.dtype != x.dtype:
                    raise TypeError(f"out has dtype {out.dtype} but the input {x.dtype}")
                _ddl.allreduce(self._h, None if out is x else x, out, code, o)
                return out
        d = self._device(x, "allreduce")
        if d is not None:
            res, r = _dev_result(x, d, out)
            if r.count != d.count:
                raise ValueError(f"input has {d.count} elements but output {r.count}")
            _ddl.dev_allreduce(0 if r.ptr == d.ptr else d.ptr, r.ptr, d.count, d.code, o,
                               d.stream)
            return res
        buf, code = as_buffer(x)
        res, rbuf = result(x, buf, code, out, "allreduce", None if self._world else count(buf))
        _ddl.allreduce(self.handle, None if res is x else buf, rbuf, code, o)
        return res

    def broadcast(self, x: Any, root: int = 0) -> Any:
        """Overwrite x on every member with root's x (in place); returns x."""
        d = self._device(x, "broadcast")
        if d is not None:
            _ddl.dev_broadcast(d.ptr, d.count, d.code, root, d.stream)
            return x
        buf, code = as_buffer(x)
        _ddl.broadcast(self.handle, buf, code, root)
        return x

    def allgather(self, x: Any, out: Any = None) -> Any:
        """Every member's x (the same count everywhere) concatenated along the first axis,
        in rank order."""
        n = self.size
        d = self._device(x, "allgather")
        if d is not None:
            res, r = _dev_result(x, d, out, gather_shape(x, n) if out is None else None)
            if r.count != d.count * n:
                raise ValueError(f"allgather: out must hold size ({n}) x {d.count} elements, "
                                 f"not {r.count}")
            _ddl.dev_allgather(d.ptr, r.ptr, d.count, d.code, d.stream)
            return res
        buf, code = as_buffer(x)
        k = count(buf)
        res, rbuf = result(x, buf, code, out, "allgather", None if self._world else k * n,
                           gather_shape(x, n))
        _ddl.allgather(self.handle, buf, rbuf, code)
        return res

    def reduce_scatter(self, x: Any, op: str = "sum", out: Any = None) -> Any:
        """Reduce x over the members and give rank i the i-th of `size` equal blocks."""
        o = op_code(op)
        n = self.size
        d = self._device(x, "reduce_scatter")
        if d is not None:
            res, r = _dev_result(x, d, out, scatter_shape(x, d.count, n, "reduce_scatter")
                                 if out is None else None)
            if r.count * n != d.count:
                raise ValueError(f"reduce_scatter: the input must hold size ({n}) x "
                                 f"{r.count} elements, not {d.count}")
            _ddl.dev_reduce_scatter(d.ptr, r.ptr, r.count, d.code, o, d.stream)
            return res
        buf, code = as_buffer(x)
        k = count(buf)
        shape = scatter_shape(x, k, n, "reduce_scatter")
        res, rbuf = result(x, buf, code, out, "reduce_scatter",
                           None if self._world else k // n, shape)
        _ddl.reduce_scatter(self.handle, buf, rbuf, code, o)
        return res

    def barrier(self) -> None:
        """Wait until every member has called barrier."""
        _ddl.barrier(self.handle)

    def alltoall(self, x: Any, out: Any = None) -> Any:
        """Block i of x (`size` equal blocks of flat x) goes to rank i; returns the blocks
        that arrived, block j from rank j, shaped like x (or into `out`; out=x in place)."""
        buf, code = _host(x, "alltoall")
        k, n = count(buf), self.size
        if k % n:
            raise ValueError(f"alltoall: x holds {k} elements, not a multiple of the {n} ranks "
                             "(one equal block each)")
        res, rbuf = result(x, buf, code, out, "alltoall", None if self._world else k)
        _ddl.alltoall(self.handle, buf, rbuf, code)
        return res

    def alltoall_counts(self, send_counts: Any) -> tuple[int, ...]:
        """What each member will send here in an alltoallv where this rank sends
        send_counts."""
        sc = rank_counts(send_counts, self.size, "alltoall_counts")
        rc = np.empty(self.size, dtype=np.int64)
        _ddl.alltoall(self.handle, sc.view(np.int64), rc, INT64)  # (one count per rank)
        return tuple(int(c) for c in rc)

    def alltoallv(self, x: Any, send_counts: Any, recv_counts: Any = None,
                  out: Any = None) -> Any:
        """send_counts[i] consecutive elements of flat x go to rank i; returns, flat, what
        arrived from every member, in rank order (its counts: alltoall_counts, which runs
        first unless recv_counts gives them). recv_counts that disagree with the senders'
        raise MismatchError on every member. out: where to receive (flat, at least
        sum(recv_counts) elements), else a new array."""
        buf, code = _host(x, "alltoallv")
        if out is not None and out is x:
            raise ValueError("alltoallv cannot run in place: give another out, or none")
        sc = rank_counts(send_counts, self.size, "alltoallv")
        if int(sc.sum()) != count(buf):
            raise ValueError(f"alltoallv: the send counts add up to {int(sc.sum())} but x holds "
                             f"{count(buf)} elements")
        rc = rank_counts(self.alltoall_counts(sc) if recv_counts is None else recv_counts,
                         self.size, "alltoallv")
        total = int(rc.sum())
        if out is None:
            res, rbuf = empty_like(x, buf, (total,))
        else:
            res, rbuf = out, check_out(out, code, None, "alltoallv")
            if count(rbuf) < total:
                raise ValueError(f"alltoallv: out must hold at least {total} elements, not "
                                 f"{count(rbuf)}")
        _ddl.alltoallv(self.handle, buf, sc.view(np.int64), rbuf, rc.view(np.int64), code)
        return res

    def allgatherv(self, x: Any, counts: Any = None, out: Any = None) -> Any:
        """Every member's x (any number of elements each), flat, in rank order. `counts`
        (every member's element count, the same list everywhere) saves the exchange that
        learns them, and then `out` may receive the result; wrong counts raise
        MismatchError everywhere."""
        buf, code = _host(x, "allgatherv")
        k = count(buf)
        if counts is None:
            counts = np.empty(self.size, dtype=np.int64)
            _ddl.allgather(self.handle, np.array([k], dtype=np.int64), counts, INT64)
        rc = rank_counts(counts, self.size, "allgatherv")
        total = int(rc.sum())
        res, rbuf = result(x, buf, code, out, "allgatherv", total, (total,))
        _ddl.allgatherv(self.handle, buf, rbuf, rc.view(np.int64), code)
        return res

    def gather(self, x: Any, root: int = 0, out: Any = None) -> Any:
        """Every member's x (same count) concatenated in rank order on `root` (into `out`
        if given there); None elsewhere."""
        r = _rank(root, self.size, "root", "gather")
        buf, code = _host(x, "gather")
        k = count(buf)
        res = rbuf = None
        if self.rank == r:
            res, rbuf = result(x, buf, code, out, "gather", k * self.size, (k * self.size,))
        _ddl.gather(self.handle, buf, rbuf, code, r)
        return res

    def scatter(self, x: Any, root: int = 0, out: Any = None, *,
                count: int | None = None) -> Any:
        """Rank i receives block i (`count` elements) of root's flat x. count defaults to
        x's elements / size on every member, so non-roots pass an array shaped like root's
        (its contents are ignored) or give count; counts that differ raise MismatchError."""
        r = _rank(root, self.size, "root", "scatter")
        buf, code = _host(x, "scatter")
        k = _count(buf)
        if count is None:
            if k % self.size:
                raise ValueError(f"scatter: {k} elements do not split into {self.size} blocks")
            count = k // self.size
        if self.rank == r and k != count * self.size:
            raise ValueError(f"scatter: root's x must hold size ({self.size}) x {count} "
                             f"elements, not {k}")
        m = int(count)
        res, rbuf = result(x, buf, code, out, "scatter", m, (m,))
        _ddl.scatter(self.handle, buf if self.rank == r else None, rbuf, code, r)
        return res

    def reduce(self, x: Any, op: str = "sum", root: int = 0, out: Any = None) -> Any:
        """The reduction of every member's x on `root` (into `out` if given there); None
        elsewhere. Same rules as allreduce."""
        o = op_code(op)
        r = _rank(root, self.size, "root", "reduce")
        buf, code = _host(x, "reduce")
        res = rbuf = None
        if self.rank == r:
            res, rbuf = result(x, buf, code, out, "reduce", count(buf))
        _ddl.reduce(self.handle, buf, rbuf, code, o, r)
        return res

    # ---- point to point ------------------------------------------------------------

    def _np_fast(self, x: Any, peer: Any, tag: Any) -> int:
        """x's dtype code when x is a contiguous numpy array of a dtype the buffer protocol
        carries and peer/tag are plain in-range ints, else -1 (the general path, which
        checks each and names what is wrong). Point-to-point latency is mostly this layer."""
        if (type(x) is np.ndarray and type(peer) is int and type(tag) is int
                and 0 <= peer < self.size and x.flags.c_contiguous):
            code = _NP_CODE.get(x.dtype, -1)
            return -1 if code == BF16_CODE else code  # bfloat16: as_buffer's uint16 view
        return -1

    def send(self, x: Any, dest: int, tag: int = 0) -> None:
        """Send x to `dest`; returns once x may be reused."""
        if _ddl.send_plain(self.handle, x, dest, tag):  # (a plain case, checked in C)
            return
        d = _rank(dest, self.size, "peer", "send")
        buf, code = _host(x, "send")
        _ddl.send(self.handle, buf, code, d, int(tag))

    def recv(self, out: Any, source: int, tag: int = 0) -> Any:
        """Receive into `out` from `source`: the message must have exactly out's size (else
        MismatchError naming both sizes; the message is consumed). Returns out."""
        if _ddl.recv_plain(self.handle, out, source, tag):
            return out
        s = _rank(source, self.size, "peer", "recv")
        buf, code = _host(out, "recv")
        _ddl.recv(self.handle, buf, code, s, int(tag))
        return out

    def isend(self, x: Any, dest: int, tag: int = 0) -> P2PHandle:
        """send() without blocking (x must stay untouched until wait())."""
        return self._start(True, x, dest, tag, "isend", None)

    def irecv(self, out: Any, source: int, tag: int = 0) -> P2PHandle:
        """recv() without blocking; wait() returns out."""
        return self._start(False, out, source, tag, "irecv", out)

    def _start(self, sending: bool, x: Any, peer: Any, tag: Any, fn: str,
               result: Any) -> P2PHandle:
        """One isend/irecv: the plain numpy case straight to C, else every argument checked
        and named in its error first."""
        start = _ddl.isend if sending else _ddl.irecv
        code = self._np_fast(x, peer, tag)
        if code >= 0:
            return P2PHandle(start(self.handle, x, code, peer, tag), result)
        p = _rank(peer, self.size, "peer", fn)
        buf, code = _host(x, fn)
        return P2PHandle(start(self.handle, buf, code, p, int(tag)), result)

    # ---- asynchronous collectives (the communicator's queue) -----------------------

    def allreduce_async(self, x: Any, op: str = "sum", out: Any = None, *,
                        name: str | None = None, shape: Any = None) -> Handle:
        """Queue an allreduce for the progress thread; small ones are fused (set_fusion).

        Unnamed requests are matched across members by submission order. With `name=`,
        the request is matched by name instead, whatever order the members submit it in
        (as Horovod does); a name may be in flight once per rank. `shape=` (e.g. x.shape)
        is compared across members as well as the count. A mismatch raises MismatchError
        from wait() on every member. GPU arrays (the world's) run at once, ordered on
        their stream; the handle is then done. A communicator's requests are matched and
        fused among its members only.
        """
        o = op_code(op)
        on_gpu = self._device(x, "allreduce_async") is not None  # (resolved once: ~0.3 us)
        kw = self._queue(on_gpu, name, shape)
        if on_gpu:
            return Handle(DONE, self.allreduce(x, op, out), None)
        buf, code = as_buffer(x)
        res, rbuf = result(x, buf, code, out, "allreduce_async")
        send = None if res is x else buf
        req = _ddl.iallreduce(self.handle, send, rbuf, code, o, **kw)
        return traced(Handle(req, res, (x, res)), "allreduce", name, buf)

    def broadcast_async(self, x: Any, root: int = 0, *, name: str | None = None,
                        shape: Any = None) -> Handle:
        """Queue a broadcast of root's x into x; name= and shape= as for allreduce_async."""
        on_gpu = self._device(x, "broadcast_async") is not None
        kw = self._queue(on_gpu, name, shape)
        if on_gpu:
            return Handle(DONE, self.broadcast(x, root), None)
        buf, code = as_buffer(x)
        return traced(Handle(_ddl.ibroadcast(self.handle, buf, code, root, **kw), x, x),
                      "broadcast", name, buf)

    def allgather_async(self, x: Any, out: Any = None, *, name: str | None = None,
                        shape: Any = None) -> Handle:
        """Queue an allgather (every member's x has the same count); name= and shape= as
        for allreduce_async (shapes: all dimensions but the first must agree)."""
        on_gpu = self._device(x, "allgather_async") is not None
        kw = self._queue(on_gpu, name, shape)
        if on_gpu:
            return Handle(DONE, self.allgather(x, out), None)
        buf, code = as_buffer(x)
        res, rbuf = result(x, buf, code, out, "allgather_async", None,
                           gather_shape(x, self.size) if out is None else None)
        return traced(Handle(_ddl.iallgather(self.handle, buf, rbuf, code, **kw), res, (x, res)),
                      "allgather", name, buf)

    def reduce_scatter_async(self, x: Any, op: str = "sum", out: Any = None, *,
                             name: str | None = None, shape: Any = None) -> Handle:
        """Queue a reduce_scatter; name= and shape= (of x) as for allreduce_async."""
        o = op_code(op)
        on_gpu = self._device(x, "reduce_scatter_async") is not None
        kw = self._queue(on_gpu, name, shape)
        if on_gpu:
            return Handle(DONE, self.reduce_scatter(x, op, out), None)
        buf, code = as_buffer(x)
        shape = (scatter_shape(x, count(buf), self.size, "reduce_scatter_async")
                 if out is None else None)
        res, rbuf = result(x, buf, code, out, "reduce_scatter_async", None, shape)
        req = _ddl.ireduce_scatter(self.handle, buf, rbuf, code, o, **kw)
        return traced(Handle(req, res, (x, res)), "reduce_scatter", name, buf)

    def allgatherv_async(self, x: Any, *, name: str | None = None,
                         shape: Any = None) -> Handle:
        """Queue an allgather whose first dimension may differ between members (Horovod's
        allgather): wait() returns every member's x concatenated along the first axis, in
        rank order (numpy for numpy and buffers, torch for torch). name= and shape= as for
        allreduce_async; with shape=, all dimensions but the first must agree."""
        on_gpu = _cuda.device_array(x) is not None
        kw = self._queue(on_gpu, name, shape)
        if on_gpu:
            raise ValueError("allgatherv_async takes host memory")
        buf, code = as_buffer(x)
        dims = tuple(getattr(x, "shape", ()) or ())
        if len(dims) > 1 and 0 in dims[1:]:
            # Rows of no elements: one byte per row travels, so every rank learns how many
            # rows each had (the result's first dimension). Ranks still disagree on the
            # dtype or on rows that hold elements as a MismatchError; trailing dimensions
            # that are all empty are not compared.
            buf = np.zeros(dims[0], np.uint8)
            if kw.get("shape") is not None:
                kw["shape"] = (dims[0], 1)
            return traced(Gathered(_ddl.iallgatherv(self.handle, buf, DTYPE_CODE["uint8"], **kw),
                                   x, rows_only=True), "allgather", name, buf)
        return traced(Gathered(_ddl.iallgatherv(self.handle, buf, code, **kw), x), "allgather",
                      name, buf)

_world: Comm | None = None  # libddl's own world (ddl_comm_world)
_current: Comm | None = None  # the world that replaced it (shrink_world, replace_world)


def comm_world() -> Comm:
    """The world communicator (every rank), after init(); after shrink_world() or
    replace_world(), the world that replaced it."""
    global _world
    if _current is not None:
        return _current
    if _world is None:
        _world = Comm(_ddl.comm_world(), world=True)
    return _world


def replaced() -> Comm | None:
    """The communicator that replaced libddl's world, or None while it has not."""
    return _current


def _make_world(new: Comm) -> Comm:
    """Make `new` the world; a previous replacement is freed (libddl's own world stays:
    only finalize() releases it)."""
    global _current
    old, _current = _current, new
    if old is not None and old is not new and old._h is not None:
        try:
            old.free()
        except _ddl.DDLError:
            pass
    return new


def shrink_world() -> Comm:
    """Fault-tolerant mode: shrink the world to its survivors (Comm.shrink, collective over
    them) and make the result the world, so ddl_core.rank(), size(), allreduce(), ... go on
    on it. Returns the new world."""
    return _make_world(comm_world().shrink())


def replace_world(mpi_comm: Any) -> Comm:
    """Make (a duplicate of) an mpi4py intracommunicator the world, e.g. the survivors
    merged with ranks spawned on a regrown host (collective over it). Returns it."""
    return _make_world(Comm(_ddl.comm_from_mpi(mpi_handle(mpi_comm))))


def mpi_handle(comm: Any) -> int:
    """The C handle of an mpi4py communicator (or an int that already is one)."""
    if isinstance(comm, int):
        return comm
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise InvalidArgumentError(
            f"a communicator {type(comm).__name__!r} was given but mpi4py is not importable "
            f"({e}): install mpi4py built against this MPI, or pass the MPI_Comm as an int") from e
    if not isinstance(comm, MPI.Intracomm):
        raise InvalidArgumentError(
            f"comm must be an mpi4py intracommunicator (MPI.Intracomm), not "
            f"{type(comm).__name__}; merge an intercommunicator first (comm.Merge())")
    return int(MPI._handleof(comm))


def on(comm: Comm | None) -> Comm:
    """The communicator a module-level call runs on: `comm`, else the world."""
    if comm is None:
        if _current is not None:
            return _current
        return _world if _world is not None else comm_world()
    if not isinstance(comm, Comm):
        raise TypeError(f"comm must be a ddl_core.Comm or None, not {type(comm).__name__}")
    return comm


def free_replacement() -> None:
    """Free the world that replaced libddl's (shrink_world, replace_world) before MPI
    finalizes. Open MPI 5.0's MPI_Finalize disconnects every communicator still holding
    processes of another job (ranks a spawn added) into an array sized by a count that a
    ULFM shrink of such a communicator does not keep right: a replaced world left alive
    there made it write past that array (a heap corruption at exit, seen after a second
    reset of a grown elastic Horovod job). Freed here, nothing of ours is left for it."""
    global _current
    old, _current = _current, None
    if old is not None and old._h is not None:
        try:
            old.free()
        except _ddl.DDLError:
            pass


def _reset() -> None:
    """finalize() drops the cached world communicators."""
    global _world, _current
    _world = None
    _current = None

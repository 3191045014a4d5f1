"""Communicators (libddl 2) against numpy: split and created communicators of odd sizes,
every dtype x op (bitwise ops on integers) x odd counts for the reductions, the new
collectives and point-to-point, concurrent communicators, and the errors.

Modes: `collectives`, `errors` (mismatch on a sub-communicator, wrong-size recv, freed
communicator, bad root/peer), `timeout` (a member of a sub-communicator never arrives),
`async` (each communicator's own queue: matching by name and order among its members,
fusion, concurrency with the world's queue, mismatch and a missing member)."""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

import numpy as np
from common import DTYPES, OPS, data, reference, same

import ddl_core as ddl

ddl.init()
world = ddl.comm_world()
r, n = world.rank, world.size
failures: list[str] = []
checks = [0]
COUNTS = (0, 1, 7, 97, 4099)
BITWISE = {"band": np.bitwise_and, "bor": np.bitwise_or, "bxor": np.bitwise_xor}


def expect(ok: bool, what: str) -> None:
    checks[0] += 1
    if not ok:
        failures.append(f"rank {r}: {what}")


def ref(inputs: list[np.ndarray], dt: np.dtype, op: str) -> np.ndarray:
    if op in BITWISE:
        return BITWISE[op].reduce(np.stack(inputs), axis=0).astype(dt)
    return reference(inputs, dt, op)


def reductions(c: ddl.Comm, tag: str) -> None:
    """allreduce, reduce and reduce_scatter on c for every dtype x op x count."""
    members = c.members
    for dname, dt in DTYPES.items():
        ops = OPS + (tuple(BITWISE) if dt.kind in "iu" else ())
        for op in ops:
            dop = "max" if op in BITWISE else op
            for count in COUNTS:
                ins = [data(q, count, dt, dop) for q in members]
                want = ref(ins, dt, op)
                got = ddl.allreduce(ins[c.rank], op=op, comm=c)
                expect(same(got, want), f"{tag} allreduce {dname} {op} {count}")
                root = c.size - 1
                red = ddl.reduce(ins[c.rank], op=op, root=root, comm=c)
                expect(same(red, want) if c.rank == root else red is None,
                       f"{tag} reduce {dname} {op} {count}")
            if dname in ("float32", "int32", "float16") and op in ("sum", "avg", "bxor"):
                # large and divisible by every communicator size here: the
                # reduce-scatter + gather path of reduce (>= 256 KiB)
                big = [data(q, 72000 * 2, dt, dop, salt=1) for q in members]
                red = ddl.reduce(big[c.rank], op=op, root=0, comm=c)
                expect(same(red, ref(big, dt, op)) if c.rank == 0 else red is None,
                       f"{tag} large reduce {dname} {op}")
            if c.size == 2:
                # two ranks: the pipelined path (>= 64 KiB, 256 KiB chunks), a count with
                # an odd tail past several chunks, every op, and in place at the root
                odd = [data(q, 3 * 65536 + 7, dt, dop, salt=2) for q in members]
                want = ref(odd, dt, op)
                for root in (0, 1):
                    red = ddl.reduce(odd[c.rank], op=op, root=root, comm=c)
                    expect(same(red, want) if c.rank == root else red is None,
                           f"{tag} pair reduce {dname} {op} root {root}")
                mine = odd[c.rank].copy()
                ddl.reduce(mine, op=op, root=1, out=mine if c.rank == 1 else None, comm=c)
                expect(same(mine, want if c.rank == 1 else odd[c.rank]),
                       f"{tag} pair reduce in place {dname} {op}")
            blocks = [np.concatenate([data(q, 3, dt, dop, salt=b) for b in range(c.size)])
                      for q in members]
            rs = ddl.reduce_scatter(blocks[c.rank], op=op, comm=c)
            want = ref([b[c.rank * 3:(c.rank + 1) * 3] for b in blocks], dt, op)
            expect(same(rs, want), f"{tag} reduce_scatter {dname} {op}")


def rooted_in_place(c: ddl.Comm, root: int, mk: Any, count: int, dt: np.dtype,
                    tag: str) -> None:
    """gather whose root's x is its own block of `out`, and scatter whose root's `out` is
    its own block of x: in place (MPI_IN_PLACE's case), the other blocks still move."""
    m, me = c.size, c.rank
    out = np.zeros(m * count, dt)
    if me == root:
        out[root * count:(root + 1) * count] = mk(root)
    x = out[root * count:(root + 1) * count] if me == root else mk(me)
    got = ddl.gather(x, root=root, out=out if me == root else None, comm=c)
    expect(same(got, np.concatenate([mk(q) for q in range(m)])) if me == root else got is None,
           f"{tag} gather in place {dt} {count} root {root}")
    src = np.concatenate([mk(q, salt=7) for q in range(m)])
    keep = src.copy()
    out = src[root * count:(root + 1) * count] if me == root else np.empty(count, dt)
    got = ddl.scatter(src if me == root else np.empty(m * count, dt), root=root, out=out,
                      comm=c)
    expect(same(got, keep[me * count:(me + 1) * count]) and (me != root or same(src, keep)),
           f"{tag} scatter in place {dt} {count} root {root}")


def pair_movers(c: ddl.Comm, tag: str) -> None:
    """Two ranks: the shared-memory paths (>= 4 KiB, 256 KiB chunks; from 8 MiB direct
    copies), counts with odd tails past several chunks, a rank sending nothing, and each
    rank as the root."""
    me = c.rank
    for dt, counts in ((np.dtype(np.uint8), (3 * 65536 + 5, 700)),
                       (np.dtype(np.float64), (3 * 65536 + 5, 700, (1 << 19) + 3))):
        for count in counts:  # the last: over 8 MiB in all, copied straight across
            def mk(q: int, salt: int = 0, k: int = count, dt: np.dtype = dt) -> np.ndarray:
                return data(q, k, dt, "max", salt=salt)
            src = [np.concatenate([mk(q, salt=j) for j in range(2)]) for q in range(2)]
            got = ddl.alltoall(src[me], comm=c)
            want = np.concatenate([src[j][me * count:(me + 1) * count] for j in range(2)])
            expect(same(got, want), f"{tag} pair alltoall {dt} {count}")
            for ks in ([count, count // 3], [0, count], [count, 0]):
                got = ddl.allgatherv(mk(me, k=ks[me]), comm=c)
                expect(same(got, np.concatenate([mk(q, k=ks[q]) for q in range(2)])),
                       f"{tag} pair allgatherv {dt} {ks}")
            for root in (0, 1):
                got = ddl.gather(mk(me), root=root, comm=c)
                expect(same(got, np.concatenate([mk(q) for q in range(2)])) if me == root
                       else got is None, f"{tag} pair gather {dt} {count} root {root}")
                got = ddl.scatter(src[root] if me == root else np.empty(2 * count, dt),
                                  root=root, comm=c)
                expect(same(got, src[root][me * count:(me + 1) * count]),
                       f"{tag} pair scatter {dt} {count} root {root}")
                rooted_in_place(c, root, mk, count, dt, f"{tag} pair")


def movers(c: ddl.Comm, tag: str) -> None:
    """The data-movement collectives and point-to-point on c, every dtype."""
    m, me = c.size, c.rank
    for dname, dt in DTYPES.items():
        for count in (0, 1, 13):
            def mk(q: int, salt: int = 0, k: int = count, dt: np.dtype = dt) -> np.ndarray:
                return data(q, k, dt, "max", salt=salt)
            src = [np.concatenate([mk(q, salt=j) for j in range(m)]) for q in range(m)]
            got = ddl.alltoall(src[me], comm=c)
            want = np.concatenate([src[j][me * count:(me + 1) * count] for j in range(m)])
            expect(same(got, want), f"{tag} alltoall {dname} {count}")
            # alltoallv: rank q sends (q + j + count) % 4 elements to rank j
            sc = [[(q + j + count) % 4 for j in range(m)] for q in range(m)]
            vin = [np.concatenate([mk(q, salt=j, k=sc[q][j]) for j in range(m)]) for q in range(m)]
            got = ddl.alltoallv(vin[me], sc[me], comm=c)
            want = np.concatenate([mk(j, salt=me, k=sc[j][me]) for j in range(m)])
            expect(same(got, want), f"{tag} alltoallv {dname} {count}")
            got = ddl.allgatherv(mk(me, k=(me * 2 + count) % 5), comm=c)
            want = np.concatenate([mk(q, k=(q * 2 + count) % 5) for q in range(m)])
            expect(same(got, want), f"{tag} allgatherv {dname} {count}")
            root = (count + 1) % m
            got = ddl.gather(mk(me), root=root, comm=c)
            expect(same(got, np.concatenate([mk(q) for q in range(m)])) if me == root
                   else got is None, f"{tag} gather {dname} {count}")
            got = ddl.scatter(src[root] if me == root else np.empty(m * count, dt), root=root,
                              comm=c)
            expect(same(got, src[root][me * count:(me + 1) * count]),
                   f"{tag} scatter {dname} {count}")
            rooted_in_place(c, root, mk, count, dt, tag)
            x = mk(me, salt=5)
            ddl.broadcast(x, root=root, comm=c)
            expect(same(x, mk(root, salt=5)), f"{tag} broadcast {dname} {count}")
            got = ddl.allgather(mk(me), comm=c)
            expect(same(got, np.concatenate([mk(q) for q in range(m)])),
                   f"{tag} allgather {dname} {count}")
            if m > 1:  # a ring of send/recv, tags per dtype; isend/irecv the other way
                nxt, prv = (me + 1) % m, (me - 1) % m
                h = ddl.isend(mk(me, salt=9), prv, tag=7, comm=c)
                if me % 2 == 0:
                    ddl.send(mk(me), nxt, tag=3, comm=c)
                    got = ddl.recv(np.empty(count, dt), prv, tag=3, comm=c)
                else:
                    got = ddl.recv(np.empty(count, dt), prv, tag=3, comm=c)
                    ddl.send(mk(me), nxt, tag=3, comm=c)
                expect(same(got, mk(prv)), f"{tag} send/recv {dname} {count}")
                got = ddl.irecv(np.empty(count, dt), nxt, tag=7, comm=c).wait()
                h.wait()
                expect(same(got, mk(nxt, salt=9)), f"{tag} isend/irecv {dname} {count}")


def concurrently(fn, args_list) -> None:
    """Run fn(*args) for each args in its own thread, all at once, and wait for them."""
    ts = [threading.Thread(target=fn, args=args) for args in args_list]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def mode_collectives() -> None:
    halves = world.split(r % 2, key=-r)  # odd sizes for 3 and 5 ranks; reversed order
    expect(halves.size == (n + 1 - r % 2) // 2, "split size")
    expect(list(halves.members) == sorted((q for q in range(n) if q % 2 == r % 2),
                                          reverse=True), f"split members {halves.members}")
    listed = list(range(n - 1, -1, -2))  # every other rank from the last, in that order
    made = world.create(listed)
    expect((made is None) == (r not in listed), "create membership")
    if made is not None:
        expect(list(made.members) == listed and made.rank == listed.index(r), "create order")
    none = world.split(None if r == 0 else 1)
    expect((none is None) == (r == 0), "split color None")
    expect(int(np.prod(halves.topology)) == halves.size,
           f"split grid {halves.topology} for {halves.size} ranks (world {world.topology})")
    for c, tag in ((world, "world"), (halves, "split"), (made, "create")):
        if c is not None:
            reductions(c, tag)
            movers(c, tag)
            if c.size == 2:
                pair_movers(c, tag)
    # Two communicators of this rank used at once from two threads, 40 calls each.
    other = world.split(0, key=r)
    errs: list[str] = []

    def spin(c: ddl.Comm, salt: int) -> None:
        try:
            for i in range(40):
                x = np.full(257, c.rank + i + salt, np.int64)
                got = ddl.allreduce(x, comm=c)
                want = sum(q + i + salt for q in range(c.size))
                if not (got == want).all():
                    errs.append(f"concurrent {salt} call {i}")
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(repr(e))

    concurrently(spin, ((halves, 0), (other, 1000)))
    expect(not errs, f"concurrent communicators: {errs}")
    for c in (halves, made, none):
        if c is not None:
            c.free()
    # `other` is left unfreed on purpose: ddl_finalize stops its progress thread (it used
    # to probe its communicator after MPI_Finalize, a fatal MPI error at exit).


def raises(exc: type, fn, *a, **kw) -> str:
    try:
        fn(*a, **kw)
    except exc as e:
        return str(e)
    failures.append(f"rank {r}: {getattr(fn, '__name__', fn)} did not raise {exc.__name__}")
    return ""


def mode_errors() -> None:
    half = world.split(r % 2)
    # Mismatch inside color 0 only: every member of it raises, color 1 runs a good call.
    if r % 2 == 0 and half.size > 1:
        msg = raises(ddl.MismatchError, ddl.allreduce, np.ones(3 + half.rank, np.float32),
                     comm=half)
        expect("different" in msg or "count" in msg, f"mismatch message: {msg}")
        msg = raises(ddl.MismatchError, ddl.reduce, np.ones(4, np.float32),
                     root=half.rank % 2, comm=half)
    else:
        got = ddl.allreduce(np.ones(5, np.float32), comm=half)
        expect((got == half.size).all(), "non-member of the mismatch unaffected")
    got = ddl.allreduce(np.ones(5, np.int32), comm=half)  # the next call works
    expect((got == half.size).all(), "call after a mismatch")
    # allgatherv with counts that do not fit: the last rank sends one element more than
    # the list says (the counts named), then a dtype that differs (counts right); every
    # member raises, and the next call works
    if half.size > 1:
        counts = [2] * half.size
        last = half.rank == half.size - 1
        msg = raises(ddl.MismatchError, ddl.allgatherv, np.ones(3 if last else 2, np.int32),
                     counts, comm=half)
        expect("sends 3 elements" in msg and "expects 2" in msg or "counts disagree" in msg,
               f"allgatherv counts message: {msg}")
        msg = raises(ddl.MismatchError, ddl.allgatherv,
                     np.ones(2, np.float32 if last else np.int32), counts, comm=half)
        expect("different arguments" in msg, f"allgatherv dtype message: {msg}")
        got = ddl.allgatherv(np.full(2, half.rank, np.int32), counts, comm=half)
        expect(same(got, np.repeat(np.arange(half.size, dtype=np.int32), 2)),
               "allgatherv after mismatches")
    # Wrong-size recv: an error naming both sizes; the next exchange works.
    if n > 1 and r < 2:
        if r == 0:
            ddl.send(np.arange(4, dtype=np.float32), 1, tag=2)
            ddl.send(np.arange(5, dtype=np.float32), 1, tag=2)
        else:
            msg = raises(ddl.MismatchError, ddl.recv, np.empty(5, np.float32), 0, tag=2)
            expect("16 bytes" in msg and "20 bytes" in msg, f"recv size message: {msg}")
            got = ddl.recv(np.empty(5, np.float32), 0, tag=2)
            expect(same(got, np.arange(5, dtype=np.float32)), "recv after a wrong size")
    # send/recv's plain case is checked in C (_ddl.p2p_fast); anything else takes the
    # general path and its errors: the same results either way
    if n > 1 and r < 2:
        if r == 0:
            ddl.send(np.arange(3, dtype=np.longlong), 1, tag=4)  # (buffer format "q")
            ddl.send(np.arange(3, dtype=np.int64), np.int64(1), tag=np.int32(4))
        else:
            for k in range(2):
                got = ddl.recv(np.empty(3, np.int64 if k else np.longlong), 0, tag=4)
                expect(same(got, np.arange(3, dtype=np.int64)), f"recv int64 {k}")
        raises(ValueError, ddl.send, np.arange(8.0)[::2], 1 - r)
        raises(TypeError, ddl.send, np.ones(2, bool), 1 - r)
        raises(TypeError, ddl.recv, np.ones(2, ">f8"), 1 - r)
        ro = np.ones(2)
        ro.flags.writeable = False
        raises(ValueError, ddl.recv, ro, 1 - r)  # (read-only: numpy refuses the buffer)
        raises(ddl.InvalidArgumentError, ddl.send, np.ones(2), 1 - r, tag=40000)
        raises(ddl.InvalidArgumentError, ddl.send, np.ones(2), -1)
    raises(ddl.InvalidArgumentError, ddl.reduce, np.ones(2), root=half.size, comm=half)
    raises(ddl.InvalidArgumentError, ddl.send, np.ones(2), half.size, comm=half)
    raises(ddl.InvalidArgumentError, ddl.allreduce, np.ones(2), op="bxor", comm=half)
    half.free()
    msg = raises(ddl.InvalidArgumentError, ddl.allreduce, np.ones(2), comm=half)
    expect("freed" in msg, f"freed message: {msg}")
    raises(ddl.InvalidArgumentError, world.free)
    world.barrier()


def mode_timeout() -> None:
    """Rank 1 of color 0 never arrives: the others of color 0 time out after the
    communicator's 2 s; color 1 is unaffected."""
    half = world.split(r % 2)
    half.set_timeout(2.0)
    if r % 2 == 0:
        if half.rank != 1:
            t0 = time.monotonic()
            msg = raises(ddl.DDLTimeoutError, ddl.allreduce, np.ones(3), comm=half)
            took = time.monotonic() - t0
            expect(1.5 < took < 20, f"timeout after {took:.1f} s")
            print(f"timeout rank {r}: {took:.1f} s: {msg}", flush=True)
    else:
        got = ddl.allreduce(np.ones(3), comm=half)
        expect((got == half.size).all(), "other communicator unaffected")
    time.sleep(0.5)


def p2p_requests(c: ddl.Comm) -> None:
    """isend/irecv (libddl's requests): receives posted before any message arrives are
    matched in posting order whatever order they are waited in, also across tags; test()
    makes progress; a wrong size fails that receive with both sizes, the next one works; a
    receive nobody sends to fails at the communicator's timeout."""
    c.set_timeout(None)
    if c.size < 2:
        return
    peer = (c.rank + 1) % c.size
    src = (c.rank - 1) % c.size
    recvs = [ddl.irecv(np.empty(3, np.int64), src, tag=5 + k % 2, comm=c) for k in range(6)]
    c.barrier()  # every receive is posted before the messages leave
    sends = [ddl.isend(np.full(3, 100 * c.rank + k, np.int64), peer, tag=5 + k % 2, comm=c)
             for k in range(6)]
    for k in reversed(range(6)):  # waited youngest first: still matched oldest first
        expect((recvs[k].wait() == 100 * src + k).all(), f"irecv {k} in posting order")
    for h in sends:
        h.wait()
    big = ddl.isend(np.arange(5, dtype=np.float32), peer, tag=9, comm=c)
    ok = ddl.isend(np.arange(4, dtype=np.float32), peer, tag=9, comm=c)
    bad = ddl.irecv(np.empty(4, np.float32), src, tag=9, comm=c)

    def poll() -> None:
        while not bad.test():  # test() raises the request's error once it is done
            time.sleep(0.001)

    msg = raises(ddl.MismatchError, poll)
    expect("20 bytes" in msg and "16 bytes" in msg, f"irecv size message: {msg}")
    got = ddl.irecv(np.empty(4, np.float32), src, tag=9, comm=c).wait()
    expect((got == np.arange(4)).all(), "irecv after a wrong size")
    big.wait()
    ok.wait()
    c.set_timeout(1.0)
    t0 = time.monotonic()
    msg = raises(ddl.DDLTimeoutError, ddl.irecv(np.empty(1), src, tag=11, comm=c).wait)
    expect(0.8 < time.monotonic() - t0 < 20 and "tag 11" in msg, f"irecv timeout: {msg}")
    c.set_timeout(None)
    c.barrier()


def mode_async() -> None:
    """Asynchronous collectives on a communicator's own queue."""
    half = world.split(r % 2, key=-r)  # reversed order, odd sizes at 3 and 5 ranks
    members = list(half.members)
    before = ddl.async_stats()
    # Named requests submitted in an order that differs between members (reversed on odd
    # communicator ranks), the same names in flight on the world's queue at the same time:
    # a name is matched within its communicator only.
    names = [f"t{i}" for i in range(12)]
    order = names[::-1] if half.rank % 2 else names
    mine = {nm: np.full(5 + i, 10 * half.rank + i, np.float32) for i, nm in enumerate(names)}
    hs = {nm: ddl.allreduce_async(mine[nm], name=nm, comm=half) for nm in order}
    ws = {nm: ddl.allreduce_async(np.full(3, r + 1, np.int64), name=nm) for nm in names[:4]}
    for i, nm in enumerate(names):
        want = sum(10 * q + i for q in range(half.size))
        expect((hs[nm].wait() == want).all(), f"named {nm} on the communicator")
    for nm in names[:4]:
        expect((ws[nm].wait() == n * (n + 1) // 2).all(), f"named {nm} on the world")
    # Unnamed requests, matched by order, with every kind of request.
    cs = half.size
    root = cs - 1
    a = ddl.allreduce_async(np.arange(7, dtype=np.int32) * (half.rank + 1), comm=half)
    b = ddl.broadcast_async(np.full(4, half.rank, np.float64), root=root, comm=half)
    g = ddl.allgather_async(np.full((2, 3), half.rank, np.int64), comm=half)
    rs = ddl.reduce_scatter_async(np.arange(cs * 3, dtype=np.float32), op="max", comm=half)
    gv = ddl.allgatherv_async(np.full((half.rank + 1, 2), half.rank, np.int32), comm=half)
    expect((a.wait() == np.arange(7) * sum(range(1, cs + 1))).all(), "unnamed allreduce")
    expect((b.wait() == root).all(), "broadcast from the last member")
    got = g.wait()
    expect(got.shape == (2 * cs, 3) and all((got[2 * q:2 * q + 2] == q).all()
                                            for q in range(cs)), f"allgather {got}")
    expect((rs.wait() == np.arange(cs * 3, dtype=np.float32)[3 * half.rank:3 * half.rank + 3])
           .all(), "reduce_scatter")
    got = gv.wait()
    want = np.concatenate([np.full((q + 1, 2), q, np.int32) for q in range(cs)])
    expect(got.shape == want.shape and (got == want).all(), f"allgatherv {got.shape}")
    # Many small ones: fused on the communicator's queue.
    small = [ddl.allreduce_async(np.full(16, half.rank + k, np.float32), comm=half)
             for k in range(64)]
    for k, h in enumerate(small):
        expect((h.wait() == sum(q + k for q in range(cs))).all(), f"small {k}")
    after = ddl.async_stats()
    if cs > 1:
        expect(after["fused_requests"] > before["fused_requests"], f"fusion {after}")
    # Two threads, each with its communicator's requests in flight, against the world's.
    other = world.split(0, key=r)
    errs: list[str] = []

    def flood(c: ddl.Comm, salt: int) -> None:
        try:
            hs = [ddl.allreduce_async(np.full(33, c.rank + i + salt, np.int64), comm=c,
                                      name=f"f{i}") for i in range(30)]
            for i, h in enumerate(hs):
                if not (h.wait() == sum(q + i + salt for q in range(c.size))).all():
                    errs.append(f"flood {salt} request {i}")
        except Exception as e:  # noqa: BLE001 - reported below
            errs.append(repr(e))

    concurrently(flood, ((half, 0), (other, 100)))
    expect(not errs, f"concurrent queues: {errs}")
    # A dtype that differs on one member: MismatchError on that communicator's members
    # only, and its next request works.
    if r % 2 == 0 and cs > 1:
        dt = np.float64 if half.rank == 0 else np.float32
        msg = raises(ddl.MismatchError, lambda: ddl.allreduce_async(
            np.ones(4, dt), name="odd", comm=half).wait())
        expect("data types" in msg or "dtype" in msg, f"mismatch message: {msg}")
    ok = ddl.allreduce_async(np.ones(6, np.int32), name="odd", comm=half).wait()
    expect((ok == cs).all(), "the request after a mismatch")
    # A member that never submits: the others hear of it at the communicator's timeout,
    # named; the other communicator is unaffected.
    half.set_timeout(2.0)
    if r % 2 == 1 and cs > 1:
        if half.rank != 0:
            t0 = time.monotonic()
            msg = raises(ddl.DDLTimeoutError, lambda: ddl.allreduce_async(
                np.ones(2), name="late", comm=half).wait())
            took = time.monotonic() - t0
            expect(1.5 < took < 20, f"async timeout after {took:.1f} s")
            absent = members[0]  # communicator rank 0: the highest world rank of its half
            expect("'late'" in msg and "by rank 0 of the communicator (world rank "
                   f"{absent})" in msg, f"timeout message: {msg}")
        half.set_timeout(None)  # the absent member waits here meanwhile
        half.barrier()
    else:
        expect((ddl.allreduce_async(np.ones(2), comm=half).wait() == cs).all(),
               "the other communicator")
    p2p_requests(half)
    for c in (half, other):
        c.free()
    msg = raises(ddl.InvalidArgumentError, ddl.allreduce_async, np.ones(2), comm=half)
    expect("freed" in msg, f"freed message: {msg}")
    world.barrier()


{"collectives": mode_collectives, "errors": mode_errors, "timeout": mode_timeout,
 "async": mode_async}[sys.argv[1]]()
if failures:
    print("\n".join(failures[:30]), file=sys.stderr)
    sys.exit(1)
print(f"checks {checks[0]}", flush=True)
print(f"OK comms-{sys.argv[1]}")
ddl.finalize()

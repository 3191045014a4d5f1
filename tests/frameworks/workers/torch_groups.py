"""Subgroups of any ranks on libddl communicators, point-to-point and uneven all_gather on
the ddl backend, each against what it must compute (3 or more ranks for the subgroup of
ranks 0 and 2)."""

import os
import sys
from datetime import timedelta

import torch
import torch.distributed as dist

dist.init_process_group("ddl")
rank, size = dist.get_rank(), dist.get_world_size()


def expect(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if not torch.equal(got, want):
        raise AssertionError(f"rank {rank}: {what}: got {got}, want {want}")


def groups() -> None:
    members = [0, 2] if size >= 3 else [1]
    g = dist.new_group(members, timeout=timedelta(seconds=60))
    odd = dist.new_group([r for r in range(size) if r % 2])  # a second one, created after
    if rank not in members:
        assert g == dist.GroupMember.NON_GROUP_MEMBER, g
    else:
        me = members.index(rank)
        assert dist.get_rank(g) == me and dist.get_world_size(g) == len(members)
        assert g.group_name and dist.get_backend(g) == "ddl"
        t = torch.full((5,), float(rank + 1))
        dist.all_reduce(t, group=g)
        expect(t, torch.full((5,), float(sum(m + 1 for m in members))), "group all_reduce")
        b = torch.arange(4) * (rank + 1)
        dist.broadcast(b, group=g, group_src=len(members) - 1)
        expect(b, torch.arange(4) * (members[-1] + 1), "group broadcast")
        outs = [torch.empty(3) for _ in members]
        dist.all_gather(outs, torch.full((3,), float(rank)), group=g)
        for k, m in enumerate(members):
            expect(outs[k], torch.full((3,), float(m)), "group all_gather")
        full = torch.arange(2 * len(members), dtype=torch.float64) * (rank + 1)
        part = torch.empty(2, dtype=torch.float64)
        dist.reduce_scatter_single(part, full, group=g)
        whole = torch.arange(2 * len(members), dtype=torch.float64) * sum(m + 1 for m in members)
        expect(part, whole[2 * me:2 * me + 2], "group reduce_scatter_single")
        rows = torch.arange(len(members), dtype=torch.int64) + 10 * rank
        got = torch.empty_like(rows)
        dist.all_to_all_single(got, rows, group=g)
        expect(got, torch.tensor([me + 10 * m for m in members]), "group all_to_all_single")
        dist.barrier(group=g)
    if rank % 2:
        t = torch.ones(2, dtype=torch.int32)
        dist.all_reduce(t, group=odd)
        expect(t, torch.full((2,), len(range(1, size, 2)), dtype=torch.int32), "odd all_reduce")
    world = torch.ones(1)
    dist.all_reduce(world)  # the world still works after the subgroups
    expect(world, torch.full((1,), float(size)), "world all_reduce after subgroups")


def p2p() -> None:
    right, left = (rank + 1) % size, (rank - 1) % size
    # a ring, blocking: even ranks send first
    out = torch.arange(4, dtype=torch.float32) + rank
    into = torch.empty(4)
    if rank % 2 == 0:
        dist.send(out, right)
        dist.recv(into, left)
    else:
        dist.recv(into, left)
        dist.send(out, right)
    expect(into, torch.arange(4, dtype=torch.float32) + left, "send/recv ring")
    # tags keep two messages to one peer apart, whatever order they are received in
    a, b = torch.empty(2, dtype=torch.int64), torch.empty(3, dtype=torch.int64)
    reqs = [dist.irecv(b, left, tag=7), dist.irecv(a, left, tag=3),
            dist.isend(torch.full((2,), rank, dtype=torch.int64), right, tag=3),
            dist.isend(torch.full((3,), 100 + rank, dtype=torch.int64), right, tag=7)]
    for req in reqs:
        req.wait()
    expect(a, torch.full((2,), left, dtype=torch.int64), "irecv tag 3")
    expect(b, torch.full((3,), 100 + left, dtype=torch.int64), "irecv tag 7")
    # batch_isend_irecv, as pipeline parallelism uses it
    got = torch.empty(6, dtype=torch.bfloat16)
    ops = [dist.P2POp(dist.isend, torch.full((6,), float(rank), dtype=torch.bfloat16), right),
           dist.P2POp(dist.irecv, got, left)]
    for req in dist.batch_isend_irecv(ops):
        req.wait()
    expect(got, torch.full((6,), float(left), dtype=torch.bfloat16), "batch_isend_irecv")


def uneven() -> None:
    outs = [torch.empty(k + 1, 2) for k in range(size)]
    dist.all_gather(outs, torch.full((rank + 1, 2), float(rank)))
    for k in range(size):
        expect(outs[k], torch.full((k + 1, 2), float(k)), "uneven all_gather")


def fallback() -> None:
    """DDL_TORCH_CPP=0 (the Python ProcessGroup, no C++ Backend): plain collectives work, a
    subgroup is refused on every rank alike with an error naming ddl-torch."""
    assert os.environ.get("DDL_TORCH_CPP") == "0"
    t = torch.ones(3)
    dist.all_reduce(t)
    expect(t, torch.full((3,), float(size)), "all_reduce on the Python ProcessGroup")
    try:
        dist.new_group([0])
    except RuntimeError as exc:
        assert "needs ddl-torch" in str(exc), exc
    else:
        raise AssertionError("a subgroup was accepted without the C++ Backend")
    dist.all_reduce(t)  # nothing half made: the world still works
    expect(t, torch.full((3,), float(size * size)), "all_reduce after the refusal")


def timeout() -> None:
    """A member that skips a collective: the others raise within the group's timeout (as
    gloo does), not hang; last, since the group is unusable afterwards."""
    import time

    g = dist.new_group([0, 1], timeout=timedelta(seconds=3))
    if rank == 0:
        t0 = time.monotonic()
        try:
            dist.all_reduce(torch.ones(4), group=g)
        except Exception as exc:  # noqa: BLE001
            took = time.monotonic() - t0
            assert took < 30, f"raised after {took:.1f} s, the group's timeout is 3 s"
            assert "timed out" in str(exc).lower() or "timeout" in str(exc).lower(), exc
        else:
            raise AssertionError("an all_reduce that rank 1 never joined succeeded")
    elif rank == 1:
        print("OK timeout", flush=True)  # (its part: being absent, and alive)
        time.sleep(10)  # alive but absent: a timeout, not a lost rank
        sys.exit(0)


for mode in sys.argv[1:]:
    {"groups": groups, "p2p": p2p, "uneven": uneven, "timeout": timeout,
     "fallback": fallback}[mode]()
    print(f"OK {mode}", flush=True)
if "timeout" not in sys.argv:
    dist.destroy_process_group()

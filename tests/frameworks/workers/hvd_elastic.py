"""Elastic Horovod's state and run-loop semantics on a healthy job (no rank dies; what a
death adds is hvd_elastic_kill.py's): ObjectState and TorchState commit / restore / sync,
hvd.elastic.run's retry after a HorovodInternalError (restore to the last commit, the
world rebuilt, reset callbacks, sync from rank 0), HostsUpdatedInterrupt raised on every
rank at the same commit from an update only rank 0 received, ElasticSampler's shards and
its resumption, the reset limit, and the HOROVOD_* variables a worker sees."""

from __future__ import annotations

import os
import sys

import horovod.torch as hvd
import torch
from checks import bad, expect, raises
from horovod.common.elastic import notification_manager
from horovod.common.exceptions import HostUpdateResult
from torch import nn

hvd.init()
r, n = hvd.rank(), hvd.size()

# -- the worker's environment ----------------------------------------------------------
for var, want in (("HOROVOD_RANK", r), ("HOROVOD_SIZE", n), ("HOROVOD_LOCAL_RANK",
                  hvd.local_rank()), ("HOROVOD_CROSS_SIZE", hvd.cross_size())):
    expect(os.environ.get(var) == str(want), f"{var}={os.environ.get(var)!r}, want {want}")
expect(bool(os.environ.get("HOROVOD_HOSTNAME")), "HOROVOD_HOSTNAME unset")

# -- ObjectState: sync from rank 0, restore undoes what was not committed ----------------
st = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, epoch=10 * r, log=[r])
st.sync()
expect(st.epoch == 0 and st.log == [0], f"after sync: epoch {st.epoch} log {st.log}")
st.epoch = 3
st.log.append(7)
st.restore()
expect(st.epoch == 0 and st.log == [0], f"restore: epoch {st.epoch} log {st.log} (want the "
       "commit, the list's append undone too)")
st.epoch, st.log = 4, [0, 4]
st.commit()
st.epoch = 99
st.restore()
expect(st.epoch == 4 and st.log == [0, 4], f"restore after commit: {st.epoch} {st.log}")

# -- TorchState: model and optimizer ---------------------------------------------------
torch.manual_seed(100 + r)  # each rank starts with its own weights: sync must fix that
model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                               named_parameters=model.named_parameters())
ts = hvd.elastic.TorchState(model, opt, batch=r, epoch=0)
ts.sync()
w0 = [p.detach().clone() for p in model.parameters()]
gathered = hvd.allgather_object([p.tolist() for p in w0])
expect(all(g == gathered[0] for g in gathered), "TorchState.sync: ranks' weights differ")
expect(ts.batch == 0, f"TorchState.sync: batch {ts.batch}, want rank 0's 0")
expect(ts.model is model and ts.optimizer is opt, "TorchState attributes are not the objects")


def step(i: int) -> None:
    g = torch.Generator().manual_seed(i * 10 + r)
    x, y = torch.randn(8, 4, generator=g), torch.randint(0, 2, (8,), generator=g)
    opt.zero_grad()
    nn.functional.cross_entropy(model(x), y).backward()
    opt.step()


ts.commit()  # committed: w0, and the momentum buffers as sync made them
committed_state = {k: {n: v.clone() if torch.is_tensor(v) else v for n, v in d.items()}
                   for k, d in opt.state_dict()["state"].items()}
step(0)
expect(any(not torch.equal(a, p) for a, p in zip(w0, model.parameters(), strict=True)),
       "a step changed nothing")
ts.restore()
expect(all(torch.equal(a, p) for a, p in zip(w0, model.parameters(), strict=True)),
       "TorchState.restore: weights are not the committed ones")
now = opt.state_dict()["state"]
expect(now.keys() == committed_state.keys() and all(
    torch.equal(now[k]["momentum_buffer"], committed_state[k]["momentum_buffer"])
    for k in now if now[k].get("momentum_buffer") is not None),
    "TorchState.restore kept the uncommitted momentum")

# -- hvd.elastic.run: a HorovodInternalError on every rank, then again, then success -----
calls: list[str] = []
failures = {2: 1, 5: 1}   # at these batches, fail this many times


def on_reset() -> None:
    calls.append(f"reset size={hvd.size()}")


ts2 = hvd.elastic.TorchState(model, opt, batch=0, done=[], rendezvous=0)
ts2.register_reset_callbacks([on_reset])


@hvd.elastic.run
def train(state: hvd.elastic.TorchState) -> str:
    state.rendezvous += 1
    calls.append(f"start batch={state.batch}")
    while state.batch < 8:
        step(state.batch)
        if failures.get(state.batch, 0) > 0:
            failures[state.batch] -= 1
            state.done.append("lost")   # not committed: the restore must undo it
            raise hvd.HorovodInternalError(f"injected at batch {state.batch}")
        state.done.append(state.batch)
        state.batch += 1
        state.commit()
    return "finished"


out = train(ts2)
expect(out == "finished", f"run returned {out!r}")
expect(calls == ["start batch=0", "reset size=2", "start batch=2", "reset size=2",
                 "start batch=5"], f"run loop calls: {calls}")
expect(ts2.done == list(range(8)), f"committed record {ts2.done}")
expect(ts2.rendezvous == 3, f"rendezvous {ts2.rendezvous} (restored, then counted again)")
wts = hvd.allgather_object([p.tolist() for p in model.parameters()])
expect(all(w == wts[0] for w in wts), "after the resets the ranks' weights differ")
expect(hvd.size() == n and hvd.rank() == r, "the world changed in a healthy job")

# a non-Horovod error is the user's: raised, no retry
raises(ValueError, lambda: hvd.elastic.run(lambda s: (_ for _ in ()).throw(ValueError("mine")))(
    hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, x=1)), "ValueError in run", "mine")

# -- HostsUpdatedInterrupt: only rank 0 is told, every rank raises at the same commit ----
hu = hvd.elastic.ObjectState(hvd.broadcast_object, hvd.rank, batch=0, interrupts=0)
hu_calls: list[int] = []


@hvd.elastic.run
def grow(state: hvd.elastic.ObjectState) -> int:
    hu_calls.append(state.batch)
    while state.batch < 6:
        if state.batch == 3 and state.interrupts == 0 and r == 0:
            notification_manager.handle_hosts_updated(1.0, HostUpdateResult.added)
        state.batch += 1
        if state.batch == 4:
            state.interrupts += 1
        state.commit()
    return state.batch


expect(grow(hu) == 6, "grow did not finish")
expect(hu_calls == [0, 4], f"HostsUpdatedInterrupt: run entered at {hu_calls}, want [0, 4] "
       "(every rank interrupted at the commit after batch 3, state kept)")
expect(hu.interrupts == 1, f"interrupts {hu.interrupts}")

# -- ElasticSampler: disjoint shards that cover the data; resumption after a reset -------
data = list(range(23))
sampler = hvd.elastic.ElasticSampler(data, shuffle=True, seed=5)
mine = list(sampler)
shards = hvd.allgather_object(mine)
flat = [i for s in shards for i in s]
expect(len(mine) == len(sampler) == 12, f"shard length {len(mine)} / {len(sampler)}")
expect(set(flat) == set(data), "shards do not cover the dataset")
expect(len(set(shards[0]) & set(shards[1])) <= 1, "shards overlap beyond the padding")
sampler.record_batch(0, 4)
sampler.record_batch(1, 4)
expect(sampler.state_dict() == {"epoch": 0, "processed_num": 16}, f"{sampler.state_dict()}")
sampler.reset()
rest = hvd.allgather_object(list(sampler))
order = list(sampler.remaining_indices)
expect(len(order) == 7 and set(i for s in rest for i in s) == set(order),
       f"after 16 processed: remaining {order}, shards {rest}")
sampler.set_epoch(1)
expect(sampler.processed_num == 0 and len(sampler) == 12, "set_epoch did not start afresh")
expect(list(sampler) != mine, "epoch 1 has epoch 0's order")
ts3 = hvd.elastic.TorchState(sampler=sampler)
sampler.record_batch(0, 5)
ts3.commit()
sampler.record_batch(1, 5)
ts3.restore()
expect(sampler.processed_num == 10, f"sampler restore: processed {sampler.processed_num}")

# -- the reset limit (horovodrun --reset-limit): exceeded is an error on every rank ------
os.environ["HOROVOD_RESET_LIMIT"] = "1"
from horovod.common import elastic_world  # noqa: E402

elastic_world._resets = 0


@hvd.elastic.run
def always_fails(state: hvd.elastic.ObjectState) -> None:
    raise hvd.HorovodInternalError("again")


raises(RuntimeError, lambda: always_fails(hvd.elastic.ObjectState(hvd.broadcast_object,
       hvd.rank, x=0)), "reset limit", "reset limit of 1")
del os.environ["HOROVOD_RESET_LIMIT"]

hvd.barrier()
if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_elastic", flush=True)

"""horovod.torch's DistributedOptimizer as Horovod documents it, at 3 ranks: every
gradient is averaged even where this rank computed none (zeros sent, as Horovod forces);
sparse gradients stay sparse (SparseAdam works) with sparse_as_dense False and True;
`_parameter_names` names every parameter the same way on every rank; step() after an
explicit synchronize() warns unless inside skip_synchronize(); and on a process set a
rank outside the set steps on its own gradients. Expected values are computed here."""

from __future__ import annotations

import copy
import sys
import warnings

import horovod.torch as hvd
import torch
from checks import bad, expect
from torch import nn

hvd.init()
r, n = hvd.rank(), hvd.size()
assert n == 3, "this worker runs on 3 ranks"
def same_everywhere(t: torch.Tensor) -> bool:
    every = hvd.allgather(t.detach().reshape(1, -1))
    return bool((every == every[0]).all())


# -- a parameter this rank computed no gradient for still gets the average --------------
torch.manual_seed(0)
heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 2)})
x = torch.ones(1, 4) * (r + 1)
opt = hvd.DistributedOptimizer(torch.optim.SGD(heads.parameters(), lr=1.0),
                               named_parameters=heads.named_parameters())
before = {k: v.detach().clone() for k, v in heads.named_parameters()}
opt.zero_grad()
(heads["a"] if r == 0 else heads["b"])(x).sum().backward()   # rank 0 uses head a only
opt.step()
# d(sum of the output)/d(weight) = the input row; head a: only rank 0's, averaged over n.
want_a = before["a.weight"] - torch.ones(2, 4) * 1 / n
want_b = before["b.weight"] - torch.ones(2, 4) * sum(k + 1 for k in range(1, n)) / n
expect(torch.allclose(heads["a"].weight, want_a) and torch.allclose(heads["b"].weight, want_b),
       "forced allreduce of a gradient some rank did not compute")
expect(all(same_everywhere(p) for p in heads.parameters()), "weights differ between ranks")

# -- _parameter_names: unique and the same on every rank, with or without names ----------
model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 3))
o = hvd.DistributedOptimizer(torch.optim.SGD([{"params": model[0].parameters()},
                                              {"params": model[1].parameters()}], lr=0.1))
names = o._parameter_names
expect(len(names) == 4 and len(set(names.values())) == 4, f"names {names}")
every = hvd.allgather_object(sorted(names.values()))
expect(all(e == every[0] for e in every), f"names differ between ranks: {every}")
o2 = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                              named_parameters=model.named_parameters())
expect(sorted(o2._parameter_names.values()) == ["0.bias", "0.weight", "1.bias", "1.weight"],
       f"named {o2._parameter_names}")

# -- step() after synchronize(): one warning, none inside skip_synchronize() -------------
lin = nn.Linear(1, 1)
hvd.broadcast_parameters(lin.state_dict(), root_rank=0)
o = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=0.1),
                             named_parameters=lin.named_parameters())
for skip in (False, True):
    o.zero_grad()
    lin(torch.ones(1, 1) * r).sum().backward()
    o.synchronize()
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        if skip:
            with o.skip_synchronize():
                o.step()
        else:
            o.step()
    mine = [w for w in ws if "skip_synchronize" in str(w.message)]
    expect(len(mine) == (0 if skip else 1), f"skip={skip}: warnings {[str(w.message) for w in ws]}")

# -- sparse gradients: SparseAdam on an embedding, sparse_as_dense False and True ---------
ids = [torch.tensor([[1, 2, 4, 5], [4, 3, 2, 9]]), torch.tensor([[1, 3, 4], [4, 7, 9]]),
       torch.tensor([[0, 0, 9]])]
torch.manual_seed(1)
emb0 = nn.Embedding(10, 3, sparse=True)
for sparse_as_dense in (False, True):
    emb = copy.deepcopy(emb0)
    ref = copy.deepcopy(emb0)
    o = hvd.DistributedOptimizer(torch.optim.SparseAdam(list(emb.parameters()), lr=0.1),
                                 sparse_as_dense=sparse_as_dense)
    o.zero_grad()
    emb(ids[r]).sum().backward()
    o.step()
    # The reference: the average of every rank's (dense) gradient, applied by SparseAdam.
    avg = torch.zeros(10, 3)
    for k in range(n):
        avg.index_add_(0, ids[k].reshape(-1), torch.ones(ids[k].numel(), 3) / n)
    ref.weight.grad = avg.to_sparse()
    torch.optim.SparseAdam(list(ref.parameters()), lr=0.1).step()
    expect(emb.weight.grad.is_sparse, f"sparse_as_dense={sparse_as_dense}: grad became dense")
    expect(torch.allclose(emb.weight, ref.weight, atol=1e-6),
           f"sparse_as_dense={sparse_as_dense}: weights differ from the averaged reference")

# -- broadcast_optimizer_state on a new optimizer: the state is created first (Horovod) --
net = nn.Linear(3, 2)
hvd.broadcast_parameters(net.state_dict(), root_rank=0)
o = hvd.DistributedOptimizer(torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9),
                             named_parameters=net.named_parameters())
hvd.broadcast_optimizer_state(o, root_rank=0)
expect(all(torch.equal(p.grad, torch.zeros_like(p)) for p in net.parameters()),
       "zero gradients after broadcast_optimizer_state")
expect(len(o.state_dict()["state"]) == 2 and
       all("momentum_buffer" in st for st in o.state_dict()["state"].values()),
       f"state not created: {o.state_dict()['state']}")
expect(all(same_everywhere(p) for p in net.parameters()), "params differ after the state init")

# -- on a process set: members average among themselves, the outsider steps alone ---------
pair = hvd.add_process_set([0, 1])
lin = nn.Linear(2, 1, bias=False)
with torch.no_grad():
    lin.weight.fill_(1.0)
o = hvd.DistributedOptimizer(torch.optim.SGD(lin.parameters(), lr=1.0),
                             named_parameters=lin.named_parameters(), process_set=pair)
o.zero_grad()
lin(torch.ones(1, 2) * (r + 1)).sum().backward()
o.step()
want = 1.0 - (1.5 if r in (0, 1) else 3.0)   # members: mean of 1 and 2; rank 2: its own 3
expect(torch.allclose(lin.weight, torch.full((1, 2), want)), f"set optimizer {lin.weight}")
hvd.remove_process_set(pair)
hvd.shutdown()

if bad:
    print(f"rank {r} FAILED:", *bad, sep="\n  ", flush=True)
    sys.exit(1)
print("OK hvd_optimizer_semantics", flush=True)

"""Shared by the torch workers: deterministic data, a small CNN, and the single-process
reference (one model trained on every rank's batches concatenated)."""

from __future__ import annotations

import copy

import torch
from torch import nn


def batch(step: int, rank: int, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def global_batch(step: int, size: int, n: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    parts = [batch(step, r, n) for r in range(size)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def cnn(bn: bool = False) -> nn.Module:
    layers: list[nn.Module] = [nn.Conv2d(1, 4, 3)]
    if bn:
        layers.append(nn.BatchNorm2d(4))
    layers += [nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 10)]
    return nn.Sequential(*layers)


def reference(model: nn.Module, steps: int, size: int, lr: float, opt: str = "sgd") -> nn.Module:
    """The same model trained in one process on the concatenated global batches."""
    ref = copy.deepcopy(model)
    o = (torch.optim.SGD(ref.parameters(), lr=lr, momentum=0.9) if opt == "sgd"
         else torch.optim.Adam(ref.parameters(), lr=lr))
    for s in range(steps):
        x, y = global_batch(s, size)
        o.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        o.step()
    return ref


def train(model: nn.Module, steps: int, rank: int, lr: float,
          device: torch.device | None = None) -> None:
    """SGD (momentum 0.9) on this rank's own batches, `steps` of them: what a data-parallel
    worker runs before comparing its parameters with `reference`."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    for s in range(steps):
        x, y = batch(s, rank)
        if device is not None:
            x, y = x.to(device), y.to(device)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def check_same_and_close(model: nn.Module, ref: nn.Module, rank: int, size: int,
                         gather: callable, atol: float = 1e-5) -> None:
    """Parameters identical on all ranks (bitwise) and close to the reference."""
    for (name, p), (_, q) in zip(model.state_dict().items(), ref.state_dict().items(), strict=True):
        everyone = gather(p.detach().reshape(1, -1).float())
        for r in range(size):
            if not torch.equal(everyone[r], everyone[0]):
                raise AssertionError(f"{name} differs between rank 0 and rank {r}")
        if not torch.allclose(p.float(), q.float(), atol=atol, rtol=1e-4):
            raise AssertionError(f"rank {rank}: {name} is not the single-process result: max "
                                 f"diff {(p.float() - q.float()).abs().max().item()}")

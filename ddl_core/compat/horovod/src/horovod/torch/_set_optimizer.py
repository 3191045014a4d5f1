"""DistributedOptimizer on a process set other than the global one.

ddl_core.torch's optimizer hooks every gradient into libddl's asynchronous requests,
which run on the world communicator; on a process set the gradients go through the
set's negotiation thread instead: each parameter's gradient is queued (named after the
parameter, so ranks may finish backward in any order) as soon as autograd has
accumulated it, and step() waits for all of them, as Horovod's optimizer does.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch


def _names(optimizer: torch.optim.Optimizer, named_parameters: Any) -> dict[int, str]:
    if named_parameters is not None:
        named = list(named_parameters)
        names = {id(p): n for n, p in named}
        if len(names) != len(named):
            raise ValueError("named_parameters names a parameter twice")
    else:
        names = {}
    out: dict[int, str] = {}
    k = 0
    for group in optimizer.param_groups:
        for p in group["params"]:
            out[id(p)] = names.get(id(p), f"param.{k}")
            k += 1
    return out


def set_optimizer(optimizer: torch.optim.Optimizer, named_parameters: Any, compression: Any,
                  op: str, predivide: float, process_set: Any, submit: Callable[..., int],
                  synchronize: Callable[[int], Any],
                  passes: int = 1) -> torch.optim.Optimizer:
    """An instance of a subclass of optimizer's class sharing its state, whose step()
    averages (op) the gradients over `process_set` first."""
    base = type(optimizer)
    names = _names(optimizer, named_parameters)
    size = process_set.size()
    # A rank outside the set averages nothing: it steps on its own gradients (Horovod's
    # optimizer registers no hooks there and its synchronize() does nothing).
    member = process_set.included()
    pre, post = (1.0 / predivide, predivide / size) if op == "avg" and predivide != 1.0 \
        else (1.0, 1.0)
    wire_op = "sum" if op == "avg" and predivide != 1.0 else op

    def _launch(self: Any, p: torch.Tensor) -> None:
        if not member or id(p) in self._hvd_handles:
            return
        if p.grad is None:  # not computed here; another member may have: send zeros
            p.grad = torch.zeros_like(p)
        if p.grad.is_sparse:
            p.grad = p.grad.to_dense()
            return
        self._hvd_handles[id(p)] = (p, submit(p.grad, wire_op, compression, pre, post,
                                              f"DistributedOptimizer.{names[id(p)]}",
                                              "allreduce", process_set))

    def synchronize_(self: Any) -> None:
        """Wait for every gradient's allreduce (queueing those not queued yet)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad:
                    _launch(self, p)
        handles, self._hvd_handles = self._hvd_handles, {}
        for _p, h in handles.values():
            synchronize(h)
        self._hvd_synced = True

    @contextmanager
    def skip_synchronize(self: Any) -> Iterator[None]:
        self._hvd_skip = True
        try:
            yield
        finally:
            self._hvd_skip = False

    def step(self: Any, closure: Any = None) -> Any:
        if not self._hvd_skip and self._hvd_synced and member:
            warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                          "context after optimizer.synchronize(). This can cause training "
                          "slowdown. You may want to consider using "
                          "optimizer.skip_synchronize() context if you use "
                          "optimizer.synchronize() in your code.", stacklevel=2)
        if not self._hvd_skip and not self._hvd_synced:
            self.synchronize()
        self._hvd_synced = False
        return base.step(self, closure)

    def zero_grad(self: Any, set_to_none: bool = True) -> None:
        if self._hvd_handles:
            raise AssertionError("optimizer.zero_grad() was called after loss.backward() but "
                                 "before optimizer.step() or optimizer.synchronize()")
        return base.zero_grad(self, set_to_none)

    cls = type(base.__name__, (base,), {"synchronize": synchronize_, "step": step,
                                        "zero_grad": zero_grad,
                                        "skip_synchronize": skip_synchronize})
    opt = cls.__new__(cls)
    opt.__dict__.update(optimizer.__dict__)
    opt._hvd_handles = {}
    opt._hvd_synced = False
    opt._hvd_skip = False
    # With several backward passes per step the gradients are complete only at step().
    for group in opt.param_groups if passes == 1 and member else []:
        for p in group["params"]:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(lambda q, o=opt: _launch(o, q))
    return opt

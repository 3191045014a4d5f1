"""Data parallelism without DDP: a gradient-averaging optimizer and the broadcasts that
make every rank start from the same model (Horovod's model, on DDL).

    opt = ddl_core.torch.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr))
    ddl_core.torch.broadcast_parameters(model.state_dict(), root_rank=0)
    ddl_core.torch.broadcast_optimizer_state(opt, root_rank=0)

Each parameter's gradient is queued for averaging as soon as autograd has accumulated it
(a post-accumulate-grad hook), so the reduction of late layers overlaps the backward pass
of early ones; `step()` waits for the rest and then applies the wrapped optimizer's update.
The wrapper is a dynamic subclass of the user's optimizer class, so `isinstance`, LR
schedulers and `state_dict()` behave as for the original.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

import ddl_core
from ddl_core.objects import allgather_object as allgather_object  # re-exported
from ddl_core.objects import broadcast_object

from ._tensors import prepare


class Compression:
    """Gradient compression on the wire (Horovod's names): `none` or `fp16`."""

    class none:  # noqa: N801 - Horovod's public name
        @staticmethod
        def compress(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
            return t, None

        @staticmethod
        def decompress(t: torch.Tensor, ctx: Any) -> torch.Tensor:  # noqa: ARG004
            return t

    class fp16:  # noqa: N801
        @staticmethod
        def compress(t: torch.Tensor) -> tuple[torch.Tensor, Any]:
            if t.dtype.is_floating_point and t.dtype != torch.float16:
                return t.to(torch.float16), t.dtype
            return t, None

        @staticmethod
        def decompress(t: torch.Tensor, ctx: Any) -> torch.Tensor:
            return t if ctx is None else t.to(ctx)


class _DistributedOptimizer(torch.optim.Optimizer):
    """Methods mixed into a subclass of the user's optimizer class by
    DistributedOptimizer(); its state is set up by _init_wrapper."""

    _ddl_handles: dict[torch.Tensor, Any]  # (handle, wire, ctx, post), or a function (sparse)

    @property
    def backward_passes_per_step(self) -> int:
        return self._ddl_passes

    @backward_passes_per_step.setter
    def backward_passes_per_step(self, n: int) -> None:
        self._ddl_passes = n

    def _ddl_grad_ready(self, p: torch.Tensor) -> None:
        count = self._ddl_counts.get(p, 0) + 1
        self._ddl_counts[p] = count
        if count < self._ddl_passes:
            return
        if p in self._ddl_handles:
            raise RuntimeError(
                "a gradient was computed twice before step(): call optimizer.synchronize() "
                "between backward passes, or raise backward_passes_per_step")
        self._ddl_handles[p] = self._ddl_submit(p)

    def _ddl_submit(self, p: torch.Tensor) -> Any:
        """Queue p's gradient; returns what synchronize() finishes: (handle, wire, ctx,
        post) for a dense gradient, a function for a sparse one."""
        grad = p.grad
        if grad is None:
            grad = p.grad = torch.zeros_like(p)
        if grad.is_sparse:
            if not self._ddl_sparse_as_dense:
                return self._ddl_submit_sparse(p, grad)
            grad = grad.to_dense()  # averaged dense, made sparse again by synchronize()
        wire, ctx = self._ddl_compression.compress(grad)
        op = self._ddl_op
        if self._ddl_predivide != 1.0:
            wire = wire if wire is not grad else wire.clone()
            wire.div_(self._ddl_predivide)
            op = "sum"
        work, wop, post = prepare(wire, op)
        # Matched by the parameter's name: hooks that fire in another order on another
        # rank still meet the right gradient.
        h = ddl_core.allreduce_async(work, op=wop, out=work, name=self._ddl_names[p],
                                     shape=tuple(work.shape))
        return h, wire, ctx, post

    def _ddl_submit_sparse(self, p: torch.Tensor, grad: torch.Tensor) -> Any:
        """A sparse gradient (e.g. nn.Embedding(sparse=True)) stays sparse, as optimizers
        like SparseAdam need: every rank's indices and values are allgathered (the result
        holds every rank's entries; duplicates add up), values divided by size() for an
        average. Returns the function that finishes it."""
        if self._ddl_op not in ("avg", "sum"):
            raise ValueError(f"a sparse gradient can be averaged or summed, not reduced with "
                             f"{self._ddl_op!r}; pass sparse_as_dense=True")
        name = self._ddl_names[p]
        idx = grad._indices().t().contiguous()
        val = grad._values().contiguous()
        hi = ddl_core.allgatherv_async(idx, name=name + ".indices", shape=tuple(idx.shape))
        hv = ddl_core.allgatherv_async(val, name=name + ".values", shape=tuple(val.shape))

        def finish() -> None:
            values, indices = hv.wait(), hi.wait()
            if self._ddl_op == "avg":
                values = values / ddl_core.size()
            p.grad = torch.sparse_coo_tensor(indices.t(), values, grad.shape,
                                             check_invariants=True)

        return finish

    def synchronize(self) -> None:
        """Wait for every gradient's average (queueing the ones whose hook did not fire,
        e.g. unused parameters, so all ranks issue the same collectives)."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.requires_grad and p not in self._ddl_handles:
                    self._ddl_handles[p] = self._ddl_submit(p)
        for p, entry in self._ddl_handles.items():
            if callable(entry):  # a sparse gradient
                entry()
                continue
            h, wire, ctx, post = entry
            h.wait()
            if post is not None:
                post()
            out = self._ddl_compression.decompress(wire, ctx)
            if self._ddl_predivide != 1.0:
                out = out.mul_(self._ddl_predivide / ddl_core.size())
            if p.grad.is_sparse:  # sparse_as_dense: averaged dense, sparse again
                p.grad = out.to_sparse()
            elif out is not p.grad:
                p.grad.copy_(out)
        self._ddl_handles.clear()
        self._ddl_counts.clear()
        self._ddl_synchronized = True

    @contextlib.contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """For `optimizer.synchronize(); clip_grad_norm_(...); with skip_synchronize(): step()`."""
        self._ddl_skip_sync = True
        try:
            yield
        finally:
            self._ddl_skip_sync = False

    def step(self, closure: Any = None) -> Any:
        if not self._ddl_skip_sync:
            if self._ddl_synchronized and not self._ddl_handles:
                # synchronize() was called explicitly for this step: nothing to redo
                if self._ddl_warn_resync:
                    warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                                  "context after optimizer.synchronize(). This can cause "
                                  "training slowdown. You may want to consider using "
                                  "optimizer.skip_synchronize() context if you use "
                                  "optimizer.synchronize() in your code.", stacklevel=2)
            else:
                self.synchronize()
        self._ddl_synchronized = False
        return super(self.__class__, self).step(closure)  # type: ignore[misc]

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self._ddl_handles:
            raise RuntimeError("zero_grad() while gradients are being averaged: call step() "
                               "or synchronize() first")
        return super(self.__class__, self).zero_grad(set_to_none)  # type: ignore[misc]


_OPS = {"average": "avg", "avg": "avg", "sum": "sum", "min": "min", "max": "max",
        "product": "prod", "prod": "prod"}


def DistributedOptimizer(optimizer: torch.optim.Optimizer,  # noqa: N802 - Horovod's name
                         named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
                         compression: Any = Compression.none,
                         backward_passes_per_step: int = 1, op: str = "average",
                         gradient_predivide_factor: float = 1.0, sparse_as_dense: bool = False,
                         **unused: Any) -> Any:
    """Wrap `optimizer` so that step() applies gradients averaged over all ranks.

    Returns an instance of a subclass of the optimizer's own class sharing its
    param_groups (and hyper-parameters). `backward_passes_per_step=k` accumulates k
    local backward passes before one averaging. Sparse gradients stay sparse (every
    rank's entries gathered) unless `sparse_as_dense=True` (averaged dense, then made
    sparse again), as Horovod's.
    """
    opname = _OPS.get(str(op).lower())
    if opname is None:
        raise ValueError(f"op {op!r}: use average, sum, min, max or product")
    cls = type(optimizer.__class__.__name__, (optimizer.__class__,),
               {k: v for k, v in _DistributedOptimizer.__dict__.items()
                if k not in ("__dict__", "__weakref__", "__init__")})
    dist_opt = cls.__new__(cls)
    # Share the wrapped optimizer's state and defaults: one set of hyper-parameters.
    dist_opt.__dict__.update(optimizer.__dict__)
    _init_wrapper(dist_opt, named_parameters, compression, backward_passes_per_step, opname,
                  gradient_predivide_factor)
    dist_opt._ddl_sparse_as_dense = sparse_as_dense
    return dist_opt


_instances = 0  # DistributedOptimizers made in this process


def _init_wrapper(self: Any, named_parameters: Any, compression: Any, passes: int, op: str,
                  predivide: float) -> None:
    """Set up the averaging state; the base optimizer's own __init__ already ran for the
    wrapped instance whose __dict__ the wrapper shares."""
    ddl_core.init()
    if passes < 1:
        raise ValueError("backward_passes_per_step must be >= 1")
    if predivide != 1.0 and op != "avg":
        raise ValueError("gradient_predivide_factor needs op=Average")
    self._ddl_compression = compression
    self._ddl_passes = passes
    self._ddl_op = op
    self._ddl_predivide = predivide
    self._ddl_handles = {}
    self._ddl_counts = {}
    self._ddl_synchronized = False
    self._ddl_skip_sync = False
    self._ddl_sparse_as_dense = False
    # Horovod warns when step() follows an explicit synchronize() outside
    # skip_synchronize(); horovod.torch's optimizer turns this on.
    self._ddl_warn_resync = False
    all_params = [p for g in self.param_groups for p in g["params"]]
    # Each gradient's request is named as Horovod names it ("allreduce.<parameter name>",
    # else by position), so ranks match gradients by name, not by hook order; a second
    # optimizer in the process gets its own names (created in the same order everywhere).
    global _instances
    prefix = "allreduce." if _instances == 0 else f"allreduce.opt{_instances}."
    _instances += 1
    self._ddl_names = {p: f"{prefix}noname.{gi}.{i}"
                       for gi, g in enumerate(self.param_groups)
                       for i, p in enumerate(g["params"])}
    if named_parameters is not None:
        named = list(named_parameters)
        ids = {id(p) for _, p in named}
        missing = [p for p in all_params if id(p) not in ids]
        if missing:
            raise ValueError(f"named_parameters does not name {len(missing)} of the "
                             "optimizer's parameters")
        if len({n for n, _ in named}) != len(named):
            raise ValueError("named_parameters has duplicate names")
        mine = {id(p) for p in all_params}
        self._ddl_names.update({p: prefix + n for n, p in named if id(p) in mine})
    self._ddl_hooks = [p.register_post_accumulate_grad_hook(self._ddl_grad_ready)
                       for p in all_params if p.requires_grad]


# -- broadcasts ---------------------------------------------------------------------------

def broadcast_parameters(params: Any, root_rank: int = 0) -> None:
    """Overwrite every rank's tensors with root_rank's, in place.

    `params`: a state_dict, `model.named_parameters()`, or any iterable of tensors or
    (name, tensor) pairs. All broadcasts are queued together and fused by libddl.
    """
    ddl_core.init()
    items = params.items() if isinstance(params, dict) else params
    handles = []
    for item in items:
        t = item[1] if isinstance(item, tuple) else item
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"broadcast_parameters: {type(t).__name__} is not a tensor")
        data = t.data
        work = data if data.is_contiguous() else data.contiguous()
        h = ddl_core.broadcast_async(work.reshape(-1).view(torch.uint8), root_rank)
        handles.append((h, data, work))
    for h, data, work in handles:
        h.wait()
        if work is not data:
            data.copy_(work)


def broadcast_optimizer_state(optimizer: torch.optim.Optimizer, root_rank: int = 0) -> None:
    """Give every rank root_rank's optimizer state and hyper-parameters.

    The whole state_dict travels (pickled), so it works for any optimizer, also when the
    state is still empty on some ranks (before the first step) and not on the root.
    """
    state = broadcast_object(optimizer.state_dict(), root_rank)
    if ddl_core.rank() != root_rank:
        optimizer.load_state_dict(state)

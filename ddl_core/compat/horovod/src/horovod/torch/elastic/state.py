"""hvd.elastic.TorchState: a model, an optimizer, ElasticSamplers and plain objects
committed, restored and synchronised together."""

from __future__ import annotations

import copy
from typing import Any

import torch

from horovod.common import basics as _basics
from horovod.common.elastic import ObjectState

from .sampler import ElasticSampler


def _bcast_object(obj: Any) -> Any:
    from horovod.torch import broadcast_object

    return broadcast_object(obj, root_rank=0)


class _Handler:
    """How one kind of value is committed, restored and synchronised."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self.save()

    def set_value(self, value: Any) -> None:
        """The user assigned a new object to the attribute: it is the one committed."""
        self.value = value
        self.save()

    def save(self) -> None:
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        self.value.load_state_dict(self._saved)

    def sync(self) -> None:
        raise NotImplementedError


class _ModelHandler(_Handler):
    def sync(self) -> None:
        from horovod.torch import broadcast_parameters

        broadcast_parameters(self.value.state_dict(), root_rank=0)


class _OptimizerHandler(_Handler):
    def restore(self) -> None:
        # A DistributedOptimizer whose step failed half-way still holds the gradient
        # averages it had queued on the old world; they will never complete, so they
        # are dropped with the uncommitted step (ddl_core.torch's wrapper keeps them in
        # _ddl_handles / _ddl_counts).
        for name in ("_ddl_handles", "_ddl_counts"):
            pending = getattr(self.value, name, None)
            if isinstance(pending, dict):
                pending.clear()
        if hasattr(self.value, "_ddl_synchronized"):
            self.value._ddl_synchronized = False
        super().restore()

    def sync(self) -> None:
        from horovod.torch import broadcast_optimizer_state

        broadcast_optimizer_state(self.value, root_rank=0)


class _SamplerHandler(_Handler):
    def sync(self) -> None:
        self.value.load_state_dict(_bcast_object(self.value.state_dict()))


#: (type, handler) pairs, first match wins; what is not listed is a plain object
_HANDLERS: list[tuple[type, type[_Handler]]] = [
    (torch.nn.Module, _ModelHandler),
    (torch.optim.Optimizer, _OptimizerHandler),
    (ElasticSampler, _SamplerHandler),
]


def get_handler_registry() -> list[tuple[type, type[_Handler]]]:
    """The (type, handler) list TorchState consults; append to it for a type of your own."""
    return _HANDLERS


def _handler_for(value: Any) -> type[_Handler] | None:
    for kind, handler in _HANDLERS:
        if isinstance(value, kind):
            return handler
    return None


class TorchState(ObjectState):
    """Elastic state of a PyTorch job: `model` and `optimizer` (either may be None) plus
    any keyword attributes. Modules, optimizers and ElasticSamplers are committed through
    their state_dict and synchronised with Horovod's broadcasts; other values as Python
    objects (broadcast_object). Each is an attribute: state.model, state.epoch, ..."""

    def __init__(self, model: torch.nn.Module | None = None,
                 optimizer: torch.optim.Optimizer | None = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, _Handler] = {}
        plain: dict[str, Any] = {}
        for name, value in kwargs.items():
            kind = _handler_for(value)
            if kind is None:
                plain[name] = value
            else:
                handlers[name] = kind(value)
        object.__setattr__(self, "_handlers", handlers)
        for name, handler in handlers.items():
            object.__setattr__(self, name, handler.value)
        super().__init__(bcast_object=_bcast_object, get_rank=_basics.rank, **plain)

    def save(self) -> None:
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def sync(self) -> None:
        for handler in self._handlers.values():
            handler.sync()
        super().sync()

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers:
            handlers[name].set_value(value)
        super().__setattr__(name, value)

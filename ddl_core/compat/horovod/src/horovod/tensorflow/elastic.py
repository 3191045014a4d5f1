"""`hvd.elastic` for TensorFlow on horovod-ddl: `hvd.elastic.run`, TensorFlowKerasState
and TensorFlowState, with Horovod's semantics (see horovod.common.elastic). Eager
execution (TensorFlow 2); a TF1 session is used to read and load variables when given."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import tensorflow as tf

import ddl_core
from horovod.common import basics as _basics
from horovod.common.elastic import ObjectState, State, run_fn
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

_LOST = ("PeerLostError", "ProcessFailedError")


def _lost_peer(exc: BaseException) -> bool:
    """Whether a TensorFlow error is a collective's lost peer: the DDL error is its cause
    in eager code; inside a tf.function only its text survives."""
    cause = exc.__cause__
    if isinstance(cause, ddl_core.PeerLostError):
        return True
    return any(name in str(exc) for name in _LOST)


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for the elastic training function `func(state, ...)` (see
    horovod.torch.elastic.run): a collective that fails because a rank was lost raises a
    TensorFlow error, taken here as Horovod's HorovodInternalError."""

    def body(state: State, *args: Any, **kwargs: Any) -> Any:
        try:
            return func(state, *args, **kwargs)
        except tf.errors.OpError as exc:
            if _lost_peer(exc):
                raise HorovodInternalError(str(exc)) from exc
            raise

    body.__name__ = getattr(func, "__name__", "body")
    body.__doc__ = func.__doc__
    return run_fn(body, _basics.elastic_reset)


def _bcast_object(obj: Any) -> Any:
    from horovod.tensorflow import broadcast_object

    return broadcast_object(obj, root_rank=0)


def _variables(owner: Any) -> list[Any]:
    """An optimizer's or model's variables (a method in older Keras, a property in 3)."""
    v = getattr(owner, "variables", [])
    return list(v() if callable(v) else v)


def _value(var: Any, session: Any) -> np.ndarray:
    if session is not None and not tf.executing_eagerly():
        return np.array(session.run(var))
    return np.array(var.numpy() if hasattr(var, "numpy") else var)


def _assign(var: Any, value: np.ndarray, session: Any) -> None:
    if session is not None and not tf.executing_eagerly():
        var.load(value, session)
    else:
        var.assign(value)


class TensorFlowState(ObjectState):
    """Elastic state of a list of tf.Variables (default: the global variables) plus any
    keyword attributes. session: TF1's session holding the variables."""

    def __init__(self, variables: list[Any] | None = None, session: Any = None,
                 **kwargs: Any) -> None:
        self.variables = list(variables) if variables is not None else \
            tf.compat.v1.global_variables()
        self.session = session
        self._save_vars()
        super().__init__(bcast_object=_bcast_object, get_rank=_basics.rank, **kwargs)

    def _save_vars(self) -> None:
        self._values = [_value(v, self.session) for v in self.variables]

    def save(self) -> None:
        self._save_vars()
        super().save()

    def restore(self) -> None:
        for var, value in zip(self.variables, self._values, strict=True):
            _assign(var, value, self.session)
        super().restore()

    def sync(self) -> None:
        values = _bcast_object([_value(v, self.session) for v in self.variables])
        for var, value in zip(self.variables, values, strict=True):
            _assign(var, value, self.session)
        self._save_vars()
        super().sync()


class TensorFlowKerasState(ObjectState):
    """Elastic state of a built Keras model and its optimizer (the compiled one unless
    given) plus any keyword attributes."""

    def __init__(self, model: Any, optimizer: Any = None, backend: Any = None,
                 **kwargs: Any) -> None:
        if hasattr(model, "built") and not model.built:
            raise ValueError("the model must be built before its elastic state is made: "
                             "call model.build(input_shape) (or run it on a batch) first")
        self.model = model
        self.optimizer = optimizer if optimizer is not None else model.optimizer
        self.backend = backend
        self._save_model()
        super().__init__(bcast_object=_bcast_object, get_rank=_basics.rank, **kwargs)

    def _all_vars(self) -> list[Any]:
        return _variables(self.model) + (_variables(self.optimizer)
                                         if self.optimizer is not None else [])

    def _save_model(self) -> None:
        self._saved_vars = [_value(v, None) for v in self._all_vars()]

    def _load(self, values: list[np.ndarray]) -> None:
        current = self._all_vars()
        if len(current) != len(values):
            # The optimizer made its slots after the commit (its first step): the model's
            # own variables are restored, the slots start again.
            current = _variables(self.model)
            values = values[:len(current)]
        for var, value in zip(current, values, strict=True):
            var.assign(value)

    def save(self) -> None:
        self._save_model()
        super().save()

    def restore(self) -> None:
        self._load(self._saved_vars)
        super().restore()

    def sync(self) -> None:
        self._load(_bcast_object([_value(v, None) for v in self._all_vars()]))
        self._save_model()
        super().sync()


__all__ = ["TensorFlowKerasState", "TensorFlowState", "ObjectState", "State", "run",
           "HorovodInternalError", "HostsUpdatedInterrupt"]

"""DDL for Keras 3 (TensorFlow backend): WMLCE's callbacks, Horovod's callbacks, and
gradient averaging for `model.fit`.

- `DDLCallback` (first in the list): averages the logged metrics over ranks at the end of
  every epoch, so what later callbacks (checkpoints, early stopping) and the progress bar
  see is the global value.
- `DDLGlobalVariablesCallback` (last in the list): at the start of training builds the
  optimizer's variables and broadcasts model and optimizer variables from rank 0, so all
  ranks start identical.
- `DistributedOptimizer(opt)`: a subclass of the optimizer's class whose `apply` averages
  the gradients first (one fused allreduce per dtype). `enable_fit_averaging()` makes every
  Keras optimizer do that, which is what WMLCE's `import ddl` did.
- `LearningRateWarmupCallback`: Goyal et al.'s gradual warmup from lr/size to lr.
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

import ddl_core

from .. import tensorflow as ddl_tf
from ..training import warmup_factor


def _size() -> int:
    ddl_core.init()
    return ddl_core.size()


class DDLCallback(keras.callbacks.Callback):
    """Average every numeric log value over ranks at the end of each epoch."""

    def __init__(self, average_batches: bool = False) -> None:
        super().__init__()
        self.average_batches = average_batches

    def _average(self, logs: dict[str, Any] | None) -> None:
        if not logs or _size() == 1:
            return
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0
                      and isinstance(np.asarray(v).item(), (int, float)))
        if not keys:
            return
        vals = np.array([float(logs[k]) for k in keys], dtype=np.float64)
        ddl_core.allreduce(vals, op="avg", out=vals)
        for k, v in zip(keys, vals, strict=True):
            logs[k] = float(v)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._average(logs)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.average_batches:
            self._average(logs)


class DDLGlobalVariablesCallback(keras.callbacks.Callback):
    """Broadcast model and optimizer variables from `root_rank` before the first step."""

    def __init__(self, root_rank: int = 0) -> None:
        super().__init__()
        self.root_rank = root_rank
        self.broadcast_done = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.broadcast_done:
            return
        model = self.model
        opt = getattr(model, "optimizer", None)
        if opt is not None and not opt.built:
            opt.build(model.trainable_variables)
        variables = list(model.variables)
        if opt is not None:
            variables += list(opt.variables)
        ddl_tf.broadcast_variables(variables, self.root_rank)
        self.broadcast_done = True


class LearningRateWarmupCallback(keras.callbacks.Callback):
    """Ramp the learning rate linearly from initial_lr/size to initial_lr over
    warmup_epochs (Goyal et al., "Accurate, Large Minibatch SGD"), per batch."""

    def __init__(self, initial_lr: float, warmup_epochs: float = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
        super().__init__()
        self.initial_lr = float(initial_lr)
        self.warmup_epochs = warmup_epochs
        self.steps_per_epoch = steps_per_epoch
        self.verbose = verbose
        self.current_epoch = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch
        if self.steps_per_epoch is None:
            self.steps_per_epoch = self.params.get("steps") if self.params else None

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.current_epoch >= self.warmup_epochs:
            return
        spe = self.steps_per_epoch or 1
        epoch = self.current_epoch + batch / spe
        lr = self.initial_lr * warmup_factor(epoch, self.warmup_epochs, _size())
        self.model.optimizer.learning_rate = lr

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))
        if self.verbose and epoch + 1 == self.warmup_epochs and ddl_core.rank() == 0:
            print(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                  f"{self.initial_lr:g}.")


# -- gradient averaging in the optimizer ------------------------------------------------------

def _averaging_apply(base_apply: Any) -> Any:
    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        if getattr(self, "_ddl_average", True) and _size() > 1:
            grads = ddl_tf.allreduce_list(list(grads), getattr(self, "_ddl_op", "average"))
        return base_apply(self, grads, trainable_variables)

    apply._ddl_averaging = True  # type: ignore[attr-defined]
    return apply


def DistributedOptimizer(optimizer: keras.optimizers.Optimizer, op: str = "average",  # noqa: N802
                         **unused: Any) -> keras.optimizers.Optimizer:
    """A copy of `optimizer` (same class and config) that averages gradients over ranks
    before applying them."""
    base = type(optimizer)
    if getattr(base.apply, "_ddl_averaging", False):
        optimizer._ddl_op = op
        return optimizer
    cls = type(base.__name__, (base,), {"apply": _averaging_apply(base.apply)})
    new = cls.from_config(optimizer.get_config())
    new._ddl_op = op
    return new


_patched: Any = None


def enable_fit_averaging() -> None:
    """Make every Keras optimizer average gradients over ranks (WMLCE's `import ddl`
    behaviour); optimizers already wrapped by DistributedOptimizer are not averaged twice."""
    global _patched
    if _patched is not None:
        return
    base = keras.optimizers.Optimizer
    _patched = base.apply
    if not getattr(base.apply, "_ddl_averaging", False):
        base.apply = _averaging_apply(base.apply)


def disable_fit_averaging() -> None:
    global _patched
    if _patched is not None:
        keras.optimizers.Optimizer.apply = _patched
        _patched = None


__all__ = ["DDLCallback", "DDLGlobalVariablesCallback", "LearningRateWarmupCallback",
           "DistributedOptimizer", "enable_fit_averaging", "disable_fit_averaging"]

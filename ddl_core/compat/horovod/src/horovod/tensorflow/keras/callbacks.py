"""Horovod's Keras callbacks on DDL."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
from ddl_core.keras import DDLCallback, DDLGlobalVariablesCallback
from ddl_core.keras import LearningRateWarmupCallback as _Warmup

from ddl_core import tensorflow as ddl_tf


class BroadcastGlobalVariablesCallback(DDLGlobalVariablesCallback):
    """Broadcast model and optimizer variables from root_rank before training starts,
    except `local_variables` (Horovod's: variables each rank keeps its own value of)."""

    def __init__(self, root_rank: int, device: str = "",  # noqa: ARG002
                 local_variables: Any = None) -> None:
        super().__init__(root_rank)
        self.local_variables = list(local_variables or [])

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not self.local_variables:
            return super().on_train_begin(logs)
        if self.broadcast_done:
            return None
        model = self.model
        opt = getattr(model, "optimizer", None)
        if opt is not None and not opt.built:
            opt.build(model.trainable_variables)
        local = {id(v) for v in self.local_variables}
        variables = list(model.variables) + (list(opt.variables) if opt is not None else [])
        ddl_tf.broadcast_variables([v for v in variables if id(v) not in local],
                                   self.root_rank)
        self.broadcast_done = True
        return None


class MetricAverageCallback(DDLCallback):
    """Average the epoch's logged metrics over ranks (put it before checkpointing)."""

    def __init__(self, device: str = "") -> None:  # noqa: ARG002
        super().__init__()


class LearningRateWarmupCallback(_Warmup):
    """Gradual warmup from initial_lr/size to initial_lr (Goyal et al.)."""

    def __init__(self, initial_lr: float, warmup_epochs: float = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0, **unused: Any) -> None:
        super().__init__(initial_lr, warmup_epochs, momentum_correction, steps_per_epoch,
                         verbose)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Horovod's schedule: from start_epoch until end_epoch (exclusive; None: the end of
    training) the learning rate is initial_lr * multiplier, where multiplier is a number
    or a function of the epoch. staircase=True sets it once per epoch (the integer
    epoch); False every batch with the fractional epoch (steps_per_epoch, or Keras's
    steps of the fit)."""

    def __init__(self, initial_lr: float, multiplier: Any, start_epoch: int = 0,
                 end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True,  # noqa: ARG002 - Keras 3 has no momentum hook
                 steps_per_epoch: int | None = None, **unused: Any) -> None:
        super().__init__()
        if initial_lr is None:
            raise ValueError("LearningRateScheduleCallback needs initial_lr")
        self.initial_lr = float(initial_lr)
        self.multiplier = multiplier if callable(multiplier) else (lambda _e: multiplier)
        self.start_epoch, self.end_epoch = start_epoch, end_epoch
        self.staircase, self.steps_per_epoch = staircase, steps_per_epoch
        self.current_epoch = 0

    def _active(self, epoch: float) -> bool:
        return epoch >= self.start_epoch and (self.end_epoch is None or epoch < self.end_epoch)

    def _set(self, epoch: float) -> None:
        self.model.optimizer.learning_rate = self.initial_lr * float(self.multiplier(epoch))

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch
        if self.steps_per_epoch is None and self.params:
            self.steps_per_epoch = self.params.get("steps")
        if self.staircase and self._active(epoch):
            self._set(epoch)

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.staircase:
            return
        epoch = self.current_epoch + batch / (self.steps_per_epoch or 1)
        if self._active(epoch):
            self._set(epoch)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["lr"] = float(np.asarray(self.model.optimizer.learning_rate))


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateWarmupCallback", "LearningRateScheduleCallback"]

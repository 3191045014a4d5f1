"""Horovod's Keras callbacks on DDL."""

from __future__ import annotations

from typing import Any

from ddl_core.keras import DDLCallback, DDLGlobalVariablesCallback
from ddl_core.keras import LearningRateWarmupCallback as _Warmup


class BroadcastGlobalVariablesCallback(DDLGlobalVariablesCallback):
    """Broadcast model and optimizer variables from root_rank before training starts."""

    def __init__(self, root_rank: int, device: str = "") -> None:  # noqa: ARG002
        super().__init__(root_rank)


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


__all__ = ["BroadcastGlobalVariablesCallback", "MetricAverageCallback",
           "LearningRateWarmupCallback"]

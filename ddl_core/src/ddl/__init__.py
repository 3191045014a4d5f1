"""WMLCE's `import ddl` for TensorFlow / Keras scripts, on DDL-CE's ddl_core.

The seeds' four steps:

    import ddl                                    # 1. import (starts DDL, averages gradients)
    x_train = ddl.shard(x_train)                  # 2. split the training data
    lr = base_lr * ddl.size()                     # 3. scale the learning rate
    model.fit(..., callbacks=[ddl.DDLCallback(), ..., ddl.DDLGlobalVariablesCallback()])

As WMLCE's did, the import makes `model.fit` average gradients over ranks (every Keras
optimizer's `apply` averages first); set DDL_KERAS_AVERAGE=0 before importing to keep
that off and use `ddl.DistributedOptimizer` or `ddl.DistributedGradientTape` explicitly.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from ddl_core.settings import env_number
from ddl_core.tensorflow import (
    DistributedGradientTape,
    allgather,
    allreduce,
    broadcast,
    broadcast_variables,
)
from ddl_core.training import (
    Prefetcher,
    global_mean,
    scale_lr,
    shard_indices,
    split_batch,
    warmup_factor,
    warmup_lr,
)

import ddl_core

from ddl_core.keras import (  # isort: skip - needs tensorflow imported first
    DDLCallback,
    DDLGlobalVariablesCallback,
    DistributedOptimizer,
    LearningRateWarmupCallback,
    disable_fit_averaging,
    enable_fit_averaging,
)

ddl_core.init()
rank = ddl_core.rank
size = ddl_core.size
local_rank = ddl_core.local_rank
local_size = ddl_core.local_size

if env_number("DDL_KERAS_AVERAGE", 0, 1, 1, integer=True):  # libddl's number rule: 0 or 1
    enable_fit_averaging()


def shard(data: Any, shuffle: bool = False, seed: int = 0, drop_remainder: bool = True) -> Any:
    """This rank's equal share of an array (numpy / tf tensor, first axis) or a
    tf.data.Dataset (seeds' step 2: each learner iterates over its own section)."""
    if hasattr(data, "shard") and hasattr(data, "element_spec"):  # tf.data.Dataset
        return data.shard(size(), rank())
    idx = shard_indices(len(data), rank(), size(), shuffle=shuffle, seed=seed,
                        drop_remainder=drop_remainder)
    if isinstance(data, np.ndarray):
        return data[idx]
    import tensorflow as tf

    return tf.gather(data, idx)


__all__ = [
    "rank", "size", "local_rank", "local_size", "DDLCallback", "DDLGlobalVariablesCallback",
    "LearningRateWarmupCallback", "DistributedOptimizer", "DistributedGradientTape",
    "allreduce", "allgather", "broadcast", "broadcast_variables", "shard", "scale_lr",
    "warmup_factor", "warmup_lr", "split_batch", "global_mean", "Prefetcher",
    "enable_fit_averaging", "disable_fit_averaging",
]

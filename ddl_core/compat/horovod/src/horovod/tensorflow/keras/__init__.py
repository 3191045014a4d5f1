"""`import horovod.tensorflow.keras as hvd` (and `horovod.keras`) on DDL."""

from __future__ import annotations

from typing import Any

import numpy as np

# Horovod's common API is basics.__all__ (listed once there, as for horovod.tensorflow);
# the TF collectives Keras users call as they are come from horovod.tensorflow.
from horovod.common.basics import *  # noqa: F403
from horovod.common.basics import Average, ProcessSet, global_process_set
from horovod.tensorflow import (  # noqa: F401 - re-exported Horovod API
    Compression,
    allgather_object,
    barrier,
    broadcast_object,
    broadcast_variables,
    join,
)
from horovod.tensorflow import DistributedOptimizer as _tf_DistributedOptimizer
from horovod.tensorflow import allgather as _tf_allgather
from horovod.tensorflow import allreduce as _tf_allreduce
from horovod.tensorflow import broadcast as _tf_broadcast

from . import callbacks, elastic  # noqa: F401


def DistributedOptimizer(optimizer: Any, name: str | None = None,  # noqa: N802
                         compression: Any = Compression.none, op: Any = Average,
                         backward_passes_per_step: int = 1, **unused: Any) -> Any:
    return _tf_DistributedOptimizer(optimizer, name=name, compression=compression, op=op,
                                    backward_passes_per_step=backward_passes_per_step,
                                    **unused)


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              op: Any = None, **kwargs: Any) -> Any:
    """Keras flavour: takes and returns numpy-convertible values."""
    return np.asarray(_tf_allreduce(value, average=average, op=op, name=name, **kwargs))


def allgather(value: Any, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    return np.asarray(_tf_allgather(value, name, process_set))


def broadcast(value: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:
    return np.asarray(_tf_broadcast(value, root_rank, name, process_set))


def broadcast_global_variables(root_rank: int) -> None:
    raise NotImplementedError("TF1 global variables do not exist in TF2; use "
                              "callbacks.BroadcastGlobalVariablesCallback(root_rank)")


def load_model(filepath: str, custom_optimizers: Any = None, custom_objects: Any = None,  # noqa: ARG001
               compression: Any = Compression.none) -> Any:  # noqa: ARG001
    """keras.models.load_model, with the optimizer wrapped in DistributedOptimizer."""
    import keras

    model = keras.models.load_model(filepath, custom_objects=custom_objects)
    if getattr(model, "optimizer", None) is not None:
        model.optimizer = DistributedOptimizer(model.optimizer)
    return model

"""`import horovod.tensorflow as hvd` on DDL: Horovod's documented TensorFlow 2 API
(eager and tf.function), implemented with ddl_core.tensorflow."""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from ddl_core.objects import allgather_object as _allgather_object
from ddl_core.objects import broadcast_object as _broadcast_object

import ddl_core
from ddl_core import tensorflow as _dtf

from ..common.basics import (  # noqa: F401 - re-exported Horovod API
    Adasum,
    Average,
    HorovodInternalError,
    Max,
    Min,
    ProcessSet,
    Product,
    Sum,
    ccl_built,
    cross_rank,
    cross_size,
    cuda_built,
    ddl_built,
    ddl_op,
    global_process_set,
    gloo_built,
    gloo_enabled,
    init,
    is_homogeneous,
    is_initialized,
    local_rank,
    local_size,
    mpi_built,
    mpi_enabled,
    mpi_threads_supported,
    nccl_built,
    rank,
    rocm_built,
    shutdown,
    size,
    start_timeline,
    stop_timeline,
)

_HOROVOD_OP = {"avg": "average", "sum": "sum", "min": "min", "max": "max", "prod": "product"}


class Compression:
    """Horovod's names; fp16 halves the bytes of float32 gradients on the wire."""

    class none:  # noqa: N801
        @staticmethod
        def compress(t: Any) -> tuple[Any, Any]:
            return t, None

        @staticmethod
        def decompress(t: Any, ctx: Any) -> Any:  # noqa: ARG004
            return t

    class fp16:  # noqa: N801
        @staticmethod
        def compress(t: Any) -> tuple[Any, Any]:
            if t.dtype.is_floating and t.dtype != tf.float16:
                return tf.cast(t, tf.float16), t.dtype
            return t, None

        @staticmethod
        def decompress(t: Any, ctx: Any) -> Any:
            return t if ctx is None else tf.cast(t, ctx)


def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",  # noqa: ARG001
              device_sparse: str = "", compression: Any = Compression.none, op: Any = None,  # noqa: ARG001
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: str | None = None, process_set: ProcessSet = global_process_set) -> Any:  # noqa: ARG001
    """`tensor` reduced over all ranks (IndexedSlices are densified)."""
    dop = _HOROVOD_OP[ddl_op(op, average)]
    t = tf.convert_to_tensor(tensor)
    if prescale_factor != 1.0:
        t = t * tf.cast(prescale_factor, t.dtype)
    wire, ctx = compression.compress(t)
    out = compression.decompress(_dtf.allreduce(wire, dop, name), ctx)
    if postscale_factor != 1.0:
        out = out * tf.cast(postscale_factor, out.dtype)
    return out


def grouped_allreduce(tensors: list[Any], average: bool | None = None, op: Any = None,
                      **kwargs: Any) -> list[Any]:  # noqa: ARG001
    return _dtf.allreduce_list(tensors, _HOROVOD_OP[ddl_op(op, average)])


def allgather(tensor: Any, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:  # noqa: ARG001
    return _dtf.allgather(tensor, name)


def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              process_set: ProcessSet = global_process_set) -> Any:  # noqa: ARG001
    return _dtf.broadcast(tensor, root_rank, name)


def alltoall(tensor: Any, splits: Any = None, name: str | None = None,  # noqa: ARG001
             process_set: ProcessSet = global_process_set) -> tuple[Any, Any]:  # noqa: ARG001
    """Eager alltoall: splits[j] rows to rank j; returns (received, received_splits)."""
    import torch

    from horovod.torch import alltoall as _a2a

    arr = np.asarray(tf.convert_to_tensor(tensor))
    s = None if splits is None else np.asarray(splits).tolist()
    out, rs = _a2a(torch.from_numpy(np.ascontiguousarray(arr)), splits=s)
    return tf.convert_to_tensor(out.numpy()), tf.convert_to_tensor(rs.numpy())


def broadcast_variables(variables: Any, root_rank: int) -> None:
    """Assign root_rank's values to `variables` (tf.Variables or Keras variables)."""
    _dtf.broadcast_variables(list(variables), root_rank)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:
    return _broadcast_object(obj, root_rank, name)


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:
    return _allgather_object(obj, name)


def barrier(process_set: ProcessSet = global_process_set) -> None:  # noqa: ARG001
    ddl_core.barrier()


def join() -> int:
    ddl_core.barrier()
    return ddl_core.size() - 1


class DistributedGradientTape(_dtf.DistributedGradientTape):
    """Horovod's DistributedGradientTape: gradient() averages over ranks."""

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "",  # noqa: ARG002
                 device_sparse: str = "", compression: Any = Compression.none,  # noqa: ARG002
                 sparse_as_dense: bool = False, op: Any = Average,  # noqa: ARG002
                 **unused: Any) -> None:
        super().__init__(gradtape, _HOROVOD_OP[ddl_op(op)])


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,  # noqa: N802, ARG001
                         device_dense: str = "", device_sparse: str = "",  # noqa: ARG001
                         compression: Any = Compression.none, sparse_as_dense: bool = False,  # noqa: ARG001
                         backward_passes_per_step: int = 1, op: Any = Average,  # noqa: ARG001
                         **unused: Any) -> Any:
    """A Keras optimizer that averages gradients over ranks before applying them."""
    from ddl_core.keras import DistributedOptimizer as _DO

    return _DO(optimizer, op=_HOROVOD_OP[ddl_op(op)])

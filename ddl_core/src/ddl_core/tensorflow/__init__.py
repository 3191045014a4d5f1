"""DDL for TensorFlow 2.x (CPU): collectives on tf tensors, gradient averaging for custom
loops (DistributedGradientTape) and for Keras optimizers, variable broadcasts.

The collectives run as `tf.numpy_function`s around ddl_core's, so they work in eager mode
and inside `tf.function` graphs (Keras's compiled train step) alike. Gradients are
averaged as one fused buffer per dtype: one allreduce per step instead of one per
variable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import tensorflow as tf

import ddl_core

_OPS = {"average": "avg", "avg": "avg", "sum": "sum", "min": "min", "max": "max",
        "product": "prod", "prod": "prod"}


def init() -> None:
    ddl_core.init()


def rank() -> int:
    ddl_core.init()
    return ddl_core.rank()


def size() -> int:
    ddl_core.init()
    return ddl_core.size()


def local_rank() -> int:
    ddl_core.init()
    return ddl_core.local_rank()


def local_size() -> int:
    ddl_core.init()
    return ddl_core.local_size()


def _np_allreduce(op: str) -> Any:
    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x)
        return ddl_core.allreduce(x, op=op)

    return run


def allreduce(tensor: Any, op: str = "average", name: str | None = None) -> tf.Tensor:
    """`tensor` reduced over all ranks (eager or in a tf.function)."""
    ddl_core.init()
    dop = _OPS.get(str(op).lower())
    if dop is None:
        raise ValueError(f"unknown op {op!r}: use average, sum, min, max or product")
    t = tf.convert_to_tensor(tensor)
    out = tf.numpy_function(_np_allreduce(dop), [t], t.dtype, stateful=True,
                            name=name or "DDLAllreduce")
    return tf.reshape(out, tf.shape(t))


def allreduce_list(tensors: Sequence[Any], op: str = "average") -> list[Any]:
    """Reduce many tensors with one allreduce per dtype (fused), keeping None entries.

    IndexedSlices (embedding gradients) are densified first: every rank must send the
    same number of bytes.
    """
    ddl_core.init()
    dop = _OPS[str(op).lower()]
    dense = [None if t is None else tf.convert_to_tensor(t) for t in tensors]
    out: list[Any] = list(dense)
    by_dtype: dict[tf.DType, list[int]] = {}
    for i, t in enumerate(dense):
        if t is not None:
            by_dtype.setdefault(t.dtype, []).append(i)
    for dtype, idx in by_dtype.items():
        flat = tf.concat([tf.reshape(dense[i], [-1]) for i in idx], axis=0)
        red = tf.numpy_function(_np_allreduce(dop), [flat], dtype, stateful=True,
                                name="DDLFusedAllreduce")
        sizes = [tf.size(dense[i]) for i in idx]
        parts = tf.split(tf.reshape(red, [-1]), sizes)
        for i, p in zip(idx, parts, strict=True):
            out[i] = tf.reshape(p, tf.shape(dense[i]))
    return out


def broadcast(tensor: Any, root_rank: int = 0, name: str | None = None) -> tf.Tensor:
    """root_rank's `tensor` on every rank."""
    ddl_core.init()
    t = tf.convert_to_tensor(tensor)

    def run(x: np.ndarray) -> np.ndarray:
        x = np.array(x, copy=True, order="C")
        return ddl_core.broadcast(x, root_rank)

    out = tf.numpy_function(run, [t], t.dtype, stateful=True, name=name or "DDLBroadcast")
    return tf.reshape(out, tf.shape(t))


def allgather(tensor: Any, name: str | None = None) -> tf.Tensor:
    """Every rank's tensor concatenated along the first axis (first dimensions may differ)."""
    ddl_core.init()
    t = tf.convert_to_tensor(tensor)

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x if x.ndim else x.reshape(1))
        rows = ddl_core.allgather(np.array([x.shape[0]], dtype=np.int64))
        longest = int(rows.max())
        padded = np.zeros((longest, *x.shape[1:]), dtype=x.dtype)
        padded[: x.shape[0]] = x
        g = ddl_core.allgather(padded).reshape(len(rows), longest, *x.shape[1:])
        return np.concatenate([g[i, : int(rows[i])] for i in range(len(rows))])

    out = tf.numpy_function(run, [t], t.dtype, stateful=True, name=name or "DDLAllgather")
    if t.shape.rank:
        out.set_shape([None, *t.shape[1:]])
    return out


def broadcast_variables(variables: Sequence[Any], root_rank: int = 0) -> None:
    """Assign root_rank's values to `variables` on every rank (eager; one fused broadcast
    per dtype)."""
    ddl_core.init()
    variables = list(variables)
    if not variables:
        return
    by_dtype: dict[Any, list[Any]] = {}
    for v in variables:
        by_dtype.setdefault(np.dtype(v.dtype.as_numpy_dtype if hasattr(v.dtype, "as_numpy_dtype")
                                     else v.dtype), []).append(v)
    for dtype, vs in sorted(by_dtype.items(), key=lambda kv: str(kv[0])):
        arrays = [np.asarray(v.numpy() if hasattr(v, "numpy") else v) for v in vs]
        flat = np.concatenate([a.reshape(-1) for a in arrays]).astype(dtype, copy=False)
        flat = np.ascontiguousarray(flat)
        ddl_core.broadcast(flat, root_rank)
        off = 0
        for v, a in zip(vs, arrays, strict=True):
            v.assign(flat[off: off + a.size].reshape(a.shape))
            off += a.size


class DistributedGradientTape:
    """`tf.GradientTape` whose gradient() returns gradients averaged over all ranks.

        with tf.GradientTape() as tape:
            loss = ...
        tape = ddl.DistributedGradientTape(tape)
        grads = tape.gradient(loss, model.trainable_variables)
    """

    def __init__(self, tape: tf.GradientTape, op: str = "average", **unused: Any) -> None:
        self._tape = tape
        self._op = op

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 **kwargs: Any) -> Any:
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        if size() == 1:
            return grads
        flat = tf.nest.flatten(grads)
        return tf.nest.pack_sequence_as(grads, allreduce_list(flat, self._op))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tape, name)

    def __enter__(self) -> DistributedGradientTape:
        self._tape.__enter__()
        return self

    def __exit__(self, *exc: Any) -> Any:
        return self._tape.__exit__(*exc)


__all__ = ["init", "rank", "size", "local_rank", "local_size", "allreduce", "allreduce_list",
           "broadcast", "allgather", "broadcast_variables", "DistributedGradientTape"]

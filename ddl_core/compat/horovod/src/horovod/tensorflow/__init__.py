"""`import horovod.tensorflow as hvd` on DDL: Horovod's documented TensorFlow 2 API
(eager and tf.function), implemented with ddl_core.tensorflow."""

from __future__ import annotations

import pickle
import weakref
from typing import Any

import numpy as np
import tensorflow as tf
from ddl_core.objects import allgather_object as _allgather_object
from ddl_core.objects import broadcast_object as _broadcast_object
from tensorflow.python.framework.func_graph import FuncGraph

import ddl_core
from ddl_core import tensorflow as _dtf
from ddl_core import timeline

# Horovod's common API (init, rank, the ops, process sets, ...) is basics.__all__, listed
# once there for every front end; the names this module calls itself are imported by name.
from ..common.basics import *  # noqa: F403
from ..common.basics import (
    Average,
    ProcessSet,
    Sum,
    barrier_raising,
    ddl_op,
    global_process_set,
    local_rank,
    local_size,
    rank,
    size,
)
from ..common.basics import join as _join
from ..common.engine import ALLGATHER, ALLREDUCE, ALLTOALL, BROADCAST
from ..common.matching import alltoall_parts, op_name, submit_alltoall
from ..common.process_sets import engine_of
from . import elastic  # noqa: F401 - hvd.elastic: Horovod's elastic API
from .util import _executing_eagerly  # noqa: F401 - Horovod exposes it as hvd._executing_eagerly


def rank_op(name: str | None = None) -> Any:  # noqa: ARG001 - Horovod's signature
    """Horovod's rank as an int32 tensor (a constant: a DDL job's ranks never change)."""
    return tf.constant(rank(), dtype=tf.int32)


def size_op(name: str | None = None) -> Any:  # noqa: ARG001
    """The number of ranks as an int32 tensor."""
    return tf.constant(size(), dtype=tf.int32)


def local_rank_op(name: str | None = None) -> Any:  # noqa: ARG001
    """This process's rank on its host as an int32 tensor."""
    return tf.constant(local_rank(), dtype=tf.int32)


def local_size_op(name: str | None = None) -> Any:  # noqa: ARG001
    """The number of ranks on this host as an int32 tensor."""
    return tf.constant(local_size(), dtype=tf.int32)

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


def _tf_error(exc: ddl_core.DDLError) -> Exception:
    """The TensorFlow error Horovod raises for a failed collective: ranks that disagree on
    it are a FailedPreconditionError (as upstream's coordinator reports them), a duplicate
    name an InvalidArgumentError, a rank that never submitted it DeadlineExceededError.
    (Eager execution keeps these classes; inside a tf.function TensorFlow reports errors
    raised in a numpy_function as UnknownError, with the same message.)"""
    if isinstance(exc, ddl_core.MismatchError):
        cls = tf.errors.FailedPreconditionError
    elif isinstance(exc, ddl_core.InvalidArgumentError):
        cls = tf.errors.InvalidArgumentError
    elif isinstance(exc, ddl_core.DDLTimeoutError):
        cls = tf.errors.DeadlineExceededError
    else:
        cls = tf.errors.UnknownError
    return cls(None, None, str(exc))


def _waited(submit: Any) -> Any:
    """Queue requests (submit() returns their handles) and wait for all of them; every
    handle is waited for even when one fails, so nothing is left in flight."""
    try:
        handles = submit()
    except ddl_core.DDLError as exc:
        raise _tf_error(exc) from exc
    single = not isinstance(handles, list)
    results, failure = [], None
    for h in [handles] if single else handles:
        try:
            results.append(h.wait())
        except ddl_core.DDLError as exc:
            failure = failure or exc
            results.append(None)
    if failure is not None:
        raise _tf_error(failure) from failure
    return results[0] if single else results


def _on_set(eng: Any, full: str | None, sig: tuple, info: Any, x: np.ndarray | None,
            label: str) -> Any:
    """Queue a request on a process set's engine and wait for it, with TensorFlow's
    errors (as _waited)."""
    try:
        return eng.submit(full, sig, info, x, label).wait()
    except ddl_core.DDLError as exc:
        raise _tf_error(exc) from exc


def _name(kind: str, t: Any, name: str | None) -> str | None:
    """Horovod's naming: a given name; inside a tf.function, one derived from the tensor's
    name (the same on every rank that traced the same function); eagerly, none (matched by
    order)."""
    if name is not None or tf.executing_eagerly():
        return name
    return f"Horovod{kind}_" + "".join(c if c.isalnum() or c in "._-" else "_" for c in t.name)


def _op_label(name: str | None, kind: str) -> str:
    """A valid TensorFlow op name for the numpy_function."""
    if not name:
        return f"Horovod{kind}"
    return "".join(c if c.isalnum() or c in "._-/" else "_" for c in name).lstrip("_-/") or kind


# The last collective built into each TF1-style graph (see _collective).
_chain: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _collective(func: Any, inp: list[Any], tout: Any, name: str) -> Any:
    """tf.numpy_function for a collective, run in program order. Each one blocks its
    thread until every rank has submitted it, so the ranks must run them in the same
    order: eagerly and in a tf.function (whose automatic control dependencies order
    stateful ops) they do; in a TF1-style graph TensorFlow would pick any order per rank
    and two ranks could block on different collectives for ever, so there each
    collective gets a control dependency on the one built before it (running one runs
    the earlier ones of the graph too). Upstream's asynchronous kernels need no order."""
    g = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    if g is None or isinstance(g, FuncGraph):
        return tf.numpy_function(func, inp, tout, stateful=True, name=name)
    prev = _chain.get(g)
    with tf.control_dependencies([] if prev is None else [prev]):
        out = tf.numpy_function(func, inp, tout, stateful=True, name=name)
    _chain[g] = (out[0] if isinstance(out, (list, tuple)) else out).op
    return out


_WIDEN = {np.dtype(np.uint16): np.int32, np.dtype(np.int16): np.int32,
          np.dtype(np.uint32): np.int64, np.dtype(np.bool_): np.uint8}


def _movable(x: np.ndarray) -> tuple[np.ndarray, Any]:
    """(array libddl moves, result -> x's dtype) for the collectives that only move data
    (allgather, broadcast, alltoall): dtypes libddl lacks travel widened, losslessly."""
    if x.dtype == np.uint64:
        return x.view(np.int64), lambda y: np.asarray(y).view(np.uint64)
    to = _WIDEN.get(x.dtype)
    if to is None:
        return x, lambda y: y
    dt = x.dtype
    return x.astype(to), lambda y: np.asarray(y).astype(dt)


def _scaled(t: Any, factor: float) -> Any:
    """t times a pre/post-scale factor in Horovod's arithmetic: integers in float64 and
    truncated back (a factor cast to an integer dtype would be 0), 16-bit floats in
    float32."""
    if factor == 1.0:
        return t
    if t.dtype.is_integer:
        return tf.cast(tf.cast(t, tf.float64) * factor, t.dtype)
    if t.dtype in (tf.float16, tf.bfloat16):
        return tf.cast(tf.cast(t, tf.float32) * factor, t.dtype)
    return t * tf.cast(factor, t.dtype)


def _np(x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x)
    return x.reshape(1) if x.ndim == 0 else x


def _differentiable(forward: Any, backward: Any, inputs: list[Any]) -> Any:
    """forward(*inputs) with `backward` as its gradient (tf.custom_gradient: eagerly, in a
    tf.function and in a TF1 graph alike). backward(inputs, dys) gets one upstream
    gradient per output (zeros for an output that does not reach the loss), cast to the
    output's dtype (TensorFlow may hand a float32 gradient to a float64 op), and returns
    one gradient per input. Horovod registers the same gradients on its kernels; the
    collectives run in the backward are matched across ranks like any others."""

    @tf.custom_gradient
    def op(*xs: Any) -> Any:
        ys = forward(*xs)
        flat = list(ys) if isinstance(ys, (list, tuple)) else [ys]

        def grad(*dys: Any) -> Any:
            dys = [tf.zeros_like(y) if d is None else
                   (tf.cast(d, y.dtype) if d.dtype != y.dtype else d)
                   for d, y in zip(dys, flat, strict=True)]
            gs = backward(xs, dys)
            return gs if len(xs) > 1 else gs[0]

        return ys, grad

    return op(*inputs)


def _set_rank_size(process_set: ProcessSet) -> tuple[int, int]:
    """(this rank's index in the set, the set's size): Horovod's process_set.rank()/size()."""
    eng = engine_of(process_set, "collective")
    if eng is None:
        return ddl_core.rank(), ddl_core.size()
    return eng.comm.rank, len(eng.members)


def _allreduce_wire(wire: Any, dop: str, prescale: float, postscale: float,
                    name: str | None, process_set: ProcessSet) -> Any:
    """The allreduce of an already compressed tensor, scale factors applied around it
    (Horovod's op). Differentiable: the gradient is the allreduce of the output's gradient
    with the same op, factors and process set (Horovod's _allreduce_grad)."""
    eng = engine_of(process_set, "allreduce")
    full = op_name("allreduce", _name("Allreduce", wire, name))

    def run(x: np.ndarray) -> np.ndarray:
        if eng is not None:
            x = np.array(x, copy=True, order="C")
            return _on_set(eng, full, (ALLREDUCE, x.dtype.str, x.shape, dop), None, x,
                           full or "allreduce")
        x = np.ascontiguousarray(x)
        return _waited(lambda: ddl_core.allreduce_async(x, op=dop, name=full, shape=x.shape))

    def forward(t: Any) -> Any:
        t = _scaled(t, prescale)
        out = _collective(run, [t], t.dtype, name=_op_label(name, "Allreduce"))
        return _scaled(tf.reshape(out, tf.shape(t)), postscale)

    def backward(_xs: Any, dys: list[Any]) -> list[Any]:
        return [_allreduce_wire(dys[0], dop, prescale, postscale, None, process_set)]

    return _differentiable(forward, backward, [wire])


def allreduce(tensor: Any, average: bool | None = None, device_dense: str = "",  # noqa: ARG001
              device_sparse: str = "", compression: Any = Compression.none, op: Any = None,  # noqa: ARG001
              prescale_factor: float = 1.0, postscale_factor: float = 1.0,
              name: str | None = None, process_set: ProcessSet = global_process_set) -> Any:
    """`tensor` reduced over the process set's ranks (all by default). Matched across
    ranks by name (any order) or, unnamed, by order; shapes and dtypes must agree.
    Differentiable (Horovod's gradient: the allreduce of the output's gradient, same op,
    factors and set). tf.IndexedSlices (embedding gradients) stay sparse as in Horovod:
    every rank's values and indices are allgathered (values divided by the set's size for
    Average); other ops and scale factors are NotImplementedError for them, as Horovod's."""
    ddl_core.init()
    if isinstance(tensor, tf.IndexedSlices):
        return _allreduce_slices(tensor, op, average, prescale_factor, postscale_factor,
                                 name, process_set)
    dop = ddl_op(op, average)
    engine_of(process_set, "allreduce")  # Horovod's error for a rank outside the set
    t = tf.convert_to_tensor(tensor)
    wire, ctx = compression.compress(t)
    out = _allreduce_wire(wire, dop, prescale_factor, postscale_factor, name, process_set)
    return compression.decompress(out, ctx)


def _allreduce_slices(slices: Any, op: Any, average: bool | None, prescale: float,
                      postscale: float, name: str | None, process_set: ProcessSet) -> Any:
    if op is None:
        op = Average if average is not False else Sum
    if op not in (Average, Sum):
        raise NotImplementedError("the allreduce of tf.IndexedSlices supports op=Average "
                                  f"and Sum only, not {op!r}")
    if prescale != 1.0 or postscale != 1.0:
        raise NotImplementedError("pre/postscale_factor are not supported for the allreduce "
                                  "of tf.IndexedSlices")
    values = allgather(slices.values, name=None if name is None else f"{name}.values",
                       process_set=process_set)
    indices = allgather(slices.indices, name=None if name is None else f"{name}.indices",
                        process_set=process_set)
    if op == Average:
        values = values / tf.cast(process_set.size(), values.dtype)
    return tf.IndexedSlices(values, indices, dense_shape=slices.dense_shape)


def grouped_allreduce(tensors: list[Any], average: bool | None = None, device_dense: str = "",  # noqa: ARG001
                      device_sparse: str = "", compression: Any = Compression.none,  # noqa: ARG001
                      op: Any = None, prescale_factor: float = 1.0,
                      postscale_factor: float = 1.0,
                      process_set: ProcessSet = global_process_set,
                      ignore_name_scope: bool = False, name: str | None = None) -> list[Any]:  # noqa: ARG001
    """Every tensor reduced over the process set's ranks: one request each (fused),
    named `<name>.<i>` when named; differentiable as allreduce. tf.IndexedSlices entries
    stay sparse, as allreduce's."""
    ddl_core.init()
    if not tensors:
        return tensors
    kw = {"compression": compression, "prescale_factor": prescale_factor,
          "postscale_factor": postscale_factor}
    if any(isinstance(t, tf.IndexedSlices) for t in tensors):
        sparse = [i for i, t in enumerate(tensors) if isinstance(t, tf.IndexedSlices)]
        dense = [i for i in range(len(tensors)) if i not in sparse]
        out: list[Any] = [None] * len(tensors)
        for i in sparse:
            out[i] = allreduce(tensors[i], average=average, op=op, process_set=process_set,
                               name=None if name is None else f"{name}.{i}", **kw)
        if dense:
            red = grouped_allreduce([tensors[i] for i in dense], average=average, op=op,
                                    name=None if name is None else f"{name}.dense",
                                    process_set=process_set, **kw)
            for i, r in zip(dense, red, strict=True):
                out[i] = r
        return out
    if engine_of(process_set, "grouped_allreduce") is not None:
        return [allreduce(t, average=average, op=op, process_set=process_set,
                          name=None if name is None else f"{name}.{i}", **kw)
                for i, t in enumerate(tensors)]
    dop = ddl_op(op, average)
    wired = [compression.compress(tf.convert_to_tensor(t)) for t in tensors]
    outs = _grouped_allreduce_wire([w for w, _ in wired], dop, prescale_factor,
                                   postscale_factor, name)
    return [compression.decompress(o, c) for o, (_, c) in zip(outs, wired, strict=True)]


def _grouped_allreduce_wire(ts: list[Any], dop: str, prescale: float, postscale: float,
                            name: str | None) -> list[Any]:
    """grouped_allreduce on the global set: one numpy_function queues every tensor (libddl
    fuses them). Differentiable: the gradients are the grouped allreduce of the outputs'
    gradients with the same op and factors (Horovod's _grouped_allreduce_grad)."""
    names = [op_name("grouped_allreduce", None if name is None else f"{name}.{i}")
             for i in range(len(ts))]

    def run(*xs: np.ndarray) -> list[np.ndarray]:
        xs = tuple(np.ascontiguousarray(x) for x in xs)
        return _waited(lambda: [ddl_core.allreduce_async(x, op=dop, name=nm, shape=x.shape)
                                for x, nm in zip(xs, names, strict=True)])

    def forward(*xs: Any) -> list[Any]:
        xs = [_scaled(x, prescale) for x in xs]
        outs = _collective(run, xs, [t.dtype for t in xs],
                           name=_op_label(name, "GroupedAllreduce"))
        return [_scaled(tf.reshape(o, tf.shape(t)), postscale)
                for o, t in zip(outs, xs, strict=True)]

    def backward(_xs: Any, dys: list[Any]) -> list[Any]:
        return _grouped_allreduce_wire(list(dys), dop, prescale, postscale, None)

    out = _differentiable(forward, backward, ts)
    return list(out) if isinstance(out, (list, tuple)) else [out]


def _allgather_raw(t: Any, name: str | None, process_set: ProcessSet) -> Any:
    """The allgather itself (not differentiable)."""
    eng = engine_of(process_set, "allgather")
    full = op_name("allgather", _name("Allgather", t, name))

    def run(x: np.ndarray) -> np.ndarray:
        x, back = _movable(_np(x))
        if eng is not None:
            return back(_on_set(eng, full, (ALLGATHER, x.dtype.str, x.shape[1:]), x.shape[0],
                                x, full or "allgather")[0])
        return back(_waited(lambda: ddl_core.allgatherv_async(x, name=full, shape=x.shape)))

    out = _collective(run, [t], t.dtype, name=_op_label(name, "Allgather"))
    if t.shape.rank:
        out.set_shape([None, *t.shape[1:]])
    return out


def allgather(tensor: Any, name: str | None = None, ignore_name_scope: bool = False,  # noqa: ARG001
              process_set: ProcessSet = global_process_set) -> Any:
    """Every rank's tensor concatenated along the first dimension (which may differ; the
    others, and the dtype, must agree). Differentiable, with Horovod's gradient: this
    rank's rows of the set's average of the output's gradients."""
    ddl_core.init()
    engine_of(process_set, "allgather")
    t = tf.convert_to_tensor(tensor)

    def backward(xs: Any, dys: list[Any]) -> list[Any]:
        x = xs[0]
        avg = _allreduce_wire(dys[0], "avg", 1.0, 1.0, None, process_set)
        mine = tf.reshape(tf.shape(x, out_type=tf.int64)[0] if x.shape.rank != 0
                          else tf.constant(1, tf.int64), [1])
        rows = _allgather_raw(mine, None, process_set)
        me, _ = _set_rank_size(process_set)
        start = tf.reduce_sum(rows[:me])
        return [tf.reshape(avg[start:start + rows[me]], tf.shape(x))]

    return _differentiable(lambda x: _allgather_raw(x, name, process_set), backward, [t])


def _broadcast_raw(t: Any, root_rank: int, name: str | None, process_set: ProcessSet) -> Any:
    """The broadcast itself (not differentiable)."""
    eng = engine_of(process_set, "broadcast")
    full = op_name("broadcast", _name("Broadcast", t, name))

    def run(x: np.ndarray) -> np.ndarray:
        x, back = _movable(np.array(x, copy=True, order="C"))
        x = np.ascontiguousarray(x)
        if eng is not None:
            return back(_on_set(eng, full, (BROADCAST, x.dtype.str, x.shape, int(root_rank)),
                                None, x, full or "broadcast"))
        _waited(lambda: ddl_core.broadcast_async(x, root_rank, name=full, shape=x.shape))
        return back(x)

    out = _collective(run, [t], t.dtype, name=_op_label(name, "Broadcast"))
    return tf.reshape(out, tf.shape(t))


def broadcast(tensor: Any, root_rank: int, name: str | None = None,
              ignore_name_scope: bool = False,  # noqa: ARG001
              process_set: ProcessSet = global_process_set) -> Any:
    """root_rank's `tensor` on every rank of the process set (root_rank: a world rank;
    shapes and dtypes must agree). Differentiable, with Horovod's gradient: the set's
    average of the output's gradients on the root, zeros on the other ranks."""
    ddl_core.init()
    eng = engine_of(process_set, "broadcast")
    if eng is not None and root_rank not in eng.members:
        raise ValueError(f"broadcast: root_rank {root_rank} is not in process set "
                         f"{process_set.process_set_id} (ranks {eng.members})")
    t = tf.convert_to_tensor(tensor)

    def backward(_xs: Any, dys: list[Any]) -> list[Any]:
        avg = _allreduce_wire(dys[0], "avg", 1.0, 1.0, None, process_set)
        return [avg if ddl_core.rank() == root_rank else avg * 0]

    return _differentiable(lambda x: _broadcast_raw(x, root_rank, name, process_set),
                           backward, [t])


def _alltoall_raw(t: Any, splits: Any, name: str | None,
                  process_set: ProcessSet) -> tuple[Any, Any]:
    """The alltoall itself (not differentiable): (received rows, received splits)."""
    eng = engine_of(process_set, "alltoall")
    n, me = ((ddl_core.size(), ddl_core.rank()) if eng is None
             else (len(eng.members), eng.comm.rank))
    if splits is None and t.shape.rank and t.shape[0] is not None and t.shape[0] % n:
        raise tf.errors.InvalidArgumentError(
            None, None, f"alltoall: {t.shape[0]} rows do not split evenly over {n} ranks; "
            "pass splits")
    rows_t = tf.shape(t)[0]
    sp = (tf.fill([n], rows_t // n) if splits is None
          else tf.cast(tf.convert_to_tensor(splits), tf.int64))
    full_name = _name("Alltoall", t, name)

    def run(x: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        x, back = _movable(np.ascontiguousarray(x))
        x = np.ascontiguousarray(x)
        s = [int(v) for v in np.asarray(s).reshape(-1)]
        if splits is None and x.shape[0] % n:
            raise tf.errors.InvalidArgumentError(
                None, None, f"alltoall: {x.shape[0]} rows do not split evenly over {n} "
                "ranks; pass splits")
        if len(s) != n or any(v < 0 for v in s) or sum(s) != x.shape[0]:
            raise tf.errors.InvalidArgumentError(
                None, None, f"alltoall: splits {s} must hold one entry >= 0 per rank of the "
                f"process set ({n}) adding up to the {x.shape[0]} rows of the tensor")
        if eng is not None:
            out, received = _on_set(eng, op_name("alltoall", full_name),
                                    (ALLTOALL, x.dtype.str, x.shape[1:]), s, x,
                                    op_name("alltoall", full_name) or "alltoall")
            return (np.ascontiguousarray(back(out)), np.asarray(received, dtype=np.int32))
        sh, dh = _waited(lambda: list(submit_alltoall(x, s, full_name)))
        parts, received = alltoall_parts(sh.reshape(n, n), me)
        out = np.concatenate([dh[a:b] for a, b in parts]) if parts else dh[:0]
        return back(out), np.asarray(received, dtype=np.int32)

    out, rsplits = _collective(run, [t, sp], [t.dtype, tf.int32],
                               name=_op_label(name, "Alltoall"))
    if t.shape.rank:
        out.set_shape([None, *t.shape[1:]])
    rsplits.set_shape([n])
    return out, rsplits


def alltoall(tensor: Any, splits: Any = None, name: str | None = None,
             ignore_name_scope: bool = False,  # noqa: ARG001
             process_set: ProcessSet = global_process_set) -> Any:
    """splits[j] rows of `tensor` to the set's j-th rank (without splits: equal blocks).
    As Horovod: with splits, returns (received rows, received splits); without, the
    received rows alone. Differentiable: the gradient goes back the way the rows came
    (an alltoall of the output's gradient with the received splits)."""
    ddl_core.init()
    engine_of(process_set, "alltoall")
    t = tf.convert_to_tensor(tensor)
    received: list[Any] = []

    def forward(x: Any) -> Any:
        out, rsplits = _alltoall_raw(x, splits, name, process_set)
        received.append(rsplits)
        return out

    def backward(_xs: Any, dys: list[Any]) -> list[Any]:
        return [_alltoall_raw(dys[0], received[0], None, process_set)[0]]

    out = _differentiable(forward, backward, [t])
    return (out, received[0]) if splits is not None else out


def reducescatter(tensor: Any, device_dense: str = "", compression: Any = Compression.none,  # noqa: ARG001
                  op: Any = Average, name: str | None = None,
                  process_set: ProcessSet = global_process_set, prescale_factor: float = 1.0,
                  postscale_factor: float = 1.0, **unused: Any) -> Any:
    """`tensor` reduced over the process set's ranks, this rank's block of the first
    dimension (the first blocks one row larger when rows do not divide, as Horovod).
    Differentiable, with Horovod's gradient: the output gradients allgathered, times the
    set's size for Sum and times the scale factors."""
    ddl_core.init()
    t = tf.convert_to_tensor(tensor)
    if t.shape.rank == 0:
        raise ValueError("reducescatter: a scalar (0-dimensional tensor) cannot be scattered")
    dop = ddl_op(op)
    engine_of(process_set, "reducescatter")
    me, n = _set_rank_size(process_set)
    wire, ctx = compression.compress(t)

    def forward(x: Any) -> Any:
        red = _allreduce_wire(x, dop, prescale_factor, postscale_factor,
                              None if name is None else f"reducescatter.{name}", process_set)
        rows = tf.shape(red)[0]
        base, extra = rows // n, rows % n
        start = me * base + tf.minimum(me, extra)
        count = base + tf.cast(me < extra, rows.dtype)
        return red[start:start + count]

    def backward(_xs: Any, dys: list[Any]) -> list[Any]:
        g = dys[0]
        factor = (n if dop == "sum" else 1.0) * prescale_factor * postscale_factor
        if factor != 1.0:
            g = g * tf.cast(factor, g.dtype)
        return [_allgather_raw(g, None, process_set)]

    out = _differentiable(forward, backward, [wire])
    return compression.decompress(out, ctx)


def grouped_reducescatter(tensors: list[Any], device_dense: str = "",  # noqa: ARG001
                          compression: Any = Compression.none, op: Any = Average,
                          name: str | None = None,
                          process_set: ProcessSet = global_process_set,
                          prescale_factor: float = 1.0, postscale_factor: float = 1.0,
                          **unused: Any) -> list[Any]:
    """reducescatter of every tensor of the list (matched by list position;
    differentiable as reducescatter)."""
    if any(tf.convert_to_tensor(t).shape.rank == 0 for t in tensors):
        raise ValueError("grouped_reducescatter: a scalar (0-dimensional tensor) cannot be "
                         "scattered")
    return [reducescatter(t, compression=compression, op=op,
                          name=None if name is None else f"{name}.{i}",
                          process_set=process_set, prescale_factor=prescale_factor,
                          postscale_factor=postscale_factor)
            for i, t in enumerate(tensors)]


def grouped_allgather(tensors: list[Any], name: str | None = None,
                      ignore_name_scope: bool = False,  # noqa: ARG001
                      process_set: ProcessSet = global_process_set) -> list[Any]:
    """allgather of every tensor of the list (matched by list position; differentiable
    as allgather)."""
    return [allgather(t, name=None if name is None else f"{name}.{i}",
                      process_set=process_set) for i, t in enumerate(tensors)]


def broadcast_(variables: list[Any], root_rank: int, name: str | None = None,
               process_set: ProcessSet = global_process_set) -> list[Any]:
    """Overwrite every variable with root_rank's value, in place; returns the variables'
    new values (in a graph, the assignments)."""
    return [v.assign(broadcast(v, root_rank, name=None if name is None else f"{name}.{i}",
                               process_set=process_set))
            for i, v in enumerate(variables)]


def broadcast_global_variables(root_rank: int) -> Any:
    """TF1: an op assigning root_rank's values to every global variable. Eagerly there are
    no global variables: RuntimeError, as Horovod's."""
    if tf.executing_eagerly():
        raise RuntimeError("hvd.broadcast_global_variables() does not support eager "
                           "execution. Please use `hvd.broadcast_variables(<model/optimizer "
                           "variables>)` instead.")
    return tf.group(*broadcast_(tf.compat.v1.global_variables(), root_rank))


def broadcast_variables(variables: Any, root_rank: int) -> None:
    """Assign root_rank's values to `variables` (tf.Variables or Keras variables)."""
    _dtf.broadcast_variables(list(variables), root_rank)


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> Any:
    """root_rank's picklable `obj` on every rank of the process set."""
    eng = engine_of(process_set, "broadcast_object")
    if eng is None:
        with timeline.timed(name or "broadcast_object", "BROADCAST_OBJECT"):
            return _broadcast_object(obj, root_rank, name)
    if root_rank not in eng.members:
        raise ValueError(f"broadcast_object: root_rank {root_rank} is not in process set "
                         f"{process_set.process_set_id} (ranks {eng.members})")
    mine = pickle.dumps(obj) if ddl_core.rank() == root_rank else b""
    data = np.frombuffer(mine, dtype=np.uint8).copy()
    flat, _ = _on_set(eng, op_name("broadcast_object", name), (ALLGATHER, "|u1", ()),
                      data.size, data, "broadcast_object")
    return pickle.loads(flat.tobytes())


def allgather_object(obj: Any, name: str | None = None,
                     process_set: ProcessSet = global_process_set) -> list[Any]:
    """Every set member's picklable `obj`, in the set's rank order."""
    eng = engine_of(process_set, "allgather_object")
    if eng is None:
        with timeline.timed(name or "allgather_object", "ALLGATHER_OBJECT"):
            return _allgather_object(obj, name)
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8).copy()
    flat, rows = _on_set(eng, op_name("allgather_object", name), (ALLGATHER, "|u1", ()),
                         data.size, data, "allgather_object")
    out, off = [], 0
    for k in rows:
        out.append(pickle.loads(flat[off: off + k].tobytes()))
        off += k
    return out


def barrier(process_set: ProcessSet = global_process_set) -> None:
    """Wait until every rank of the process set has called barrier()."""
    barrier_raising(process_set, _tf_error)


def join() -> int:
    """Horovod's join for uneven data: see horovod.torch.join."""
    return _join()


class DistributedGradientTape(_dtf.DistributedGradientTape):
    """Horovod's DistributedGradientTape: gradient() averages over the ranks of
    `process_set` (all by default), except the gradients of sources registered with
    register_local_source(), which stay this rank's own, divided by the set's size when
    scale_local_gradients (Horovod's default)."""

    def __init__(self, gradtape: tf.GradientTape, device_dense: str = "",  # noqa: ARG002
                 device_sparse: str = "", compression: Any = Compression.none,  # noqa: ARG002
                 sparse_as_dense: bool = False, op: Any = Average,  # noqa: ARG002
                 process_set: ProcessSet = global_process_set,
                 scale_local_gradients: bool = True, **unused: Any) -> None:
        super().__init__(gradtape, _HOROVOD_OP[ddl_op(op)])
        self._hvd_op = op
        self._hvd_set = process_set if engine_of(process_set, "DistributedGradientTape") \
            is not None else None
        self._hvd_process_set = process_set
        self._scale_local = scale_local_gradients
        self._local_sources: list[Any] = []

    def register_local_source(self, source: Any) -> None:
        """Mark a source (a variable) as this worker's own: its gradient is not averaged
        over ranks (Horovod's model-parallel layers)."""
        self._local_sources.append(source)

    def _is_local(self, source: Any) -> bool:
        return any(source is s for s in self._local_sources)

    def _reduced(self, grads: list[Any]) -> list[Any]:
        if self._hvd_set is None:  # the global set: ddl_core's fused path, as the base class
            idx = [i for i, g in enumerate(grads) if g is not None]
            out = list(grads)
            if idx and ddl_core.size() > 1:
                red = _dtf.allreduce_list([grads[i] for i in idx],
                                          _HOROVOD_OP[ddl_op(self._hvd_op)])
                for i, g in zip(idx, red, strict=True):
                    out[i] = g
            return out
        return [None if g is None else
                allreduce(g, op=self._hvd_op, process_set=self._hvd_set,
                          name=f"DistributedGradientTape.{i}")
                for i, g in enumerate(grads)]

    def gradient(self, target: Any, sources: Any, output_gradients: Any = None,
                 **kwargs: Any) -> Any:
        if self._hvd_set is None and not self._local_sources:
            return super().gradient(target, sources, output_gradients, **kwargs)
        kwargs.pop("use_generic_names", None)
        grads = self._tape.gradient(target, sources, output_gradients, **kwargs)
        flat_src, flat = tf.nest.flatten(sources), tf.nest.flatten(grads)
        glob = [i for i, src in enumerate(flat_src) if not self._is_local(src)]
        out = list(flat)
        for i, g in zip(glob, self._reduced([flat[i] for i in glob]), strict=True):
            out[i] = g
        n = float(self._hvd_process_set.size())
        for i, src in enumerate(flat_src):
            if self._is_local(src) and out[i] is not None and self._scale_local:
                g = out[i]
                out[i] = (tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                          if isinstance(g, tf.IndexedSlices) else g / n)
        return tf.nest.pack_sequence_as(grads, out)


def DistributedOptimizer(optimizer: Any, name: str | None = None, use_locking: bool = False,  # noqa: N802, ARG001
                         device_dense: str = "", device_sparse: str = "",  # noqa: ARG001
                         compression: Any = Compression.none, sparse_as_dense: bool = False,  # noqa: ARG001
                         backward_passes_per_step: int = 1, op: Any = Average,  # noqa: ARG001
                         **unused: Any) -> Any:
    """A Keras optimizer that averages gradients over ranks before applying them."""
    from ddl_core.keras import DistributedOptimizer as _DO

    process_set = unused.get("process_set", global_process_set)
    if process_set is not global_process_set and process_set.process_set_id != 0:
        process_set._check_registered()
        return _set_optimizer(optimizer, op, process_set)
    return _DO(optimizer, op=_HOROVOD_OP[ddl_op(op)])


def _set_optimizer(optimizer: Any, op: Any, process_set: ProcessSet) -> Any:
    """A copy of the Keras `optimizer` (same class and config) whose apply() averages the
    gradients over `process_set` first, one named request per gradient on the set's
    engine (works eagerly and inside fit's tf.function); on a rank outside the set the
    gradients are applied as they are (Horovod's optimizer averages nothing there)."""
    base = type(optimizer)
    member = process_set.included()

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        if member:
            grads = [None if g is None else
                     allreduce(g, op=op, process_set=process_set,
                               name=f"DistributedOptimizer.{i}")
                     for i, g in enumerate(list(grads))]
        return base.apply(self, grads, trainable_variables)

    cls = type(base.__name__, (base,), {"apply": apply})
    return cls.from_config(optimizer.get_config())

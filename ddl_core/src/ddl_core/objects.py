"""Python objects through DDL (pickled): what Horovod's broadcast_object /
allgather_object do, without any framework, so torch, TensorFlow and the horovod
front ends share them."""

from __future__ import annotations

import pickle
from typing import Any

import numpy as np

import ddl_core


def broadcast_object(obj: Any, root_rank: int = 0, name: str | None = None) -> Any:  # noqa: ARG001
    """root_rank's `obj` on every rank (pickled; anything picklable)."""
    ddl_core.init()
    me = ddl_core.rank()
    payload = np.frombuffer(pickle.dumps(obj), dtype=np.uint8) if me == root_rank else None
    n = np.array([0 if payload is None else payload.size], dtype=np.int64)
    ddl_core.broadcast(n, root_rank)
    buf = payload.copy() if payload is not None else np.empty(int(n[0]), dtype=np.uint8)
    ddl_core.broadcast(buf, root_rank)
    return obj if me == root_rank else pickle.loads(buf.tobytes())


def allgather_object(obj: Any, name: str | None = None) -> list[Any]:  # noqa: ARG001
    """Every rank's `obj`, in rank order, on every rank."""
    ddl_core.init()
    data = np.frombuffer(pickle.dumps(obj), dtype=np.uint8)
    sizes = ddl_core.allgather(np.array([data.size], dtype=np.int64))
    longest = int(sizes.max())
    padded = np.zeros(longest, dtype=np.uint8)
    padded[: data.size] = data
    gathered = ddl_core.allgather(padded).reshape(len(sizes), longest)
    return [pickle.loads(gathered[i, : int(sizes[i])].tobytes()) for i in range(len(sizes))]


__all__ = ["broadcast_object", "allgather_object"]

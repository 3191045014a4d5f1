"""How horovod-ddl hands Horovod's matching contract to libddl, shared by the torch and
tensorflow front ends.

Horovod keys every collective by a name: a request runs once every rank has submitted
that name, whatever the order in which the ranks submitted it, and its dtype and shape
must agree (all dimensions; allgather and alltoall: all but the first). A request
without a name gets a generated one from a counter, so the n-th unnamed request of each
rank meets the n-th of the others. libddl's progress thread implements both (named and
unnamed asynchronous requests); here the user's name becomes Horovod's full name
(`allreduce.<name>`, `broadcast.<name>`, ...), so the same name used by two different
collectives does not collide, as in Horovod.
"""

from __future__ import annotations

from typing import Any

import numpy as np

import ddl_core


def op_name(prefix: str, name: str | None) -> str | None:
    """Horovod's full name of a collective named `name` (None: unnamed, matched by order)."""
    return None if name is None else f"{prefix}.{name}"


def alltoall_parts(all_splits: np.ndarray, me: int) -> tuple[list[tuple[int, int]], list[int]]:
    """From every rank's splits (row j: how many rows rank j sends to each rank), the
    (start, stop) rows of the gathered data that are this rank's, and what it receives
    from each rank."""
    n = all_splits.shape[0]
    starts = np.concatenate([[0], np.cumsum(all_splits.sum(axis=1))])
    parts, received = [], []
    for j in range(n):
        off = int(starts[j] + all_splits[j, :me].sum())
        k = int(all_splits[j, me])
        parts.append((off, off + k))
        received.append(k)
    return parts, received


def submit_alltoall(x: Any, splits: list[int], name: str | None) -> tuple[Any, Any]:
    """Queue an alltoall as two named requests (every rank's splits, and every rank's rows:
    an allgatherv, as horovod-ddl has no point-to-point), which meet the other ranks' by
    name like any request. Returns their handles."""
    n = ddl_core.size()
    if len(splits) != n:
        raise ValueError(f"alltoall: splits has {len(splits)} entries; it needs one per rank "
                         f"({n})")
    rows = int(x.shape[0]) if x.shape else 1
    if any(s < 0 for s in splits) or sum(splits) != rows:
        raise ValueError(f"alltoall: splits {splits} must be >= 0 and add up to the tensor's "
                         f"{rows} rows")
    full = op_name("alltoall", name)
    sh = ddl_core.allgather_async(np.asarray(splits, dtype=np.int64),
                                  name=None if full is None else full + ".splits", shape=(n,))
    dh = ddl_core.allgatherv_async(x, name=full, shape=tuple(x.shape))
    return sh, dh

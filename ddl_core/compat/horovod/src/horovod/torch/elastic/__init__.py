"""`hvd.elastic` for PyTorch on horovod-ddl: `hvd.elastic.run`, TorchState and
ElasticSampler, with Horovod's semantics (see horovod.common.elastic)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from horovod.common import basics as _basics
from horovod.common.elastic import ObjectState, State, run_fn
from horovod.common.exceptions import HorovodInternalError, HostsUpdatedInterrupt

from .sampler import ElasticSampler
from .state import TorchState


def run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for the elastic training function `func(state, ...)`: it is called again
    (state restored to its last commit, the world rebuilt over the ranks alive, state
    synchronised from rank 0) whenever a collective fails because a rank was lost, or the
    launcher reports new hosts. Collectives must be inside `func`, not before it: a rank
    joining at a reset starts with the sync."""
    return run_fn(func, _basics.elastic_reset)


__all__ = ["run", "State", "ObjectState", "TorchState", "ElasticSampler",
           "HorovodInternalError", "HostsUpdatedInterrupt"]

"""The seeds' "technical considerations" for data-parallel training, as small helpers.

Framework-free (numbers, indices, numpy), so torch, TensorFlow and Horovod scripts share
them; the ones that communicate use ddl_core's collectives.

- Batch size: the global batch is per-rank batch x ranks; `split_batch` / `global_batch`.
- Learning rate: `scale_lr` (linear scaling rule of Goyal et al.: k times the batch, k times
  the rate; or sqrt), `warmup_factor` / `warmup_lr` (gradual warmup from lr/k to lr).
- Batch normalization: statistics come from the per-rank batch; `bn_batch` says how many
  samples each BN layer normalises over and `needs_sync_bn` when SyncBatchNorm should be
  used instead.
- On-the-fly validation: `shard_indices` splits the validation set without dropping
  samples, `global_mean` combines per-rank sums and counts exactly (uneven shards too).
- Data pipelining: `shard_indices` (per-epoch shuffled, disjoint shards), `Prefetcher`
  (loads the next batches in a background thread while the current step runs).
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

# -- batch size -------------------------------------------------------------------------------

def global_batch(per_rank: int, size: int) -> int:
    """Samples per optimizer step over the whole job."""
    if per_rank < 1 or size < 1:
        raise ValueError("per_rank and size must be >= 1")
    return per_rank * size


def split_batch(global_batch_size: int, size: int) -> int:
    """Per-rank batch for a global batch; refuses sizes that do not divide (a silently
    smaller global batch would change the learning-rate schedule)."""
    if global_batch_size % size:
        raise ValueError(f"a global batch of {global_batch_size} does not split over {size} "
                         f"ranks; use a multiple of {size}")
    return global_batch_size // size


# -- learning rate ----------------------------------------------------------------------------

def scale_lr(base_lr: float, size: int, rule: str = "linear") -> float:
    """Learning rate for `size` learners from the single-learner one: linear (Goyal et al.)
    or sqrt (Krizhevsky's, for adaptive optimizers)."""
    if rule == "linear":
        return base_lr * size
    if rule == "sqrt":
        return base_lr * math.sqrt(size)
    raise ValueError(f"unknown rule {rule!r}: linear or sqrt")


def warmup_factor(epoch: float, warmup_epochs: float, size: int) -> float:
    """Multiplier of the scaled learning rate at (fractional) `epoch`: 1/size at 0 rising
    linearly to 1 at warmup_epochs (Goyal et al.'s gradual warmup, as Horovod's
    LearningRateWarmupCallback)."""
    if warmup_epochs <= 0 or epoch >= warmup_epochs:
        return 1.0
    return 1.0 / size * (epoch * (size - 1) / warmup_epochs + 1)


def warmup_lr(step: int, warmup_steps: int, target_lr: float, size: int) -> float:
    """warmup_factor by optimizer steps instead of epochs."""
    return target_lr * warmup_factor(step, warmup_steps, size)


# -- batch normalization ----------------------------------------------------------------------

def bn_batch(per_rank: int, size: int, synchronized: bool) -> int:
    """How many samples a batch-norm layer's statistics are computed over."""
    return per_rank * size if synchronized else per_rank


def needs_sync_bn(per_rank: int, min_samples: int = 16) -> bool:
    """Whether per-rank batch-norm statistics are too noisy (fewer than `min_samples` per
    rank; 16-32 is the usual threshold) so SyncBatchNorm should be used."""
    return per_rank < min_samples


# -- data: sharding, validation, pipelining ---------------------------------------------------

def shard_indices(n: int, rank: int, size: int, shuffle: bool = False, seed: int = 0,
                  epoch: int = 0, drop_remainder: bool = False) -> np.ndarray:
    """This rank's sample indices: disjoint shards covering 0..n-1.

    With shuffle, every rank draws the same permutation (seed + epoch) and takes its
    strided share, so the shards stay disjoint and change every epoch. drop_remainder
    gives every rank the same count (training: equal steps per rank); without it the
    first n % size ranks get one more (validation: every sample counted once).
    """
    if not 0 <= rank < size:
        raise ValueError(f"rank {rank} is not in 0..{size - 1}")
    order = (np.random.default_rng(seed + epoch).permutation(n) if shuffle
             else np.arange(n))
    if drop_remainder:
        order = order[: n - n % size]
    return order[rank::size]


def global_mean(local_sum: float, local_count: int) -> float:
    """Mean of a metric over every rank's samples: sums and counts are allreduced, so
    uneven shards weigh correctly (an average of per-rank means would not)."""
    import ddl_core

    ddl_core.init()
    buf = np.array([float(local_sum), float(local_count)], dtype=np.float64)
    ddl_core.allreduce(buf, op="sum", out=buf)
    if buf[1] == 0:
        raise ValueError("no samples on any rank")
    return float(buf[0] / buf[1])


class Prefetcher:
    """Iterate `source` in a background thread, `depth` items ahead, so loading and
    preprocessing the next batch overlaps the current training step. Exceptions from the
    source are re-raised in the consumer."""

    _END = object()

    def __init__(self, source: Iterable[Any], depth: int = 2) -> None:
        if depth < 1:
            raise ValueError("depth must be >= 1")
        self._q: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._thread = threading.Thread(target=self._fill, args=(iter(source),), daemon=True,
                                        name="ddl-prefetch")
        self._thread.start()

    def _fill(self, it: Iterator[Any]) -> None:
        try:
            for item in it:
                self._q.put(item)
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._q.put(_Failure(exc))
            return
        self._q.put(self._END)

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        item = self._q.get()
        if item is self._END:
            self._q.put(self._END)
            raise StopIteration
        if isinstance(item, _Failure):
            raise item.exc
        return item


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


__all__ = ["global_batch", "split_batch", "scale_lr", "warmup_factor", "warmup_lr",
           "bn_batch", "needs_sync_bn", "shard_indices", "global_mean", "Prefetcher"]

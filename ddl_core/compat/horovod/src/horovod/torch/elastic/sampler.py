"""hvd.elastic.ElasticSampler: DistributedSampler's sharding, re-done over the new world
at every reset, skipping what the job already processed this epoch."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import torch.utils.data

from horovod.common import basics as _basics


class ElasticSampler(torch.utils.data.Sampler):
    """Shards `dataset`'s indices over the ranks as DistributedSampler does (every rank
    the same number, the last ones padded with the first), and remembers how many samples
    the whole job has processed this epoch (`record_batch`), so after a reset the new set
    of ranks shares out only the rest.

    Keep it in the TorchState (its progress is then committed and restored with the
    rest), call `record_batch(batch_idx, batch_size)` after each batch and
    `set_epoch(epoch)` at the END of each epoch (a partly done epoch must not start over).
    shuffle: a permutation per epoch, the same on every rank (seed + epoch)."""

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0
        self.processed_indices: set[int] = set()  # Horovod's attribute, kept for scripts
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.reset()

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch`: its own order when shuffling, nothing processed yet."""
        self.epoch = epoch
        self.processed_num = 0
        self.reset()

    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """One batch of `batch_size` samples processed on every rank."""
        self.processed_num += batch_size * self.num_replicas

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "processed_num": self.processed_num}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict["processed_num"])
        self.reset()

    def reset(self) -> None:
        """Shard what is left of this epoch over the current world."""
        self.num_replicas = _basics.size()
        self.rank = _basics.rank()
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)
        self.remaining_indices = order[self.processed_num:]
        self.num_samples = math.ceil(len(self.remaining_indices) / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas

    def _padded(self) -> list[int]:
        idx = list(self.remaining_indices)
        while idx and len(idx) < self.total_size:
            idx += idx[:self.total_size - len(idx)]
        return idx

    def __iter__(self) -> Iterator[int]:
        self.indices = self._padded()[self.rank:self.total_size:self.num_replicas]
        return iter(self.indices)

    def __len__(self) -> int:
        return self.num_samples

"""The technical-consideration helpers (ddl_core.training)."""

from __future__ import annotations

import math
import time

import numpy as np
import pytest
from conftest import WORKERS, mpirun, ok_lines

from ddl_core import training as tr


def test_batch_size() -> None:
    assert tr.global_batch(32, 4) == 128
    assert tr.split_batch(128, 4) == 32
    with pytest.raises(ValueError, match="multiple of 3"):
        tr.split_batch(128, 3)


def test_learning_rate_scaling_and_warmup() -> None:
    assert tr.scale_lr(0.1, 8) == pytest.approx(0.8)
    assert tr.scale_lr(0.1, 4, "sqrt") == pytest.approx(0.2)
    with pytest.raises(ValueError):
        tr.scale_lr(0.1, 4, "cubic")
    # Goyal: from lr/size to lr, linearly, then constant
    assert tr.warmup_factor(0, 5, 8) == pytest.approx(1 / 8)
    assert tr.warmup_factor(2.5, 5, 8) == pytest.approx((1 / 8 + 1) / 2)
    assert tr.warmup_factor(5, 5, 8) == 1.0
    assert tr.warmup_factor(7, 5, 8) == 1.0
    lrs = [tr.warmup_lr(s, 10, 0.8, 8) for s in range(12)]
    assert all(b > a for a, b in zip(lrs[:10], lrs[1:11], strict=True))
    assert lrs[10] == lrs[11] == pytest.approx(0.8)


def test_batch_normalization() -> None:
    assert tr.bn_batch(8, 4, synchronized=False) == 8
    assert tr.bn_batch(8, 4, synchronized=True) == 32
    assert tr.needs_sync_bn(4) and not tr.needs_sync_bn(64)


def test_sharding() -> None:
    shards = [tr.shard_indices(10, r, 3) for r in range(3)]
    assert sorted(np.concatenate(shards).tolist()) == list(range(10))
    assert [len(s) for s in shards] == [4, 3, 3]
    eq = [tr.shard_indices(10, r, 3, drop_remainder=True) for r in range(3)]
    assert [len(s) for s in eq] == [3, 3, 3]
    e0 = tr.shard_indices(100, 0, 2, shuffle=True, epoch=0)
    e1 = tr.shard_indices(100, 0, 2, shuffle=True, epoch=1)
    assert not np.array_equal(e0, e1)
    other = tr.shard_indices(100, 1, 2, shuffle=True, epoch=0)
    assert not set(e0) & set(other)
    with pytest.raises(ValueError):
        tr.shard_indices(10, 3, 3)


def test_prefetcher_overlaps_and_reraises() -> None:
    def slow():
        for i in range(4):
            time.sleep(0.05)
            yield i

    t0 = time.perf_counter()
    out = []
    for item in tr.Prefetcher(slow(), depth=2):
        time.sleep(0.05)  # the "training step" runs while the next item loads
        out.append(item)
    took = time.perf_counter() - t0
    assert out == [0, 1, 2, 3]
    assert took < 0.05 * 8 * 0.85, f"no overlap: {took:.3f}s"

    def broken():
        yield 1
        raise OSError("disk gone")

    it = tr.Prefetcher(broken())
    assert next(it) == 1
    with pytest.raises(OSError, match="disk gone"):
        next(it)
    assert math.isfinite(took)


def test_global_mean_and_shards_on_two_ranks() -> None:
    proc = mpirun(2, WORKERS / "training_helpers.py")
    assert ok_lines(proc, "helpers") == 2, proc.stdout

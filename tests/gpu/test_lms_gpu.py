"""ddl_core.lms on a CUDA device: the activations really leave the GPU and come back,
gradients are those of training without LMS, a batch that does not fit without it fits,
and the benchmark and the example run. Bookkeeping on CPU: tests/ddl_core/test_lms.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gpu_util import gpu

pytestmark = gpu

ROOT = Path(__file__).resolve().parents[2]


def _model(torch, width=1024, depth=6):
    torch.manual_seed(0)
    layers = []
    for _ in range(depth):
        layers += [torch.nn.Linear(width, width), torch.nn.GELU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(width, 1)).cuda()


def _step(torch, model, x, ctx):
    model.zero_grad(set_to_none=True)
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    if ctx is None:
        loss = model(x).square().mean()
    else:
        with ctx:
            loss = model(x).square().mean()
    after_forward = torch.cuda.memory_allocated() - base
    loss.backward()
    torch.cuda.synchronize()
    return [p.grad.clone() for p in model.parameters()], after_forward


def test_offload_and_back_gives_the_same_gradients_with_less_memory():
    import ddl_core.lms as lms
    import torch

    model = _model(torch)
    x = torch.randn(4096, 1024, device="cuda")
    plain, held_plain = _step(torch, model, x, None)
    off = lms.offload(threshold="1M")
    got, held_lms = _step(torch, model, x, off)
    for a, b in zip(plain, got, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    s = off.stats
    assert s.offloaded >= 12, s  # every Linear's input and every GELU's input (16 MiB each)
    assert s.fetched + s.prefetched == s.offloaded, s  # each came back exactly once
    assert s.prefetched > 0, s  # backward found the next ones already on their way
    assert s.cpu_noop == 0
    assert held_lms < held_plain / 2, (held_lms, held_plain)
    assert s.host_bytes == 0, s  # the graph is gone: so are its host copies


def test_limit_keeps_tensors_while_memory_is_below_it():
    import ddl_core.lms as lms
    import torch

    model = _model(torch, depth=2)
    x = torch.randn(1024, 1024, device="cuda")
    roomy = lms.offload(threshold=0, limit="64G")
    _step(torch, model, x, roomy)
    assert roomy.stats.offloaded == 0 and roomy.stats.kept > 0
    tight = lms.offload(threshold=0, limit=0)
    _step(torch, model, x, tight)
    # limit 0: every activation goes; only the parameters (weights, biases) stay
    assert tight.stats.offloaded > 0
    assert set(tight.stats.decisions) == {"offload", "param"}, tight.stats.decisions


def test_a_batch_that_does_not_fit_trains_with_lms():
    import ddl_core.lms as lms
    import torch

    model = _model(torch, width=2048, depth=12)
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.empty_cache()
    # 12 blocks x 2 saved tensors x 16384 x 2048 x 4 B = 3 GiB of activations; 1.5 GiB cap
    torch.cuda.set_per_process_memory_fraction((torch.cuda.memory_allocated() + (1536 << 20))
                                               / total)
    try:
        x = torch.randn(16384, 2048, device="cuda")
        with pytest.raises(torch.cuda.OutOfMemoryError):
            _step(torch, model, x, None)
        torch.cuda.empty_cache()
        _, _ = _step(torch, model, x, lms.offload())
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


def test_the_example_and_the_benchmark_run():
    ex = subprocess.run([sys.executable, str(ROOT / "ddl_core/examples/lms_pytorch.py"),
                         "--steps", "2", "--depth", "8", "--batch-size", "16384"],
                        capture_output=True, text=True, timeout=300)
    assert ex.returncode == 0, ex.stderr
    assert "LMS:" in ex.stdout and "offloaded" in ex.stdout
    bench = subprocess.run([sys.executable, "-m", "ddl_core.bench", "lms", "--gpu-memory", "2G",
                            "--width", "2048", "--depth", "8", "--max-factor", "4",
                            "--reps", "3"], capture_output=True, text=True, timeout=300)
    assert bench.returncode == 0, bench.stderr
    assert "largest batch with LMS" in bench.stdout

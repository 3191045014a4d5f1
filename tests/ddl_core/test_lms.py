"""ddl_core.lms on any machine: the policy, the settings' parsing, the CPU no-op (said once,
gradients unchanged) and the offload bookkeeping. The CUDA path itself (copies out and
back, prefetch on the side stream, memory saved) is in tests/gpu/test_lms.py."""

from __future__ import annotations

import gc
import subprocess
import sys
import warnings
import weakref

import pytest

torch = pytest.importorskip("torch")
lms = pytest.importorskip("ddl_core.lms")


@pytest.fixture(autouse=True)
def _fresh_warning():
    lms._warned_cpu = False
    yield
    lms._warned_cpu = False


@pytest.mark.parametrize("text,expect", [
    (0, 0), (4096, 4096), ("512K", 512 << 10), ("1M", 1 << 20), ("1MiB", 1 << 20),
    ("8g", 8 << 30), ("1.5G", 3 << 29), (" 64MB ", 64 << 20), (None, None)])
def test_parse_bytes(text, expect):
    assert lms.parse_bytes(text, "limit") == expect


@pytest.mark.parametrize("bad", ["lots", "-1M", "1X", "", True, -5])
def test_parse_bytes_refuses_with_the_setting_named(bad):
    with pytest.raises(ValueError, match="lms threshold"):
        lms.parse_bytes(bad, "threshold")


def test_offloader_refuses_bad_settings():
    with pytest.raises(ValueError, match="lms limit: cannot read 'eight'"):
        lms.offload(limit="eight")
    with pytest.raises(ValueError, match="lms prefetch"):
        lms.offload(prefetch=-1)


def test_decide_policy():
    M = 1 << 20
    assert lms.decide(100 * M, False, M, None, 0) == "cpu"
    assert lms.decide(M - 1, True, M, None, 0) == "keep"          # under the threshold
    assert lms.decide(M, True, M, None, 0) == "offload"            # at it: offloaded
    assert lms.decide(8 * M, True, M, 16 * M, 8 * M) == "keep"     # fits under the limit
    assert lms.decide(8 * M, True, M, 16 * M, 8 * M + 1) == "offload"  # would pass it
    assert lms.decide(8 * M, True, 0, 0, 0) == "offload"           # limit 0: everything
    assert lms.decide(8 * M, True, 0, 0, 0, is_param=True) == "param"  # ... but parameters
    assert lms.decide(8 * M, False, 0, 0, 0, is_param=True) == "cpu"


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 256), torch.nn.GELU(),
                               torch.nn.Linear(256, 1))


def _grads(model, x, ctx):
    model.zero_grad()
    with ctx:
        loss = model(x).square().mean()
    loss.backward()
    return [p.grad.clone() for p in model.parameters()]


def test_cpu_tensors_are_a_noop_said_once():
    model, x = _mlp(), torch.randn(32, 64)
    plain = _grads(model, x, torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
    off = lms.offload(threshold=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = _grads(model, x, off)
        second = _grads(model, x, off)
    said = [w for w in seen if "ddl_core.lms" in str(w.message)]
    assert len(said) == 1, [str(w.message) for w in seen]
    assert "CPU" in str(said[0].message) and "does nothing" in str(said[0].message)
    for a, b, c in zip(plain, first, second, strict=True):
        assert torch.equal(a, b) and torch.equal(a, c)
    s = off.stats
    assert s.cpu_noop > 0 and s.cpu_noop == len(s.decisions)
    assert set(s.decisions) == {"cpu"}
    # two identical passes save the same tensors
    assert s.cpu_noop % 2 == 0
    assert s.offloaded == s.kept == s.fetched == s.prefetched == s.host_bytes == 0


def test_noop_message_is_said_once_per_process():
    code = ("import warnings, torch, ddl_core.lms as lms\n"
            "warnings.simplefilter('always')\n"
            "m = torch.nn.Linear(4, 4)\n"
            "for _ in range(3):\n"
            "    with lms.offload():\n"
            "        m(torch.randn(2, 4, requires_grad=True)).sum().backward()\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("ddl_core.lms: tensors saved for backward are on the CPU") == 1


def test_one_offloader_cannot_be_entered_twice():
    off = lms.offload()
    with off:
        with pytest.raises(RuntimeError, match="already active"):
            off.__enter__()
    with off:  # usable again once left
        pass


def test_hooks_are_removed_on_exit_even_after_an_error():
    off = lms.offload()
    with pytest.raises(ZeroDivisionError), off:
        1 / 0  # noqa: B018
    m = _mlp()
    m(torch.randn(2, 64)).sum().backward()
    assert off.stats.decisions == []


def _saved(index: int, nbytes: int = 16):
    return lms._Saved(index, torch.zeros(nbytes // 4), "cpu", nbytes, None)


def test_prefetch_order_is_the_tensors_saved_before():
    off = lms.Offloader(prefetch=2)
    keep = [_saved(i) for i in range(6)]
    off._order = [weakref.ref(s) for s in keep]
    # backward unpacks in reverse save order: after 5 come 4 and 3
    assert [s.index for s in off._upcoming(5)] == [4, 3]
    keep[4].gpu = object()  # already fetched: skipped, the next one is taken
    assert [s.index for s in off._upcoming(5)] == [3, 2]
    assert off._upcoming(0) == []
    del keep[2]  # its graph is gone: nothing to prefetch there
    gc.collect()
    assert [s.index for s in off._upcoming(4)] == [3, 1]
    assert off.resident() == 5
    assert [s.index for s in lms.Offloader(prefetch=0)._upcoming(5)] == []


def test_host_bytes_are_given_back_when_the_graph_goes():
    off = lms.Offloader()
    items = []

    def offloaded(i: int, n: int) -> None:  # as Offloader.pack books one offloaded tensor
        s = _saved(i, n)
        off._order.append(weakref.ref(s))
        off.stats.host_bytes += n
        off.stats.peak_host_bytes = max(off.stats.peak_host_bytes, off.stats.host_bytes)
        weakref.finalize(s, off._release_bytes, n)
        items.append(s)

    offloaded(0, 1 << 20)
    offloaded(1, 3 << 20)
    assert off.stats.host_bytes == 4 << 20
    del items[:]
    gc.collect()
    assert off.stats.host_bytes == 0 and off.stats.peak_host_bytes == 4 << 20
    assert off.resident() == 0


def test_bench_lms_says_it_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: tests/gpu/test_lms.py runs the benchmark")
    proc = subprocess.run([sys.executable, "-m", "ddl_core.bench", "lms"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2
    assert "needs a CUDA device" in proc.stderr and "torch.cuda.is_available() is False" \
        in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "ddl_core.bench", "gpu"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 2 and "needs a CUDA device" in proc.stderr, proc.stderr

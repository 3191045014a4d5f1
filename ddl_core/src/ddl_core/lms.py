"""Large Model Support (LMS) for PyTorch: train with activations that do not fit on the GPU.

WMLCE's LMS let a model whose activations exceed GPU memory train anyway, by moving
tensors to host memory and back. This is the same idea built on torch's saved-tensor
hooks (`torch.autograd.graph.saved_tensors_hooks`), so it needs no patched torch:

    import ddl_core.lms as lms
    with lms.offload(threshold="1M", limit="8G"):
        loss = model(x).sum()      # activations saved for backward go to pinned host memory
    loss.backward()                # ... and come back, prefetched on a side stream

What happens to each tensor autograd saves for backward inside the block:

- a CUDA tensor of at least `threshold` bytes is copied to pinned host memory on a side
  stream (after the compute stream has produced it), and its GPU memory is given back as
  soon as the copy is done; smaller ones stay on the GPU (offloading them costs more
  latency than they save memory);
- with `limit`, only while the GPU memory in use (`torch.cuda.memory_allocated`) plus the
  tensor would exceed the limit: below it nothing moves and nothing is slowed down;
- in backward, the first use of an offloaded tensor copies it back and also starts the
  copies of the next `prefetch` offloaded tensors backward will need (they were saved
  before it, so they are unpacked after it) on the side stream, so transfers overlap the
  compute of the layers in between; the compute stream waits only on an event;
- parameters (leaves that require grad) stay where they are: they live on the GPU anyway;
- CPU tensors are left alone: LMS is a no-op for them and says so once (a `UserWarning`).

`Offloader.stats` counts what moved (tensors and bytes offloaded, kept, fetched,
prefetched, CPU no-ops, the peak of pinned host bytes held); the bookkeeping is the same
on CPU and GPU, which is what lets it be tested on machines without a GPU.

`python -m ddl_core.bench lms` measures the largest batch with and without LMS and the
throughput cost (it needs CUDA); `ddl_core/examples/lms_pytorch.py` trains a model whose
batch does not fit without it.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Offloader", "Stats", "offload", "parse_bytes", "decide"]

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_bytes(value: int | str | None, what: str) -> int | None:
    """An amount of memory from an int or "512K", "64M", "8G" (binary units); None stays None.

    One parser for both settings, so a bad value fails the same way wherever it comes from.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"lms {what}: expected bytes (an int or e.g. '64M'), got {value!r}")
    if isinstance(value, int):
        n = value
    else:
        text = str(value).strip().upper().removesuffix("IB").removesuffix("B")
        unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
        number = text[: len(text) - len(unit)]
        try:
            n = int(float(number) * _UNITS[unit])
        except ValueError:
            raise ValueError(f"lms {what}: cannot read {value!r} as bytes; write e.g. 1048576, "
                             "'1M' or '8G'") from None
    if n < 0:
        raise ValueError(f"lms {what}: must be >= 0 bytes, got {value!r}")
    return n


def decide(nbytes: int, is_cuda: bool, threshold: int, limit: int | None,
           in_use: int, is_param: bool = False) -> str:
    """What happens to one saved tensor: 'cpu' (left alone), 'param' (a parameter: it stays
    on the GPU anyway, so a host copy would free nothing), 'keep' (stays on the GPU) or
    'offload'. Pure, so the policy is tested on any machine.

    `in_use` is the GPU memory allocated now; with a `limit`, a tensor is offloaded only
    when keeping it would take the GPU memory in use past the limit.
    """
    if not is_cuda:
        return "cpu"
    if is_param:
        return "param"
    if nbytes < threshold:
        return "keep"
    if limit is not None and in_use + nbytes <= limit:
        return "keep"
    return "offload"


@dataclass
class Stats:
    """What an Offloader did (counts and bytes), for tests, logs and the benchmark."""

    offloaded: int = 0
    offloaded_bytes: int = 0
    kept: int = 0
    kept_bytes: int = 0
    cpu_noop: int = 0
    fetched: int = 0
    prefetched: int = 0
    host_bytes: int = 0
    peak_host_bytes: int = 0
    decisions: list[str] = field(default_factory=list, repr=False)

    def as_dict(self) -> dict[str, int]:
        return {k: v for k, v in self.__dict__.items() if k != "decisions"}


class _Saved:
    """One offloaded tensor: its pinned host copy, the event that says the copy is done,
    and, once fetched (or prefetched), its GPU copy and the event for that."""

    __slots__ = ("index", "host", "device", "nbytes", "to_host", "gpu", "to_gpu", "released",
                 "__weakref__")

    def __init__(self, index: int, host: Any, device: Any, nbytes: int, to_host: Any) -> None:
        self.index, self.host, self.device, self.nbytes = index, host, device, nbytes
        self.to_host, self.gpu, self.to_gpu, self.released = to_host, None, None, False


_warned_cpu = False
_warn_lock = threading.Lock()


def _warn_cpu_once() -> None:
    global _warned_cpu
    with _warn_lock:
        if _warned_cpu:
            return
        _warned_cpu = True
    warnings.warn("ddl_core.lms: tensors saved for backward are on the CPU; LMS offloads "
                  "CUDA tensors only, so it does nothing for them (said once)", UserWarning,
                  stacklevel=3)


class Offloader:
    """The saved-tensor hooks and their bookkeeping; use `offload(...)` or `with Offloader()`.

    One Offloader may span several forward passes; each `with` block installs the hooks
    for the autograd graph built inside it. Thread-safe for one forward at a time (autograd
    runs unpack hooks on its own thread).
    """

    def __init__(self, threshold: int | str = "1M", limit: int | str | None = None,
                 prefetch: int = 2, pin_memory: bool = True) -> None:
        self.threshold = parse_bytes(threshold, "threshold")
        self.limit = parse_bytes(limit, "limit")
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 0:
            raise ValueError(f"lms prefetch: a number of tensors >= 0, got {prefetch!r}")
        self.prefetch, self.pin_memory = prefetch, pin_memory
        self.stats = Stats()
        self._lock = threading.Lock()
        # offloaded tensors of the current graph in save order (weak: autograd owns them,
        # a graph that is freed without backward frees its host copies too)
        self._order: list[weakref.ref[_Saved]] = []
        self._streams: dict[Any, Any] = {}
        self._hooks: Any = None

    # ---- the hooks ----------------------------------------------------------------------
    def pack(self, t: Any) -> Any:
        import torch

        nbytes = t.numel() * t.element_size()
        in_use = torch.cuda.memory_allocated(t.device) if t.is_cuda else 0
        # a leaf that requires grad is a parameter (or an input the user keeps): autograd
        # saves it by reference, offloading would copy it out and back for nothing. Linear
        # saves a view of its weight (weight.t(), for addmm), so a view of one counts too.
        base = t if t._base is None else t._base
        is_param = bool(base.requires_grad and base.is_leaf)
        what = decide(nbytes, t.is_cuda, self.threshold or 0, self.limit, in_use, is_param)
        if what == "offload" and t.layout != torch.strided:
            what = "keep"  # sparse and other layouts: not worth a special copy path
        with self._lock:
            self.stats.decisions.append(what)
            if what == "cpu":
                self.stats.cpu_noop += 1
            elif what in ("keep", "param"):
                self.stats.kept += 1
                self.stats.kept_bytes += nbytes
        if what == "cpu":
            _warn_cpu_once()
            return t
        if what in ("keep", "param"):
            return t
        side = self._stream(t.device)
        host = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=self.pin_memory)
        side.wait_stream(torch.cuda.current_stream(t.device))
        with torch.no_grad(), torch.cuda.stream(side):
            host.copy_(t, non_blocking=True)
            done = torch.cuda.Event()
            done.record(side)
        # the caching allocator must not hand t's memory to the compute stream before the
        # side stream has read it
        t.record_stream(side)
        with self._lock:
            saved = _Saved(len(self._order), host, t.device, nbytes, done)
            self._order.append(weakref.ref(saved))
            self.stats.offloaded += 1
            self.stats.offloaded_bytes += nbytes
            self.stats.host_bytes += nbytes
            self.stats.peak_host_bytes = max(self.stats.peak_host_bytes, self.stats.host_bytes)
        weakref.finalize(saved, self._release_bytes, nbytes)
        return saved

    def unpack(self, saved: Any) -> Any:
        if not isinstance(saved, _Saved):
            return saved
        import torch

        with self._lock:
            upcoming = self._upcoming(saved.index)
            first = saved.gpu is None
        if first:
            self._fetch(saved)
            with self._lock:
                self.stats.fetched += 1
        for other in upcoming:
            if other.gpu is None:
                self._fetch(other)
                with self._lock:
                    self.stats.prefetched += 1
        compute = torch.cuda.current_stream(saved.device)
        compute.wait_event(saved.to_gpu)
        out = saved.gpu
        out.record_stream(compute)
        return out

    # ---- helpers ------------------------------------------------------------------------
    def _upcoming(self, index: int) -> list[_Saved]:
        """The offloaded tensors saved just before `index` that backward will want next."""
        out: list[_Saved] = []
        i = index - 1
        while i >= 0 and len(out) < self.prefetch:
            s = self._order[i]()
            if s is not None and s.gpu is None:
                out.append(s)
            i -= 1
        return out

    def _fetch(self, saved: _Saved) -> None:
        import torch

        side = self._stream(saved.device)
        with torch.no_grad(), torch.cuda.stream(side):
            side.wait_event(saved.to_host)
            gpu = torch.empty(saved.host.shape, dtype=saved.host.dtype, device=saved.device)
            gpu.copy_(saved.host, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(side)
        saved.gpu, saved.to_gpu = gpu, ev

    def _stream(self, device: Any) -> Any:
        import torch

        key = str(device)
        if key not in self._streams:
            self._streams[key] = torch.cuda.Stream(device=device)
        return self._streams[key]

    def _release_bytes(self, nbytes: int) -> None:
        with self._lock:
            self.stats.host_bytes -= nbytes

    def resident(self) -> int:
        """Offloaded tensors of graphs still alive (their host copies are held)."""
        with self._lock:
            return sum(1 for r in self._order if r() is not None)

    # ---- context manager ----------------------------------------------------------------
    def __enter__(self) -> Offloader:
        import torch

        if self._hooks is not None:
            raise RuntimeError("ddl_core.lms: this Offloader is already active; nest a new one "
                               "or leave the first `with` block")
        with self._lock:
            self._order = [r for r in self._order if r() is not None]
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        hooks, self._hooks = self._hooks, None
        hooks.__exit__(*exc)


def offload(threshold: int | str = "1M", limit: int | str | None = None, prefetch: int = 2,
            pin_memory: bool = True) -> Offloader:
    """A context manager offloading saved activations (see the module's docstring).

    threshold: tensors smaller than this stay on the GPU (bytes or "1M");
    limit: offload only while GPU memory in use would exceed this (None: always);
    prefetch: how many offloaded tensors to fetch ahead in backward.
    """
    return Offloader(threshold=threshold, limit=limit, prefetch=prefetch, pin_memory=pin_memory)

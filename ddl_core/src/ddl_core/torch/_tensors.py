"""Map torch tensors and reduce ops onto what libddl reduces, without copies when possible.

libddl reduces float16/bfloat16/float32/float64 and int8/uint8/int32/int64 contiguous
buffers. Everything else torch.distributed accepts is mapped onto those: bool as uint8
(sum = logical or, product = logical and), complex as its real view (sum/avg only),
int16 through an int32 copy, and non-contiguous tensors through a contiguous copy that
is copied back when the collective has finished.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

NATIVE = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
          torch.uint8, torch.int32, torch.int64}
_COMPLEX = {torch.complex64, torch.complex128}
_WIDEN = {torch.int16: torch.int32}


def _tensors(args: Iterable[Any]) -> Iterator[torch.Tensor]:
    for a in args:
        if isinstance(a, torch.Tensor):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from _tensors(a)


def cuda_device(args: Iterable[Any]) -> torch.device | None:
    """The CUDA device a call's tensors (found in args and lists of them) live on, or None
    when they are all in host memory. One call on one kind of memory: a mix, or tensors on
    two GPUs, is refused here, naming both, before anything moves."""
    device = None
    host = None
    for t in _tensors(args):
        if t.is_cuda:
            if device is None:
                device = t.device
                if host is None:
                    continue
            elif host is None and t.device == device:
                continue
            _refuse(device, host or t)
        elif host is None:
            host = t
            if not t.is_cpu:
                raise TypeError(f"the ddl backend takes CPU and CUDA tensors; got one on "
                                f"{t.device}: move it with .cpu() or .cuda()")
            if device is not None:
                _refuse(device, t)
    return device


def _refuse(device: torch.device, other: torch.Tensor) -> None:
    raise TypeError(f"one collective on tensors in {device} and {other.device}: the ddl "
                    "backend takes one call's tensors on one device (all on this rank's GPU, "
                    "or all in host memory); move them with .to(device) first")


def prepare(t: torch.Tensor,
            op: str = "sum") -> tuple[torch.Tensor, str, Callable[[], None] | None]:
    """(tensor libddl can use, op to use, callback to copy the result back or None).

    The returned tensor shares memory with `t` whenever its dtype and layout allow, so
    an in-place collective on it updates `t` directly. CUDA tensors map the same way (the
    copies stay on the GPU).
    """
    dt = t.dtype
    if dt in NATIVE:
        if t.is_contiguous():
            return t, op, None
        work = t.contiguous()
        return work, op, lambda: t.copy_(work)
    if dt == torch.bool:
        mapped = {"sum": "max", "max": "max", "min": "min", "prod": "min", "band": "min",
                  "bor": "max", "bxor": "bxor"}.get(op)
        if mapped is None:
            raise ValueError(f"op {op!r} is not defined for bool tensors")
        if t.is_contiguous():
            return t.view(torch.uint8), mapped, None
        work = t.contiguous().view(torch.uint8)
        return work, mapped, lambda: t.copy_(work.view(torch.bool))
    if dt in _COMPLEX:
        if op not in ("sum", "avg"):
            raise ValueError(f"op {op!r} is not defined for complex tensors")
        src = t if t.is_contiguous() else t.contiguous()
        work = torch.view_as_real(src)
        if src is t:
            return work, op, None
        return work, op, lambda: t.copy_(src)
    if dt in _WIDEN:
        work = t.to(_WIDEN[dt])
        return work, op, lambda: t.copy_(work)
    raise TypeError(f"the ddl backend does not reduce {dt} tensors")


def chain(posts: list[Callable[[], None] | None]) -> Callable[[], None] | None:
    todo = [p for p in posts if p is not None]
    if not todo:
        return None

    def run() -> None:
        for p in todo:
            p()

    return run

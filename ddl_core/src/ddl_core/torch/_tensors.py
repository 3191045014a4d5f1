"""Map torch tensors and reduce ops onto what libddl reduces, without copies when possible.

libddl reduces float16/bfloat16/float32/float64 and int8/uint8/int32/int64 contiguous
buffers. Everything else torch.distributed accepts is mapped onto those: bool as uint8
(sum = logical or, product = logical and), complex as its real view (sum/avg only),
int16 through an int32 copy, and non-contiguous tensors through a contiguous copy that
is copied back when the collective has finished.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

NATIVE = {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.int8,
          torch.uint8, torch.int32, torch.int64}
_COMPLEX = {torch.complex64, torch.complex128}
_WIDEN = {torch.int16: torch.int32}


def check_cpu(t: torch.Tensor) -> None:
    if t.device.type != "cpu":
        raise TypeError(
            f"the ddl backend reduces CPU tensors; got one on {t.device}. Use "
            "init_process_group('cpu:ddl,cuda:nccl') or move it with .cpu()")


def prepare(t: torch.Tensor,
            op: str = "sum") -> tuple[torch.Tensor, str, Callable[[], None] | None]:
    """(tensor libddl can use, op to use, callback to copy the result back or None).

    The returned tensor shares memory with `t` whenever its dtype and layout allow, so
    an in-place collective on it updates `t` directly.
    """
    check_cpu(t)
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

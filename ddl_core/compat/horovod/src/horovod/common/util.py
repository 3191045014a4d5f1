"""`horovod.common.util` on horovod-ddl: the few helpers of that module that scripts (and
Horovod's own Keras tests, at import) use. The build queries (mpi_built, nccl_built, ...)
are the ones in horovod.common.basics."""

from __future__ import annotations

import re
from typing import Any

from .basics import ccl_built, ddl_built, gloo_built, mpi_built, nccl_built  # noqa: F401


def is_version_greater_equal_than(ver: str, target: str) -> bool:
    """Whether version string `ver` is at least `target` ("major.minor.patch"), as
    Horovod's helper of that name: non-strings and other target forms are ValueError."""
    if not isinstance(ver, str) or not isinstance(target, str):
        raise ValueError(f"versions must be strings, not {type(ver).__name__} and "
                         f"{type(target).__name__}")
    if len(target.split(".")) != 3:
        raise ValueError(f"the target version must be major.minor.patch, not {target!r}")
    return _release(ver) >= _release(target)


def _release(ver: str) -> tuple[int, ...]:
    """The numeric release of a version string ("2.21.0rc1" -> (2, 21, 0)), padded to
    three parts; what a framework-version check compares (no packaging dependency)."""
    parts = []
    for piece in ver.strip().lstrip("vV").split(".")[:3]:
        m = re.match(r"\d+", piece)
        if m is None:
            break
        parts.append(int(m.group()))
        if m.end() != len(piece):
            break
    if not parts:
        raise ValueError(f"not a version: {ver!r}")
    return tuple(parts + [0] * (3 - len(parts)))


def split_list(items: list[Any], n: int) -> list[list[Any]]:
    """`items` cut into n consecutive parts whose lengths differ by at most one (the first
    ones longer)."""
    if n < 1:
        raise ValueError(f"split_list: n must be >= 1, not {n}")
    base, extra = divmod(len(items), n)
    out, start = [], 0
    for i in range(n):
        end = start + base + (1 if i < extra else 0)
        out.append(items[start:end])
        start = end
    return out


def num_rank_is_power_2(num_rank: int) -> bool:
    """Whether num_rank is a power of two (Adasum's condition in Horovod)."""
    return num_rank > 0 and num_rank & (num_rank - 1) == 0

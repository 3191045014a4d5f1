"""Which CUDA an environment is built for, read from its packages' own requirements.

conda-forge's CUDA builds say what driver they need through the ``__cuda`` virtual
package: pytorch's CUDA build ``depends`` on ``__cuda >=13.0``, ``cuda-version 13.0``
``constrains`` it. The env's CUDA is the highest such lower bound; the packages that
state it are named, so a message can say who needs what. ``validate`` compares it with
the driver (the ``cuda-driver`` check) and ``module`` marks a CUDA env's module name.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from envtools.prefix.records import Record


@dataclass(frozen=True)
class CudaNeed:
    """The CUDA version an env needs from the driver, and the packages that say so."""

    version: str
    packages: tuple[str, ...]

    @property
    def key(self) -> tuple[int, ...]:
        return _key(self.version)


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def lower_bound(spec: str) -> str | None:
    """The lower bound of a ``__cuda`` match spec (``__cuda >=13.0``, ``__cuda >=12.8,<13``,
    ``__cuda 13.*``), or None when the spec is not about __cuda or states no lower bound
    (a bare ``__cuda`` asks for any driver)."""
    text = spec.strip()
    m = re.match(r"^__cuda(?=\s|[<>=!]|$)\s*(.*)$", text)
    if not m:
        return None
    found = []
    rest = re.sub(r"([<>=!]=?)\s+", r"\1", m.group(1)).split()
    for piece in re.split(r"[,|]", rest[0] if rest else ""):
        piece = piece.strip()
        if not piece or piece.startswith(("<", "!")):
            continue
        v = re.match(r"^(?:>=|>|==|=)?\s*(\d+(?:\.\d+)*)", piece)
        if v:
            found.append(v.group(1))
    return max(found, key=_key) if found else None


def need_of(specs: Iterable[str]) -> str | None:
    """The CUDA one package's requirements (depends, constrains) ask of the driver: the
    highest ``__cuda`` lower bound, "0" for a bare ``__cuda``; None when none is about it.
    (What the channel pipeline solves a CUDA build with: ``--virtual __cuda=<it>``.)"""
    best: str | None = None
    for spec in specs:
        s = str(spec).strip()
        if not re.match(r"^__cuda(\s|[<>=!]|$)", s):
            continue
        low = lower_bound(s) or "0"
        if best is None or _key(low) > _key(best):
            best = low
    return best


def env_cuda(records: Iterable[Record]) -> CudaNeed | None:
    """The CUDA the env needs (highest ``__cuda`` lower bound over depends and constrains),
    or None for a CPU env. A bare ``__cuda`` dependency counts as CUDA with version "0"."""
    best: str | None = None
    who: dict[str, list[str]] = {}
    for r in records:
        low = need_of([*r.data.get("depends", []), *r.data.get("constrains", [])])
        if low is None:
            continue
        who.setdefault(low, []).append(r.name)
        if best is None or _key(low) > _key(best):
            best = low
    if best is None:
        return None
    return CudaNeed(best, tuple(sorted(set(who[best]))))


def supports(driver: str, need: CudaNeed) -> bool:
    """Whether a driver for CUDA ``driver`` (the __cuda virtual package) runs ``need``."""
    return _key(driver) >= need.key

"""DDL_* values on the Python side, checked by libddl's own rule.

Why no parser of our own here: two parsers drift (Python's float() takes " 1", "1_000",
"nan" and "inf"; strtod takes hex), and a value one side accepts and the other refuses
fails a job late, on every rank, instead of at once. So ddlrun, the tune-file reader and
the Python-only variables call libddl's config.c through the binding: ddl_parse_number
(decimal, nothing around it, finite, in range; integer settings digits only) and
ddl_check_setting (a libddl variable exactly as ddl_init reads it). Neither needs init.
Errors are `InvalidArgumentError` (a `ValueError`) naming the variable, the value, the
accepted range and the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from . import _ddl


def number(name: str, text: str, lo: float, hi: float, *, integer: bool = False) -> float:
    """`text` as a number under libddl's rule (an int when `integer`); `name` is what the
    message calls it (a variable, or "tune file X line 3: alpha")."""
    v = _ddl.parse_number(name, text, float(lo), float(hi), integer)
    return int(v) if integer else v


def env_number(name: str, lo: float, hi: float, default: float, *, integer: bool = False,
               environ: Mapping[str, str] | None = None) -> float:
    """The variable `name` as a number, `default` when it is unset (set but empty is an
    error, as it is for libddl's own variables)."""
    env = os.environ if environ is None else environ
    text = env.get(name)
    if text is None:
        return default
    return number(name, text, lo, hi, integer=integer)


def check(name: str, text: str) -> float | None:
    """One of libddl's variables checked as ddl_init will check it: its value (for
    DDL_TOPOLOGY the number of ranks it describes), or None for a name libddl does not
    read."""
    return _ddl.check_setting(name, text)


def check_all(pairs: Mapping[str, str]) -> None:
    """Check every libddl variable among `pairs` (name -> value); the first bad one
    raises."""
    for name in sorted(pairs):
        if name.startswith("DDL_"):
            check(name, pairs[name])

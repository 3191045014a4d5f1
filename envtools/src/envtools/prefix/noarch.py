"""Where an installed path lives inside its extracted package: a noarch: python
package's site-packages/ and python-scripts/ move at install."""

from __future__ import annotations

import re

_SITE_RE = re.compile(r"^lib/python\d+\.\d+/site-packages/")


def cache_rel(noarch_python: bool, rel: str) -> str:
    """Where an installed path lives inside the extracted package (a noarch: python
    package's site-packages/ and python-scripts/ move at install)."""
    if noarch_python:
        m = _SITE_RE.match(rel)
        if m:
            return "site-packages/" + rel[m.end():]
        if rel.startswith("bin/"):
            return "python-scripts/" + rel[4:]
    return rel

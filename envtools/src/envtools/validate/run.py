"""validate as one call: every check in order over one context, and the --json document."""

from __future__ import annotations

import os
from dataclasses import asdict

from envtools.prefix.records import Prefix
from envtools.solve import virtual
from envtools.validate.binaries import check_binaries
from envtools.validate.depends import check_cuda, check_depends
from envtools.validate.files import check_explicit, check_files
from envtools.validate.findings import SCHEMA, SEVERITIES, Context, Finding
from envtools.validate.imports import check_imports, start_imports
from envtools.validate.interrupted import check_interrupted
from envtools.validate.pip import check_pip

CHECKS = (check_interrupted, check_depends, check_cuda, check_files, check_explicit, check_pip,
          check_binaries, check_imports)


def validate(prefix: str | os.PathLike[str], full: bool = False,
             virtual_overrides: list[str] | None = None, imports: bool = True,
             import_timeout: float = 60.0) -> tuple[Context, list[Finding]]:
    """Run every check; raises EnvtoolsError (exit 2) if the env cannot be read."""
    pre = Prefix.load(prefix)
    ctx = Context(pre, virtual.resolve(virtual_overrides), full, imports=imports,
                  import_timeout=import_timeout)
    start_imports(ctx)
    for check in CHECKS:
        check(ctx)
    order = {s: i for i, s in enumerate(SEVERITIES)}
    ctx.findings.sort(key=lambda f: (order[f.severity], f.check, f.message))
    return ctx, ctx.findings


def to_json(ctx: Context) -> dict:
    summary = {s: sum(f.severity == s for f in ctx.findings) for s in SEVERITIES}
    return {
        "schema": SCHEMA,
        "prefix": str(ctx.prefix.root),
        "exit_status": 1 if summary["error"] else 0,
        "summary": summary,
        "virtual_packages": [f"{v.name}={v.version}={v.build}" for v in ctx.virtuals],
        "checked": ctx.checked,
        "findings": [asdict(f) for f in ctx.findings],
    }

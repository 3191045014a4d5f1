"""``envtools validate``: run the checks, print the findings (or --json), exit 1 on an
error-severity finding."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from envtools.base.progress import info
from envtools.errors import EnvtoolsError
from envtools.validate.findings import SCHEMA
from envtools.validate.run import to_json, validate


def run_validate(prefix: Path, json_out: bool = False, full: bool = False,
                 virtual_overrides: list[str] | None = None, imports: bool = True,
                 import_timeout: float = 60.0) -> int:
    """CLI body: print findings (text or JSON); return the exit status (0, 1 or 2)."""
    try:
        ctx, findings = validate(prefix, full, virtual_overrides, imports, import_timeout)
    except EnvtoolsError as e:
        if json_out:
            print(json.dumps({"schema": SCHEMA, "prefix": str(prefix), "exit_status": 2,
                              "error": e.message, "hint": e.hint}, indent=2))
        raise EnvtoolsError(e.message, e.hint, exit_code=2) from e
    doc = to_json(ctx)
    if json_out:
        json.dump(doc, sys.stdout, indent=2)
        sys.stdout.write("\n")
        return doc["exit_status"]
    colors = {"error": "bold red", "warning": "yellow", "info": "cyan"}
    for f in findings:
        pk = f" [{', '.join(f.packages)}]" if f.packages else ""
        info(f"[{colors[f.severity]}]{f.severity:7}[/] {f.check:17} {f.message}{pk}")
        if f.hint:
            info(f"{'':25} hint: {f.hint}")
    s = doc["summary"]
    c = doc["checked"]
    info(
        f"{ctx.prefix.root}: {c.get('packages', 0)} packages, {c.get('files', 0)} files "
        f"({c.get('hashed', 0)} hashed), {c.get('pip_distributions', 0)} pip distributions, "
        f"{c.get('elf_files', 0)} ELF files, {c.get('imports', 0)} modules imported: "
        f"{s['error']} errors, {s['warning']} "
        f"warnings, {s['info']} notes")
    return doc["exit_status"]

"""What every check of validate shares: a finding, and the context the checks read and
add to."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from envtools.prefix.records import Prefix, Record
from envtools.solve import virtual

SCHEMA = "envtools-validate/1"


SEVERITIES = ("error", "warning", "info")


@dataclass
class Finding:
    check: str
    severity: str
    message: str
    packages: list[str] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    hint: str = ""


@dataclass
class Context:
    """What the checks share: the env, its records, virtual packages, and file facts."""

    prefix: Prefix
    virtuals: list[virtual.Virtual]
    full: bool
    #: run the import smoke test (``--no-imports`` turns it off), per-module limit in s
    imports: bool = True
    import_timeout: float = 60.0
    findings: list[Finding] = field(default_factory=list)
    checked: dict[str, int] = field(default_factory=dict)
    #: rel path -> owning conda record names (more than one means clobbered)
    owners: dict[str, list[Record]] = field(default_factory=dict)
    pip_owned: dict[str, str] = field(default_factory=dict)
    #: a clone's own links to its package cache that check_files accepted (and so the
    #: only links check_binaries follows): files (rel) and directories ({rel: target})
    cache_links: set[str] = field(default_factory=set)
    linked_dirs: dict[str, str] = field(default_factory=dict)
    #: the import smoke test running beside the other checks (see start_imports)
    import_job: tuple | None = None
    #: (record, rel) of altered .pyc files, checked together by _settle_pycs
    pending_pycs: list[tuple[Record, str]] = field(default_factory=list)
    #: what the import smoke test found, by module (envtools.validate.smoke.Outcome): for callers
    #: that need one module's result, as the channel pipeline does for its curated imports
    import_outcomes: dict = field(default_factory=dict)

    def add(self, check: str, severity: str, message: str, packages=(), paths=(), hint=""):
        self.findings.append(Finding(check, severity, message, list(packages), list(paths),
                                     hint))

    @property
    def subdir(self) -> str:
        subs = [r.data.get("subdir") for r in self.prefix.records]
        subs = [s for s in subs if s and s != "noarch"]
        if subs:
            return max(set(subs), key=subs.count)
        machine = os.uname().machine
        return {"x86_64": "linux-64"}.get(machine, f"linux-{machine}")

    def python_version(self) -> tuple[int, int] | None:
        r = self.prefix.by_name().get("python")
        if r is None:
            return None
        parts = r.version.split(".")
        try:
            return int(parts[0]), int(parts[1])
        except (IndexError, ValueError):
            return None

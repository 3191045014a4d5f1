"""The conda and conda-pack executables these tests run, and the envtools fixtures they
run them on (tests/envtools' fixture channel: small, built once, cached).

conda is not on PyPI: ``DDLCE_CONDA`` names one (or ``conda`` on PATH); a test that needs
it is skipped with that reason when there is none. conda-pack is on PyPI
(.ci/requirements-dev.txt): ``DDLCE_CONDA_PACK``, then ``conda-pack`` beside this python,
then on PATH.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "envtools"))


def conda_exe() -> str:
    exe = os.environ.get("DDLCE_CONDA") or shutil.which("conda")
    if not exe or not os.access(exe, os.X_OK):
        pytest.skip("needs a conda executable: set DDLCE_CONDA (conda is not on PyPI; "
                    "see docs/conda.md for making one from conda's source)")
    return exe


def conda_pack_exe() -> str:
    for exe in (os.environ.get("DDLCE_CONDA_PACK"), str(Path(sys.executable).with_name(
            "conda-pack")), shutil.which("conda-pack")):
        if exe and os.access(exe, os.X_OK):
            return exe
    pytest.skip("needs conda-pack (pip install conda-pack, or set DDLCE_CONDA_PACK)")


def conda_env(tmp: Path) -> dict[str, str]:
    """An environment for a conda subprocess: offline, its own config and package cache
    under ``tmp``, no user .condarc."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDA")}
    env.update(CONDARC=str(tmp / "condarc"), CONDA_PKGS_DIRS=str(tmp / "pkgs"),
               CONDA_OFFLINE="true", CONDA_SOLVER="classic", CONDA_ALWAYS_YES="true",
               CONDA_NOTIFY_OUTDATED_CONDA="false", CONDA_REPORT_ERRORS="false",
               CONDA_ENVS_DIRS=str(tmp / "condaenvs"))
    (tmp / "condarc").write_text("channels: []\n")
    return env


def run(cmd: list, check: bool = True, **kw) -> subprocess.CompletedProcess:
    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"{' '.join(map(str, cmd))} -> {p.returncode}\n"
                             f"stdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
    return p


def envtools(*args) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "envtools", *args])


def fixture_channels() -> list[Path]:
    """tests/envtools' fixture channel and its upstream (pip), built if needed."""
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fixture packages (apt-get install gcc)")
    from fixtures import build_channel, upstream_channel

    ch = build_channel()
    return [ch, upstream_channel(ch)]


def validate_errors(prefix: Path, *extra: str) -> list[dict]:
    import json

    p = run([sys.executable, "-m", "envtools", "validate", prefix, "--json", *extra],
            check=False)
    assert p.returncode in (0, 1), p.stderr
    return [f for f in json.loads(p.stdout)["findings"] if f["severity"] == "error"]

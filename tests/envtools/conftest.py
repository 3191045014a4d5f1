"""Session fixtures: the fixture channel (built once, cached) and a read-only env from it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from fixtures import build_channel  # noqa: E402

ENVTOOLS = [sys.executable, "-m", "envtools"]


def run_envtools(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as users and the channel pipeline do."""
    p = subprocess.run([*ENVTOOLS, *map(str, args)], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"envtools {' '.join(map(str, args))} -> {p.returncode}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


@pytest.fixture(scope="session")
def channel() -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fixture packages (apt-get install gcc)")
    return build_channel()


@pytest.fixture(scope="session")
def site(tmp_path_factory, channel) -> Path:
    """A site layout: <root>/envs/powerai installed read-only (as `make channel` does)."""
    root = tmp_path_factory.mktemp("site")
    run_envtools("install", "--channel", channel, "--prefix", root / "envs" / "powerai",
                 "demo-meta")
    return root


@pytest.fixture(scope="session")
def env(site) -> Path:
    return site / "envs" / "powerai"


@pytest.fixture(scope="session")
def clone_env(tmp_path_factory, env) -> Path:
    """A writable clone the validate tests break (each breaks its own copy of it)."""
    dest = tmp_path_factory.mktemp("clones") / "base"
    run_envtools("clone", env, dest)
    return dest


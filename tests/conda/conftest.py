"""Shared fixtures of the conda suite: the real conda, the channel, the site env.

conda is taken from ``DDLCE_CONDA`` or PATH (condahelp.find_conda); the fixtures skip with
the reason when there is none, or when ``make channel`` has not made channel/,
channel-upstream/ and envs/powerai. Helpers the tests call live in condahelp.py.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from condahelp import CHANNEL, SITE_ENV, UPSTREAM, Conda, find_conda


@pytest.fixture(scope="session")
def conda_exe() -> str:
    exe, why = find_conda()
    if exe is None:
        pytest.skip(why)
    p = subprocess.run([exe, "--version"], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"{exe} --version fails: {(p.stderr or p.stdout).strip()[-300:]}")
    return exe


@pytest.fixture(scope="session")
def channels() -> list[Path]:
    """channel/ and channel-upstream/ from ``make channel`` (skipped when absent)."""
    missing = [p for p in (CHANNEL, UPSTREAM) if not (p / "noarch" / "repodata.json").exists()]
    if missing:
        pytest.skip(f"needs {', '.join(p.name for p in missing)} from `make channel`")
    return [CHANNEL, UPSTREAM]


@pytest.fixture(scope="session")
def site_env() -> Path:
    """envs/powerai, the site env ``make channel`` installs (skipped when absent)."""
    if not (SITE_ENV / "conda-meta").is_dir():
        pytest.skip("needs envs/powerai from `make channel`")
    return SITE_ENV


@pytest.fixture(scope="session")
def conda(conda_exe, channels, tmp_path_factory) -> Conda:
    """The real conda with a package cache of this session's own (made readable and writable
    for other uids too: the other-uid tests share it) and the local channels."""
    pkgs = tmp_path_factory.mktemp("conda-pkgs")
    pkgs.chmod(0o1777)
    args = ["--override-channels", *[f"-c={c.as_uri()}" for c in channels]]
    return Conda(conda_exe, pkgs, args)


@pytest.fixture(scope="session")
def default_env(conda, tmp_path_factory) -> Path:
    """A plain ``conda create -p E --offline -c ./channel -c ./channel-upstream powerai``:
    what a new user gets (no driver)."""
    prefix = tmp_path_factory.mktemp("conda-default") / "env"
    conda.plain_create(prefix)
    return prefix


@pytest.fixture(scope="session")
def cuda_env(conda, tmp_path_factory) -> Path:
    """The same with a CUDA 13.0 driver described (CONDA_OVERRIDE_CUDA=13.0)."""
    prefix = tmp_path_factory.mktemp("conda-cuda") / "env"
    conda.plain_create(prefix, extra_env={"CONDA_OVERRIDE_CUDA": "13.0"})
    return prefix



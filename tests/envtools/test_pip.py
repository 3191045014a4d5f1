"""pip in every env (as conda's add_pip_as_python_dependency), the read-only env's PEP 668
marker, ``python -m pip install`` into a clone, and the second (upstream) channel that
installs record and ``envtools add`` finds without flags.

The fixture ``pip`` is made from the system's pip wheel and lives in the second fixture
channel (fixtures.upstream_channel), as the stand-ins do in ``channel-upstream/``.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from conftest import run_envtools
from fixtures import upstream_channel


@pytest.fixture(scope="module")
def pip_env(tmp_path_factory, channel) -> Path:
    """envs/powerai as `make channel` installs it: from the channel and its upstream."""
    up = upstream_channel(channel)
    if not list((up / "noarch").glob("pip-*.conda")):
        pytest.skip("no pip wheel on this machine (apt-get install python3-pip-whl)")
    prefix = tmp_path_factory.mktemp("pipsite") / "envs" / "powerai"
    run_envtools("install", "--channel", channel, "--channel", up, "--prefix", prefix,
                 "demo-meta")
    return prefix


def _names(prefix: Path) -> set[str]:
    return {p.name.rsplit("-", 2)[0] for p in (prefix / "conda-meta").glob("*.json")}


def _validate(prefix: Path) -> dict:
    return json.loads(run_envtools("validate", prefix, "--json", check=False).stdout)


def test_pip_comes_with_python_and_the_read_only_env_says_clone_it(pip_env, channel):
    assert "pip" in _names(pip_env)
    (marker,) = pip_env.glob("lib/python3.*/EXTERNALLY-MANAGED")
    text = marker.read_text()
    assert text.startswith("[externally-managed]") and f"envtools clone {pip_env}" in text
    info = json.loads((pip_env / "conda-meta" / "envtools" / "prefix.json").read_text())
    assert info["channels"] == [str(channel), str(upstream_channel(channel))]
    assert _validate(pip_env)["exit_status"] == 0


def test_pip_install_into_a_clone_and_validate(pip_env, tmp_path, wheel_factory):
    mine = tmp_path / "mine"
    run_envtools("clone", pip_env, mine)
    assert not list(mine.glob("lib/python3.*/EXTERNALLY-MANAGED"))  # the clone is yours
    whl = wheel_factory("tinyw", "1.0", {"tinyw/__init__.py": "ANSWER = 42\n"},
                        scripts={"tinyw": "tinyw:ANSWER"})
    env = {**os.environ, "PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PIP_FIND_LINKS", None)
    p = subprocess.run([mine / "bin" / "python", "-m", "pip", "install", "--no-index",
                        "--no-deps", str(whl)], capture_output=True, text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    out = subprocess.run([mine / "bin" / "python", "-c", "import tinyw, sys; "
                          "print(tinyw.ANSWER, tinyw.__file__.startswith(sys.prefix))"],
                         capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["42", "True"]
    assert (mine / "bin" / "tinyw").read_text().startswith(f"#!{mine}/bin/python")
    v = _validate(mine)
    assert v["exit_status"] == 0, v["findings"]
    # pip overwriting a conda package's files is still found
    bad = wheel_factory("demo-py", "3.0", {"demo_py/__init__.py": "PREFIX = 'pip'\n"})
    p = subprocess.run([mine / "bin" / "python", "-m", "pip", "install", "--no-index",
                        "--no-deps", "--force-reinstall", str(bad)], capture_output=True,
                       text=True, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    v = _validate(mine)
    assert v["exit_status"] == 1 and "demo_py/__init__.py" in json.dumps(v["findings"])


def test_add_takes_packages_from_the_recorded_upstream_channel(pip_env, tmp_path):
    mine = tmp_path / "mine"
    run_envtools("clone", pip_env, mine)
    p = run_envtools("drop", mine, "pip", check=False)
    assert p.returncode == 2 and "python needs pip" in p.stderr, p.stderr
    run_envtools("drop", mine, "pip", "--force")
    assert "pip" not in _names(mine)
    p = run_envtools("add", mine, "pip")  # no --channel: the env records both
    assert "pip=" in p.stderr, p.stderr
    assert subprocess.run([mine / "bin" / "python", "-m", "pip", "--version"],
                          capture_output=True).returncode == 0
    assert _validate(mine)["exit_status"] == 0

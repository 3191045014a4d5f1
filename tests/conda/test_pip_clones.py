"""The real site env (envs/powerai, a real CPython) is closed to pip for root (PEP 668)
and to conda (CEP 22); a clone made by conda, by envtools or by conda-pack/unpack takes
``pip install``."""

from __future__ import annotations

import tarfile
from pathlib import Path

import pytest
from conda_exes import ROOT, conda_env, conda_exe, conda_pack_exe, envtools, run

SITE = ROOT / "envs" / "powerai"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    if not (SITE / "bin" / "python").exists():
        pytest.skip(f"needs the site env {SITE} (make channel)")
    import importlib.util

    # tests/envtools' real-wheel writer (loaded by path: "conftest" is also this folder's)
    spec = importlib.util.spec_from_file_location(
        "envtools_conftest", ROOT / "tests" / "envtools" / "conftest.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    make_wheel = mod.make_wheel

    return make_wheel(tmp_path_factory.mktemp("wheel"), "h2-demo", "1.0",
                      {"h2_demo/__init__.py": "VALUE = 42\n"})


def pip_install(env: Path, wheel: Path, *extra: str):
    return run([env / "bin" / "python", "-m", "pip", "install", "--no-index",
                "--no-deps", *extra, wheel], check=False)


def test_site_env_refuses_pip_even_for_root(wheel):
    p = pip_install(SITE, wheel, "--dry-run")
    assert p.returncode != 0 and "externally-managed-environment" in p.stderr, p.stderr
    assert f"envtools clone {SITE}" in p.stderr


def _takes_pip(env: Path, wheel: Path) -> None:
    p = pip_install(env, wheel)
    assert p.returncode == 0, p.stdout + p.stderr
    out = run([env / "bin" / "python", "-c", "import h2_demo; print(h2_demo.VALUE)"])
    assert out.stdout.strip() == "42"


def test_conda_clone_takes_pip(wheel, tmp_path):
    dest = tmp_path / "mine"
    run([conda_exe(), "create", "-p", dest, "--clone", SITE, "--offline", "-y"],
        env=conda_env(tmp_path))
    _takes_pip(dest, wheel)


def test_envtools_clone_takes_pip(wheel, tmp_path):
    dest = tmp_path / "mine"
    envtools("clone", SITE, dest)
    _takes_pip(dest, wheel)


def test_conda_pack_copy_takes_pip(wheel, tmp_path):
    out = tmp_path / "env.tar.gz"
    run([conda_pack_exe(), "-p", SITE, "-o", out, "-q", "--n-threads", "2"])
    dest = tmp_path / "unpacked"
    dest.mkdir()
    with tarfile.open(out) as tf:
        tf.extractall(dest, filter="fully_trusted")
    run([dest / "bin" / "conda-unpack"])
    _takes_pip(dest, wheel)


"""conda doctor and envtools validate agree: nothing on a pristine site env, on a clone
made by envtools or by conda, or after conda install; both find a planted edit. The site
env is frozen for conda (CEP 22), and its package cache serves conda's clone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conda_exes import conda_env, conda_exe, envtools, fixture_channels, run, validate_errors


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    ch, up = fixture_channels()
    prefix = tmp_path_factory.mktemp("doctor") / "envs" / "powerai"
    envtools("install", "--channel", ch, "--channel", up, "--prefix", prefix,
             "demo-meta", "demo-noarch", "pip")
    return prefix


def doctor(prefix: Path, tmp: Path) -> dict[str, list[str]]:
    """conda doctor's altered and missing files: {"Altered Files": [...], ...} (package
    lines under each failed check, empty when both pass)."""
    p = run([conda_exe(), "doctor", "-v", "-p", prefix], env=conda_env(tmp), check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    found: dict[str, list[str]] = {}
    current = None
    for line in p.stdout.splitlines():
        s = line.strip()
        if s.endswith(("Altered Files:", "Missing Files:")):
            current = s.split(" ", 1)[-1].rstrip(":")
            found[current] = []
        elif current and s and not s.startswith(("✅", "❌")):
            found[current].append(s)
        elif s.startswith(("✅", "❌")):
            current = None
    return found


def conda_clone(src: Path, dest: Path, tmp: Path, pkgs_dirs: list[Path] | None = None):
    env = conda_env(tmp)
    if pkgs_dirs:
        env["CONDA_PKGS_DIRS"] = ",".join(map(str, pkgs_dirs))
    return run([conda_exe(), "create", "-p", dest, "--clone", src, "--offline", "-y"], env=env)


def test_pristine_site_env(site, tmp_path):
    assert doctor(site, tmp_path) == {}
    assert validate_errors(site) == []


def test_envtools_clone(site, tmp_path):
    dest = tmp_path / "mine"
    envtools("clone", site, dest)
    assert doctor(dest, tmp_path) == {}
    assert validate_errors(dest) == []


def test_conda_clone_then_conda_install_then_an_edit(site, tmp_path):
    dest = tmp_path / "mine"
    conda_clone(site, dest, tmp_path)
    assert doctor(dest, tmp_path) == {}
    assert validate_errors(dest) == []
    ch, _ = fixture_channels()
    run([conda_exe(), "install", "-p", dest, "--offline", "-y", "-c", ch.as_uri(),
         "demo-extra"], env=conda_env(tmp_path))
    assert doctor(dest, tmp_path) == {}
    assert validate_errors(dest) == []
    h = dest / "include" / "demo.h"
    h.write_bytes(h.read_bytes()[:-2] + b"X\n")  # same size: only a hash sees it
    found = doctor(dest, tmp_path)
    assert list(found) == ["Altered Files"] and any("libdemo" in s for s in found[
        "Altered Files"]), found
    errs = validate_errors(dest)
    assert [(f["check"], f["paths"]) for f in errs] == [("altered-file", ["include/demo.h"])]


def test_site_env_is_frozen_for_conda_even_as_root(site, tmp_path):
    ch, _ = fixture_channels()
    p = run([conda_exe(), "install", "-p", site, "--offline", "-y", "-c", ch.as_uri(),
             "demo-extra"], env=conda_env(tmp_path), check=False)
    assert p.returncode != 0
    out = p.stdout + p.stderr
    assert "frozen" in out and f"--clone {site}" in out, out
    assert not list((site / "conda-meta").glob("demo-extra-*.json"))


def test_conda_clone_links_from_the_site_cache(site, tmp_path):
    """With the site's cache in pkgs_dirs, conda's clone fetches and extracts nothing."""
    own = tmp_path / "own-pkgs"
    dest = tmp_path / "mine"
    conda_clone(site, dest, tmp_path, [own, site.parent / (site.name + ".pkgs")])
    extracted = [d.name for d in own.iterdir() if (d / "info").is_dir()] if own.is_dir() else []
    fetched = [f.name for f in own.glob("*.conda")] if own.is_dir() else []
    assert extracted == [] and fetched == [], (extracted, fetched)
    assert validate_errors(dest) == []
    assert not os.path.isfile(dest / "conda-meta" / "frozen")

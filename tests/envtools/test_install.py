"""envtools install: a read-only prefix with its marker, explicit set and package cache."""

from __future__ import annotations

import json
import os
import stat
import subprocess

from conftest import run_envtools


def test_install_makes_readonly_env_that_runs(env):
    marker = json.loads((env / "conda-meta" / "envtools" / "readonly.json").read_text())
    assert marker["readonly"] is True and marker["specs"] == ["demo-meta"]
    names = {p.name.split("-")[0] for p in (env / "conda-meta").glob("*.json")}
    assert {"libdemo", "python", "cuda", "demo"} <= names
    explicit = (env / "conda-meta" / "envtools" / "explicit.txt").read_text().splitlines()
    assert "@EXPLICIT" in explicit and sum(".conda#sha256:" in x for x in explicit) == 5
    for p in [env, env / "bin", env / "lib" / "libdemo.so.1", env / "conda-meta"]:
        assert not os.stat(p).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), p
    # records must be readable by every user of a shared env (rattler writes them 0600)
    for p in (env / "conda-meta").glob("*.json"):
        assert os.stat(p).st_mode & stat.S_IROTH, p
    out = subprocess.run([env / "bin" / "demo"], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [f"{env}/share/demo", f"prefix={env}"]
    cache = env.parent / "powerai.pkgs"
    assert (cache / "libdemo-1.0.0-hb0f4dca_0" / "info" / "paths.json").exists() or any(
        cache.glob("libdemo-*/info/paths.json"))


def test_install_refuses_existing_readonly_and_bad_input(env, channel, tmp_path):
    p = run_envtools("install", "--channel", channel, "--prefix", env, "demo-meta", check=False)
    assert p.returncode == 2 and "already an envtools read-only environment" in p.stderr
    assert "envtools remove" in p.stderr
    p = run_envtools("install", "--channel", tmp_path / "nope", "--prefix", tmp_path / "e",
                     "demo-meta", check=False)
    assert p.returncode == 2 and "neither a URL nor an existing directory" in p.stderr
    p = run_envtools("install", "--channel", channel, "--prefix", tmp_path / "e",
                     "no-such-package", check=False)
    assert p.returncode == 2 and "cannot solve" in p.stderr
    assert not (tmp_path / "e").exists()
    assert not [x for x in tmp_path.iterdir() if "envtools-tmp" in x.name]
    # writing inside the read-only env is refused by marker, even for root
    p = run_envtools("install", "--channel", channel, "--prefix", env / "sub", "demo-meta",
                     check=False)
    assert p.returncode == 2 and "read-only environment" in p.stderr


def test_remove(channel, tmp_path):
    prefix = tmp_path / "envs" / "x"
    run_envtools("install", "--channel", channel, "--prefix", prefix, "libdemo")
    assert (tmp_path / "envs" / "x.pkgs").is_dir()
    run_envtools("remove", prefix)
    assert not prefix.exists() and not (tmp_path / "envs" / "x.pkgs").exists()


def test_help_for_every_subcommand():
    for sub in ("install", "module", "clone", "validate", "remove"):
        p = run_envtools(sub, "--help")
        assert p.stdout.startswith(f"usage: envtools {sub} ")
        assert "options:" in p.stdout
    p = run_envtools(check=False)  # no command: the list of commands, and exit 2
    assert p.returncode == 2 and all(s in p.stdout for s in ("install", "clone", "validate"))
    p = run_envtools("clone", "a", "b", "--link-mode", "nope", check=False)
    assert p.returncode == 2 and "invalid choice: 'nope'" in p.stderr

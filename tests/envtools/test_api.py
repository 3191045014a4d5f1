"""envtools.api: the library the channel pipeline calls gives what the commands give."""

from __future__ import annotations

import json
import os

import pytest
from conftest import run_envtools
from envtools.solve import virtual

from envtools import api


def test_solve_for_this_machine_and_another_platform(channel):
    names = {r.name.normalized for r in api.solve([str(channel)], ["demo-meta"])}
    assert {"demo-meta", "demo-py", "libdemo", "python"} <= names
    # another platform: a described machine (nothing detected here), --virtual on top
    vs = {v.name: v.version for v in virtual.for_platform("linux-aarch64", ["__cuda=13.0"])}
    assert vs == {"__glibc": "2.28", "__unix": "0", "__linux": "5.0", "__cuda": "13.0"}
    assert virtual.for_platform(virtual.host_platform(), None) == virtual.resolve(None)
    with pytest.raises(api.EnvtoolsError) as err:  # the fixture packages are linux-64's
        api.solve([str(channel)], ["demo-meta"], platform="linux-aarch64")
    assert "cannot solve demo-meta for linux-aarch64" in err.value.message
    with pytest.raises(api.EnvtoolsError, match="cannot describe a machine"):
        api.solve([str(channel)], ["demo-meta"], platform="osx-arm64")


def test_install_validate_module_remove_as_the_commands_do(channel, tmp_path):
    prefix = tmp_path / "envs" / "demo"
    assert api.install([str(channel)], prefix, ["demo-meta"]) == prefix
    assert api.made_by_envtools(prefix) and not api.made_by_envtools(tmp_path)
    with pytest.raises(api.EnvtoolsError, match="already an envtools read-only environment"):
        api.install([str(channel)], prefix, ["demo-meta"])
    v = api.validate(prefix)
    cli = json.loads(run_envtools("validate", prefix, "--json", check=False).stdout)
    assert v.exit_status == cli["exit_status"]
    assert v.report["summary"] == cli["summary"] and v.report["checked"] == cli["checked"]
    assert v.imports["demo_py"] == "ok" and cli["checked"]["imports"] == len(v.imports)
    assert api.validate(prefix, imports=False).imports == {}
    written = api.write_modulefiles(prefix, "demo/1.0", tmp_path / "mods")
    assert sorted(p.relative_to(tmp_path / "mods").as_posix() for p in written) == [
        "demo/1.0", "demo/1.0.lua"]
    api.remove(prefix)
    assert not prefix.exists() and not (tmp_path / "envs" / "demo.pkgs").exists()


def test_a_system_error_arrives_as_an_envtools_error(channel, tmp_path):
    """What the command line prints for a system error (the path, a hint) is what the
    library raises: here modulefiles asked for under a regular file."""
    prefix = tmp_path / "env"
    api.install([str(channel)], prefix, ["libdemo"])
    (tmp_path / "file").write_text("")
    with pytest.raises(api.EnvtoolsError) as err:
        api.write_modulefiles(prefix, "demo/1.0", tmp_path / "file" / "mods")
    assert os.strerror(20) in err.value.message and str(tmp_path / "file") in err.value.message
    assert err.value.exit_code == 1


def test_cuda_need_of_a_package():
    assert api.cuda_need(["python >=3.11", "__cuda >=12.8,<13", "__cuda >=13.0"]) == "13.0"
    assert api.cuda_need(["__cuda"]) == "0"
    assert api.cuda_need(["numpy", "cuda-version 13.0.*"]) is None

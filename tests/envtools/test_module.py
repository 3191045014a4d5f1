"""envtools module: real `module load` / `module unload` in bash with Lmod and Tcl Modules.

Load, run the env's python and programs, unload, and compare the whole environment
before and after. Only the module system's own bookkeeping may differ (the variables in
BOOKKEEPING: loaded-module lists and Lmod's/Modules' internal state), which is what any
module leaves behind in those tools.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from conftest import run_envtools
from modtools import lmod_prelude, tcl_modules_prelude

BOOKKEEPING = re.compile(
    r"^(_ModuleTable\d*_|_ModuleTable_Sz_|__LMOD_.*|LMOD_.*|_LMFILES_|LOADEDMODULES|"
    r"__MODULES_.*|MODULES_.*|_)$"
)
SYSTEMS = {"lmod": lmod_prelude, "tcl": tcl_modules_prelude}


@pytest.fixture(scope="module")
def modulefiles(env, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("modulefiles")
    p = run_envtools("module", env, "--name", "powerai/1.0", "--out", out, "--format", "both")
    assert "powerai/1.0.lua" in p.stderr
    # another python provider, to check the family conflict
    (out / "otherpy").mkdir()
    (out / "otherpy" / "1.0.lua").write_text('family("python")\nsetenv("OTHERPY","1")\n')
    (out / "otherpy" / "1.0").write_text("#%Module1.0\nfamily python\nsetenv OTHERPY 1\n")
    return out


def prelude_for(system: str) -> str:
    text, why = SYSTEMS[system]()
    if text is None:
        pytest.skip(why)
    return text


def parse_env(blob: bytes) -> dict[str, str]:
    env = {}
    for item in blob.split(b"\0"):
        if b"=" in item:
            k, _, v = item.decode().partition("=")
            env[k] = v
    return env


def run_bash(system: str, modulefiles: Path, body: str, tmp_path: Path,
             preset: str = "") -> tuple[dict, dict, dict, str]:
    """Run ``body`` between env dumps; returns (before, loaded, after, stdout)."""
    script = tmp_path / f"{system}.sh"
    dumps = {n: tmp_path / f"{system}.{n}" for n in ("before", "loaded", "after")}
    script.write_text(
        "set -e\n"
        f"{prelude_for(system)}\n"
        f"export MODULEPATH={modulefiles}\n"
        f"{preset}\n"
        "module list >/dev/null 2>&1 || true\n"
        f"env -0 > {dumps['before']}\n"
        "module load powerai/1.0\n"
        f"env -0 > {dumps['loaded']}\n"
        f"{body}\n"
        "module unload powerai/1.0\n"
        f"env -0 > {dumps['after']}\n"
    )
    p = subprocess.run(
        ["env", "-i", f"HOME={tmp_path}", "PATH=/usr/local/bin:/usr/bin:/bin", "TERM=dumb",
         "bash", "--noprofile", "--norc", str(script)],
        capture_output=True, text=True,
    )
    assert p.returncode == 0, f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    before, loaded, after = (parse_env(dumps[n].read_bytes()) for n in ("before", "loaded",
                                                                          "after"))
    return before, loaded, after, p.stdout


def user_visible(env: dict) -> dict:
    return {k: v for k, v in env.items() if not BOOKKEEPING.match(k)}


@pytest.mark.parametrize("system", ["lmod", "tcl"])
def test_load_run_unload_restores_environment(system, env, modulefiles, tmp_path):
    body = (
        'echo "PY=$(python -c \'import sys, demo_py; print(sys.prefix, demo_py.where())\')"\n'
        'echo "DEMO=$(demo | tail -1)"\n'
        'echo "WHICH=$(command -v python)"\n'
    )
    before, loaded, after, out = run_bash(system, modulefiles, body, tmp_path)
    assert f"PY={env} {env}" in out
    assert f"DEMO=prefix={env}" in out
    assert f"WHICH={env}/bin/python" in out
    # what conda activate does
    assert loaded["PATH"].split(":")[0] == f"{env}/bin"
    assert loaded["CONDA_PREFIX"] == str(env)
    assert loaded["CONDA_DEFAULT_ENV"] == str(env)
    assert loaded["CONDA_SHLVL"] == "1"
    assert loaded["CONDA_PROMPT_MODIFIER"] == "(powerai/1.0) "
    assert loaded["DEMO_HOME"] == f"{env}/share/demo"  # from the env's activate.d script
    assert loaded["DEMO_MODE"] == "activated"
    assert "CONDA_PREFIX_0" not in loaded
    # and all of it undone
    assert user_visible(after) == user_visible(before)


@pytest.mark.parametrize("system", ["lmod", "tcl"])
def test_stacks_on_an_active_env_and_restores_it(system, env, modulefiles, tmp_path):
    preset = (
        "export CONDA_PREFIX=/opt/other CONDA_DEFAULT_ENV=other CONDA_SHLVL=1 "
        "CONDA_PROMPT_MODIFIER='(other) ' DEMO_HOME=/preset/demo\n"
        "export PATH=/opt/other/bin:$PATH"
    )
    before, loaded, after, _ = run_bash(system, modulefiles, "true", tmp_path, preset)
    assert loaded["CONDA_SHLVL"] == "2"
    assert loaded["CONDA_PREFIX_1"] == "/opt/other"
    assert loaded["CONDA_PREFIX"] == str(env)
    assert loaded["DEMO_HOME"] == f"{env}/share/demo"
    assert loaded["PATH"].startswith(f"{env}/bin:/opt/other/bin:")
    assert user_visible(after) == user_visible(before)
    assert after["DEMO_HOME"] == "/preset/demo" and after["CONDA_SHLVL"] == "1"


@pytest.mark.parametrize("system", ["lmod", "tcl"])
def test_help_whatis_and_family(system, env, channel, modulefiles, tmp_path):
    body = (
        "module whatis powerai/1.0 2>&1 | sed 's/^/WHATIS /'\n"
        "module help powerai/1.0 2>&1 | sed 's/^/HELP /'\n"
        "module load otherpy/1.0 >/dev/null 2>&1 || echo OTHER_REFUSED\n"
        'echo "LOADED=${LOADEDMODULES:-}"\n'
        "module unload otherpy/1.0 >/dev/null 2>&1 || true\n"
        "module load powerai/1.0 >/dev/null 2>&1 || true\n"
    )
    _, _, _, out = run_bash(system, modulefiles, body, tmp_path)
    assert f"Prefix: {env}" in out and "envtools clone" in out
    assert "HELP" in out and "envtools validate" in out
    # the seeds' flow (clone, then envtools add or pip) and the channels add takes from
    assert "envtools add" in out and "-m pip install" in out
    assert f"HELP   {channel}" in out, out
    loaded = next(line for line in out.splitlines() if line.startswith("LOADED="))
    # never two members of the python family at once (Lmod swaps, Tcl Modules refuses)
    assert not ("powerai/1.0" in loaded and "otherpy/1.0" in loaded), loaded


def test_lmod_spider_lists_packages_as_extensions(env, modulefiles, tmp_path):
    prelude = prelude_for("lmod")
    script = tmp_path / "spider.sh"
    script.write_text(f"{prelude}\nexport MODULEPATH={modulefiles}\nmodule spider libdemo 2>&1\n")
    p = subprocess.run(["env", "-i", f"HOME={tmp_path}", "PATH=/usr/bin:/bin", "bash",
                        "--noprofile", "--norc", str(script)], capture_output=True, text=True)
    assert "powerai/1.0" in p.stdout + p.stderr, p.stdout + p.stderr


def test_module_refuses_bad_input(env, tmp_path):
    p = run_envtools("module", env, "--name", "../x", "--out", tmp_path, check=False)
    assert p.returncode == 2 and "bad module name" in p.stderr
    p = run_envtools("module", env, "--name", "a/1", "--out", tmp_path, "--format", "xml",
                     check=False)
    assert p.returncode == 2 and "invalid choice: 'xml'" in p.stderr
    p = run_envtools("module", env, "--name", "a/1", "--out", env / "modulefiles", check=False)
    assert p.returncode == 2 and "read-only environment" in p.stderr

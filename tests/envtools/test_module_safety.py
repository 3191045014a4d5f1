"""Modulefiles from hostile data, loaded by the real Lmod and Environment Modules.

Every string that goes into a modulefile comes from the env: its path, the module name,
package names and versions in its records, conda-meta/state env_vars, and what its
activate.d scripts set. Each hostile value here either is refused by ``envtools module``
with an error naming the character, or loads in both module systems with exactly its
value and without running anything: every attack tries to create the file SENTINEL in
the directory it runs in, which must never appear.

The env is reached through a symlink at the hostile path (an env's modulefile is
written for the path it is given), so no env is copied per case.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest
from conftest import ENVTOOLS, run_envtools
from modtools import lmod_prelude, tcl_modules_prelude

SYSTEMS = {"lmod": lmod_prelude, "tcl": tcl_modules_prelude}
BOOKKEEPING = re.compile(
    r"^(_ModuleTable\d*_|_ModuleTable_Sz_|__LMOD_.*|LMOD_.*|_LMFILES_|LOADEDMODULES|"
    r"__MODULES_.*|MODULES_.*|_)$"
)

#: path components that break out of a Lua string, a Lua long bracket, a Tcl word, or
#: the shell code the module systems print, if anything is written unescaped
HOSTILE = {
    "lua-quote": ['q"); os.execute("touch SENTINEL"); print("',
                  "b\\\"); os.execute('touch SENTINEL') --"],
    "lua-long-bracket": ["]==] os.execute('touch SENTINEL') --[==[",
                         "]] os.execute('touch SENTINEL') --[["],
    "tcl": ["[exec touch SENTINEL]", "c} ; exec touch SENTINEL ; {", "${env(HOME)}$HOME"],
    "shell": ["$(touch SENTINEL)", "`touch SENTINEL`", "d; touch SENTINEL;", "e' 'f"],
    "non-ascii": ["café", "環境-目录", "ünï ∂ 🐍"],
    "backslash-end": ["g\\", "h\\\\"],
}


def prelude(system: str) -> str:
    text, why = SYSTEMS[system]()
    if text is None:
        pytest.skip(why)
    return text


def parse_env(blob: bytes) -> dict[str, str]:
    env = {}
    for item in blob.split(b"\0"):
        if b"=" in item:
            k, _, v = item.decode("utf-8", "surrogateescape").partition("=")
            env[k] = v
    return env


def load_unload(system: str, modulefiles: Path, work: Path, lang: str = "C.UTF-8",
                body: str = "") -> tuple[dict, dict, dict, str]:
    """``module load`` then ``unload`` powerai/1.0 in a clean bash run in ``work``;
    returns the environment before, loaded and after, and the output."""
    script = work / f"{system}.sh"
    dumps = {n: work / f"{system}.{n}" for n in ("before", "loaded", "after")}
    script.write_text(
        "set -e\n"
        f"{prelude(system)}\n"
        f"export MODULEPATH='{modulefiles}'\n"
        f"env -0 > {dumps['before']}\n"
        "module load powerai/1.0\n"
        f"env -0 > {dumps['loaded']}\n"
        f"{body}\n"
        "module unload powerai/1.0\n"
        f"env -0 > {dumps['after']}\n"
    )
    p = subprocess.run(
        ["env", "-i", f"HOME={work}", "PATH=/usr/local/bin:/usr/bin:/bin", "TERM=dumb",
         f"LANG={lang}", "bash", "--noprofile", "--norc", str(script)],
        capture_output=True, cwd=work,
    )
    out = (p.stdout + p.stderr).decode("utf-8", "replace")
    assert p.returncode == 0, out
    before, loaded, after = (parse_env(dumps[n].read_bytes()) for n in ("before", "loaded",
                                                                          "after"))
    return before, loaded, after, out


def visible(env: dict) -> dict:
    return {k: v for k, v in env.items() if not BOOKKEEPING.match(k)}


def hostile_prefix(base: Path, env: Path, parts: list[str]) -> Path:
    """A symlink to ``env`` at ``base/<part>/.../<part>/env``."""
    d = base.joinpath(*parts[:-1]) if len(parts) > 1 else base
    d.mkdir(parents=True, exist_ok=True)
    link = d / parts[-1] if parts[-1].endswith("\\") else d / parts[-1] / "env"
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(env)
    return link


@pytest.mark.parametrize("kind", sorted(HOSTILE))
def test_hostile_prefix_loads_exactly_and_runs_nothing(kind, env, tmp_path):
    prefix = hostile_prefix(tmp_path / "p", env, HOSTILE[kind])
    out = tmp_path / "modulefiles"
    work = tmp_path / "work"
    work.mkdir()
    run_envtools("module", prefix, "--name", "powerai/1.0", "--out", out, cwd=work)
    assert (out / "powerai" / "1.0.lua").is_file() and (out / "powerai" / "1.0").is_file()
    for system in SYSTEMS:
        for lang in ("C.UTF-8", "C"):
            before, loaded, after, text = load_unload(
                system, out, work, lang, body="module help powerai/1.0 2>&1\n"
                "module whatis powerai/1.0 2>&1")
            where = f"{system}, LANG={lang}"
            assert loaded["CONDA_PREFIX"] == str(prefix), where
            assert loaded["CONDA_DEFAULT_ENV"] == str(prefix), where
            assert loaded["PATH"].split(":")[0] == f"{prefix}/bin", where
            assert loaded["DEMO_HOME"] == f"{prefix}/share/demo", where  # (activate.d)
            assert f"Prefix: {prefix}" in text, (where, text)  # whatis
            assert f"  {prefix}" in text, (where, text)  # help (a Lua long bracket)
            assert visible(after) == visible(before), where
    assert not list(tmp_path.rglob("SENTINEL")), "a hostile prefix ran a command"


@pytest.mark.parametrize(("part", "named"), [
    ('x\nos.execute("touch SENTINEL")', "a newline"),
    ("x\r[exec touch SENTINEL]", "a carriage return"),
    ("tab\there", "a tab"),
    ("esc\x1b[31m", "an escape (ESC)"),
    ("del\x7f", "U+007F"),
    ("a:b", "':'"),
])
def test_prefix_that_cannot_be_a_literal_is_refused(part, named, env, tmp_path):
    prefix = hostile_prefix(tmp_path / "p", env, [part])
    out = tmp_path / "modulefiles"
    p = run_envtools("module", prefix, "--name", "powerai/1.0", "--out", out, check=False,
                     cwd=tmp_path)
    assert p.returncode == 2, p.stderr
    assert named in p.stderr and "hint:" in p.stderr, p.stderr
    assert "Traceback" not in p.stderr
    assert not out.exists() and not list(tmp_path.rglob("SENTINEL"))


def test_prefix_with_bytes_that_are_not_utf8_is_refused(env, tmp_path):
    base = os.fsencode(tmp_path)
    os.symlink(env, base + b"/bad\xff")
    p = run_envtools("module", os.fsdecode(base + b"/bad\xff"), "--name", "powerai/1.0",
                     "--out", tmp_path / "m", check=False)
    assert p.returncode == 2 and "not UTF-8 (0xff)" in p.stderr, p.stderr


@pytest.mark.parametrize("name", ["power\nai/1.0", "p/./1.0", "p//1.0", "powerai/"])
def test_bad_module_names_are_refused(name, env, tmp_path):
    p = subprocess.run([*ENVTOOLS, "module", str(env), "--name", name, "--out",
                        str(tmp_path / "m")], capture_output=True, text=True)
    assert p.returncode == 2 and ("bad module name" in p.stderr or "newline" in p.stderr), \
        p.stderr
    assert not (tmp_path / "m").exists()


def test_hostile_module_name_records_and_env_vars(env, tmp_path):
    """Name, package names/versions and env_vars are data too: escaped, loaded exactly."""
    clone = tmp_path / "c"
    run_envtools("clone", env, clone)
    meta = clone / "conda-meta"
    rec = next(meta.glob("demo-meta-*.json"))
    data = json.loads(rec.read_text())
    data["version"] = ("1.0]==]os.execute('touch SENTINEL')--[==[\"$(touch SENTINEL)"
                       "[exec touch SENTINEL]")
    rec.write_text(json.dumps(data))
    weird = ("$(touch SENTINEL) `touch SENTINEL` [exec touch SENTINEL] \"); "
             "os.execute('touch SENTINEL') --]==] {\\} ; café 'x' \\")
    (meta / "state").write_text(json.dumps({"env_vars": {"HOSTILE": weird,
                                                         "BAD NAME": "ignored"}}))
    name = "powerai/1.0"
    out = tmp_path / "modulefiles"
    work = tmp_path / "work"
    work.mkdir()
    run_envtools("module", clone, "--name", name, "--out", out, cwd=work)
    assert "BAD NAME" not in (out / "powerai" / "1.0.lua").read_text()
    for system in SYSTEMS:
        before, loaded, after, text = load_unload(system, out, work,
                                                  body="module help powerai/1.0 2>&1")
        assert loaded["HOSTILE"] == weird, system
        # the package list in help (wrapped: compared with whitespace collapsed)
        assert " ".join(data["version"].split()) in " ".join(text.split()), (system, text)
        assert visible(after) == visible(before), system
    assert not list(tmp_path.rglob("SENTINEL"))


@pytest.mark.parametrize(("where", "value", "named"), [
    ("state", "first\ntouch SENTINEL", "a newline"),
    ("state", "bell\x07", "U+0007"),
    ("record", "1.0\x1b]0;title\x07", "an escape (ESC)"),
    ("state", "--set-if-undef", "take as an option"),
])
def test_values_the_module_systems_cannot_set_are_refused(where, value, named, env,
                                                          tmp_path):
    """Lmod and Modules both print a value with a newline into the shell code the user's
    shell evaluates, where the rest runs as a command: such values are refused."""
    clone = tmp_path / "c"
    run_envtools("clone", env, clone)
    meta = clone / "conda-meta"
    if where == "state":
        (meta / "state").write_text(json.dumps({"env_vars": {"V": value}}))
    else:
        rec = next(meta.glob("demo-meta-*.json"))
        rec.write_text(json.dumps({**json.loads(rec.read_text()), "version": value}))
    p = run_envtools("module", clone, "--name", "powerai/1.0", "--out", tmp_path / "m",
                     check=False, cwd=tmp_path)
    assert p.returncode == 2 and named in p.stderr and "hint:" in p.stderr, p.stderr
    assert not (tmp_path / "m").exists() and not list(tmp_path.rglob("SENTINEL"))


def test_lua_long_bracket_level_is_chosen_by_content():
    from envtools.commands.module import lua_long, lua_str, tcl_str

    assert lua_long("a]]b]=]c]==]") == "[===[\na]]b]=]c]==]\n]===]"
    assert lua_long("plain") == "[[\nplain\n]]"
    assert lua_long("bell\x07") == lua_str("bell\x07") == '"bell\\007"'
    assert lua_str('a\\"\n') == '"a\\\\\\"\\n"'
    assert tcl_str('$x [y] {z} \\ "') == '"\\$x \\[y\\] \\{z\\} \\\\ \\""'

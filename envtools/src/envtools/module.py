"""``envtools module``: modulefiles that do what ``conda activate`` does, reversibly.

The env's ``etc/conda/activate.d/*.sh`` scripts are run once, now, in a clean bash with
the activation variables set, and the changes they make are written into the modulefile
as prepend/append/pushenv commands (what Lmod's ``sh_to_modulefile`` does). That gives
the same result in Lmod and Environment Modules, and every command is one the module
system can undo: ``pushenv`` restores the previous value on unload, path commands are
reference counted. The env is read-only, so its scripts cannot change behind our back;
re-run ``envtools module`` after changing an env.

Activation follows ``conda activate --stack``: PATH gets ``<prefix>/bin`` in front,
CONDA_PREFIX / CONDA_DEFAULT_ENV / CONDA_PROMPT_MODIFIER are set, CONDA_SHLVL goes up by
one and a previously active env is kept as CONDA_PREFIX_<n> (``setenv``: conda's own
stacking never leaves one behind, so unload unsets it).
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

from envtools.errors import EnvtoolsError
from envtools.prefix_records import Prefix
from envtools.readonly import read_marker, refuse_readonly

PATH_LIKE = {"PATH", "LD_LIBRARY_PATH", "MANPATH", "PYTHONPATH", "PKG_CONFIG_PATH",
             "CPATH", "LIBRARY_PATH", "XDG_DATA_DIRS", "CMAKE_PREFIX_PATH", "INFOPATH"}
# variables the scripts see but that are the shell's own business
IGNORED = {"_", "SHLVL", "PWD", "OLDPWD", "BASH_EXECUTION_STRING", "RANDOM", "LINENO"}


@dataclass
class Change:
    """One environment change: op is prepend, append or set."""

    op: str
    var: str
    value: str


def _env_of(script: str, base: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(
        ["bash", "--noprofile", "--norc", "-c", script + "\nenv -0"],
        env=base, capture_output=True, check=False,
    )
    if out.returncode != 0:
        raise EnvtoolsError(
            f"an activate.d script failed (exit {out.returncode}): "
            f"{out.stderr.decode(errors='replace').strip()[:500]}",
            "fix the script in the env's etc/conda/activate.d, or remove it",
        )
    env = {}
    for item in out.stdout.split(b"\0"):
        if b"=" in item:
            k, _, v = item.decode(errors="replace").partition("=")
            env[k] = v
    return env


def activate_d_changes(prefix: Path, base_vars: dict[str, str]) -> list[Change]:
    """Run the env's bash activate.d scripts and turn their effect into module commands."""
    scripts = sorted((prefix / "etc" / "conda" / "activate.d").glob("*.sh"))
    if not scripts:
        return []
    base = {"PATH": "/usr/bin:/bin", "HOME": os.environ.get("HOME", "/"),
            "LANG": "C", **base_vars}
    before = _env_of("true", base)
    body = "\n".join(f". {json.dumps(str(s))}" for s in scripts)
    after = _env_of(body, base)
    changes: list[Change] = []
    for var in sorted(after):
        if var in IGNORED:
            continue
        old, new = before.get(var), after[var]
        if old == new:
            continue
        if old and var in PATH_LIKE and new.endswith(":" + old):
            for p in reversed(new[: -len(old) - 1].split(":")):
                changes.append(Change("prepend", var, p))
        elif old and var in PATH_LIKE and new.startswith(old + ":"):
            for p in new[len(old) + 1:].split(":"):
                changes.append(Change("append", var, p))
        elif not old and var in PATH_LIKE:
            for p in reversed(new.split(":")):
                changes.append(Change("prepend", var, p))
        else:
            changes.append(Change("set", var, new))
    return changes


def _state_env_vars(prefix: Path) -> dict[str, str]:
    """``conda env config vars set`` stores these in conda-meta/state; conda activate sets them."""
    try:
        data = json.loads((prefix / "conda-meta" / "state").read_text())
        return {str(k): str(v) for k, v in (data.get("env_vars") or {}).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def _lua_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid Lua string literal for our content


def _tcl_str(s: str) -> str:
    return "{" + s + "}" if not any(c in s for c in "{}\\") else '"' + "".join(
        "\\" + c if c in '"$[]\\{}' else c for c in s) + '"'


def _help_text(prefix: Path, name: str, pkgs: list[tuple[str, str]], readonly: bool) -> str:
    ro = "read-only " if readonly else ""
    lines = [
        f"{name}: a {ro}conda environment of the DDL-CE distribution at",
        f"  {prefix}",
        "",
        "Loading it does what `conda activate` does: puts its bin/ first on PATH,",
        "sets CONDA_PREFIX, CONDA_DEFAULT_ENV and CONDA_SHLVL, and runs its",
        "activate.d settings; unloading undoes all of it.",
        "",
        "To add packages, clone it (fast: linked from its package cache), then use",
        "the clone:",
        f"  envtools clone {prefix} $HOME/envs/mine --add SPEC",
        "  conda activate $HOME/envs/mine    # or prepend $HOME/envs/mine/bin to PATH",
        "Then check that your additions still fit the curated set:",
        "  envtools validate $HOME/envs/mine",
        "",
        f"{len(pkgs)} packages: " + ", ".join(f"{n} {v}" for n, v in pkgs),
    ]
    return "\n".join(lines)


def _wrap(text: str, width: int = 78) -> str:
    import textwrap

    out = []
    for line in text.splitlines():
        if len(line) <= width:
            out.append(line)
        else:
            out += textwrap.wrap(line, width, subsequent_indent="  ")
    return "\n".join(out)


def render_lua(prefix: Path, name: str, pkgs, changes, readonly: bool, desc: str) -> str:
    modname, _, version = name.partition("/")
    help_text = _wrap(_help_text(prefix, name, pkgs, readonly))
    ext = ", ".join(f"{n}/{v}" for n, v in pkgs)
    L = [
        "-- -*- lua -*-",
        f"-- Generated by envtools module from {prefix}; re-run it instead of editing.",
        f"whatis({_lua_str('Name: ' + modname)})",
        f"whatis({_lua_str('Version: ' + (version or 'default'))})",
        f"whatis({_lua_str('Description: ' + desc)})",
        f"whatis({_lua_str('Prefix: ' + str(prefix))})",
        f"whatis({_lua_str('Clone: envtools clone ' + str(prefix) + ' DEST --add SPEC')})",
        f"help([==[\n{help_text}\n]==])",
        'family("python")',
        f"extensions({_lua_str(ext)})",
        f"local prefix = {_lua_str(str(prefix))}",
        "-- conda activate --stack: CONDA_SHLVL + 1, the previous env kept in CONDA_PREFIX_<n>",
        'local shlvl = tonumber(os.getenv("CONDA_SHLVL") or "") or 0',
        'if mode() == "unload" then shlvl = shlvl - 1 end',
        'if mode() == "unload" then',
        '  if os.getenv("CONDA_PREFIX_" .. shlvl) then setenv("CONDA_PREFIX_" .. shlvl, "") end',
        'elseif os.getenv("CONDA_PREFIX") then',
        '  setenv("CONDA_PREFIX_" .. shlvl, os.getenv("CONDA_PREFIX"))',
        "end",
        'pushenv("CONDA_SHLVL", tostring(shlvl + 1))',
        'pushenv("CONDA_PREFIX", prefix)',
        'pushenv("CONDA_DEFAULT_ENV", prefix)',
        f'pushenv("CONDA_PROMPT_MODIFIER", {_lua_str("(" + name + ") ")})',
        'prepend_path("PATH", pathJoin(prefix, "bin"))',
    ]
    if changes:
        L.append("-- from the env's etc/conda/activate.d scripts and conda-meta/state env_vars")
    for c in changes:
        fn = {"prepend": "prepend_path", "append": "append_path", "set": "pushenv"}[c.op]
        L.append(f"{fn}({_lua_str(c.var)}, {_lua_str(c.value)})")
    return "\n".join(L) + "\n"


def render_tcl(prefix: Path, name: str, pkgs, changes, readonly: bool, desc: str) -> str:
    modname, _, version = name.partition("/")
    help_text = _wrap(_help_text(prefix, name, pkgs, readonly))
    T = [
        "#%Module1.0",
        f"## Generated by envtools module from {prefix}; re-run it instead of editing.",
        f"module-whatis {_tcl_str('Name: ' + modname)}",
        f"module-whatis {_tcl_str('Version: ' + (version or 'default'))}",
        f"module-whatis {_tcl_str('Description: ' + desc)}",
        f"module-whatis {_tcl_str('Prefix: ' + str(prefix))}",
        f"module-whatis {_tcl_str('Clone: envtools clone ' + str(prefix) + ' DEST --add SPEC')}",
        "proc ModulesHelp { } {",
        *[f"    puts stderr {_tcl_str(line)}" for line in help_text.splitlines()],
        "}",
        "family python",
        f"set prefix {_tcl_str(str(prefix))}",
        "# conda activate --stack: CONDA_SHLVL + 1, the previous env kept in CONDA_PREFIX_<n>",
        "set shlvl 0",
        "if {[info exists ::env(CONDA_SHLVL)]",
        "    && [string is integer -strict $::env(CONDA_SHLVL)]} {",
        "    set shlvl $::env(CONDA_SHLVL)",
        "}",
        "if {[module-info mode unload]} {",
        "    incr shlvl -1",
        "    if {[info exists ::env(CONDA_PREFIX_$shlvl)]} { setenv CONDA_PREFIX_$shlvl {} }",
        "} elseif {[info exists ::env(CONDA_PREFIX)]} {",
        "    setenv CONDA_PREFIX_$shlvl $::env(CONDA_PREFIX)",
        "}",
        "pushenv CONDA_SHLVL [expr {$shlvl + 1}]",
        "pushenv CONDA_PREFIX $prefix",
        "pushenv CONDA_DEFAULT_ENV $prefix",
        f"pushenv CONDA_PROMPT_MODIFIER {_tcl_str('(' + name + ') ')}",
        "prepend-path PATH $prefix/bin",
    ]
    if changes:
        T.append("# from the env's etc/conda/activate.d scripts and conda-meta/state env_vars")
    for c in changes:
        fn = {"prepend": "prepend-path", "append": "append-path", "set": "pushenv"}[c.op]
        T.append(f"{fn} {c.var} {_tcl_str(c.value)}")
    return "\n".join(T) + "\n"


def write_modulefiles(prefix: Path, name: str, out: Path, fmt: str = "both") -> list[Path]:
    """Write ``out/<name>.lua`` (Lmod) and/or ``out/<name>`` (Tcl); returns the paths."""
    if fmt not in ("lmod", "tcl", "both"):
        raise EnvtoolsError(f"unknown --format {fmt!r}", "use lmod, tcl or both")
    if not name or name.startswith("/") or ".." in name.split("/") or name.count("/") > 3:
        raise EnvtoolsError(f"bad module name {name!r}", "use NAME/VERSION, e.g. powerai/1.0")
    pre = Prefix.load(prefix)
    root = pre.root
    out = Path(os.path.abspath(out))
    refuse_readonly(out, "write modulefiles into")
    pkgs = sorted((r.name, r.version) for r in pre.records)
    base = {
        "CONDA_PREFIX": str(root),
        "CONDA_DEFAULT_ENV": str(root),
        "CONDA_SHLVL": "1",
        "CONDA_PROMPT_MODIFIER": f"({name}) ",
        "PATH": f"{root}/bin:/usr/bin:/bin",
    }
    state_vars = _state_env_vars(root)
    changes = [Change("set", k, v) for k, v in sorted(state_vars.items())]
    changes += activate_d_changes(root, {**base, **state_vars})
    changes = [c for c in changes if c.var not in base or c.var == "PATH" and c.value != str(
        root / "bin")]
    readonly = read_marker(root) is not None
    top = next((r for r in pre.records if r.name == name.partition("/")[0]), None)
    desc = (f"{top.name} {top.version}: " if top else "") + (
        "DDL-CE curated distributed deep-learning environment")
    written = []
    target = out / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if fmt in ("lmod", "both"):
        p = target.with_name(target.name + ".lua")
        p.write_text(render_lua(root, name, pkgs, changes, readonly, desc))
        written.append(p)
    if fmt in ("tcl", "both"):
        target.write_text(render_tcl(root, name, pkgs, changes, readonly, desc))
        written.append(target)
    return written

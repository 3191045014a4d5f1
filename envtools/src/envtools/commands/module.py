r"""``envtools module``: modulefiles that do what ``conda activate`` does, reversibly.

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

Everything written into a modulefile from the env is data, never code: the prefix, the
module name, package names and versions (from records anyone may have written),
``conda-meta/state`` env_vars and what the activate.d scripts set. A prefix or a module
name that cannot be written as a literal in both languages (a control character such as
a newline, or bytes that are not UTF-8) is refused, and so is a prefix holding ``:``
(PATH cannot). Everything else is escaped for each language: Lua gets double-quoted
strings with ``\\``, ``\"`` and decimal escapes for control characters (``\ddd``),
and the help text in a long bracket whose level is chosen so that nothing in the text
can close it; Tcl gets double-quoted words with every character that Tcl substitutes
(``\ " $ [ ] { }``) backslash-escaped and control characters as ``\uXXXX``. Text
that is not ASCII (``café``, CJK) is written as UTF-8 and loads in both.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path

from envtools.errors import EnvtoolsError
from envtools.prefix.readonly import read_marker, read_prefix_info, refuse_readonly
from envtools.prefix.records import Prefix
from envtools.solve import cudaenv

PATH_LIKE = {"PATH", "LD_LIBRARY_PATH", "MANPATH", "PYTHONPATH", "PKG_CONFIG_PATH",
             "CPATH", "LIBRARY_PATH", "XDG_DATA_DIRS", "CMAKE_PREFIX_PATH", "INFOPATH"}
# variables the scripts see but that are the shell's own business
IGNORED = {"_", "SHLVL", "PWD", "OLDPWD", "BASH_EXECUTION_STRING", "RANDOM", "LINENO"}
_VAR_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


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
    body = "\n".join(f". {shlex.quote(str(s))}" for s in scripts)
    after = _env_of(body, base)
    changes: list[Change] = []
    for var in sorted(after):
        if var in IGNORED or not _VAR_NAME.fullmatch(var):
            continue  # (exported bash functions, BASH_FUNC_f%%, are not variables)
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
        return {str(k): str(v) for k, v in (data.get("env_vars") or {}).items()
                if _VAR_NAME.fullmatch(str(k))}
    except (OSError, ValueError, AttributeError):
        return {}


# ------------------------------------------------------------------ literals

#: characters no literal in a modulefile may hold, with their names for the error
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_CONTROL_NAMES = {"\n": "a newline", "\r": "a carriage return", "\t": "a tab",
                  "\x00": "a NUL byte", "\x1b": "an escape (ESC)"}
#: words Environment Modules takes as options wherever they appear among a path or
#: setenv command's values
_TCL_OPTION_WORDS = {"--append-on-unload", "--prepend-on-unload", "--remove-on-unload",
                     "--noop-on-unload", "--set-if-undef"}


def _char_name(c: str) -> str:
    if 0xD800 <= ord(c) <= 0xDFFF:
        return f"a byte that is not UTF-8 (0x{ord(c) - 0xDC00:02x})"
    return _CONTROL_NAMES.get(c, f"the control character U+{ord(c):04X}")


def check_literal(what: str, text: str, hint: str) -> None:
    """Refuse ``text`` if a character in it cannot be written into a modulefile: control
    characters (newlines included) and bytes that are not UTF-8."""
    m = _CONTROL.search(text)
    if m:
        raise EnvtoolsError(
            f"{what} {text!r} contains {_char_name(m.group())} (at position {m.start()}), "
            "which cannot be written into a Lua or Tcl modulefile safely", hint)


def _check_value(what: str, text: str) -> None:
    """A value from the env: no control characters either. Both module systems print a
    value with a newline into the shell code the user's shell evaluates, where the text
    after the newline runs as a command (seen with Lmod 8.6 and Modules 5)."""
    check_literal(what, text, "fix it in the env (its conda-meta records, conda-meta/state "
                  "or etc/conda/activate.d scripts), then write the modulefiles again")
    if text in _TCL_OPTION_WORDS:
        raise EnvtoolsError(f"{what} is {text!r}, which Environment Modules would take as "
                            "an option", "fix the value in the env")


_LUA = {ord("\\"): "\\\\", ord('"'): '\\"', ord("\n"): "\\n"}
_LUA.update({c: f"\\{c:03d}" for c in [*range(0x01, 0x20), 0x7F] if c != 0x0A})
_TCL = {ord(c): "\\" + c for c in '\\"$[]{}'}
_TCL.update({ord("\n"): "\\n"})
_TCL.update({c: f"\\u{c:04x}" for c in [*range(0x01, 0x20), 0x7F] if c != 0x0A})


def lua_str(s: str) -> str:
    """A Lua string literal holding exactly ``s`` (UTF-8 text passes through as bytes;
    Lua 5.3 has no \\uXXXX escape, which is why JSON strings are not Lua strings).
    Control characters are escaped too, although every caller refuses them first."""
    return '"' + s.translate(_LUA) + '"'


def lua_long(s: str) -> str:
    """A Lua long-bracket string holding ``s`` and a final newline: its level is the
    lowest whose closing bracket does not occur in ``s`` (the opening newline is dropped
    by Lua, and the newline before the closer keeps ``s`` from running into it). Used for
    the help text, which stays readable in the file; anything with control characters
    other than newlines is written as a quoted string."""
    if re.search(r"[\x00-\x09\x0b-\x1f\x7f]", s):
        return lua_str(s)
    level = 0
    while "]" + "=" * level + "]" in s:
        level += 1
    eq = "=" * level
    return f"[{eq}[\n{s}\n]{eq}]"


def tcl_str(s: str) -> str:
    """A Tcl word holding exactly ``s``: double-quoted, with every character Tcl would
    substitute (command ``[...]``, variable ``$``, backslash) or use to end the word
    escaped, so nothing in ``s`` is ever evaluated. Other text is left as it is, not
    written as \\uXXXX: Tcl reads the file and writes the environment in the same
    system encoding (UTF-8, or ISO 8859-1 in the C locale, byte for byte), so UTF-8 text
    arrives unchanged either way, where a \\u escape would be re-encoded."""
    return '"' + s.translate(_TCL) + '"'


def _help_text(prefix: Path, name: str, pkgs: list[tuple[str, str]], readonly: bool) -> str:
    """The help text. Only the package list is wrapped: the prefix stays on one line, and
    in the clone command it is shell-quoted, so the line can be copied into a shell
    whatever the path holds."""
    import textwrap


    ro = "read-only " if readonly else ""
    channels = [c for c in read_prefix_info(prefix).get("channels") or []
                if isinstance(c, str)]
    packages = f"{len(pkgs)} packages: " + ", ".join(f"{n} {v}" for n, v in pkgs)
    lines = [
        f"{name}: a {ro}conda environment of the DDL-CE distribution at",
        f"  {prefix}",
        "",
        "Loading it does what `conda activate` does: puts its bin/ first on PATH,",
        "sets CONDA_PREFIX, CONDA_DEFAULT_ENV and CONDA_SHLVL, and runs its",
        "activate.d settings; unloading undoes all of it.",
        "",
        "To add packages, clone it (fast: linked from its package cache), then add",
        "to the clone with envtools add (conda install) or pip:",
        f"  envtools clone {shlex.quote(str(prefix))} $HOME/envs/mine",
        "  envtools add $HOME/envs/mine SPEC   # or: $HOME/envs/mine/bin/python -m pip install P",
        "  conda activate $HOME/envs/mine    # or prepend $HOME/envs/mine/bin to PATH",
        "Then check that your additions still fit the curated set:",
        "  envtools validate $HOME/envs/mine",
        "",
        *(["envtools add takes packages from the channels it was installed from:",
           *[f"  {c}" for c in channels], ""] if channels else []),
        *textwrap.wrap(packages, 78, subsequent_indent="  ", break_on_hyphens=False),
    ]
    return "\n".join(lines)


def _clone_hint(prefix: Path) -> str:
    return f"Clone: envtools clone {shlex.quote(str(prefix))} DEST --add SPEC"


def render_lua(prefix: Path, name: str, pkgs, changes, readonly: bool, desc: str) -> str:
    modname, _, version = name.partition("/")
    help_text = _help_text(prefix, name, pkgs, readonly)
    ext = ", ".join(f"{n}/{v}" for n, v in pkgs)
    L = [
        "-- -*- lua -*-",
        "-- Generated by envtools module; re-run it instead of editing.",
        f"whatis({lua_str('Name: ' + modname)})",
        f"whatis({lua_str('Version: ' + (version or 'default'))})",
        f"whatis({lua_str('Description: ' + desc)})",
        f"whatis({lua_str('Prefix: ' + str(prefix))})",
        f"whatis({lua_str(_clone_hint(prefix))})",
        f"help({lua_long(help_text)})",
        'family("python")',
        f"extensions({lua_str(ext)})",
        f"local prefix = {lua_str(str(prefix))}",
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
        f'pushenv("CONDA_PROMPT_MODIFIER", {lua_str("(" + name + ") ")})',
        'prepend_path("PATH", pathJoin(prefix, "bin"))',
    ]
    if changes:
        L.append("-- from the env's etc/conda/activate.d scripts and conda-meta/state env_vars")
    for c in changes:
        fn = {"prepend": "prepend_path", "append": "append_path", "set": "pushenv"}[c.op]
        L.append(f"{fn}({lua_str(c.var)}, {lua_str(c.value)})")
    return "\n".join(L) + "\n"


def render_tcl(prefix: Path, name: str, pkgs, changes, readonly: bool, desc: str) -> str:
    modname, _, version = name.partition("/")
    help_text = _help_text(prefix, name, pkgs, readonly)
    T = [
        "#%Module1.0",
        "## Generated by envtools module; re-run it instead of editing.",
        f"module-whatis {tcl_str('Name: ' + modname)}",
        f"module-whatis {tcl_str('Version: ' + (version or 'default'))}",
        f"module-whatis {tcl_str('Description: ' + desc)}",
        f"module-whatis {tcl_str('Prefix: ' + str(prefix))}",
        f"module-whatis {tcl_str(_clone_hint(prefix))}",
        "proc ModulesHelp { } {",
        *[f"    puts stderr {tcl_str(line)}" for line in help_text.splitlines()],
        "}",
        "family python",
        f"set prefix {tcl_str(str(prefix))}",
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
        f"pushenv CONDA_PROMPT_MODIFIER {tcl_str('(' + name + ') ')}",
        "prepend-path PATH $prefix/bin",
    ]
    if changes:
        T.append("# from the env's etc/conda/activate.d scripts and conda-meta/state env_vars")
    for c in changes:
        fn = {"prepend": "prepend-path", "append": "append-path", "set": "pushenv"}[c.op]
        T.append(f"{fn} {tcl_str(c.var)} {tcl_str(c.value)}")
    return "\n".join(T) + "\n"


def default_name(prefix: Path) -> str:
    """``powerai/1.0`` for the CPU build of an env installed for ``powerai 1.0.x``, and
    ``powerai/1.0-cuda`` for its CUDA build, so both can sit side by side on one MODULEPATH.

    The package is the first spec the env was installed for (its read-only marker);
    the CUDA build is told by its packages' ``__cuda`` requirements (see cudaenv).
    """

    pre = Prefix.load(prefix)
    marker = read_marker(pre.root) or {}
    specs = marker.get("specs") if isinstance(marker.get("specs"), list) else []
    top = None
    if specs:
        first = re.split(r"[\s=<>!~\[]", str(specs[0]).strip(), maxsplit=1)[0]
        top = pre.by_name().get(first)
    if top is None:
        raise EnvtoolsError(
            f"cannot tell a module name for {pre.root}: it records no package it was installed "
            "for", "give one: envtools module PREFIX --name NAME/VERSION (e.g. powerai/1.0)")
    version = ".".join(top.version.split(".")[:2])
    cuda = "-cuda" if cudaenv.env_cuda(pre.records) is not None else ""
    return f"{top.name}/{version}{cuda}"


def write_modulefiles(prefix: Path, name: str | None, out: Path,
                      fmt: str = "both") -> list[Path]:
    """Write ``out/<name>.lua`` (Lmod) and/or ``out/<name>`` (Tcl); returns the paths.

    Without a name, ``default_name`` picks one (``powerai/1.0`` or ``powerai/1.0-cuda``).
    """
    if fmt not in ("lmod", "tcl", "both"):
        raise EnvtoolsError(f"unknown --format {fmt!r}", "use lmod, tcl or both")
    if name is None:
        name = default_name(prefix)
    parts = name.split("/")
    if not name or len(parts) > 4 or any(p in ("", ".", "..") for p in parts):
        raise EnvtoolsError(f"bad module name {name!r}", "use NAME/VERSION, e.g. powerai/1.0")
    check_literal("the module name", name,
                  "use NAME/VERSION in printable characters, e.g. powerai/1.0")
    pre = Prefix.load(prefix)
    root = pre.root
    move = ("move or clone the environment to a path without it (envtools clone "
            "OLD NEW), then write its modulefiles")
    check_literal("the environment's path", str(root), move)
    if ":" in str(root):
        raise EnvtoolsError(f"the environment's path {str(root)!r} contains ':', which PATH "
                            "and every other search path use to separate entries", move)
    out = Path(os.path.abspath(out))
    refuse_readonly(out, "write modulefiles into")
    pkgs = sorted((r.name, r.version) for r in pre.records)
    for n, v in pkgs:
        _check_value("a package name", n)
        _check_value(f"the version of {n!r}", v)
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
    for c in changes:
        _check_value(f"the value {c.var} gets", c.value)
    readonly = read_marker(root) is not None
    top = next((r for r in pre.records if r.name == name.partition("/")[0]), None)
    desc = (f"{top.name} {top.version}: " if top else "") + (
        "DDL-CE curated distributed deep-learning environment")
    need = cudaenv.env_cuda(pre.records)
    if need is not None:
        desc += (f" (CUDA {need.version} build: needs an NVIDIA driver for CUDA "
                 f"{need.version} or newer)")
    written = []
    target = out / name
    target.parent.mkdir(parents=True, exist_ok=True)
    if fmt in ("lmod", "both"):
        p = target.with_name(target.name + ".lua")
        p.write_text(render_lua(root, name, pkgs, changes, readonly, desc), encoding="utf-8")
        written.append(p)
    if fmt in ("tcl", "both"):
        target.write_text(render_tcl(root, name, pkgs, changes, readonly, desc),
                          encoding="utf-8")
        written.append(target)
    return written

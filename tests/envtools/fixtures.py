"""Build the fixture conda packages once (cached by recipe contents) and make envs from them.

The recipes under recipes/ need no channel at all: their build scripts only use the
system gcc and sh. Built packages are kept in ~/.cache/ddl-ce/envtools-fixtures/<hash>,
so a test session builds them at most once per change of the recipes.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import sys
import sysconfig
import warnings
from pathlib import Path

RECIPES = Path(__file__).parent / "recipes"
SYS_PYTHON = Path("/usr/bin/python3")


def system_python() -> Path:
    """The interpreter the stand-in python package points at (resolved, versioned)."""
    p = SYS_PYTHON if SYS_PYTHON.exists() else Path(sys.executable)
    return p.resolve()


def _subst() -> dict[str, str]:
    import subprocess

    py = system_python()
    out = subprocess.run(
        [str(py), "-c", "import sys,sysconfig;print('%d.%d' % sys.version_info[:2]);"
         "print(sys.version.split()[0]);print(sysconfig.get_config_var('SOABI'))"],
        capture_output=True, text=True, check=True,
    ).stdout.split()
    pyver, pyfull, soabi = out
    wheel = pip_wheel()
    pytag = soabi.split("-")[0] + "-" + soabi.split("-")[1] if soabi.count("-") >= 1 else soabi
    return {
        "@PYVER@": pyver,
        "@PYFULL@": pyfull,
        "@PYTAG@": pytag,  # e.g. cpython-311
        "@SYSPY@": str(py),
        "@SYSPYDIR@": str(py.parent),
        "@PIPWHL@": str(wheel or ""),
        "@PIPVER@": wheel.name.split("-")[1] if wheel else "",
    }


#: where Debian's python3-pip-whl keeps the pip wheel the fixture ``pip`` is made from
PIP_WHEELS = Path("/usr/share/python-wheels")
#: the fixture packages that go into the second channel (the upstream stand-in)
UPSTREAM = ("pip",)


def pip_wheel() -> Path | None:
    found = sorted(PIP_WHEELS.glob("pip-*-py3-none-any.whl"))
    return found[-1] if found else None


def _render(dst: Path) -> str:
    """Copy the recipes with the system python's details filled in; returns a content hash."""
    subst = _subst()
    h = hashlib.sha256()
    for recipe in sorted(RECIPES.glob("*/recipe.yaml")):
        if recipe.parent.name == "pip" and not subst["@PIPWHL@"]:
            continue  # (no pip wheel here: the pip tests skip)
        text = recipe.read_text()
        for k, v in subst.items():
            text = text.replace(k, v)
        out = dst / recipe.parent.name / "recipe.yaml"
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text)
        h.update(recipe.parent.name.encode() + b"\0" + text.encode())
    return h.hexdigest()[:16]


def upstream_channel(channel: Path) -> Path:
    """The second fixture channel beside ``channel`` (the pip package, when it was made)."""
    return channel.parent / "channel-upstream"


def build_channel() -> Path:
    """Return an indexed local channel with every fixture package, building if needed;
    the packages named in UPSTREAM go to a second channel (:func:`upstream_channel`)."""
    import rattler
    import rattler_build

    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddl-ce"
    staging = base / "envtools-fixtures" / "staging"
    shutil.rmtree(staging, ignore_errors=True)
    key = _render(staging / "recipes")
    final = base / "envtools-fixtures" / key
    channel = final / "channel"
    if (channel / "linux-64" / "repodata.json").exists():
        shutil.rmtree(staging, ignore_errors=True)
        return channel
    out = staging / "out"
    ch = staging / "channel"
    recipes = sorted((staging / "recipes").glob("*/recipe.yaml"))
    # two rounds: recipes with host requirements (noarch: python needs a python in its
    # host env) resolve them from the channel the first round made
    first = [r for r in recipes if "host:" not in r.read_text()]
    for batch, channels in ((first, None), ([r for r in recipes if r not in first], [ch])):
        if not batch:
            continue
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            rattler_build.build_recipes(
                [str(p) for p in batch],
                output_dir=str(out),
                test="skip",
                channel=[c.as_uri() for c in channels] if channels else None,
            )
        for sub in ("linux-64", "noarch"):
            (ch / sub).mkdir(parents=True, exist_ok=True)
            for pkg in (out / sub).glob("*.conda") if (out / sub).exists() else []:
                shutil.copy2(pkg, ch / sub / pkg.name)
        asyncio.run(rattler.index.index_fs(ch, write_zst=False, write_shards=False))
    up = staging / "channel-upstream"
    for sub in ("linux-64", "noarch"):
        (up / sub).mkdir(parents=True, exist_ok=True)
        for pkg in sorted((ch / sub).glob("*.conda")):
            if pkg.name.rsplit("-", 2)[0] in UPSTREAM:
                os.rename(pkg, up / sub / pkg.name)
    for c in (ch, up):
        asyncio.run(rattler.index.index_fs(c, write_zst=False, write_shards=False))
    final.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(channel, ignore_errors=True)
    shutil.rmtree(upstream_channel(channel), ignore_errors=True)
    os.rename(up, upstream_channel(channel))
    os.rename(ch, channel)
    shutil.rmtree(staging, ignore_errors=True)
    return channel


if __name__ == "__main__":  # handy for debugging: python tests/envtools/fixtures.py
    print(build_channel(), sysconfig.get_config_var("SOABI"))

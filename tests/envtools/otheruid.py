"""A python and an envtools that another uid can run, for the tests that run as one.

The tests' own interpreter often sits where another uid cannot reach it: a checkout
under a private (0700) home, its .venv, or a venv made from a python under /root. So,
once per session, a minimal copy of what ``python -m envtools`` needs goes into a
directory every user can read: the base interpreter (and libpython, relinked to find
its copy: patchelf), its standard library without the parts nothing here imports,
the site-packages of envtools' runtime requirements, and envtools itself. The copy
finds its stdlib from where it lies, so it needs no PYTHONHOME, PYTHONPATH or
LD_LIBRARY_PATH, which would leak into the programs of the envs the tests make.
"""

from __future__ import annotations

import compileall
import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

from envtools.errors import EnvtoolsError
from packaging.requirements import Requirement

import envtools

# stdlib parts that neither envtools nor its requirements import: ~180 MiB less to copy
_STDLIB_SKIP = {"site-packages", "dist-packages", "test", "idlelib", "tkinter", "turtledemo",
                "ensurepip", "lib2to3"}


def _runtime_dists() -> list[md.Distribution]:
    """envtools' distribution and what it needs to run (its Requires-Dist, closed)."""
    seen: dict[str, md.Distribution] = {}
    todo = ["envtools"]
    while todo:
        dist = md.distribution(todo.pop())
        key = dist.metadata["Name"].lower().replace("_", "-")
        if key in seen:
            continue
        seen[key] = dist
        for spec in dist.requires or []:
            req = Requirement(spec)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def _copy_dist(dist: md.Distribution, site: Path) -> None:
    """The files a wheel installed into site-packages (its RECORD), not its scripts."""
    root = Path(dist.locate_file("")).resolve()
    for f in dist.files or []:
        src = Path(dist.locate_file(f)).resolve()
        if not src.is_relative_to(root) or not src.is_file():
            continue  # bin/ scripts, or a pyc that RECORD names but is gone
        dest = site / src.relative_to(root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest)


def _interpreter(dest: Path) -> Path:
    """The base interpreter, its stdlib and lib-dynload, and libpython when shared."""
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    exe = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    stdlib = Path(sysconfig.get_path("stdlib"))
    lib = dest / "lib" / minor
    shutil.copytree(stdlib, lib, symlinks=True,
                    ignore=lambda d, names: [n for n in names if Path(d) == stdlib and (
                        n in _STDLIB_SKIP or n.startswith("config-"))])
    dynload = next((Path(p) for p in sys.path if p.endswith("lib-dynload")), None)
    if dynload is not None and not (lib / "lib-dynload").exists():
        shutil.copytree(dynload, lib / "lib-dynload")
    python = dest / "bin" / minor
    python.parent.mkdir(parents=True)
    shutil.copy2(exe, python)
    if sysconfig.get_config_var("Py_ENABLE_SHARED"):
        soname = sysconfig.get_config_var("INSTSONAME")
        shutil.copy2(Path(sysconfig.get_config_var("LIBDIR")) / soname, dest / "lib" / soname)
        if not shutil.which("patchelf"):
            raise EnvtoolsError(f"{exe} loads a shared {soname}: patchelf is needed to make "
                                "a copy of it that another uid can run",
                                "apt-get install patchelf")
        subprocess.run(["patchelf", "--set-rpath", "$ORIGIN/../lib", python], check=True)
    return python


def build(parent: str | os.PathLike[str] = "/tmp") -> tuple[Path, Path]:
    """(directory, its python): a copy of this interpreter with envtools and its
    requirements in its site-packages, readable and runnable by every user. The caller
    removes the directory."""
    top = Path(tempfile.mkdtemp(prefix="envtools-otheruid-", dir=parent))
    try:
        python = _interpreter(top)
        minor = python.name
        site = top / "lib" / minor / "site-packages"
        for dist in _runtime_dists():
            if dist.metadata["Name"] != "envtools":
                _copy_dist(dist, site)
        # envtools is an editable install: its package as it is now, and its metadata
        pkg = Path(envtools.__file__).resolve().parent
        shutil.copytree(pkg, site / "envtools", ignore=shutil.ignore_patterns("__pycache__"))
        compileall.compile_dir(site, quiet=1, workers=1)
        for dirpath, _dirs, files in os.walk(top):
            os.chmod(dirpath, 0o755)
            for name in files:
                p = os.path.join(dirpath, name)
                if not os.path.islink(p):
                    mode = os.stat(p).st_mode & 0o777
                    os.chmod(p, 0o755 if mode & 0o111 else 0o644)
        return top, python
    except BaseException:
        shutil.rmtree(top, ignore_errors=True)
        raise

"""Find the real Lmod and Environment Modules, for tests that `module load` in bash.

Debian's ``lmod`` and ``environment-modules`` packages conflict, so one machine can have
only one installed. The other is taken from its Debian package, unpacked with
``dpkg-deb -x`` into ~/.cache/ddl-ce/envtools-debs (both run from any directory: Lmod finds its
Lua sources next to its own script, Modules' modulecmd.tcl is self-contained).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddl-ce" / "envtools-debs"


def _unpack(pkg: str) -> Path | None:
    root = CACHE / pkg / "root"
    if (root / "usr").is_dir():
        return root
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        return None
    work = CACHE / pkg / "download"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    r = subprocess.run(["apt-get", "download", pkg], cwd=work, capture_output=True, text=True)
    debs = list(work.glob(f"{pkg}_*.deb"))
    if r.returncode != 0 or not debs:
        return None
    tmp = CACHE / pkg / "root.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", str(debs[0]), str(tmp)], check=True)
    os.rename(tmp, root)
    return root


def lmod_prelude() -> tuple[str | None, str]:
    """Bash lines defining ``module`` for Lmod, or (None, why not)."""
    if Path("/usr/share/lmod/lmod/init/bash").exists():
        return ". /usr/share/lmod/lmod/init/bash", "system lmod"
    lua = shutil.which("lua5.3") or shutil.which("lua")
    if not lua:
        return None, "Lmod needs lua5.3 and lua-posix (apt-get install lua5.3 lua-posix)"
    root = _unpack("lmod")
    if root is None:
        return None, "lmod is not installed and its Debian package could not be downloaded"
    pkg = root / "usr" / "share" / "lmod" / "lmod"
    cmd = pkg / "libexec" / "lmod"
    return (
        f'export LMOD_PKG="{pkg}" LMOD_DIR="{pkg}/libexec" LMOD_CMD="{cmd}"\n'
        f'module() {{ eval "$({lua} {cmd} bash "$@")"; }}',
        f"lmod unpacked in {root}",
    )


def tcl_modules_prelude() -> tuple[str | None, str]:
    """Bash lines defining ``module`` for Environment Modules (Tcl), or (None, why not)."""
    for init in ("/usr/share/modules/init/bash",):
        if Path(init).exists():
            return f". {init}", "system environment-modules"
    tclsh = shutil.which("tclsh8.6") or shutil.which("tclsh")
    if not tclsh:
        return None, "Environment Modules needs tclsh (apt-get install tcl)"
    root = _unpack("environment-modules")
    if root is None:
        return None, "environment-modules is not installed and its package could not be fetched"
    cmd = next(iter(root.glob("usr/lib/*/modulecmd.tcl")), None) or root / "usr/lib/modulecmd.tcl"
    return (f'module() {{ eval "$({tclsh} {cmd} bash "$@")"; }}',
            f"environment-modules unpacked in {root}")

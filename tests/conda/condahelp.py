"""What the conda suite's tests share: finding conda, running it, reading its answers.

conda is not on PyPI, so it is taken from ``DDLCE_CONDA`` (a conda executable, e.g. one
that tests/conda/make_conda.sh made from conda's source) or ``conda`` on PATH; the tests
that need it are skipped with that reason when there is none. The channel tests need
``channel/``, ``channel-upstream/`` and ``envs/powerai`` from ``make channel``.

Every conda command runs offline with only the local channels (``--override-channels``),
its package cache in this session's temp dir (never the user's ``~/.conda`` nor conda's
own root), and without the caller's CONDA_* settings, so a developer's conda setup cannot
change what a test sees.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHANNEL = ROOT / "channel"
#: the stand-in channel (DDLCE_UPSTREAM_CHANNEL: another copy of it, e.g. ci's cache)
UPSTREAM = Path(os.environ.get("DDLCE_UPSTREAM_CHANNEL") or ROOT / "channel-upstream")
SITE_ENV = ROOT / "envs" / "powerai"
MODULEFILES = ROOT / "modulefiles"


def find_conda() -> tuple[str | None, str]:
    """(the conda executable, '') or (None, why there is none)."""
    given = os.environ.get("DDLCE_CONDA")
    if given:
        if not os.access(given, os.X_OK):
            return None, f"DDLCE_CONDA={given} is not an executable"
        return given, ""
    found = shutil.which("conda")
    if found:
        return found, ""
    return None, ("no conda: set DDLCE_CONDA to a conda executable (tests/conda/make_conda.sh "
                  "makes one from conda's source) or put conda on PATH")


@dataclass
class Conda:
    """The real conda, run offline against the local channels only."""

    exe: str
    pkgs_dir: Path
    #: the channel arguments every solving command gets
    channel_args: list[str] = field(default_factory=list)

    def env(self, extra: dict[str, str] | None = None, home: Path | None = None) -> dict:
        """The environment a conda command runs in: the caller's minus its CONDA_* settings
        (an active env, CONDA_OVERRIDE_CUDA), plus this suite's package cache."""
        e = {k: v for k, v in os.environ.items()
             if not k.startswith(("CONDA_", "_CE_", "MAMBA_")) and k != "PYTHONPATH"}
        e["CONDA_PKGS_DIRS"] = str(self.pkgs_dir)
        e["CONDA_OFFLINE"] = "true"
        e["CONDA_REPORT_ERRORS"] = "false"
        if home is not None:
            e["HOME"] = str(home)
        e.update(extra or {})
        return e

    def run(self, *args: str, check: bool = True, extra_env: dict[str, str] | None = None,
            uid: int | None = None, home: Path | None = None,
            timeout: float = 1800, cwd: Path | str = "/") -> subprocess.CompletedProcess:
        """``conda ARGS``; as ``uid`` through setpriv when given (then ``home`` is its HOME).
        ``check``: a failure raises AssertionError with conda's output."""
        cmd = [self.exe, *args]
        if uid is not None:
            cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", *cmd]
        p = subprocess.run(cmd, capture_output=True, text=True, env=self.env(extra_env, home),
                           cwd=cwd, timeout=timeout)
        if check and p.returncode != 0:
            raise AssertionError(f"conda {' '.join(args)} -> {p.returncode}\n"
                                 f"stdout:\n{p.stdout[-4000:]}\nstderr:\n{p.stderr[-4000:]}")
        return p

    def json(self, *args: str, **kw) -> dict:
        """``conda ARGS --json``, parsed (conda's JSON errors too, when check=False)."""
        p = self.run(*args, "--json", **kw)
        return json.loads(p.stdout or "{}")

    def create(self, prefix: Path, *specs: str, extra_env: dict[str, str] | None = None,
               **kw) -> subprocess.CompletedProcess:
        """``conda create -p PREFIX SPECS`` from the channels, offline."""
        return self.run("create", "-y", "-p", str(prefix), "--offline", *self.channel_args,
                        *specs, extra_env=extra_env, **kw)

    def plain_create(self, prefix: Path, *args: str, **kw) -> subprocess.CompletedProcess:
        """The issue's "done when" command as a user types it in the checkout: ``conda
        create -p PREFIX --offline -c ./channel -c ./channel-upstream powerai``, nothing
        else named (no --override-channels, no solver, no priority: conda's own settings).
        A bare ``-c channel`` would be a channel *name* on anaconda.org to conda; a
        directory is named by its path."""
        return self.run("create", "-y", "-p", str(prefix), "--offline", *args,
                        *plain_channel_args(), "powerai", cwd=ROOT, **kw)

    def installed(self, prefix: Path, **kw) -> dict[str, dict]:
        """name -> record of what ``conda list`` says is in ``prefix``."""
        return {r["name"]: r for r in self.json("list", "-p", str(prefix), **kw)}


def plain_channel_args() -> list[str]:
    """``-c ./channel -c ./channel-upstream`` (relative to the checkout, where the command
    runs; a DDLCE_UPSTREAM_CHANNEL outside it by its absolute path)."""
    out = []
    for ch in (CHANNEL, UPSTREAM):
        try:
            out += ["-c", f"./{ch.relative_to(ROOT)}"]
        except ValueError:
            out += ["-c", str(ch)]
    return out


def final_names(installed: dict[str, dict], actions: dict) -> set[str]:
    """The package names a prefix would hold after a (dry-run) transaction's actions."""
    names = set(installed)
    for rec in actions.get("UNLINK", []):
        names.discard(rec["name"])
    for rec in actions.get("LINK", []):
        names.add(rec["name"])
    return names


MPI_TEST = r"""
import numpy as np, ddl_core as ddl
from mpi4py import MPI
ddl.init()
assert ddl.size() == 2, ddl.size()
y = ddl.allreduce(np.ones(8, np.float32))
assert (y == 2).all(), y
assert MPI.COMM_WORLD.allreduce(1) == 2
print("allreduce ok", ddl.rank())
"""


def mpirun_allreduce(prefix: Path) -> subprocess.CompletedProcess:
    """A 2-rank allreduce (ddl_core and mpi4py) with the env's own mpirun, run as conda
    run's activation would: PATH with the env's bin first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CONDA_", "OMPI_MCA"))}
    env.pop("PYTHONPATH", None)
    env.update(PATH=f"{prefix / 'bin'}:{env.get('PATH', '')}", OMPI_ALLOW_RUN_AS_ROOT="1",
               OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMPI_MCA_mpi_yield_when_idle="1",
               CONDA_PREFIX=str(prefix))
    return subprocess.run([str(prefix / "bin" / "mpirun"), "-n", "2", "--oversubscribe",
                           str(prefix / "bin" / "python"), "-c", MPI_TEST],
                          capture_output=True, text=True, env=env, timeout=600, cwd="/")

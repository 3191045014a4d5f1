"""Run envtools as an unprivileged user who does not own the site env (bench and tests).

A site's env and package cache belong to root (or a software account); a user's clone
is made by someone else. Measuring or testing that needs a real, different uid: a user
namespace as root keeps root's uid on the files it creates and makes it the owner of
root's files, which is the other case. As root we switch to a uid nobody uses
(``setpriv``, no account needed); as anyone else we already are that user.

The interpreter running envtools may not be reachable by that uid (a venv made from a
python under /root): then the same minor version of python from the system runs it,
with envtools and the current interpreter's site-packages on PYTHONPATH; or the caller
names the interpreter (the tests make a copy every user can read: a checkout under a
private home leaves that uid nothing else).
"""

from __future__ import annotations

import os
import pwd
import shutil
import site
import subprocess
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

import envtools
from envtools.errors import EnvtoolsError


def free_uid(start: int = 60000) -> int:
    """The first uid from ``start`` that no account has."""
    uid = start
    while True:
        try:
            pwd.getpwuid(uid)
        except KeyError:
            return uid
        uid += 1


@dataclass
class User:
    """How to run a command as the unprivileged user (``prefix`` + argv, with ``env``)."""

    uid: int
    gid: int
    home: Path
    prefix: list[str] = field(default_factory=list)  # setpriv ..., or nothing
    python: list[str] = field(default_factory=list)  # an interpreter that can run envtools
    env: dict[str, str] = field(default_factory=dict)

    def cmd(self, *argv: str | os.PathLike[str]) -> list[str]:
        return [*self.prefix, *map(str, argv)]

    def envtools(self, *argv: str | os.PathLike[str]) -> list[str]:
        return [*self.prefix, *self.python, "-m", "envtools", *map(str, argv)]

    def run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(argv, env=self.env, capture_output=True, text=True, **kw)

    def own(self, path: Path) -> Path:
        """Make ``path`` (a new directory) the user's, as a home for their clones."""
        path.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            os.chown(path, self.uid, self.gid)
        return path


def unprivileged(home: Path, uid: int | None = None,
                 python: str | os.PathLike[str] | None = None) -> User:
    """The user to run as: a uid without an account when we are root, else ourselves.

    ``home`` becomes theirs (HOME for the commands). ``python``, when given, is the one
    interpreter to run envtools with, as is (one that has envtools in its own
    site-packages, where that user can read it: the tests' copy when the checkout is
    private). Raises EnvtoolsError when root cannot switch users (no setpriv) or no
    python can run envtools as that user.
    """
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            raise EnvtoolsError("setpriv is needed to run as an unprivileged user",
                                "apt-get install util-linux")
        uid = free_uid() if uid is None else uid
        user = User(uid, uid, home, ["setpriv", f"--reuid={uid}", f"--regid={uid}",
                                     "--clear-groups", "--"])
    else:
        user = User(os.geteuid(), os.getegid(), home)
    user.own(home)
    pkg_root = str(Path(envtools.__file__).resolve().parent.parent)
    paths = [pkg_root, *site.getsitepackages(), sysconfig.get_path("purelib"),
             sysconfig.get_path("platlib")]
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    base.update(HOME=str(home), PYTHONNOUSERSITE="1", PYTHONDONTWRITEBYTECODE="1")
    minor = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    tried = []
    pythons = [os.fspath(python)] if python is not None else [
        sys.executable, os.path.realpath(sys.executable), f"/usr/bin/{minor}",
        shutil.which(minor)]
    envs = [base] if python is not None else [
        {**base, "PYTHONPATH": pkg_root},
        {**base, "PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}]
    for py in dict.fromkeys(filter(None, pythons)):
        for env in envs:
            p = subprocess.run([*user.prefix, py, "-c", "import envtools.cli, rattler"],
                               env=env, capture_output=True, text=True)
            if p.returncode == 0:
                user.python, user.env = [py], env
                return user
            tried.append(f"{py}: {p.stderr.strip().splitlines()[-1:] or p.returncode}")
    raise EnvtoolsError(f"no python can run envtools as uid {user.uid}: {'; '.join(tried)}",
                        f"install python {minor} where every user can run it")

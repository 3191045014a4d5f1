"""Session fixtures: the fixture channel (built once, cached) and a read-only env from it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import otheruid  # noqa: E402
from envtools.errors import EnvtoolsError  # noqa: E402
from fixtures import build_channel  # noqa: E402

ENVTOOLS = [sys.executable, "-m", "envtools"]


def run_envtools(*args: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    """Run the real CLI in a subprocess, as users and the channel pipeline do."""
    p = subprocess.run([*ENVTOOLS, *map(str, args)], capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise AssertionError(f"envtools {' '.join(map(str, args))} -> {p.returncode}\n"
                             f"stdout:\n{p.stdout}\nstderr:\n{p.stderr}")
    return p


_OTHER_UID: dict[str, object] = {}


def other_uid_python() -> Path | None:
    """This session's python that every uid can run envtools with (otheruid.build: a
    copy in a directory all can read, made at first use, removed when the session
    ends), or None, with the reason kept, when it could not be made."""
    if "python" not in _OTHER_UID:
        try:
            _OTHER_UID["top"], _OTHER_UID["python"] = otheruid.build()
        except (EnvtoolsError, OSError, subprocess.CalledProcessError) as e:
            _OTHER_UID["python"] = None
            _OTHER_UID["why"] = getattr(e, "message", None) or str(e)
    return _OTHER_UID["python"]  # type: ignore[return-value]


@pytest.fixture(scope="session", autouse=True)
def _remove_other_uid_python():
    yield
    if _OTHER_UID.get("top"):
        shutil.rmtree(_OTHER_UID["top"], ignore_errors=True)


def other_user(home: Path, **kw):
    """A uid without an account to run envtools as (asuser.unprivileged), running the
    session's readable copy of python and envtools (the checkout and its .venv may sit
    under a private home directory), or a skip that says why there is none."""
    from envtools.bench import asuser

    python = other_uid_python() if os.geteuid() == 0 else None
    try:
        return asuser.unprivileged(home, python=python, **kw)
    except EnvtoolsError as e:
        why = f" (no copy of python: {_OTHER_UID['why']})" if "why" in _OTHER_UID else ""
        pytest.skip(f"needs another uid that can run envtools: {e.message} ({e.hint}){why}")


_RUNS_AS: dict[int, str] = {}


def envtools_as(uid: int) -> list[str]:
    """The command line that runs the envtools CLI as ``uid`` (setpriv, the session's
    readable python: other_uid_python), or a skip saying why that uid cannot import
    envtools with it. Probed once per uid."""
    python = other_uid_python() or Path(sys.executable)
    cmd = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "--", str(python)]
    if uid not in _RUNS_AS:
        p = subprocess.run([*cmd, "-c", "import envtools.cli"], capture_output=True,
                           text=True, cwd="/")
        _RUNS_AS[uid] = "" if p.returncode == 0 else (p.stderr.strip().splitlines() or [
            f"exit status {p.returncode}"])[-1]
    if _RUNS_AS[uid]:
        why = f" (no copy of python: {_OTHER_UID['why']})" if "why" in _OTHER_UID else ""
        pytest.skip(f"needs uid {uid} to run envtools from {python}: {_RUNS_AS[uid]}{why}")
    return [*cmd, "-m", "envtools"]


@pytest.fixture(scope="session")
def channel() -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fixture packages (apt-get install gcc)")
    return build_channel()


@pytest.fixture(scope="session")
def site(tmp_path_factory, channel) -> Path:
    """A site layout: <root>/envs/powerai installed read-only (as `make channel` does)."""
    root = tmp_path_factory.mktemp("site")
    run_envtools("install", "--channel", channel, "--prefix", root / "envs" / "powerai",
                 "demo-meta")
    return root


@pytest.fixture(scope="session")
def env(site) -> Path:
    return site / "envs" / "powerai"


@pytest.fixture(scope="session")
def clone_env(tmp_path_factory, env) -> Path:
    """A writable clone the validate tests break (each breaks its own copy of it)."""
    dest = tmp_path_factory.mktemp("clones") / "base"
    run_envtools("clone", env, dest)
    return dest



def make_wheel(dest_dir: Path, name: str, version: str, files: dict[str, str | bytes],
               requires: list[str] | None = None, scripts: dict[str, str] | None = None) -> Path:
    """Write a real (pure-Python) wheel: what pip installs; no build backend needed."""
    import base64
    import hashlib
    import zipfile

    dist = name.replace("-", "_")
    di = f"{dist}-{version}.dist-info"
    meta = ["Metadata-Version: 2.1", f"Name: {name}", f"Version: {version}"]
    meta += [f"Requires-Dist: {r}" for r in requires or []]
    contents = dict(files)
    contents[f"{di}/METADATA"] = "\n".join(meta) + "\n"
    contents[f"{di}/WHEEL"] = ("Wheel-Version: 1.0\nGenerator: envtools-tests\n"
                               "Root-Is-Purelib: true\nTag: py3-none-any\n")
    if scripts:
        contents[f"{di}/entry_points.txt"] = "[console_scripts]\n" + "".join(
            f"{k} = {v}\n" for k, v in scripts.items())
    record = []
    for path, text in contents.items():
        data = text if isinstance(text, bytes) else text.encode()
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(data)}")
    record.append(f"{di}/RECORD,,")
    contents[f"{di}/RECORD"] = "\n".join(record) + "\n"
    whl = dest_dir / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in contents.items():
            z.writestr(path, text)
    return whl


@pytest.fixture
def wheel_factory(tmp_path):
    def make(name, version, files, requires=None, scripts=None):
        return make_wheel(tmp_path, name, version, files, requires, scripts)

    return make

"""envtools install: a read-only prefix with its marker, explicit set and package cache."""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import stat
import subprocess
from pathlib import Path

from conftest import other_user, run_envtools


def test_install_makes_readonly_env_that_runs(env):
    marker = json.loads((env / "conda-meta" / "envtools" / "readonly.json").read_text())
    assert marker["readonly"] is True and marker["specs"] == ["demo-meta"]
    names = {p.name.split("-")[0] for p in (env / "conda-meta").glob("*.json")}
    assert {"libdemo", "python", "cuda", "demo"} <= names
    explicit = (env / "conda-meta" / "envtools" / "explicit.txt").read_text().splitlines()
    assert "@EXPLICIT" in explicit and sum(".conda#sha256:" in x for x in explicit) == 5
    for p in [env, env / "bin", env / "lib" / "libdemo.so.1", env / "conda-meta"]:
        assert not os.stat(p).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH), p
    # records must be readable by every user of a shared env (rattler writes them 0600)
    for p in (env / "conda-meta").glob("*.json"):
        assert os.stat(p).st_mode & stat.S_IROTH, p
    out = subprocess.run([env / "bin" / "demo"], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [f"{env}/share/demo", f"prefix={env}"]
    cache = env.parent / "powerai.pkgs"
    assert (cache / "libdemo-1.0.0-hb0f4dca_0" / "info" / "paths.json").exists() or any(
        cache.glob("libdemo-*/info/paths.json"))


def test_install_refuses_existing_readonly_and_bad_input(env, channel, tmp_path):
    p = run_envtools("install", "--channel", channel, "--prefix", env, "demo-meta", check=False)
    assert p.returncode == 2 and "already an envtools read-only environment" in p.stderr
    assert "envtools remove" in p.stderr
    p = run_envtools("install", "--channel", tmp_path / "nope", "--prefix", tmp_path / "e",
                     "demo-meta", check=False)
    assert p.returncode == 2 and "neither a URL nor an existing directory" in p.stderr
    p = run_envtools("install", "--channel", channel, "--prefix", tmp_path / "e",
                     "no-such-package", check=False)
    assert p.returncode == 2 and "cannot solve" in p.stderr
    assert not (tmp_path / "e").exists()
    assert not [x for x in tmp_path.iterdir() if "envtools-tmp" in x.name]
    # writing inside the read-only env is refused by marker, even for root
    p = run_envtools("install", "--channel", channel, "--prefix", env / "sub", "demo-meta",
                     check=False)
    assert p.returncode == 2 and "read-only environment" in p.stderr


def test_install_onto_a_plain_file_says_it_is_a_file(channel, tmp_path):
    f = tmp_path / "env"
    f.write_text("a user's file\n")
    p = run_envtools("install", "--channel", channel, "--prefix", f, "demo-meta", check=False)
    assert p.returncode == 2 and "is a file, not a directory" in p.stderr
    assert "already an envtools" not in p.stderr
    assert f.read_text() == "a user's file\n"
    assert sorted(x.name for x in tmp_path.iterdir()) == ["env"]


def test_remove(channel, tmp_path):
    prefix = tmp_path / "envs" / "x"
    run_envtools("install", "--channel", channel, "--prefix", prefix, "libdemo")
    assert (tmp_path / "envs" / "x.pkgs").is_dir()
    run_envtools("remove", prefix)
    assert not prefix.exists() and not (tmp_path / "envs" / "x.pkgs").exists()


def test_help_for_every_subcommand():
    for sub in ("install", "module", "clone", "validate", "remove"):
        p = run_envtools(sub, "--help")
        assert p.stdout.startswith(f"usage: envtools {sub} ")
        assert "options:" in p.stdout
    p = run_envtools(check=False)  # no command: the list of commands, and exit 2
    assert p.returncode == 2 and all(s in p.stdout for s in ("install", "clone", "validate"))
    p = run_envtools("clone", "a", "b", "--link-mode", "nope", check=False)
    assert p.returncode == 2 and "invalid choice: 'nope'" in p.stderr


def _snapshot(root) -> dict[str, tuple]:
    """Every entry under root: its type, size and mtime (what using an env must not change)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            out[p] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


def test_noarch_bytecode_is_compiled_at_install_and_use_changes_nothing(channel, tmp_path):
    """A noarch: python package gets checked-hash pycs at install, listed in its record;
    importing it as root or as another user writes nothing into the read-only env, and
    validate is clean; a clone leaves the installer's bytecode out and compiles its own."""
    import shutil
    import tempfile
    from pathlib import Path

    top = Path(tempfile.mkdtemp(prefix="envtools-pyc-", dir="/tmp"))  # (every user's)
    try:
        _noarch_bytecode(channel, top)
    finally:
        subprocess.run(["chmod", "-R", "u+w", top], check=False)
        shutil.rmtree(top, ignore_errors=True)


def _noarch_bytecode(channel, tmp_path) -> None:
    import importlib.util
    import shutil


    os.chmod(tmp_path, 0o755)
    env = tmp_path / "site"
    run_envtools("install", "--channel", channel, "--prefix", env, "demo-meta", "demo-noarch")
    rec = json.loads(next((env / "conda-meta").glob("demo-noarch-*.json")).read_text())
    pycs = [e for e in rec["paths_data"]["paths"] if e.get("path_type") == "pyc_file"]
    assert pycs and {e["_path"] for e in pycs} <= set(rec["files"])
    for e in pycs:
        data = (env / e["_path"]).read_bytes()
        flags = int.from_bytes(data[4:8], "little")
        assert flags == 0b11, e  # PEP 552: hash-based (bit 0) and checked (bit 1)
        assert hashlib.sha256(data).hexdigest() == e["sha256"]
        assert len(data) == e["size_in_bytes"]
    src = env / pycs[0]["_path"].replace("/__pycache__", "").rsplit(".", 2)[0]
    assert importlib.util.cache_from_source(str(src) + ".py").endswith(pycs[0]["_path"])
    # the same pycs are in the package's cache entry (the env's are hardlinks of them),
    # naming their source by its path in the prefix: one pyc serves every prefix
    entry = Path(rec["extracted_package_dir"])
    assert entry.parent == env.parent / "site.pkgs"
    sp = pycs[0]["_path"].split("/site-packages/")[0] + "/site-packages/"
    for e in pycs:
        cached = entry / ("site-packages/" + e["_path"][len(sp):])
        assert os.stat(cached).st_ino == os.stat(env / e["_path"]).st_ino, e
        assert not os.stat(cached).st_mode & 0o222
        code = marshal.loads((env / e["_path"]).read_bytes()[16:])
        assert code.co_filename == e["_path"].replace("__pycache__/", "").rsplit(".", 2)[0] \
            + ".py"
    before = _snapshot(env)
    # python's relocated module (holding the prefix, as _sysconfigdata does): the bytecode
    # its package shipped is replaced by the installer's, compiled from the relocated file
    prec = json.loads(next((env / "conda-meta").glob("python-*.json")).read_text())
    where = [e for e in prec["paths_data"]["paths"] if "_demo_where" in e["_path"]]
    assert [e.get("path_type") for e in where if e["_path"].endswith(".pyc")] == ["pyc_file"]
    relocated = next(e["_path"] for e in where if e["_path"].endswith(".pyc"))
    assert os.stat(env / relocated).st_nlink == 1  # (holds the prefix: the env's only)
    code = "import _demo_where, demo_noarch; print(demo_noarch.__cached__)"
    out = subprocess.run([env / "bin" / "python", "-c", code], capture_output=True,
                         text=True, check=True)
    assert out.stdout.strip() == str(env / pycs[0]["_path"])
    if shutil.which("setpriv"):
        user = other_user(tmp_path / "home")
        p = user.run(user.cmd(env / "bin" / "python", "-c", code))
        assert p.returncode == 0, p.stderr
    assert _snapshot(env) == before  # nothing written, as root or not
    doc = json.loads(run_envtools("validate", "--json", env).stdout)
    assert doc["exit_status"] == 0 and not [f for f in doc["findings"]
                                            if f["severity"] != "info"], doc["findings"]
    dest = tmp_path / "mine"
    run_envtools("clone", env, dest)
    # only the relocated module's bytecode (a pyc its package ships: conda-pack and conda
    # doctor want it), compiled again for the clone's own relocated source
    assert [p.relative_to(dest).as_posix() for p in dest.rglob("*.pyc")] == [relocated]
    ours = (dest / relocated).read_bytes()
    where_src = next(e["_path"] for e in where if e["_path"].endswith(".py"))
    assert marshal.loads(ours[16:]).co_filename == str(dest / where_src)
    crec = json.loads(next((dest / "conda-meta").glob("demo-noarch-*.json")).read_text())
    assert not [e for e in crec["paths_data"]["paths"] if e.get("path_type") == "pyc_file"]
    assert not [f for f in crec["files"] if f.endswith(".pyc")]
    subprocess.run([dest / "bin" / "python", "-c", code], check=True, capture_output=True)
    assert (dest / relocated).read_bytes() == ours  # up to date: python kept it
    doc = json.loads(run_envtools("validate", "--json", dest).stdout)
    assert doc["exit_status"] == 0, doc["findings"]

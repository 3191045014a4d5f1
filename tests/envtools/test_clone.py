"""envtools clone: exact, relocated, atomic; with and without the package cache."""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ENVTOOLS, run_envtools
from envtools.prefix.hashing import STAT_CACHE, entry_sha, load_stat_cache


def tree_digest(root: Path, skip=("conda-meta",)) -> dict[str, str]:
    """Relative path -> sha256 (or 'link:target') of everything under root except conda-meta."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir.split(os.sep)[0] in skip:
            continue
        for f in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            p = os.path.join(dirpath, f)
            rel = os.path.normpath(os.path.join(rel_dir, f))
            if os.path.islink(p):
                out[rel] = "link:" + os.readlink(p)
            else:
                out[rel] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def installer_bytecode(prefix: Path) -> set[str]:
    """The pycs install compiled into ``prefix`` for noarch: python packages
    (envtools.place.bytecode), which a clone leaves out: its python compiles its own. (What
    install compiled for a relocated source in place of a pyc its package ships, a clone
    compiles again for its own prefix: the same bytes as an install there.)"""
    return {e["_path"] for fp in (prefix / "conda-meta").glob("*.json")
            for rec in [json.loads(fp.read_text())] if rec.get("noarch") in (
                "python", {"type": "python"})
            for e in rec["paths_data"]["paths"] if e.get("path_type") == "pyc_file"}


def run_demo(prefix: Path) -> list[str]:
    out = subprocess.run([prefix / "bin" / "demo"], capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def check_runs_at(prefix: Path) -> None:
    """What was cloned runs from its new place and sees only its new place."""
    assert run_demo(prefix) == [f"{prefix}/share/demo", f"prefix={prefix}"]
    wrapper = subprocess.run([prefix / "bin" / "demo-wrapper"], capture_output=True, text=True,
                             check=True)
    assert wrapper.stdout.splitlines()[0] == f"{prefix}/share/demo"
    py = subprocess.run(
        [prefix / "bin" / "python", "-c", "import sys, demo_py; print(sys.prefix); "
         "print(demo_py.where()); print(demo_py.__file__)"],
        capture_output=True, text=True, check=True,
    ).stdout.splitlines()
    assert py[0] == str(prefix) and py[1] == str(prefix) and py[2].startswith(str(prefix))


def test_clone_from_cache_is_exact_and_runs(env, tmp_path):
    dest = tmp_path / "a" / "myenv"
    p = run_envtools("clone", env, dest)
    assert "5 packages from the package cache" in p.stderr
    check_runs_at(dest)
    # no trace of the source prefix in any file outside conda-meta
    for rel in tree_digest(dest):
        full = dest / rel
        if not full.is_symlink():
            assert str(env).encode() not in full.read_bytes(), rel
    # the clone is writable for its user and not marked read-only
    assert not (dest / "conda-meta" / "envtools" / "readonly.json").exists()
    assert os.access(dest / "bin", os.W_OK)
    # installing the same packages at dest directly gives the same bytes
    rel = run_envtools("validate", dest, "--json")
    doc = json.loads(rel.stdout)
    assert doc["exit_status"] == 0, doc["findings"]


def test_clone_without_cache_equals_clone_with_cache(env, tmp_path):
    """Relocating from SRC's files must give the same bits as relinking from the cache."""
    a = tmp_path / "x" / "env"
    run_envtools("clone", env, a)
    digest_cache = tree_digest(a)
    shutil.rmtree(a)
    p = run_envtools("clone", "--no-cache", env, a)
    assert "0 packages from the package cache, 5 copied from the source" in p.stderr
    assert tree_digest(a) == digest_cache
    check_runs_at(a)


def test_clone_when_cache_is_gone(env, tmp_path):
    """A cache that was deleted (or is unreadable) silently falls back to copying."""
    # copy the env (records still name the cache) and point it at a cache that is missing
    src = tmp_path / "copy-of-site" / "powerai"
    shutil.copytree(env, src, symlinks=True)
    for p in [src, *src.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | 0o200)
    for rec in (src / "conda-meta").glob("*.json"):
        data = json.loads(rec.read_text())
        if "extracted_package_dir" in data:
            data["extracted_package_dir"] = str(tmp_path / "gone" / Path(
                data["extracted_package_dir"]).name)
            rec.write_text(json.dumps(data))
    info = json.loads((src / "conda-meta" / "envtools" / "prefix.json").read_text())
    info["package_cache"] = str(tmp_path / "gone")
    (src / "conda-meta" / "envtools" / "prefix.json").write_text(json.dumps(info))
    dest = tmp_path / "d"
    p = run_envtools("clone", src, dest)
    assert "0 packages from the package cache" in p.stderr
    check_runs_at(dest)


def test_clone_to_another_filesystem(env, tmp_path):
    """Across filesystems links fail (EXDEV) and clone copies; tmpfs where we can mount it."""
    mnt = tmp_path / "tmpfs"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mnt)],
                             capture_output=True).returncode == 0
    if not mounted:
        if Path("/dev/shm").is_dir() and os.stat("/dev/shm").st_dev != os.stat(env).st_dev:
            mnt = Path("/dev/shm") / f"envtools-test-{os.getpid()}"
            mnt.mkdir()
        else:
            pytest.skip("cannot mount a tmpfs and /dev/shm is not another filesystem")
    try:
        assert os.stat(mnt).st_dev != os.stat(env).st_dev
        dest = mnt / "env"
        run_envtools("clone", env, dest)
        check_runs_at(dest)
    finally:
        if mounted:
            subprocess.run(["umount", "-l", str(mnt)], check=False)
        else:
            shutil.rmtree(mnt, ignore_errors=True)


def test_hardlinks_never_write_through(env, tmp_path):
    """Whatever link kind was used, writing the clone's files never changes the shared env."""
    dest = tmp_path / "w"
    run_envtools("clone", env, dest)
    before = tree_digest(env)
    for rel in ("share/demo-meta/README", "include/demo.h", "lib/libdemo.so.1"):
        f = dest / rel
        f.chmod(0o644)
        with open(f, "ab") as fh:
            fh.write(b"user change\n")
    assert tree_digest(env) == before


def test_clone_carries_pip_installs_and_reports_editables(clone_env, tmp_path, wheel_factory):
    """pip-installed distributions come along with their prefix rewritten."""
    src = tmp_path / "src"
    run_envtools("clone", clone_env, src)
    whl = wheel_factory("hello-tool", "1.0", {"hello_tool/__init__.py": "X = 1\n"},
                        scripts={"hello-tool": "hello_tool:main"})
    pip_install(src, whl)
    # an editable install: a .pth pointing at a source checkout
    site = next(src.glob("lib/python*/site-packages"))
    (site / "__editable__.mytool-0.1.pth").write_text(str(tmp_path / "checkout") + "\n")
    dest = tmp_path / "dest"
    p = run_envtools("clone", src, dest)
    assert "editable install" in p.stderr and "mytool" in p.stderr
    dsite = next(dest.glob("lib/python*/site-packages"))
    assert (dsite / "hello_tool" / "__init__.py").exists()
    script = (dest / "bin" / "hello-tool").read_text()
    assert script.startswith(f"#!{dest}/bin/python") and str(src) not in script
    # pip's RECORD still matches the rewritten script
    out = subprocess.run([dest / "bin" / "python", "-c", "import hello_tool; print(1)"],
                         capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"
    doc = json.loads(run_envtools("validate", dest, "--json").stdout)
    assert doc["exit_status"] == 0, doc["findings"]
    assert any(f["check"] == "editable-install" for f in doc["findings"])


def pip_install(prefix: Path, wheel: Path) -> None:
    """Install a wheel with the real pip, the way a user of the env would."""
    site = next(prefix.glob("lib/python*/site-packages"))
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet",
         "--ignore-installed",  # (else pip uninstalls the running env's copy: --prefix)
         "--disable-pip-version-check", "--prefix", str(prefix), "--no-warn-script-location",
         str(wheel)],
        check=True, env={**os.environ, "PYTHONNOUSERSITE": "1"},
    )
    # pip --prefix writes shebangs for the interpreter running pip; a user inside the env
    # runs the env's python, so make them point at it as pip would have
    for script in (prefix / "bin").iterdir():
        if script.is_file() and not script.is_symlink():
            data = script.read_bytes()
            if data.startswith(b"#!" + sys.executable.encode()):
                script.write_bytes(data.replace(sys.executable.encode(),
                                                str(prefix / "bin" / "python").encode(), 1))
    assert site.exists()


def test_refuses_nonempty_dest_and_bad_src(env, tmp_path):
    dest = tmp_path / "full"
    dest.mkdir()
    (dest / "x").write_text("mine")
    p = run_envtools("clone", env, dest, check=False)
    assert p.returncode == 2 and "exists and is not empty" in p.stderr
    assert (dest / "x").read_text() == "mine"
    p = run_envtools("clone", tmp_path / "nothing", tmp_path / "d", check=False)
    assert p.returncode == 2 and "does not exist" in p.stderr
    p = run_envtools("clone", env, env / "inside", check=False)
    assert p.returncode == 2
    empty = tmp_path / "empty"
    empty.mkdir()
    run_envtools("clone", env, empty)  # an empty directory is fine
    assert run_demo(empty)[1] == f"prefix={empty}"


@pytest.mark.parametrize("workers", ["1", "4"])
def test_failed_clone_leaves_nothing(env, tmp_path, workers):
    """A binary that cannot be relocated (path too long) fails the clone cleanly, also
    when the failure happens in a forked placement process."""
    dest = tmp_path / ("x" * 250) / "env"
    p = run_envtools("clone", env, dest, check=False,
                     env={**os.environ, "ENVTOOLS_WORKERS": workers})
    assert p.returncode == 2 and "cannot relocate" in p.stderr and "shorter path" in p.stderr
    assert not dest.exists()
    assert not [x for x in dest.parent.iterdir() if "envtools-tmp" in x.name]


def test_interrupted_clone_leaves_nothing(env, tmp_path):
    """SIGINT / SIGTERM in the middle of a clone: no DEST, no temp directory."""
    big = tmp_path / "big"
    run_envtools("clone", env, big)
    data = big / "share" / "bulk"
    data.mkdir()
    for i in range(3000):  # untracked files make the clone take long enough to interrupt
        (data / f"f{i}.txt").write_text(f"{big}\n" * 200)
    for sig in (signal.SIGINT, signal.SIGTERM):
        dest = tmp_path / f"dest-{sig}"
        proc = subprocess.Popen([*ENVTOOLS, "clone", str(big), str(dest)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not any(
            "envtools-tmp" in x.name for x in tmp_path.iterdir()
        ):
            time.sleep(0.005)
        time.sleep(0.05)
        proc.send_signal(sig)
        proc.communicate(timeout=60)
        assert proc.returncode != 0, "clone finished before it could be interrupted"
        assert not dest.exists()
        assert not [x for x in tmp_path.iterdir() if "envtools-tmp" in x.name]


def test_clone_add_pins_existing_packages(env, channel, tmp_path):
    dest = tmp_path / "added"
    p = run_envtools("clone", env, dest, "--add", "demo-extra")
    assert "demo-extra=0.5.0" in p.stderr
    info = (dest / "share" / "demo-extra" / "info.txt").read_text()
    assert info == f"extra at {dest}\n"  # installed at the clone's path, not the temp dir
    # every package of the source stays (not only what the added spec needs)
    names = {p.name.rsplit("-", 2)[0] for p in (dest / "conda-meta").glob("*.json")}
    assert names == {p.name.rsplit("-", 2)[0] for p in (env / "conda-meta").glob("*.json")
                     } | {"demo-extra"}
    assert json.loads(run_envtools("validate", dest, "--json").stdout)["exit_status"] == 0
    # a spec that would need another version of an installed package is refused, atomically
    dest2 = tmp_path / "refused"
    p = run_envtools("clone", env, dest2, "--add", "libdemo>=2", check=False)
    assert p.returncode == 2 and "--allow-update" in p.stderr
    assert not dest2.exists()


def test_hardlinks_only_when_safe_and_never_writable(env, tmp_path):
    """Not root (a user namespace drops root's override): read-only cache files are
    hardlinked, placeholder files are written fresh, and writing a linked file fails."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root to create a user namespace with unshare --user")
    dest = tmp_path / "hl"
    p = subprocess.run(["unshare", "--user", "--", *ENVTOOLS, "clone", str(env), str(dest)],
                       capture_output=True, text=True)
    if p.returncode != 0 and "unshare" in p.stderr:
        pytest.skip(f"user namespaces unavailable: {p.stderr.strip()}")
    assert p.returncode == 0, p.stderr
    assert "hardlink" in p.stderr
    cache_h = next((env.parent / "powerai.pkgs").glob("libdemo-*")) / "include" / "demo.h"
    assert os.stat(dest / "include" / "demo.h").st_ino == os.stat(cache_h).st_ino
    assert os.stat(dest / "share" / "demo" / "config.txt").st_nlink == 1  # relocated: own copy
    w = subprocess.run(["unshare", "--user", "--", "sh", "-c",
                        f"echo x >> {dest / 'include' / 'demo.h'}"], capture_output=True)
    assert w.returncode != 0
    assert b"x\n" not in cache_h.read_bytes()
    check_runs_at(dest)


@pytest.fixture
def xfs_dir(tmp_path):
    """A loop-mounted XFS with reflink, where root can make one (else the test skips)."""
    if os.geteuid() != 0 or not shutil.which("mkfs.xfs"):
        pytest.skip("needs root and mkfs.xfs (apt-get install xfsprogs) for a reflink fs")
    img, mnt = tmp_path / "xfs.img", tmp_path / "xfs"
    mnt.mkdir()
    with open(img, "wb") as fh:
        fh.truncate(512 << 20)
    if subprocess.run(["mkfs.xfs", "-q", "-m", "reflink=1", str(img)],
                      capture_output=True).returncode != 0 or subprocess.run(
            ["mount", "-o", "loop", str(img), str(mnt)], capture_output=True).returncode != 0:
        pytest.skip("cannot make or loop-mount an XFS image here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_reflink_clone_on_xfs(channel, xfs_dir):
    """On a reflink filesystem even root links from the cache, safely (copy-on-write)."""
    env = xfs_dir / "envs" / "powerai"
    run_envtools("install", "--channel", channel, "--prefix", env, "demo-meta")
    dest = xfs_dir / "clone"
    p = run_envtools("clone", env, dest)
    assert "reflink" in p.stderr and "hardlink" not in p.stderr
    check_runs_at(dest)
    h = dest / "include" / "demo.h"
    with open(h, "ab") as fh:  # the clone's copy is writable and private
        fh.write(b"int mine;\n")
    assert b"mine" not in (env / "include" / "demo.h").read_bytes()
    assert json.loads(run_envtools("validate", env, "--json").stdout)["exit_status"] == 0


def test_clone_is_bit_for_bit_a_fresh_install_at_dest(env, channel, tmp_path):
    """Cloning to DEST gives the bytes installing the same packages at DEST gives."""
    dest = tmp_path / "same" / "env"
    run_envtools("clone", env, dest)
    cloned = tree_digest(dest)
    shutil.rmtree(dest)
    run_envtools("install", "--channel", channel, "--prefix", dest, "demo-meta")
    compiled = installer_bytecode(dest)
    installed = {k: v for k, v in tree_digest(dest).items() if k not in compiled}
    # (python's relocated module: compiled at DEST by both)
    assert any(k.endswith("/_demo_where.cpython-311.pyc") for k in cloned)
    # the read-only env's PEP 668 and CEP 22 markers are the one difference: a clone is
    # pip's and conda's to change (the link to the PEP 668 file, the files behind both)
    marker = {k for k in installed if k.endswith("/EXTERNALLY-MANAGED")
              or k.startswith("pkgs/envtools-site-only/")}
    assert len(marker) == 4
    assert {k: v for k, v in installed.items() if k not in marker} == cloned


def test_untracked_cache_notices_new_files(channel, tmp_path):
    """The recorded list of untracked files is only trusted while no directory changed."""
    from envtools.prefix.records import Prefix
    from envtools.prefix.untracked import untracked

    env = tmp_path / "envs" / "p"
    run_envtools("install", "--channel", channel, "--prefix", env, "demo-meta")
    owned = {e["_path"] for r in Prefix.load(env).records for e in r.paths}
    # no CACHEDIR.TAG (see test_hygiene); the PEP 668 marker's link and the files behind
    # the site markers are the untracked files
    assert untracked(env, lambda: owned)[0] == [
        "lib/python3.11/EXTERNALLY-MANAGED", "pkgs/envtools-site-only/EXTERNALLY-MANAGED",
        "pkgs/envtools-site-only/README", "pkgs/envtools-site-only/frozen"]
    share = env / "share" / "demo"
    os.chmod(share, 0o755)  # an admin adds a file to the read-only env behind our back
    (share / "site-note.txt").write_text(f"see {env}\n")
    os.chmod(share, 0o555)
    assert "share/demo/site-note.txt" in untracked(env, lambda: owned)[0]
    dest = tmp_path / "c"
    run_envtools("clone", env, dest)
    assert (dest / "share" / "demo" / "site-note.txt").read_text() == f"see {dest}\n"


def test_sharded_placement_equals_serial(env, tmp_path):
    """Files placed by eight processes (packages split across them, records written by
    whichever placed a package) give the same clone, bit for bit and hardlinks and all,
    as one process does."""
    if os.geteuid() != 0 or not shutil.which("unshare"):
        pytest.skip("needs root to create a user namespace with unshare --user")
    dest = tmp_path / "w" / "env"
    digests, links = [], []
    for workers in ("1", "8"):
        p = subprocess.run(["unshare", "--user", "--", *ENVTOOLS, "clone", str(env), str(dest)],
                           capture_output=True, text=True,
                           env={**os.environ, "ENVTOOLS_WORKERS": workers})
        if p.returncode != 0 and "unshare" in p.stderr:
            pytest.skip(f"user namespaces unavailable: {p.stderr.strip()}")
        assert p.returncode == 0, p.stderr
        assert "hardlink" in p.stderr and "relocated" in p.stderr
        links.append(p.stderr[p.stderr.index("files:"):])
        check_runs_at(dest)
        assert json.loads(run_envtools("validate", dest, "--json").stdout)["exit_status"] == 0
        d = tree_digest(dest, skip=())
        # the history has a time stamp; the stat cache, relocated files' inode numbers
        # (and its parts are cut by process)
        del d["conda-meta/history"]
        for k in [k for k in d if k.startswith("conda-meta/envtools/statcache/")]:
            del d[k]
        d["stat cache"] = sorted((k, v[0], entry_sha(v)) for k, v in load_stat_cache(dest).items())
        digests.append(d)
        run_envtools("remove", dest)
    assert digests[0] == digests[1]
    assert links[0] == links[1]  # the same number of files hardlinked, relocated, copied
    p = run_envtools("clone", env, tmp_path / "bad", check=False,
                     env={**os.environ, "ENVTOOLS_WORKERS": "many"})
    assert p.returncode == 2 and "ENVTOOLS_WORKERS='many' is not a number" in p.stderr


def test_filesystem_kind_picks_the_process_count(tmp_path, monkeypatch):
    """Network filesystems get 8 placement processes, local ones one per core (at most 4);
    the longest mount prefix decides."""
    from envtools.place import placement

    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        "srv:/home /home nfs4 rw 0 0\n"
        "lfs@o2ib:/scratch /scratch lustre rw 0 0\n"
        "/dev/loop0 /scratch/local\\040disk xfs rw 0 0\n"
    )
    assert placement.fs_type("/home/u/envs/x", str(mounts)) == "nfs4"
    assert placement.fs_type("/scratch/u", str(mounts)) == "lustre"
    assert placement.fs_type("/scratch/local disk/u", str(mounts)) == "xfs"
    assert placement.fs_type("/scratchy", str(mounts)) == "ext4"
    assert placement.fs_type("/x", str(tmp_path / "missing")) == ""
    monkeypatch.delenv("ENVTOOLS_WORKERS", raising=False)
    local = max(1, min(4, len(os.sched_getaffinity(0))))
    assert placement.workers(tmp_path) in (local, 8)  # whatever this machine's /tmp is
    monkeypatch.setenv("ENVTOOLS_WORKERS", "3")
    assert placement.workers(tmp_path) == 3


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupted_sharded_clone_stops_its_processes(env, tmp_path, sig):
    """Ctrl-C / SIGTERM to the clone while forked placement processes are working: they
    are stopped, and no DEST, temp directory or process is left. Made deterministic by a
    cache whose placeholder files are FIFOs: opening one blocks until interrupted."""
    src = tmp_path / "site" / "envs" / "powerai"
    cache = tmp_path / "site" / "envs" / "powerai.pkgs"
    shutil.copytree(env, src, symlinks=True)
    shutil.copytree(env.parent / "powerai.pkgs", cache, symlinks=True)
    for p in [src, cache, *src.rglob("*"), *cache.rglob("*")]:
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | 0o200)
    for rec in (src / "conda-meta").glob("*.json"):
        data = json.loads(rec.read_text())
        if data.get("extracted_package_dir"):
            data["extracted_package_dir"] = str(cache / Path(data["extracted_package_dir"]).name)
            rec.write_text(json.dumps(data))
    info_file = src / "conda-meta" / "envtools" / "prefix.json"
    info = json.loads(info_file.read_text())
    info["package_cache"] = str(cache)
    info_file.write_text(json.dumps(info))
    fifos = 0
    for pkg in cache.iterdir():
        paths = pkg / "info" / "paths.json"
        if not paths.is_file() or "noarch" in json.loads((pkg / "info/index.json").read_text()):
            continue
        for e in json.loads(paths.read_text())["paths"]:
            if e.get("prefix_placeholder"):
                (pkg / e["_path"]).unlink()
                os.mkfifo(pkg / e["_path"])
                fifos += 1
    assert fifos >= 2
    dest = tmp_path / "dest"
    proc = subprocess.Popen([*ENVTOOLS, "clone", str(src), str(dest)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, "ENVTOOLS_WORKERS": "4"})
    children: list[int] = []
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not children:
        time.sleep(0.05)
        out = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True)
        children = [int(x) for x in out.stdout.split()]
    assert children, "no placement process was forked"
    time.sleep(0.2)
    assert proc.poll() is None, "the clone did not block on the FIFOs"
    proc.send_signal(sig)  # to the parent only: it must stop the children itself
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "interrupted; nothing was left behind" in err.decode()
    assert not dest.exists()
    assert not [x for x in tmp_path.iterdir() if "envtools-tmp" in x.name]
    for pid in children:
        assert not Path(f"/proc/{pid}").exists(), f"placement process {pid} outlived the clone"


def test_noarch_python_links_from_the_cache_and_its_entry_point_follows(channel, tmp_path):
    """A noarch: python package's module sits under site-packages/ in the cache and is
    linked from there; its entry point was written by the installer with SRC's python in
    the shebang and no placeholder, so the clone's must be rewritten to run the clone's
    python (a clone's pip or envtools would otherwise act on the read-only env)."""
    src = tmp_path / "site" / "env"
    run_envtools("install", "--channel", channel, "--prefix", src, "demo-noarch")
    cached = next((tmp_path / "site" / "env.pkgs").glob(
        "demo-noarch-*/site-packages/demo_noarch/__init__.py"))
    as_user = ["unshare", "--user", "--"] if os.geteuid() == 0 and shutil.which("unshare") \
        else []
    for who, cmd in (("user", as_user), ("no-cache", ["--no-cache"])):
        dest = tmp_path / who / "env"
        args = [*ENVTOOLS, "clone", str(src), str(dest)]
        p = subprocess.run(cmd + args if who == "user" else args + cmd, capture_output=True,
                           text=True)
        if p.returncode != 0 and "unshare" in p.stderr:
            pytest.skip(f"user namespaces unavailable: {p.stderr.strip()}")
        assert p.returncode == 0, p.stderr
        module = next(dest.glob("lib/python*/site-packages/demo_noarch/__init__.py"))
        if who == "user" and as_user:
            assert module.stat().st_ino == cached.stat().st_ino  # linked, from its cache place
        entry = dest / "bin" / "demo-noarch"
        assert entry.read_text().splitlines()[0] == f"#!{dest}/bin/python{module.parts[-4][6:]}"
        out = subprocess.run([entry], capture_output=True, text=True, check=True).stdout
        assert out.split() == ["demo-noarch", str(module)]
        rec = json.loads(next((dest / "conda-meta").glob("demo-noarch-*.json")).read_text())
        e = next(e for e in rec["paths_data"]["paths"] if e["_path"] == "bin/demo-noarch")
        assert e["sha256"] == hashlib.sha256(entry.read_bytes()).hexdigest()
        assert e["size_in_bytes"] == entry.stat().st_size
        # no part of the stat cache vouches for a hash the file does not have (a part is
        # written per process: one with SRC's hash would hide behind another's)
        for part in (dest / STAT_CACHE).iterdir():
            _version, entries = marshal.loads(part.read_bytes())
            for rel, entry_ in entries.items():
                if entry_sha(entry_):
                    assert entry_sha(entry_) == hashlib.sha256(
                        (dest / rel).read_bytes()).hexdigest(), (part.name, rel)
        assert json.loads(run_envtools("validate", dest, "--json").stdout)["exit_status"] == 0

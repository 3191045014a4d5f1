"""A clone by a user who does not own the site env: root installs the env, another uid
clones it (symlinks to the root-owned cache, cachelinks.py), and nothing that user does
in the clone reaches the site env or its cache."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from types import SimpleNamespace

import pip as pip_module
import pytest
from conftest import make_wheel, other_user, run_envtools
from envtools.bench import asuser
from envtools.cache import find
from envtools.place import cachelinks, plan
from test_clone import installer_bytecode, tree_digest


def _rmtree(p: Path) -> None:
    for dirpath, _dirs, _files in os.walk(p):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(p, ignore_errors=True)


@pytest.fixture(scope="module")
def shared(channel):
    """A root-owned site env in a directory every user can reach, and a user (a uid
    without an account) who clones it."""
    if os.geteuid() != 0:
        pytest.skip("needs root: the site env must be root's and the clone another uid's")
    if not shutil.which("setpriv"):
        pytest.skip("needs setpriv (util-linux) to run as another uid")
    root = Path(tempfile.mkdtemp(prefix="envtools-nonowner-", dir="/tmp"))
    try:
        os.chmod(root, 0o755)
        env = root / "site" / "envs" / "powerai"
        run_envtools("install", "--channel", channel, "--prefix", env, "demo-meta",
                     "demo-noarch")
        user = other_user(root / "home")
        yield SimpleNamespace(root=root, env=env, cache=env.parent / "powerai.pkgs",
                              user=user, channel=channel)
    finally:
        _rmtree(root)


def clone_as(user: asuser.User, *args) -> subprocess.CompletedProcess:
    p = user.run(user.envtools("clone", *args))
    assert p.returncode == 0, p.stderr
    return p


def run_as(user: asuser.User, *argv, check: bool = True, env: dict | None = None):
    p = subprocess.run(user.cmd(*argv), capture_output=True, text=True,
                       env={**user.env, **(env or {})})
    if check:
        assert p.returncode == 0, f"{argv}: {p.stderr}"
    return p


def content_digest(root: Path, cache: Path) -> dict[str, str]:
    """tree_digest, reading through links to the package cache (whole directories and
    single files): what counts is their content; a package's own links stay links."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        rel_dir = os.path.relpath(dirpath, root)
        if rel_dir.split(os.sep)[0] == "conda-meta":
            continue
        for name in [*dirnames, *filenames]:
            p = os.path.join(dirpath, name)
            rel = os.path.normpath(os.path.join(rel_dir, name))
            if os.path.islink(p) and not os.readlink(p).startswith(f"{cache}/"):
                out[rel] = "link:" + os.readlink(p)
                if name in dirnames:
                    dirnames.remove(name)
            elif name in filenames:
                out[rel] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


def cache_links(root: Path, cache: Path) -> dict[str, str]:
    """The clone's files that are symlinks to the cache: {rel: target}."""
    out = {}
    for d, _dirs, files in os.walk(root):
        for n in files:
            p = os.path.join(d, n)
            if os.path.islink(p) and os.readlink(p).startswith(f"{cache}/"):
                out[os.path.relpath(p, root)] = os.readlink(p)
    return out


def linked_dirs(root: Path) -> dict[str, str]:
    """The clone's directory links: {rel: target}."""
    return {os.path.relpath(os.path.join(d, n), root): os.readlink(os.path.join(d, n))
            for d, dirnames, _f in os.walk(root) for n in dirnames
            if os.path.islink(os.path.join(d, n))}


def site_state(shared) -> dict[str, tuple]:
    """Every file of the site env and its cache: content, mode, owner, inode."""
    out = {}
    for top in (shared.env, shared.cache):
        for dirpath, dirnames, filenames in os.walk(top):
            for name in filenames + dirnames:
                p = os.path.join(dirpath, name)
                st = os.lstat(p)
                digest = (hashlib.sha256(open(p, "rb").read()).hexdigest()
                          if os.path.isfile(p) and not os.path.islink(p) else None)
                out[p] = (digest, st.st_mode, st.st_uid, st.st_ino, st.st_size)
    return out


def check_runs_as(user: asuser.User, prefix: Path) -> None:
    """The clone's program, script and python run for its user and see only the clone."""
    assert run_as(user, prefix / "bin" / "demo").stdout.splitlines() == [
        f"{prefix}/share/demo", f"prefix={prefix}"]
    assert run_as(user, prefix / "bin" / "demo-wrapper").stdout.splitlines()[0] == \
        f"{prefix}/share/demo"
    py = run_as(user, prefix / "bin" / "python", "-c",
                "import sys, demo_py, demo_noarch; print(sys.prefix); print(demo_py.where()); "
                "print(demo_py.__file__); print(demo_noarch.__file__)").stdout.splitlines()
    assert py[0] == str(prefix) and py[1] == str(prefix)
    assert py[2].startswith(str(prefix)) and py[3].startswith(str(prefix))
    out = run_as(user, prefix / "bin" / "demo-noarch").stdout.split()
    assert out[0] == "demo-noarch" and out[1].startswith(str(prefix))


def test_nonowner_clone_links_the_cache_runs_and_validates(shared):
    dest = shared.user.home / "mine"
    p = clone_as(shared.user, shared.env, dest)
    assert "symlinks to the cache" in p.stderr and "hardlink" not in p.stderr
    assert "linked directories" not in p.stderr
    cache = {d.name.rsplit("-", 2)[0]: d for d in shared.cache.iterdir() if d.is_dir()}
    site = next(dest.glob("lib/python*/site-packages"))
    sp = site.relative_to(dest)
    # plain package files: a symlink each, to the root-owned cache file
    for rel, pkg in (("include/demo.h", "libdemo"), ("share/demo-meta/README", "demo-meta"),
                     (str(next(site.glob("demo_py/_ext.*.so")).relative_to(dest)), "demo-py"),
                     (f"{sp}/demo_py-2.0.0.dist-info/RECORD", "demo-py"),
                     (f"{sp}/demo_noarch/__init__.py", "demo-noarch")):
        f = dest / rel
        assert f.is_symlink(), rel
        target = Path(os.readlink(f))
        assert target.is_relative_to(cache[pkg]) and target.stat().st_uid == 0, rel
    # real files: relocated ones, the installer's entry point, and a program whose
    # package relocates (run through a link, its $ORIGIN would be the cache's)
    for rel in ("bin/demo", "lib/libdemo.so.1", "share/demo/config.txt", "bin/demo-noarch",
                f"{sp}/demo_py/__init__.py"):
        assert not (dest / rel).is_symlink() and (dest / rel).stat().st_uid == shared.user.uid
    # every directory is the user's own (pip, conda, editors add and remove there)
    assert linked_dirs(dest) == {}
    for dirpath, _dirs, _files in os.walk(dest):
        assert os.stat(dirpath).st_uid == shared.user.uid
    check_runs_as(shared.user, dest)
    rec = json.loads(next((dest / "conda-meta").glob("demo-meta-*.json")).read_text())
    assert rec["link"] == {"source": str(cache["demo-meta"]), "type": cachelinks.LINK_SOFTLINK}
    doc = json.loads(run_as(shared.user, *shared.user.python, "-m", "envtools", "validate",
                            dest, "--json").stdout)
    assert doc["exit_status"] == 0, doc["findings"]
    assert doc["checked"]["hashed"] == 0  # the stat cache vouched for every linked file
    assert not [f for f in doc["findings"] if f["check"] == "linked-directories"]
    full = json.loads(run_envtools("validate", "--full", "--json", dest).stdout)
    assert full["exit_status"] == 0 and full["checked"]["elf_files"] == \
        doc["checked"]["elf_files"] >= 3  # the linked extension is checked too


def test_linked_directories_and_detach(shared):
    """--link-mode dirs: one link for each directory one package owns wholly and that
    needs no file of the clone's own; envtools detach turns such links into a symlink per
    file, what the default clone has."""
    dest = shared.user.home / "dirs"
    p = clone_as(shared.user, "--link-mode", "dirs", shared.env, dest)
    assert "linked directories" in p.stderr
    cache = {d.name.rsplit("-", 2)[0]: d for d in shared.cache.iterdir() if d.is_dir()}
    sp = next(dest.glob("lib/python*/site-packages")).relative_to(dest)
    dirs = linked_dirs(dest)
    assert dirs == {"share/demo-meta": f"{cache['demo-meta']}/share/demo-meta",
                    "share/cuda-version": f"{cache['cuda-version']}/share/cuda-version",
                    f"{sp}/demo_py-2.0.0.dist-info":
                    f"{cache['demo-py']}/{sp}/demo_py-2.0.0.dist-info",
                    f"{sp}/demo_noarch": f"{cache['demo-noarch']}/site-packages/demo_noarch"}
    # (demo_py/ holds a relocated file, include/ is shared; demo_noarch/ has the pycs
    # install compiled into its cache entry)
    for target in dirs.values():
        assert Path(target).stat().st_uid == 0
    check_runs_as(shared.user, dest)
    doc = json.loads(run_as(shared.user, *shared.user.python, "-m", "envtools", "validate",
                            dest, "--json").stdout)
    assert doc["exit_status"] == 0 and doc["checked"]["hashed"] == 0, doc["findings"]
    linked = [f for f in doc["findings"] if f["check"] == "linked-directories"]
    assert linked[0]["packages"] == ["cuda-version", "demo-meta", "demo-noarch", "demo-py"]
    assert f"envtools detach {dest}" in linked[0]["hint"]
    p = run_as(shared.user, *shared.user.python, "-m", "envtools", "detach", dest,
               "demo-meta")
    assert "detached 1 directories of 1 packages: demo-meta" in p.stderr
    assert "share/demo-meta" not in linked_dirs(dest) and len(linked_dirs(dest)) == 3
    run_as(shared.user, *shared.user.python, "-m", "envtools", "detach", dest)
    assert linked_dirs(dest) == {}
    per_file = shared.user.home / "per-file"
    clone_as(shared.user, shared.env, per_file)
    # the same entries, and each file that is a link leads to the same cache file; and
    # the noarch: python package's bytecode, which only --link-mode dirs takes along
    pycs = {k for k in content_digest(dest, shared.cache) if "demo_noarch/__pycache__/" in k}
    assert pycs and all(k.endswith(".pyc") for k in pycs)
    assert content_digest(dest, shared.cache).keys() - pycs == \
        content_digest(per_file, shared.cache).keys()
    assert {k: v for k, v in cache_links(dest, shared.cache).items() if k not in pycs} == \
        cache_links(per_file, shared.cache)
    doc = json.loads(run_as(shared.user, *shared.user.python, "-m", "envtools", "validate",
                            dest, "--json").stdout)
    assert doc["exit_status"] == 0 and doc["checked"]["hashed"] == 0, doc["findings"]
    assert not [f for f in doc["findings"] if f["check"] == "linked-directories"]
    check_runs_as(shared.user, dest)
    p = run_as(shared.user, *shared.user.python, "-m", "envtools", "detach", dest, "nope",
               check=False)
    assert p.returncode == 2 and "no package named nope" in p.stderr


def test_a_directory_that_fails_its_check_is_split_not_given_up(shared):
    """One file the cache should not hold, in share/demo-meta/notes/: that directory is
    placed a symlink per file and the stray file is not brought in; its sibling data/
    is still one link, and share/demo-meta itself is a real directory."""
    cache = next(d for d in shared.cache.iterdir() if d.name.startswith("demo-meta-"))
    stray = cache / "share" / "demo-meta" / "notes" / "stray.txt"
    stray.write_text("not the package's\n")
    try:
        dest = shared.user.home / "split"
        p = clone_as(shared.user, "--link-mode", "dirs", shared.env, dest)
        assert "linked directories" in p.stderr
        dirs = linked_dirs(dest)
        assert dirs.get("share/demo-meta/data") == f"{cache}/share/demo-meta/data", dirs
        assert "share/demo-meta" not in dirs and "share/demo-meta/notes" not in dirs
        notes = dest / "share" / "demo-meta" / "notes"
        assert sorted(os.listdir(notes)) == ["a.txt"]
        assert os.readlink(notes / "a.txt") == f"{cache}/share/demo-meta/notes/a.txt"
        assert (dest / "share" / "demo-meta" / "README").is_symlink()
        assert (dest / "share" / "demo-meta" / "data" / "b.txt").read_text() == "data\n"
        doc = json.loads(run_as(shared.user, *shared.user.python, "-m", "envtools",
                                "validate", dest, "--json").stdout)
        assert doc["exit_status"] == 0, doc["findings"]
        run_as(shared.user, "rm", "-rf", dest)
    finally:
        stray.unlink()


@pytest.mark.parametrize("mode", ["auto", "dirs"])
def test_nonowner_clone_has_the_bytes_of_an_install_at_dest(shared, mode):
    """Read through its links, the clone is what installing the packages there gives."""
    dest = shared.user.home / "same" / "env"
    clone_as(shared.user, "--link-mode", mode, shared.env, dest)
    cloned = content_digest(dest, shared.cache)
    assert cloned != tree_digest(dest)  # (it does link)
    _rmtree(dest)
    run_envtools("install", "--channel", shared.channel, "--prefix", dest, "demo-meta",
                 "demo-noarch")
    try:
        # (but for the bytecode install compiles, which a clone leaves out:
        # envtools.place.bytecode; with --link-mode dirs, only the one that holds the prefix:
        # the noarch: python package's is the same in every prefix, and comes along)
        compiled = installer_bytecode(dest)
        assert compiled
        if mode == "dirs":
            noarch = {p for p in compiled if "/demo_noarch/" in p}
            assert noarch and noarch <= cloned.keys()
            compiled -= noarch
        # (less the read-only env's PEP 668 and CEP 22 markers, which a clone leaves out)
        assert {k: v for k, v in tree_digest(dest).items()
                if k not in compiled and not k.endswith("/EXTERNALLY-MANAGED")
                and not k.startswith("pkgs/envtools-site-only/")} == cloned
    finally:
        run_envtools("remove", dest)


def test_noarch_bytecode_comes_from_the_cache_and_is_checked(shared):
    """--link-mode dirs takes the pycs install compiled into a noarch: python package's
    cache entry, so its directory is one link: the user's python imports it from those
    pycs (the code names the clone's file) and writes nothing, and validate is clean
    without hashing. A cache pyc changed after install is refused like any cache file."""
    user = shared.user
    dest = user.home / "noarch-dirs"
    clone_as(user, "--link-mode", "dirs", shared.env, dest)
    site = next(dest.glob("lib/python*/site-packages"))
    assert (site / "demo_noarch").is_symlink()
    rec = json.loads(next((dest / "conda-meta").glob("demo-noarch-*.json")).read_text())
    pycs = [e["_path"] for e in rec["paths_data"]["paths"] if e.get("path_type") == "pyc_file"]
    assert pycs and set(pycs) <= set(rec["files"])
    before = {p: os.lstat(p).st_mtime_ns for p in map(str, dest.rglob("*"))}
    code = ("import demo_noarch, sys; print(demo_noarch.__cached__); "
            "print(demo_noarch.main.__code__.co_filename); print(sys.dont_write_bytecode)")
    out = run_as(user, dest / "bin" / "python", "-c", code,
                 env={"PYTHONDONTWRITEBYTECODE": ""}).stdout.split()
    assert out == [str(dest / pycs[0]), str(site / "demo_noarch" / "__init__.py"), "False"]
    assert {p: os.lstat(p).st_mtime_ns for p in map(str, dest.rglob("*"))} == before
    doc = json.loads(run_as(user, *user.python, "-m", "envtools", "validate", dest,
                            "--json").stdout)
    assert doc["exit_status"] == 0 and doc["checked"]["hashed"] == 0, doc["findings"]
    cached = Path(os.path.realpath(site / "demo_noarch")) / "__pycache__"
    run_as(user, "rm", "-rf", dest)
    pyc = next(cached.iterdir())
    original, st = pyc.read_bytes(), pyc.stat()
    os.chmod(pyc, 0o644)
    try:
        pyc.write_bytes(original[:16] + b"changed")  # (the same inode: the stat changes)
        os.chmod(pyc, 0o444)
        for mode in ("dirs", "auto"):
            p = user.run(user.envtools("clone", "--link-mode", mode, shared.env, dest))
            if mode == "dirs":
                assert p.returncode == 1 and "does not match its record" in p.stderr, p.stderr
                assert not dest.exists()
            else:  # (the default leaves the installer's bytecode out)
                assert p.returncode == 0, p.stderr
                assert not list(dest.rglob("*.pyc")) or all(
                    "demo_noarch" not in str(x) for x in dest.rglob("*.pyc"))
                run_as(user, "rm", "-rf", dest)
    finally:
        os.chmod(pyc, 0o644)
        pyc.write_bytes(original)
        os.chmod(pyc, 0o444)
        os.utime(pyc, ns=(st.st_atime_ns, st.st_mtime_ns))  # (its stat key: vouched again)


def test_nothing_the_user_does_in_the_clone_reaches_the_site_env(shared):
    """Writing into a linked file or directory fails; replacing files, pip install, pip
    upgrade and pip uninstall of a conda package whose files are links (for linked
    directories: after envtools detach), and rm -rf all work; the site env and its cache
    stay as they were, byte for byte, mode and inode."""
    before = site_state(shared)
    user = shared.user
    dest, dirs = user.home / "work", user.home / "work-dirs"
    clone_as(user, shared.env, dest)
    clone_as(user, "--link-mode", "dirs", shared.env, dirs)
    header, readme = dest / "include" / "demo.h", dirs / "share" / "demo-meta" / "README"
    assert readme.parent.is_symlink()
    for f in (header, dest / "share" / "demo-meta" / "README", readme):
        assert run_as(user, "sh", "-c", f"echo x >> {f}", check=False).returncode != 0
        assert run_as(user, "chmod", "u+w", f, check=False).returncode != 0
        assert run_as(user, "truncate", "-s", "0", f, check=False).returncode != 0
    assert run_as(user, "touch", readme.parent / "new", check=False).returncode != 0
    run_as(user, "sh", "-c", f"rm {header} && echo mine > {header}")  # replacing is fine
    assert header.read_text() == "mine\n" and not header.is_symlink()

    pip = pip_as(shared)
    wheels = shared.root / "wheels"  # (where the user can read them)
    wheels.mkdir(exist_ok=True)
    new = make_wheel(wheels, "hello-tool", "1.0", {"hello_tool/__init__.py": "X = 1\n"})
    upgrade = make_wheel(wheels, "demo-py", "3.0.0", {"demo_py/__init__.py": "V = 3\n"})
    run_as(user, *user.python, "-m", "envtools", "detach", dirs, "demo-py")
    for prefix in (dest, dirs):
        run_as(user, *pip(prefix), "install", "--no-deps", "--no-index", new)
        site = next(prefix.glob("lib/python*/site-packages"))
        ext = next(site.glob("demo_py/_ext.*.so"))
        assert ext.is_symlink()
        # pip replaces the conda package: it removes its files (links), writes its own
        p = run_as(user, *pip(prefix), "install", "--no-deps", "--no-index", "--upgrade",
                   upgrade)
        assert "Successfully uninstalled demo-py-2.0.0" in p.stdout, p.stdout
        assert not ext.exists() and not ext.is_symlink()
        assert sorted(x.name for x in site.glob("demo_py*")) == [
            "demo_py", "demo_py-3.0.0.dist-info"]
        out = run_as(user, prefix / "bin" / "python", "-c",
                     "import demo_py, hello_tool; print(demo_py.V)").stdout
        assert out.strip() == "3"
        run_as(user, *pip(prefix), "uninstall", "--yes", "demo-py")
        assert not (site / "demo_py").exists()
        run_as(user, "rm", "-rf", prefix / "share" / "demo-meta",
               prefix / "lib" / "libdemo.so.1")
    assert site_state(shared) == before
    # and the clones go away like any directory of the user's
    run_as(user, "rm", "-rf", dest, dirs)
    assert site_state(shared) == before


def pip_as(shared):
    """The pip command for a clone: the clone's python running pip, seeing no other
    distribution than the clone's. A copy of pip, not a link to ours: the user may not
    reach our .venv (a checkout under a private home)."""
    pip_only = shared.root / "pip-only"
    if not pip_only.exists():
        shutil.copytree(Path(pip_module.__file__).parent, pip_only / "pip")

    def cmd(prefix: Path) -> list:
        return ["env", f"PYTHONPATH={pip_only}", prefix / "bin" / "python", "-m", "pip",
                "--disable-pip-version-check", "--no-cache-dir", "--no-input"]
    return cmd


def test_pip_cannot_change_a_linked_package_nor_the_site(shared):
    """Before envtools detach, pip cannot remove a package whose directories are links
    (they are the site's): whatever it reports, the site env and its cache are unchanged,
    and validate shows what is left (the clone's python here is venv-like: pip skips the
    files it may not remove; a conda env's python stops with Permission denied)."""
    before = site_state(shared)
    dest = shared.user.home / "linked-pip"
    clone_as(shared.user, "--link-mode", "dirs", shared.env, dest)
    (shared.root / "wheels").mkdir(exist_ok=True)
    upgrade = make_wheel(shared.root / "wheels", "demo-py", "3.0.0",
                         {"demo_py/__init__.py": "V = 3\n"})
    run_as(shared.user, *pip_as(shared)(dest), "install", "--no-deps", "--no-index",
           "--upgrade", upgrade, check=False)
    assert site_state(shared) == before
    site = next(dest.glob("lib/python*/site-packages"))
    assert (site / "demo_py-2.0.0.dist-info").is_symlink()  # (not removed: the site's)
    doc = json.loads(run_as(shared.user, *shared.user.python, "-m", "envtools", "validate",
                            dest, "--json", check=False).stdout)
    assert doc["exit_status"] == 1  # (two demo-py: the conda one is still there)


@pytest.mark.parametrize("mode", ["auto", "dirs"])
def test_validate_reads_through_the_links(shared, mode):
    """A cache file changed after the clone is reported by the clone's validate (through
    a linked file, or a linked directory), and a cache that is gone is named in the
    finding (the clone needs it)."""
    dest = shared.user.home / f"checked-{mode}"
    clone_as(shared.user, "--link-mode", mode, shared.env, dest)
    validate = [*shared.user.python, "-m", "envtools", "validate", "--json", dest]
    site = next(dest.glob("lib/python*/site-packages"))
    ext = next(site.glob("demo_py/_ext.*.so"))
    changed = {"share/demo-meta/README": dest / "share/demo-meta/README",
               "include/demo.h": dest / "include/demo.h"}
    for rel, f in changed.items():
        real = Path(os.path.realpath(f))
        assert real.is_relative_to(shared.cache), rel
        original = real.read_bytes()
        os.chmod(real, 0o644)
        try:
            real.write_bytes(b"changed by someone\n")
            doc = json.loads(run_as(shared.user, *validate, check=False).stdout)
            assert doc["exit_status"] == 1
            assert [f["paths"] for f in doc["findings"] if f["check"] == "altered-file"] == [
                [rel]]
        finally:
            real.write_bytes(original)
            os.chmod(real, 0o444)
    assert json.loads(run_as(shared.user, *validate).stdout)["exit_status"] == 0
    for pkg in (Path(os.path.realpath(changed["share/demo-meta/README"])).parents[2],
                Path(os.path.realpath(ext)).parents[4]):
        os.rename(pkg, pkg.with_name(pkg.name + ".gone"))
    try:
        doc = json.loads(run_as(shared.user, *validate, check=False).stdout)
        missing = {p: f for f in doc["findings"] if f["check"] == "missing-file"
                   for p in f["paths"]}
        for rel in ("share/demo-meta/README", str(ext.relative_to(dest)),
                    f"{site.relative_to(dest)}/demo_py-2.0.0.dist-info/RECORD"):
            assert "package cache" in missing[rel]["hint"], rel
    finally:
        for pkg in shared.cache.glob("*.gone"):
            os.rename(pkg, pkg.with_name(pkg.name[:-5]))


def test_another_users_cache_is_copied_unless_trusted(shared):
    """A colleague's env: its owner could change its cache later, so a clone of it copies
    by default; --link-mode symlink links it for a user who trusts that owner."""
    channel = shared.root / "channel"
    shutil.copytree(shared.channel, channel)
    for dirpath, _dirs, files in os.walk(channel):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    colleague = other_user(shared.root / "colleague", uid=asuser.free_uid(shared.user.uid + 1))
    theirs = colleague.home / "envs" / "theirs"
    p = colleague.run(colleague.envtools("install", "--channel", channel, "--prefix", theirs,
                                         "demo-meta"))
    assert p.returncode == 0, p.stderr
    p = clone_as(shared.user, theirs, shared.user.home / "copied")
    assert "symlinks to the cache" not in p.stderr and "copy" in p.stderr
    p = clone_as(shared.user, "--link-mode", "symlink", theirs, shared.user.home / "trusted")
    assert "symlinks to the cache" in p.stderr and "linked directories" not in p.stderr
    check_runs_as_minimal = run_as(shared.user, shared.user.home / "trusted" / "bin" / "demo")
    assert check_runs_as_minimal.stdout.splitlines()[1] == \
        f"prefix={shared.user.home / 'trusted'}"


def test_a_group_writable_shared_cache_is_not_safe(shared):
    """Why envtools has no ``install --shared-cache GROUP``: with protected_hardlinks the
    kernel lets a user hardlink a file they do not own only if they may also write it, and
    then they can change the site's file through the link."""
    if Path("/proc/sys/fs/protected_hardlinks").read_text().strip() != "1":
        pytest.skip("fs.protected_hardlinks is not 1 here")
    site_file = shared.root / "site" / "shared-file"
    site_file.write_text("site content\n")
    os.chown(site_file, 0, shared.user.gid)
    link = shared.user.home / "link"
    user = shared.user
    for mode, allowed in ((0o444, False), (0o440, False), (0o664, True)):
        os.chmod(site_file, mode)
        p = run_as(user, "ln", site_file, link, check=False)
        assert (p.returncode == 0) == allowed, (oct(mode), p.stderr)
    run_as(user, "sh", "-c", f"echo changed by a user > {link}")
    assert site_file.read_text() == "changed by a user\n"
    site_file.unlink()
    link.unlink()


def test_a_program_is_linked_only_where_it_runs_the_same(tmp_path):
    """A program run through a symlink gets its real directory as $ORIGIN: it may be a
    link only if every library it finds through $ORIGIN is its own package's."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    env, pkg = tmp_path / "env", tmp_path / "pkg"
    for d in (env / "bin", env / "lib", pkg / "bin", pkg / "lib"):
        d.mkdir(parents=True)
    (tmp_path / "x.c").write_text("int x(void){return 1;}\n")
    (tmp_path / "m.c").write_text("int x(void); int main(void){return x();}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", env / "lib" / "libx.so",
                    tmp_path / "x.c"], check=True)
    subprocess.run(["gcc", "-o", env / "bin" / "prog", tmp_path / "m.c", "-L", env / "lib",
                    "-lx", "-Wl,-rpath,$ORIGIN/../lib"], check=True)
    shutil.copy2(env / "bin" / "prog", pkg / "bin" / "prog")
    # libx belongs to another package: from the cache, $ORIGIN/../lib has no libx
    assert not cachelinks.runs_from_cache("bin/prog", str(pkg), str(env))
    shutil.copy2(env / "lib" / "libx.so", pkg / "lib" / "libx.so")  # now its own
    assert cachelinks.runs_from_cache("bin/prog", str(pkg), str(env))


def test_an_rpath_serves_what_it_loads_from_its_own_origin(tmp_path):
    """A program's DT_RPATH (not RUNPATH) is searched for its libraries' libraries too,
    with $ORIGIN the program's directory; an entry leading out of the tree that holds
    nothing is passed over, as the loader does."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    env, pkg = tmp_path / "tree" / "env", tmp_path / "tree" / "pkg"
    for d in (env / "bin", env / "lib" / "sub", pkg / "bin", pkg / "lib" / "sub"):
        d.mkdir(parents=True)
    (tmp_path / "y.c").write_text("int y(void){return 1;}\n")
    (tmp_path / "x.c").write_text("int y(void); int x(void){return y();}\n")
    (tmp_path / "m.c").write_text("int x(void); int main(void){return x();}\n")
    lib = env / "lib"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib / "liby.so", tmp_path / "y.c"],
                   check=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", lib / "sub" / "libx.so", tmp_path / "x.c",
                    "-L", lib, "-ly"], check=True)
    subprocess.run(["gcc", "-o", env / "bin" / "prog", tmp_path / "m.c", "-L", lib / "sub",
                    "-lx", f"-Wl,-rpath-link,{lib}", "-Wl,--disable-new-dtags",
                    "-Wl,-rpath,$ORIGIN/../../nowhere:$ORIGIN/../lib/sub:$ORIGIN/../lib"],
                   check=True)
    assert subprocess.run([env / "bin" / "prog"]).returncode == 1  # (x() found y())
    for rel in ("bin/prog", "lib/sub/libx.so"):
        shutil.copy2(env / rel, pkg / rel)
    # liby, which libx finds through the program's RPATH, is another package's
    assert not cachelinks.runs_from_cache("bin/prog", str(pkg), str(env))
    shutil.copy2(lib / "liby.so", pkg / "lib" / "liby.so")  # now its own
    assert cachelinks.runs_from_cache("bin/prog", str(pkg), str(env))
    (tmp_path / "tree" / "nowhere").mkdir()  # (found outside the trees: not its own)
    shutil.copy2(lib / "sub" / "libx.so", tmp_path / "tree" / "nowhere" / "libx.so")
    assert not cachelinks.runs_from_cache("bin/prog", str(pkg), str(env))


def test_a_records_link_type_is_changed_in_place():
    """The record's bytes are kept; only its trailing link object changes, in either of
    the two forms records are written in, and nothing else is touched."""
    rec = {"name": "x", "paths_data": {"paths": []}, "link": {"source": "/c/x-1-0", "type": 1}}
    pretty = json.dumps(rec, indent=2).encode()
    for form in (pretty, pretty + b"\n", json.dumps(rec).encode()):
        out = cachelinks.relinked_record(form, "/c/x-1-0", 1, 2)
        assert json.loads(out) == {**rec, "link": {"source": "/c/x-1-0", "type": 2}}
        assert out.replace(b'"type": 2', b'"type": 1') == form
    assert cachelinks.relinked_record(pretty, "/c/other", 1, 2) is None
    moved = json.dumps({"link": rec["link"], "name": "x"}).encode()  # not the last field
    assert cachelinks.relinked_record(moved, "/c/x-1-0", 1, 2) is None


def test_which_directories_become_links():
    """Only a directory one package owns wholly, that needs no file of the clone's own,
    whose every .py has its .pyc, and that nobody commonly adds to."""
    from envtools.place.layers import plan
    from envtools.place.plan import IN_ARCHIVE

    sp = "lib/python3.11/site-packages"

    def items(*rels, placeholder=None):
        return [(r, "/c/" + r, "hardlink", placeholder, None, True, None, 1) for r in rels]

    groups = [
        (0, items(f"{sp}/good/__init__.py", f"{sp}/good/__pycache__/__init__.cpython-311.pyc",
                  f"{sp}/good/data/x.bin", f"{sp}/good-1.0.dist-info/RECORD")),
        (1, items(f"{sp}/nopyc/__init__.py")),  # (python would compile it on every import)
        (2, items(f"{sp}/ns/part/__init__.py", f"{sp}/ns/part/__pycache__/__init__.c.pyc")),
        (3, items(f"{sp}/shared/__init__.py", f"{sp}/shared/__pycache__/__init__.c.pyc",
                  "share/man/man1/tool.1", "share/tool/a", "etc/tool/conf", "bin/tool")),
        (4, items(f"{sp}/shared/extra.py", f"{sp}/shared/__pycache__/extra.c.pyc")),
        (5, items("share/reloc/a") + items("share/reloc/b", placeholder="/ph")),
        (6, items("share/pinned/a", "include/lib6/x.h")),
        (7, items("share/untrusted/a")),
    ]
    chosen = plan(groups, linkable=range(7), untracked=["share/pinned/user-file"],
                  in_archive=IN_ARCHIVE)
    assert chosen == {f"{sp}/good": 0, f"{sp}/good-1.0.dist-info": 0,
                      f"{sp}/ns/part": 2,  # (the namespace package ns itself: not a link)
                      "share/tool": 3, "include/lib6": 6}


def test_install_plans_the_directory_links_a_clone_would(shared):
    """install stores the plan of directory links for its own records (planning walks
    every path, before a clone can place anything): the same plan a clone makes, used
    only for the record index it was made for, with no untracked files in SRC."""
    from envtools.place import layers
    from envtools.place.placement import Ctx
    from envtools.prefix import record_index
    from envtools.prefix.noarch import cache_rel

    prefix = record_index.load_prefix(shared.env)
    assert prefix.index_key is not None
    stored = layers.read_plan(shared.env, prefix.index_key)
    assert stored is not None and stored.dirs
    records = prefix.records
    cache = find.find_cache(shared.env, records)
    kept: set[int] = set()
    groups = plan.plan_files(records, cache, shared.env, str(shared.env), kept)
    planned = layers.plan(groups, range(len(records)), [], plan.IN_ARCHIVE)
    assert (stored.dirs, stored.kept) == ({d: records[k].dist for d, k in planned.items()},
                                          {records[k].dist for k in kept})
    # (the programs placed alone that must be real files: bin/demo, whose package
    # relocates files, so from the cache its $ORIGIN/../lib would not be the clone's)
    assert stored.real == frozenset({"bin/demo"})
    # with a listing of each directory it checked: its top, then every file of it,
    # and the cache directory it listed
    assert set(stored.listings) == set(planned) == set(stored.targets)
    for d, k in planned.items():
        in_cache = cache_rel(records[k].noarch_python, d)
        assert stored.targets[d] == f"{cache[records[k].name]}/{in_cache}"
    for d, listing in stored.listings.items():
        assert listing.startswith(b"\0d ")
        names = set(listing.split(b"\0")[::3])
        assert {it[0][len(d) + 1:].encode() for _k, items in groups for it in items
                if it[0].startswith(d + "/")} <= names
    ctx = Ctx(dest_tmp=Path("/nonexistent"), new_prefix="/x", old_prefix=str(shared.env),
              src_root=str(shared.env), euid=shared.user.uid, link_mode="dirs",
              symlink_roots={k: str(cache[r.name]) for k, r in enumerate(records)},
              index_key=prefix.index_key)
    assert plan._planned_at_install(ctx, records, kept, []) == planned
    assert plan._planned_at_install(ctx, records, kept, ["share/x"]) is None  # untracked
    assert plan._planned_at_install(ctx, records, set(), []) is None  # no bytecode then
    ctx.index_key = (0, 0, 0)  # (records that are not the index's: planned anew)
    assert plan._planned_at_install(ctx, records, kept, []) is None
    assert layers.read_plan(shared.env, (0, 0, 0)) is None


def _site_of_its_own(shared, name: str) -> SimpleNamespace:
    """root's install of demo-meta at a prefix of its own (other tests change the shared
    cache), with what a user's clone reads of it, and a user's placement context for it
    (``ctx()``: a new one each call, nothing listed yet)."""
    from envtools.place.placement import Ctx
    from envtools.prefix import record_index

    env = shared.root / name / "env"
    env.parent.mkdir(mode=0o755)
    run_envtools("install", "--channel", shared.channel, "--prefix", env, "demo-meta")
    prefix = record_index.load_prefix(env)
    records = prefix.records
    cache = find.find_cache(env, records)
    kept: set[int] = set()
    groups = plan.plan_files(records, cache, env, str(env), kept)

    def ctx() -> Ctx:
        return Ctx(dest_tmp=Path("/nonexistent"), new_prefix="/x", old_prefix=str(env),
                   src_root=str(env), euid=shared.user.uid, link_mode="dirs",
                   index_key=prefix.index_key,
                   symlink_roots={k: str(cache[r.name]) for k, r in enumerate(records)})

    return SimpleNamespace(env=env, records=records, cache=cache, kept=kept, groups=groups,
                           ctx=ctx)


def test_installs_listings_stand_for_the_checks_only_while_they_hold(shared):
    """A clone of root's site env lists the cache directories it links with find and
    skips layers.verify for each one whose listing is the one root's install stored.
    Only a plan root wrote counts, and a directory changed since (a mode, here) is
    checked again."""
    from envtools.place import layers
    from envtools.place.placement import Ctx, finish_prechecks, start_prechecks

    site = _site_of_its_own(shared, "listed")
    env, records, cache, kept, groups = site.env, site.records, site.cache, site.kept, site.groups

    def ctx_now() -> Ctx:
        ctx = site.ctx()
        plan.list_planned_early(ctx, records, cache)
        return ctx

    ctx = ctx_now()
    layered = plan.plan_layers(ctx, records, cache, groups, [], kept)
    planned = {it[0]: it[1] for _k, items in layered for it in items
               if it[2] == layers.LAYER}
    assert planned and ctx.listings is not None and set(ctx.listings) == set(planned)
    finish_prechecks(ctx)  # (list_planned_early started them)
    assert ctx.prechecked == frozenset(planned)
    d, target = sorted(planned.items())[0]
    victim = next(p for p in Path(target).rglob("*") if p.is_file() and not p.is_symlink())
    mode = victim.stat().st_mode
    plan_file = env / layers.PLAN
    try:
        os.chmod(victim, 0o400)
        start_prechecks(ctx, planned)
        finish_prechecks(ctx)
        assert d not in ctx.prechecked and ctx.prechecked
        os.chmod(victim, mode)
        os.chown(plan_file, shared.user.uid, -1)  # (not root's word any more)
        other = ctx_now()
        assert other.plan is not None and other.listings is None
        assert plan.plan_layers(other, records, cache, groups, [], kept) == layered
        finish_prechecks(other)
        assert other.prechecked == frozenset()
    finally:
        os.chmod(victim, mode)
        os.chown(plan_file, 0, -1)


def test_listings_start_before_the_records_and_count_only_for_the_same_directories(shared):
    """A clone as a user starts find on the cache directories root's plan names before
    it reads the env's records, and uses what it listed only if the records lead to
    exactly those directories; otherwise it lists the ones they lead to."""
    from envtools.place import layers, placement
    from envtools.place.placement import finish_prechecks

    site = _site_of_its_own(shared, "listed-first")
    env, records, cache, kept, groups = site.env, site.records, site.cache, site.kept, site.groups
    ctx_now = site.ctx

    early = plan.list_plan_first(env)
    assert early is not None and early.dirs == frozenset(early.plan.listings)
    ctx = ctx_now()
    plan.list_planned_early(ctx, records, cache, early)
    assert ctx._listing_jobs is early.jobs  # (the same directories: adopted)
    layered = plan.plan_layers(ctx, records, cache, groups, [], kept)
    planned = {it[0] for _k, items in layered for it in items if it[2] == layers.LAYER}
    finish_prechecks(ctx)
    assert ctx.prechecked == frozenset(planned) == early.dirs

    # records that lead elsewhere (a package's cache directory seen through another
    # path, here a symlink to it): what was listed first is dropped, those are listed
    name = records[0].name
    alias = shared.root / "listed-first" / "alias"
    alias.symlink_to(cache[name])
    elsewhere = {**cache, name: alias}
    early = plan.list_plan_first(env)
    ctx = ctx_now()
    plan.list_planned_early(ctx, records, elsewhere, early)
    assert ctx._listing_jobs is not early.jobs
    assert all(job is None or job.proc.poll() is not None for job, _d in early.jobs)
    listed = [d for _job, dirs in ctx._listing_jobs for d in dirs]
    assert any(d in planned for d in listed)
    placement.stop_listings(ctx._listing_jobs)

    # a plan that is not root's word: nothing is started first
    plan_file = env / layers.PLAN
    os.chown(plan_file, shared.user.uid, -1)
    try:
        assert plan.list_plan_first(env) is None
    finally:
        os.chown(plan_file, 0, -1)


def test_a_library_that_climbs_out_of_its_directory_is_not_behind_a_link(tmp_path):
    """The kernel resolves `..` after following a directory link: a library whose RUNPATH
    is $ORIGIN/.. searches the cache, not the clone. Its directory stays real unless
    every library it finds that way is its own package's, at the same place in the env
    (a wheel's bundled `$ORIGIN/../pkg.libs`)."""
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc")
    from envtools.place.layers import verify

    pkg, env = tmp_path / "cache" / "pkg", tmp_path / "env"
    layer = pkg / "lib" / "sub"
    for d in (layer, env / "lib" / "sub", env / "lib" / "other"):
        d.mkdir(parents=True)
    (tmp_path / "x.c").write_text("int y(void); int x(void){return y();}\n")
    (tmp_path / "y.c").write_text("int y(void){return 1;}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", env / "lib" / "other" / "liby.so",
                    tmp_path / "y.c"], check=True)
    items = [("lib/sub/libx.so", str(layer / "libx.so"), "hardlink", None, None, True, None, 1)]
    # (liby: another package's in the env; then also this package's own, in its cache)
    for runpath, own_liby, linkable in (("$ORIGIN", False, True),
                                        ("$ORIGIN/../other", False, False),
                                        ("$ORIGIN/../other", True, True)):
        (layer / "libx.so").unlink(missing_ok=True)
        subprocess.run(["gcc", "-shared", "-fPIC", "-o", layer / "libx.so", tmp_path / "x.c",
                        "-L", env / "lib" / "other", "-ly", f"-Wl,-rpath,{runpath}",
                        "-Wl,--enable-new-dtags"], check=True)
        os.chmod(layer / "libx.so", 0o555)
        shutil.copy2(layer / "libx.so", env / "lib" / "sub" / "libx.so")
        if own_liby:
            (pkg / "lib" / "other").mkdir(exist_ok=True)
            shutil.copy2(env / "lib" / "other" / "liby.so", pkg / "lib" / "other" / "liby.so")
        got = verify(str(layer), items, "lib/sub", str(env), frozenset())
        assert (got is not None) == linkable, (runpath, own_liby)


def test_a_source_python_cannot_compile_needs_no_bytecode(tmp_path):
    """A .py without its .pyc keeps its directory from being linked (python would
    compile it on every import), unless python cannot compile it at all (torch ships a
    py3.12-only test module): then it writes no bytecode for it either."""
    import sys

    from envtools.place import bytecode, layers
    from envtools.place.plan import IN_ARCHIVE

    good, bad = tmp_path / "good.py", tmp_path / "bad.py"
    good.write_text("x = 1\n")
    bad.write_text("def f(:\n")
    assert bytecode.uncompilable(Path(sys.executable), [str(good), str(bad)]) == {str(bad)}
    assert bytecode.uncompilable(tmp_path / "no-python", [str(bad)]) == set()
    groups = [(0, [(f"share/t/{n}", str(tmp_path / n), "hardlink", None, None, True, None, 1)
                   for n in ("bad.py", "data.bin")])]
    assert layers.without_bytecode(groups) == {"share/t/bad.py": str(bad)}
    assert layers.plan(groups, [0], [], IN_ARCHIVE) == {}
    assert layers.plan(groups, [0], [], IN_ARCHIVE,
                       no_bytecode=frozenset({"share/t/bad.py"})) == {"share/t": 0}


def test_a_listing_stands_for_its_directory_only_while_it_is_the_same(tmp_path):
    """find's listing of a directory covers what verify checks (names, types, modes,
    owners, sizes, mtimes, inodes, link targets), and a walk along several directories'
    listings stops at the first that differs, including one with an entry added at the
    end of its listing."""
    from envtools.place import layers

    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a / "sub", b):
        d.mkdir(parents=True)
    (a / "sub" / "f").write_bytes(b"1")
    (a / "l").symlink_to("sub/f")
    (b / "g").write_bytes(b"2")
    want = [layers.listing(str(a)), layers.listing(str(b))]
    assert all(want) and b"sub/f\0f " in want[0] and b"\0l " in want[0]

    def same() -> int:
        return layers.same_listings(
            layers.finish_listing(layers.start_listing([str(a), str(b)])), want)

    assert same() == 2
    os.utime(b / "g", ns=(0, 0))  # (b differs: a still counts)
    assert same() == 1
    want[1] = layers.listing(str(b))
    os.chmod(a / "sub" / "f", 0o600)
    assert same() == 0
    os.chmod(a / "sub" / "f", 0o644)
    want[0] = layers.listing(str(a))
    # an entry more in a, listed after all of a's: a's listing is a prefix, yet a differs
    out = layers.finish_listing(layers.start_listing([str(a), str(b)]))
    extra = want[0] + b"zz\0f 644 0 1 1.0000000000 1\0\0"
    assert layers.same_listings(extra + want[1], want) == 0
    assert layers.same_listings(out, want) == 2
    assert layers.same_listings(None, want) == 0
    assert layers.split_listing(out) == want  # (install lists all in one find)
    assert layers.split_listing(None) == [] and layers.split_listing(b"x\0") == []
    assert layers.start_listing(["relative/dir"]) is None
    assert layers.finish_listing(layers.start_listing([str(tmp_path / "missing")])) is None

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
from conftest import make_wheel, run_envtools
from test_clone import tree_digest

from envtools import asuser, cachelinks


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
        user = asuser.unprivileged(root / "home")
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
    """tree_digest, reading files that are links to the package cache: their content
    counts (the packages' own links are kept as links)."""
    out = tree_digest(root)
    for rel, v in out.items():
        if v.startswith(f"link:{cache}/"):
            out[rel] = hashlib.sha256((root / rel).read_bytes()).hexdigest()
    return out


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
    assert "symlink to the cache" in p.stderr and "hardlink" not in p.stderr
    cache = {d.name.rsplit("-", 2)[0]: d for d in shared.cache.iterdir() if d.is_dir()}
    site = next(dest.glob("lib/python*/site-packages"))
    # plain package files: symlinks to the root-owned cache file, nothing else
    for rel, pkg in (("include/demo.h", "libdemo"), ("share/demo-meta/README", "demo-meta"),
                     (str(next(site.glob("demo_py/_ext.*.so")).relative_to(dest)), "demo-py"),
                     (str((site / "demo_noarch/__init__.py").relative_to(dest)),
                      "demo-noarch")):
        f = dest / rel
        assert f.is_symlink(), rel
        target = Path(os.readlink(f))
        assert target.is_relative_to(cache[pkg]) and target.stat().st_uid == 0, rel
    # real files: relocated ones, the installer's entry point, and a program whose
    # package relocates (run through a link, its $ORIGIN would be the cache's)
    for rel in ("bin/demo", "lib/libdemo.so.1", "share/demo/config.txt", "bin/demo-noarch",
                str((site / "demo_py/__init__.py").relative_to(dest))):
        assert not (dest / rel).is_symlink() and (dest / rel).stat().st_uid == shared.user.uid
    # every directory is the user's own (pip, conda, editors may add and remove entries)
    for dirpath, dirnames, _files in os.walk(dest):
        for d in dirnames:
            assert not os.path.islink(os.path.join(dirpath, d)), d
        assert os.stat(dirpath).st_uid == shared.user.uid
    check_runs_as(shared.user, dest)
    rec = json.loads(next((dest / "conda-meta").glob("demo-meta-*.json")).read_text())
    assert rec["link"] == {"source": str(cache["demo-meta"]), "type": cachelinks.LINK_SOFTLINK}
    doc = json.loads(run_as(shared.user, *shared.user.python, "-m", "envtools", "validate",
                            dest, "--json").stdout)
    assert doc["exit_status"] == 0, doc["findings"]
    assert doc["checked"]["hashed"] == 0  # the stat cache vouched for every linked file
    full = json.loads(run_envtools("validate", "--full", "--json", dest).stdout)
    assert full["exit_status"] == 0 and full["checked"]["elf_files"] == \
        doc["checked"]["elf_files"] >= 3  # the linked extension is checked too


def test_nonowner_clone_has_the_bytes_of_an_install_at_dest(shared):
    """Read through its links, the clone is what installing the packages there gives."""
    dest = shared.user.home / "same" / "env"
    clone_as(shared.user, shared.env, dest)
    cloned = content_digest(dest, shared.cache)
    assert any(v != w for v, w in zip(cloned.values(), tree_digest(dest).values(),
                                      strict=True))  # (it does link)
    _rmtree(dest)
    run_envtools("install", "--channel", shared.channel, "--prefix", dest, "demo-meta",
                 "demo-noarch")
    try:
        assert tree_digest(dest) == cloned
    finally:
        run_envtools("remove", dest)


def test_nothing_the_user_does_in_the_clone_reaches_the_site_env(shared):
    """Writing into a linked file fails; replacing files, pip install, pip upgrade and
    pip uninstall of a conda package whose files are links, and rm -rf all work, and
    leave every file of the site env and its cache as it was."""
    before = site_state(shared)
    dest = shared.user.home / "work"
    clone_as(shared.user, shared.env, dest)
    user = shared.user
    header = dest / "include" / "demo.h"
    assert run_as(user, "sh", "-c", f"echo x >> {header}", check=False).returncode != 0
    assert run_as(user, "chmod", "u+w", header, check=False).returncode != 0
    assert run_as(user, "truncate", "-s", "0", header, check=False).returncode != 0
    run_as(user, "sh", "-c", f"rm {header} && echo mine > {header}")  # replacing is fine
    assert header.read_text() == "mine\n" and not header.is_symlink()

    wheels = shared.root / "wheels"  # (where the user can read them)
    wheels.mkdir()
    new = make_wheel(wheels, "hello-tool", "1.0", {"hello_tool/__init__.py": "X = 1\n"})
    upgrade = make_wheel(wheels, "demo-py", "3.0.0", {"demo_py/__init__.py": "V = 3\n"})
    pip = [dest / "bin" / "python", "-m", "pip", "--disable-pip-version-check",
           "--no-cache-dir", "--no-input"]
    pip_only = shared.root / "pip-only"  # the clone's python runs this pip, and sees
    pip_only.mkdir()  # no other distribution than the clone's
    (pip_only / "pip").symlink_to(Path(pip_module.__file__).parent)
    env = {"PYTHONPATH": str(pip_only)}
    run_as(user, *pip, "install", "--no-deps", "--no-index", new, env=env)
    site = next(dest.glob("lib/python*/site-packages"))
    ext = next(site.glob("demo_py/_ext.*.so"))
    assert ext.is_symlink()
    # pip replaces the conda package: it removes its files (links) and writes its own
    p = run_as(user, *pip, "install", "--no-deps", "--no-index", "--upgrade", upgrade, env=env)
    assert "Successfully uninstalled demo-py-2.0.0" in p.stdout, p.stdout
    assert not ext.exists() and not ext.is_symlink()
    out = run_as(user, dest / "bin" / "python", "-c",
                 "import demo_py, hello_tool; print(demo_py.V)").stdout
    assert out.strip() == "3"
    run_as(user, *pip, "uninstall", "--yes", "demo-py", env=env)
    assert not (site / "demo_py").exists()
    run_as(user, "rm", "-rf", dest / "share" / "demo-meta", dest / "lib" / "libdemo.so.1")
    assert site_state(shared) == before
    # and the clone itself goes away like any directory of the user's
    run_as(user, "rm", "-rf", dest)
    assert site_state(shared) == before


def test_validate_reads_through_the_links(shared):
    """A cache file changed after the clone is reported by the clone's validate, and a
    cache that is gone is named in the finding (the clone needs it)."""
    dest = shared.user.home / "checked"
    clone_as(shared.user, shared.env, dest)
    validate = [*shared.user.python, "-m", "envtools", "validate", "--json", dest]
    readme = Path(os.readlink(dest / "share" / "demo-meta" / "README"))
    original = readme.read_bytes()
    os.chmod(readme, 0o644)
    try:
        readme.write_bytes(b"changed by someone\n")
        doc = json.loads(run_as(shared.user, *validate, check=False).stdout)
        assert doc["exit_status"] == 1
        assert [f["paths"] for f in doc["findings"] if f["check"] == "altered-file"] == [
            ["share/demo-meta/README"]]
    finally:
        readme.write_bytes(original)
        os.chmod(readme, 0o444)
    assert json.loads(run_as(shared.user, *validate).stdout)["exit_status"] == 0
    pkg = readme.parents[2]
    os.rename(pkg, pkg.with_name(pkg.name + ".gone"))
    try:
        doc = json.loads(run_as(shared.user, *validate, check=False).stdout)
        missing = [f for f in doc["findings"] if f["check"] == "missing-file"]
        assert missing and "package cache" in missing[0]["hint"]
        assert "share/demo-meta/README" in missing[0]["paths"]
    finally:
        os.rename(pkg.with_name(pkg.name + ".gone"), pkg)


def test_another_users_cache_is_copied_unless_trusted(shared):
    """A colleague's env: its owner could change its cache later, so a clone of it copies
    by default; --link-mode symlink links it for a user who trusts that owner."""
    channel = shared.root / "channel"
    shutil.copytree(shared.channel, channel)
    for dirpath, _dirs, files in os.walk(channel):
        os.chmod(dirpath, 0o755)
        for f in files:
            os.chmod(os.path.join(dirpath, f), 0o644)
    colleague = asuser.unprivileged(shared.root / "colleague",
                                    asuser.free_uid(shared.user.uid + 1))
    theirs = colleague.home / "envs" / "theirs"
    p = colleague.run(colleague.envtools("install", "--channel", channel, "--prefix", theirs,
                                         "demo-meta"))
    assert p.returncode == 0, p.stderr
    p = clone_as(shared.user, theirs, shared.user.home / "copied")
    assert "symlink to the cache" not in p.stderr and "copy" in p.stderr
    p = clone_as(shared.user, "--link-mode", "symlink", theirs, shared.user.home / "trusted")
    assert "symlink to the cache" in p.stderr
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

"""Security: hostile packages, channels, source envs and package caches.

Each hostile input must give one clear error (exit 1, a hint, no traceback) and leave
the filesystem as it was: the case's directory, a sentinel "home" and "outside" directory
(both writable by everyone, so that a write there would succeed if envtools tried) and
the site env are listed before and after and must be identical. Every case runs as root
and as an unprivileged user (uid 65534, through ``setpriv``); a few also as the cache's
owner without root's privileges (a user namespace), which hardlinks from the cache.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import marshal
import os
import shutil
import stat
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import hostile
import pytest
from conftest import ENVTOOLS, envtools_as, run_envtools
from hostile import Entry, Package

NOBODY = 65534


@dataclass
class World:
    root: Path
    home: Path  # a user's home: must stay as it was
    outside: Path  # where hostile symlinks point
    user: Path  # HOME of the unprivileged runs
    base: Path  # the fixture channel, readable by everyone
    hostile: Path  # a channel of hostile packages
    site: Path  # a read-only env installed (by root) from `base`


def _world_dir(p: Path, mode: int = 0o777) -> Path:
    p.mkdir(parents=True, exist_ok=True)
    os.chmod(p, mode)
    return p


def _rmtree(p: Path) -> None:
    for dirpath, _dirs, _files in os.walk(p):
        os.chmod(dirpath, 0o755)
    shutil.rmtree(p, ignore_errors=True)


@pytest.fixture(scope="module")
def world(channel) -> World:
    root = Path(tempfile.mkdtemp(prefix="envtools-security-", dir="/tmp"))
    os.chmod(root, 0o755)
    home, outside, user = (_world_dir(root / n) for n in ("home", "outside", "user"))
    (home / ".bash_profile").write_text("# the user's own\n")
    os.chmod(home / ".bash_profile", 0o666)
    base = root / "base"
    shutil.copytree(channel, base)
    for p in base.rglob("*"):  # (readable by everyone, as a published channel must be)
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    deep = "../../../"  # from <root>/case-N/envs/p (or /dest) to <root>
    # A path that names a file of the package itself when joined onto its cache entry
    # (<cache>/<dist>/../<dist>/f) lands beside the prefix when joined onto it: without
    # the checks, rattler links it there (the a/../../PKG/f).
    packages = [
        Package("evil-dotdot", [Entry("f"), Entry("../evil-dotdot-1.0-0/f")]),
        Package("evil-home", [Entry(deep + "home/.bash_profile")]),
        Package("evil-abs", [Entry(str(home / ".bash_profile"))]),
        Package("evil-aslash", [Entry("f"), Entry("a/../../evil-aslash-1.0-0/f")]),
        Package("evil-symwrite", [Entry("lib/x", target=str(outside)),
                                  Entry("lib/x/.bash_profile")]),
        Package("evil-crosslink", [Entry("lib/y", target=str(outside))]),
        Package("evil-cross", [Entry("lib/y/.bash_profile")], depends=["evil-crosslink"]),
        Package("evil-placeholder", [
            Entry("f", b"at @PREFIX@\n", placeholder=True),
            Entry("../evil-placeholder-1.0-0/f", b"at @PREFIX@\n", placeholder=True)]),
        Package("evil-entry", [Entry("site-packages/evil.py", b"def main(): pass\n")],
                depends=["python"], entry_points=[f"{deep}home/.bash_profile = evil:main"]),
        Package("evil-meta", [Entry("conda-meta/history")]),
        Package("evil-under", [Entry("share/under/.bash_profile")]),  # (harmless alone)
    ]
    hostile.build_channel(root / "hostile", packages, base)
    site = root / "site" / "envs" / "powerai"
    run_envtools("install", "--channel", base, "--prefix", site, "demo-meta")
    w = World(root, home, outside, user, base, root / "hostile", site)
    try:
        yield w
    finally:
        _rmtree(root)


_cases = itertools.count()


@pytest.fixture
def case(world) -> Path:
    """A fresh directory the unprivileged user may write in."""
    return _world_dir(world.root / f"case-{next(_cases)}")


def listing(*roots: Path) -> dict[str, tuple]:
    """Everything under ``roots``: type, mode, and for a file its size, mtime and hash
    (a directory's own mtime is left out: a temp dir made and removed changes it)."""
    out: dict[str, tuple] = {}
    for root in roots:
        out[str(root)] = ("d", stat.S_IMODE(os.lstat(root).st_mode))
        for dirpath, dirnames, filenames in os.walk(root):
            for n in dirnames + filenames:
                p = os.path.join(dirpath, n)
                st = os.lstat(p)
                if stat.S_ISLNK(st.st_mode):
                    out[p] = ("l", os.readlink(p))
                elif stat.S_ISDIR(st.st_mode):
                    out[p] = ("d", stat.S_IMODE(st.st_mode))
                elif stat.S_ISREG(st.st_mode):
                    out[p] = ("f", stat.S_IMODE(st.st_mode), st.st_size, st.st_mtime_ns,
                              hashlib.sha256(Path(p).read_bytes()).hexdigest())
                else:
                    out[p] = ("?", stat.S_IFMT(st.st_mode))
    return out


def snapshot(world: World, case: Path) -> dict[str, tuple]:
    return listing(case, world.home, world.outside, world.site.parent)


WHO = ["root", "user"]


def as_who(who: str, world: World, *args, timeout: int = 120) -> subprocess.CompletedProcess:
    """Run the envtools CLI as root, as an unprivileged user (uid 65534), or as the
    owner of root's files without root's privileges (``owner``: a user namespace)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    cmd = [*ENVTOOLS, *map(str, args)]
    if who == "root":
        if os.geteuid() != 0:
            pytest.skip("needs root")
    elif who == "user":
        if os.geteuid() == 0:
            if not shutil.which("setpriv"):
                pytest.skip("needs setpriv (util-linux) to run as another user")
            cmd = [*envtools_as(NOBODY), *map(str, args)]
            env.update(HOME=str(world.user), XDG_CACHE_HOME=str(world.user / "cache"))
    elif who == "owner":
        if os.geteuid() != 0 or not shutil.which("unshare"):
            pytest.skip("needs root to create a user namespace with unshare --user")
        cmd = ["unshare", "--user", "--", *cmd]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    if who == "owner" and p.returncode != 0 and "unshare" in p.stderr:
        pytest.skip(f"user namespaces unavailable: {p.stderr.strip()}")
    return p


def refused(p: subprocess.CompletedProcess, *fragments: str) -> None:
    """One clear error with a hint, exit status 1, no traceback."""
    err = p.stderr
    assert p.returncode == 1, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{err}"
    assert "Traceback" not in err and "panicked" not in err, err
    assert err.count("error:") == 1 and "hint:" in err, err
    for f in fragments:
        assert f in err, f"{f!r} not in:\n{err}"


def no_leftovers(*dirs: Path) -> None:
    for d in dirs:
        if d.exists():
            left = [p for p in d.rglob("*") if "envtools-tmp" in p.name
                    or "envtools-staging" in p.name]
            assert not left, left


# ---------------------------------------------------------------- install: hostile packages
HOSTILE = [
    ("evil-dotdot", "'../evil-dotdot-1.0-0/f'"),
    ("evil-home", "'../../../home/.bash_profile'"),
    ("evil-abs", "absolute"),
    ("evil-aslash", "'a/../../evil-aslash-1.0-0/f'"),
    ("evil-symwrite", "'lib/x/.bash_profile'"),
    ("evil-cross", "'lib/y/.bash_profile'"),
    ("evil-placeholder", "'../evil-placeholder-1.0-0/f'"),
    ("evil-entry", "entry point"),
    ("evil-meta", "conda-meta"),
]


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize(("spec", "fragment"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_install_refuses_a_hostile_package(world, case, who, spec, fragment):
    envs = _world_dir(case / "envs")
    before = snapshot(world, case)
    p = as_who(who, world, "install", "--channel", world.hostile, "--prefix", envs / "p", spec)
    refused(p, fragment, "package")
    assert snapshot(world, case) == before
    assert not (world.outside / ".bash_profile").exists()


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize(("spec", "fragment"), [
    ("evil-dotdot", "'../evil-dotdot-1.0-0/f'"), ("evil-cross", "'lib/y/.bash_profile'"),
    ("evil-under", "share/under")], ids=["dotdot", "cross", "under-untracked-link"])
def test_clone_add_refuses_a_hostile_package(world, case, who, spec, fragment):
    """clone --add checks the added packages as install does, and also against the
    clone itself: a package file under a symlink the source env holds (untracked) is
    refused."""
    src = _writable_clone(world, case)
    (src / "share" / "under").symlink_to(world.outside)
    before = snapshot(world, case)
    p = as_who(who, world, "clone", src, case / "dest", "--add", spec, "--channel",
               world.hostile, "--channel", world.base)
    refused(p, fragment)
    assert snapshot(world, case) == before
    no_leftovers(world.user)


# ---------------------------------------------------------------- archives vs repodata
def _tampered_channel(world: World, case: Path, how: str) -> Path:
    """A copy of the fixture channel whose demo-extra archive or repodata entry is bad."""
    ch = case / "channel"
    shutil.copytree(world.base, ch)
    for p in [ch, *ch.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)
    pkg = next((ch / "linux-64").glob("demo-extra-*.conda"))
    if how == "repacked":  # one file changed, a valid archive; the repodata's size fixed up
        hostile.repack_conda(pkg, "share/demo-extra/README",
                             lambda b: (b or b"x").replace(b"e", b"E", 1) + b"!")
        hostile.set_repodata(ch, "linux-64", pkg.name, size=pkg.stat().st_size)
    elif how == "flipped":  # one byte changed, same size
        data = bytearray(pkg.read_bytes())
        data[len(data) // 2] ^= 0xFF
        pkg.write_bytes(bytes(data))
    elif how == "zeroed":
        hostile.set_repodata(ch, "linux-64", pkg.name, sha256="0" * 64)
    elif how == "no-sha256":
        hostile.set_repodata(ch, "linux-64", pkg.name, sha256=None)
    return ch


ARCHIVES = [("repacked", "sha256"), ("flipped", "sha256"), ("zeroed", "all zeros"),
            ("no-sha256", "no valid sha256")]


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("command", ["install", "clone --add"])
@pytest.mark.parametrize(("how", "fragment"), ARCHIVES, ids=[a[0] for a in ARCHIVES])
def test_a_tampered_archive_is_refused(world, case, who, command, how, fragment):
    if how == "repacked" and not shutil.which("zstd"):
        pytest.skip("needs the zstd command to repack a .conda")
    ch = _tampered_channel(world, case, how)
    before = snapshot(world, case)
    if command == "install":
        p = as_who(who, world, "install", "--channel", ch, "--prefix", case / "p", "demo-extra")
    else:
        p = as_who(who, world, "clone", world.site, case / "p", "--add", "demo-extra",
                   "--channel", ch)
    refused(p, "demo-extra", fragment)
    assert snapshot(world, case) == before
    no_leftovers(world.user)


def test_a_good_channel_installs_and_explicit_records_the_checked_sha256(world, case):
    """The same channel, untampered: installs, and explicit.txt names the sha256 each
    archive was checked against (the repodata's)."""
    p = as_who("user", world, "install", "--channel", world.base, "--prefix", case / "p",
               "demo-extra")
    assert p.returncode == 0, p.stderr
    explicit = (case / "p" / "conda-meta" / "envtools" / "explicit.txt").read_text()
    for line in explicit.splitlines():
        if "#sha256:" in line:
            url, sha = line.split("#sha256:")
            archive = Path(url.removeprefix("file://"))
            assert hashlib.sha256(archive.read_bytes()).hexdigest() == sha


def test_install_keeps_an_identical_cache_entry_and_replaces_a_tampered_one(world, case):
    """A shared --cache: the next install keeps an entry that still holds exactly what
    the verified archive holds (the first env keeps sharing its inodes), and replaces one
    that was changed, so the new env gets the package's own bytes."""
    cache = case / "cache"
    for name in ("a", "b"):
        run_envtools("install", "--channel", world.base, "--prefix", case / name, "--cache",
                     cache, "libdemo")
    h = next(cache.glob("libdemo-*")) / "include" / "demo.h"
    assert h.stat().st_ino == (case / "a" / "include" / "demo.h").stat().st_ino
    assert h.stat().st_ino == (case / "b" / "include" / "demo.h").stat().st_ino
    good = h.read_bytes()
    os.chmod(h, 0o644)
    h.write_bytes(good.replace(b"demo", b"evil", 1))
    run_envtools("install", "--channel", world.base, "--prefix", case / "c", "--cache", cache,
                 "libdemo")
    assert (case / "c" / "include" / "demo.h").read_bytes() == good
    assert h.read_bytes() == good
    doc = json.loads(run_envtools("validate", case / "c", "--json").stdout)
    assert doc["exit_status"] == 0, doc


def test_install_compiles_noarch_bytecode_into_a_shared_cache_without_trusting_it(world, case):
    """The pycs install compiles into a noarch: python package's cache entry do not make
    the next install replace the entry (it compiles them again and keeps the same bytes,
    so both envs share the inodes); a pyc changed in the cache is compiled over, and
    neither env nor cache keeps the change."""
    cache = case / "cache"
    for name in ("a", "b"):
        run_envtools("install", "--channel", world.base, "--prefix", case / name, "--cache",
                     cache, "demo-noarch")
    entry = next(cache.glob("demo-noarch-*"))
    pyc = next((entry / "site-packages" / "demo_noarch" / "__pycache__").iterdir())
    rel = next(str(p.relative_to(case / "a")) for p in (case / "a").rglob(pyc.name))
    assert pyc.stat().st_ino == (case / "a" / rel).stat().st_ino == \
        (case / "b" / rel).stat().st_ino
    good = pyc.read_bytes()
    os.chmod(pyc, 0o644)
    pyc.write_bytes(good[:16] + b"evil")
    run_envtools("install", "--channel", world.base, "--prefix", case / "c", "--cache", cache,
                 "demo-noarch")
    assert (case / "c" / rel).read_bytes() == good == pyc.read_bytes()
    assert (case / "c" / rel).stat().st_ino == pyc.stat().st_ino
    for name in ("b", "c"):
        doc = json.loads(run_envtools("validate", case / name, "--json", check=False).stdout)
        assert doc["exit_status"] == (1 if name == "b" else 0), doc
    # (b shared the changed inode: validate of b reports its pyc, as for any cache file)


# ---------------------------------------------------------------- clone: forged source envs
def _writable_clone(world: World, case: Path) -> Path:
    src = case / "src"
    run_envtools("clone", world.site, src)
    return src


def _record(src: Path, name: str) -> Path:
    return next((src / "conda-meta").glob(f"{name}-*.json"))


def _add_entries(src: Path, name: str, *entries: dict) -> None:
    fp = _record(src, name)
    rec = json.loads(fp.read_text())
    rec["paths_data"]["paths"] += list(entries)
    rec["files"] += [e["_path"] for e in entries]
    fp.write_text(json.dumps(rec))


def _file_entry(path: str, data: bytes = b"x", **extra) -> dict:
    return {"_path": path, "path_type": "hardlink", "sha256": hashlib.sha256(data).hexdigest(),
            "size_in_bytes": len(data), **extra}


def _forge_untracked(src: Path, files: list[str]) -> None:
    """Rewrite untracked.json so that clone trusts it (every directory mtime current)."""
    from envtools.prefix.untracked import UNTRACKED_CACHE, scan

    _files, empty, mtimes = scan(src, set())
    (src / UNTRACKED_CACHE).write_text(json.dumps(
        {"version": 1, "files": files, "empty": empty, "dirs": mtimes}))


def _forge(world: World, src: Path, how: str) -> str:
    """Make ``src`` hostile in one way; returns what the error must name."""
    deep = "../../../home/.bash_profile"
    if how == "untracked-dotdot":
        _forge_untracked(src, ["CACHEDIR.TAG", deep])
        return repr(deep)
    if how == "untracked-symlink":  # a link, then a file "under" it, both "untracked"
        (src / "evil").symlink_to(world.outside)
        _forge_untracked(src, ["evil", "evil/.bash_profile"])
        return "evil"
    if how == "record-dotdot":
        _add_entries(src, "libdemo", _file_entry(deep))
        return repr(deep)
    if how == "record-placeholder":
        _add_entries(src, "libdemo", _file_entry("../../../home/.profile",
                                                 prefix_placeholder="/x", file_mode="text"))
        return "'../../../home/.profile'"
    if how == "record-symlink":
        (src / "share" / "evil").symlink_to(world.outside)
        _add_entries(src, "libdemo",
                     {"_path": "share/evil", "path_type": "softlink", "sha256": "0" * 64},
                     _file_entry("share/evil/.bash_profile"))
        (world.outside / ".bash_profile").write_text("x")  # (what a no-cache clone copies)
        return "share/evil"
    if how == "record-name":
        fp = _record(src, "libdemo")
        rec = json.loads(fp.read_text())
        rec["name"] = "../../../home/.bash_profile"
        fp.write_text(json.dumps(rec))
        return "refusing name"
    raise AssertionError(how)


FORGED = ["untracked-dotdot", "untracked-symlink", "record-dotdot", "record-placeholder",
          "record-symlink", "record-name"]


@pytest.mark.parametrize("who", WHO)
@pytest.mark.parametrize("cache", ["cache", "no-cache"])
@pytest.mark.parametrize("how", FORGED)
def test_clone_refuses_a_forged_source(world, case, who, cache, how):
    src = _writable_clone(world, case)
    fragment = _forge(world, src, how)
    before = snapshot(world, case)
    args = ["clone", src, case / "dest"] + (["--no-cache"] if cache == "no-cache" else [])
    p = as_who(who, world, *args)
    refused(p, fragment)
    assert snapshot(world, case) == before
    if how == "record-symlink":
        (world.outside / ".bash_profile").unlink()


@pytest.mark.parametrize("who", WHO)
def test_clone_refuses_a_forged_record_index(world, case, who):
    """The record index (records.marshal) is data too: a path in it is checked although
    the JSON records are clean."""
    from envtools.prefix.hashing import stat_key
    from envtools.prefix.record_index import INDEX

    src = case / "copy"
    shutil.copytree(world.site, src, symlinks=True)
    version, entries = marshal.loads((src / INDEX).read_bytes())
    forged = []
    for name, _size, _mtime, _ino, summary in entries:
        if name.startswith("libdemo-"):
            fields = list(summary[6])
            fields.append(("../../../home/.bash_profile", "hardlink", None, None, "0" * 64, 1))
            summary = (*summary[:6], fields)
        forged.append((name, *stat_key(os.stat(src / "conda-meta" / name)), summary))
    os.chmod(src / INDEX.parent, 0o755)
    os.chmod(src / INDEX, 0o644)
    (src / INDEX).write_bytes(marshal.dumps((version, forged)))
    before = snapshot(world, case)
    refused(as_who(who, world, "clone", src, case / "dest"), "'../../../home/.bash_profile'")
    assert snapshot(world, case) == before


# ---------------------------------------------------------------- clone: a tampered cache
@pytest.mark.parametrize("who", ["root", "user", "owner"])
@pytest.mark.parametrize("what", ["include/demo.h", "share/demo/config.txt"])
def test_clone_refuses_a_tampered_package_cache(world, case, who, what):
    """A package cache file changed after install (replaced: the env keeps the old
    inode) is neither linked, copied nor relocated into a clone."""
    site = case / "site" / "p"
    run_envtools("install", "--channel", world.base, "--prefix", site, "demo-meta")
    pkg = next((case / "site" / "p.pkgs").glob("libdemo-*"))
    target = pkg / what
    os.chmod(target.parent, 0o755)
    tmp = target.with_name(target.name + ".new")
    tmp.write_bytes(target.read_bytes().replace(b"demo", b"evil", 1))
    os.chmod(tmp, 0o444)
    os.rename(tmp, target)
    os.chmod(target.parent, 0o555)
    os.chmod(case / "site", 0o777)
    before = snapshot(world, case)
    p = as_who(who, world, "clone", site, case / "site" / "dest")
    refused(p, str(target), "does not match its record")
    assert snapshot(world, case) == before


@pytest.mark.parametrize("who", ["root", "user", "owner"])
def test_clone_of_a_good_cache_still_links_and_validates(world, case, who):
    """The checks cost no hashing when the source's stat cache vouches for the cache:
    the owner still hardlinks, and plain validate of the clone hashes nothing."""
    dest = case / "dest"
    p = as_who(who, world, "clone", world.site, dest)
    assert p.returncode == 0, p.stderr
    if who == "owner":
        assert "hardlink" in p.stderr
    doc = json.loads(as_who(who, world, "validate", dest, "--json").stdout)
    assert doc["exit_status"] == 0 and doc["checked"]["hashed"] == 0, doc


# ---------------------------------------------------------------- clone by a non-owner: symlinks
def _trusted_site(world: World, case: Path) -> Path:
    """A site env (root's) in a directory only root can change all the way up, so that
    a user's clone of it is made of symlinks to its package cache (cachelinks.py)."""
    top = world.root / f"trusted-{case.name}"
    top.mkdir(mode=0o755)
    site = top / "envs" / "p"
    run_envtools("install", "--channel", world.base, "--prefix", site, "demo-meta")
    return site


def _cache_links(root: Path) -> dict[str, str]:
    return {os.path.relpath(os.path.join(d, n), root): os.readlink(os.path.join(d, n))
            for d, dirs, files in os.walk(root) for n in dirs + files
            if os.path.islink(os.path.join(d, n))
            and os.readlink(os.path.join(d, n)).startswith("/")}


TAMPER = ["replaced", "edited", "symlink", "writable-dir"]


@pytest.mark.parametrize("how", TAMPER)
@pytest.mark.parametrize(("mode", "what", "workers"),
                         [("auto", "include/demo.h", None),
                          ("dirs", "share/demo-meta/README", None),
                          ("dirs", "share/demo-meta/README", "3")])
def test_a_nonowner_clone_links_only_vouched_cache_files(world, case, monkeypatch, how, mode,
                                                         what, workers):
    """A user's clone of a root-owned site links each cache file (or, with --link-mode
    dirs, a directory of them) only as a hardlink or a copy would use it: vouched for by
    the site's stat cache or hashed. A changed cache file (replaced, or edited in place)
    is refused, and so is one replaced by a link (even to the same bytes: a link's
    target can change later). Under a package directory others may write, files are
    copied, not linked. With three placing processes, each links the directories it
    put aside while find listed them only once the main process sends what the
    listings found."""
    if workers:
        monkeypatch.setenv("ENVTOOLS_WORKERS", workers)
    site = _trusted_site(world, case)
    good = case / "good"
    p = as_who("user", world, "clone", "--link-mode", mode, site, good)
    assert p.returncode == 0 and "symlinks to the cache" in p.stderr, p.stderr
    linked = good / what if mode == "auto" else (good / what).parent
    assert linked.is_symlink()
    target = Path(os.path.realpath(good / what))
    original = target.read_bytes()
    os.chmod(target.parent, 0o755)
    if how == "replaced":
        tmp = target.with_name("demo.h.new")
        tmp.write_bytes(original.replace(b"demo", b"evil", 1))
        os.chmod(tmp, 0o444)
        os.rename(tmp, target)
    elif how == "edited":  # (same inode; its mtime tells)
        os.chmod(target, 0o644)
        target.write_bytes(original.replace(b"demo", b"evil", 1))
        os.chmod(target, 0o444)
    elif how == "symlink":
        (world.outside / "demo.h").write_bytes(original)
        target.unlink()
        target.symlink_to(world.outside / "demo.h")
    else:
        os.chmod(target.parent, 0o777)
    if how != "writable-dir":
        os.chmod(target.parent, 0o555)
    before = snapshot(world, case)
    dest = case / "dest"
    p = as_who("user", world, "clone", "--link-mode", mode, site, dest)
    if how == "writable-dir":
        assert p.returncode == 0, p.stderr
        for x in (dest / what, (dest / what).parent):
            assert not x.is_symlink(), x
        assert (dest / what).read_bytes() == original
        links = _cache_links(dest)
        assert links and not [t for t in links.values()
                              if t.startswith(f"{target.parent}/")]
        doc = json.loads(as_who("user", world, "validate", dest, "--json").stdout)
        assert doc["exit_status"] == 0, doc["findings"]
        return
    refused(p, str(target), "does not match its record")
    assert snapshot(world, case) == before
    no_leftovers(case)
    if how == "symlink":
        (world.outside / "demo.h").unlink()


NONOWNER_MODES = ["auto", "dirs", "no-cache"]


@pytest.mark.parametrize("mode", NONOWNER_MODES)
@pytest.mark.parametrize("how", FORGED)
def test_a_users_symlinked_clone_made_hostile_writes_nothing_outside(world, case, how, mode):
    """The source is a user's clone of the site (symlinks to the root-owned cache),
    forged afterwards; cloning it by a non-owner, with per-file links, linked
    directories or no cache, is refused and writes nothing anywhere."""
    src = case / "src"
    link_mode = "dirs" if mode == "dirs" else "auto"
    p = as_who("user", world, "clone", "--link-mode", link_mode, world.site, src)
    assert p.returncode == 0 and "symlinks to the cache" in p.stderr, p.stderr
    fragment = _forge(world, src, how)
    before = snapshot(world, case)
    args = ["clone", src, case / "dest"] + (
        ["--no-cache"] if mode == "no-cache" else ["--link-mode", link_mode])
    refused(as_who("user", world, *args), fragment)
    assert snapshot(world, case) == before
    if how == "record-symlink":
        (world.outside / ".bash_profile").unlink()


def test_a_symlinked_clone_is_copied_only_through_its_own_links(world, case):
    """--no-cache of a non-owner's clone copies what its links to the package cache
    lead to (the clone's files); a link turned elsewhere is refused, not followed.
    With the cache, the package's files come from the cache, never through SRC's links."""
    src = case / "src"
    p = as_who("user", world, "clone", world.site, src)
    assert p.returncode == 0 and (src / "include" / "demo.h").is_symlink(), p.stderr
    original = (src / "include" / "demo.h").read_bytes()
    p = as_who("user", world, "clone", "--no-cache", src, case / "copied")
    assert p.returncode == 0, p.stderr
    copied = case / "copied" / "include" / "demo.h"
    assert not copied.is_symlink() and copied.read_bytes() == original
    (world.outside / "demo.h").write_bytes(b"not the package's\n")
    (src / "include" / "demo.h").unlink()
    (src / "include" / "demo.h").symlink_to(world.outside / "demo.h")
    before = snapshot(world, case)
    refused(as_who("user", world, "clone", "--no-cache", src, case / "dest"),
            f"{src}/include/demo.h is a symbolic link")
    assert snapshot(world, case) == before
    p = as_who("user", world, "clone", src, case / "dest")
    assert p.returncode == 0, p.stderr
    assert Path(os.path.realpath(case / "dest" / "include" / "demo.h")).read_bytes() == original
    (world.outside / "demo.h").unlink()


@pytest.mark.parametrize("who", WHO)
def test_validate_follows_only_a_clones_own_links_to_its_cache(world, case, who):
    """A non-owner's clone: its links to the package cache are read through (no hashing,
    exit 0). A package file whose link was turned elsewhere, and a linked directory
    turned elsewhere, are reported and not opened (they lead to FIFOs, which would
    block a reader until the timeout); ELF files are not looked for through them."""
    files, dirs = case / "files", case / "dirs"
    for dest, mode in ((files, "auto"), (dirs, "dirs")):
        p = as_who("user", world, "clone", "--link-mode", mode, world.site, dest)
        assert p.returncode == 0, p.stderr
        doc = json.loads(as_who(who, world, "validate", dest, "--json").stdout)
        assert doc["exit_status"] == 0 and doc["checked"]["hashed"] == 0, doc["findings"]
    site = next(files.glob("lib/python*/site-packages"))
    ext = next(site.glob("demo_py/_ext.*.so"))
    assert ext.is_symlink()
    os.mkfifo(case / "fifo.so")
    ext.unlink()
    ext.symlink_to(case / "fifo.so")
    p = as_who(who, world, "validate", files, "--json", timeout=60)
    doc = json.loads(p.stdout)
    assert doc["exit_status"] == 1
    altered = [f for f in doc["findings"] if f["check"] == "altered-file"]
    assert [f["paths"] for f in altered] == [[str(ext.relative_to(files))]]
    assert "symbolic link" in altered[0]["message"]
    linked = next(d for d in ("share/demo-meta", "share/cuda-version")
                  if (dirs / d).is_symlink())
    elsewhere = case / "elsewhere"
    elsewhere.mkdir()
    for name in os.listdir(dirs / linked):
        os.mkfifo(elsewhere / name)
    (dirs / linked).unlink()
    (dirs / linked).symlink_to(elsewhere)
    doc = json.loads(as_who(who, world, "validate", dirs, "--json", timeout=60).stdout)
    unsafe = [f for f in doc["findings"] if f["check"] == "unsafe-path"]
    assert doc["exit_status"] == 1 and len(unsafe) == 1, doc["findings"]
    assert unsafe[0]["paths"] and all(x.startswith(linked + "/") for x in unsafe[0]["paths"])
    assert not [f for f in doc["findings"] if f["check"] == "linked-directories"
                and linked in f["paths"]]


# ---------------------------------------------------------------- validate
@pytest.mark.parametrize("who", WHO)
def test_validate_reports_unsafe_paths_without_following_them(world, case, who):
    """A record path outside the env, and files under a directory that was replaced by a
    link: error findings, and neither is opened (both lead to FIFOs, which would block
    a reader until the timeout)."""
    src = _writable_clone(world, case)
    os.mkfifo(case / "fifo")
    _add_entries(src, "libdemo", _file_entry("../fifo"))
    out = case / "elsewhere"
    out.mkdir()
    os.mkfifo(out / "config.txt")
    shutil.rmtree(src / "share" / "demo")
    (src / "share" / "demo").symlink_to(out)
    p = as_who(who, world, "validate", src, "--json", timeout=60)
    assert p.returncode == 1, p.stderr
    doc = json.loads(p.stdout)
    unsafe = [f for f in doc["findings"] if f["check"] == "unsafe-path"]
    assert {tuple(f["paths"]) for f in unsafe} == {("../fifo",), ("share/demo/config.txt",)}
    assert all(f["severity"] == "error" and f["hint"] for f in unsafe)
    assert not [f for f in doc["findings"] if f["check"] in ("missing-file", "altered-file")]


def test_validate_reports_a_clone_of_a_tampered_cache(world, case):
    """A clone made by envtools before the cache check (stat cache version 3) vouched
    for what it copied from a tampered cache: plain validate ignores such parts now and
    reports the file. Reproduced here: a clone's file changed, and an old-style part
    vouching for it with its package's hash, as that code wrote it."""
    from envtools.prefix.hashing import STAT_CACHE, stat_key

    src = _writable_clone(world, case)
    h = src / "include" / "demo.h"
    os.chmod(h, 0o644)
    h.write_bytes(h.read_bytes().replace(b"demo", b"evil", 1))
    rec = json.loads(_record(src, "libdemo").read_text())
    sha = next(e["sha256"] for e in rec["paths_data"]["paths"] if e["_path"] == "include/demo.h")
    (src / STAT_CACHE / "placed-0.marshal").write_bytes(
        marshal.dumps((3, {"include/demo.h": (*stat_key(h.stat()), sha)})))
    doc = json.loads(run_envtools("validate", src, "--json", check=False).stdout)
    assert [f["paths"] for f in doc["findings"] if f["check"] == "altered-file"] == [
        ["include/demo.h"]]


def test_validate_checks_explicit_against_the_records(world, case):
    env = case / "p"
    run_envtools("install", "--channel", world.base, "--prefix", env, "libdemo")
    explicit = env / "conda-meta" / "envtools" / "explicit.txt"
    os.chmod(explicit.parent, 0o755)
    os.chmod(explicit, 0o644)
    text = explicit.read_text()
    sha = text.split("#sha256:")[1][:64]
    explicit.write_text(text.replace(sha, "f" * 64))
    doc = json.loads(run_envtools("validate", env, "--json", check=False).stdout)
    errs = [f for f in doc["findings"] if f["check"] == "explicit"]
    assert doc["exit_status"] == 1 and len(errs) == 1 and "f" * 64 in errs[0]["message"]


# ---------------------------------------------------------------- remove
def test_remove_never_deletes_outside_the_prefix(world, case):
    """remove deletes the env's own entries: a symlink in it to a directory outside is
    removed as a link, and a prefix that is itself a link is refused."""
    env = case / "p"
    run_envtools("install", "--channel", world.base, "--prefix", env, "libdemo")
    keep = case / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    os.chmod(env, 0o755)
    (env / "link-out").symlink_to(keep)
    link = case / "alias"
    link.symlink_to(env)
    p = run_envtools("remove", link, check=False)
    assert p.returncode == 2 and "symbolic link" in p.stderr
    assert env.is_dir()
    run_envtools("remove", env)
    assert not env.exists() and (keep / "precious").read_text() == "x"


def test_a_failed_install_leaves_a_shared_cache_read_only(world, case):
    """A shared --cache that another env uses: an install that fails on a tampered archive
    (after the cache was opened for writing) leaves no writable entry in it."""
    cache = case / "cache"
    run_envtools("install", "--channel", world.base, "--prefix", case / "a", "--cache",
                 cache, "libdemo")

    def writable() -> list[str]:
        return sorted(str(p.relative_to(cache)) for p in [cache, *cache.rglob("*")]
                      if not p.is_symlink() and p.stat().st_mode & 0o222)

    assert writable() == []
    ch = _tampered_channel(world, case, "flipped")
    p = run_envtools("install", "--channel", ch, "--prefix", case / "b", "--cache", cache,
                     "demo-extra", check=False)
    refused(p, "demo-extra", "sha256")
    assert not (case / "b").exists()
    assert writable() == []
    doc = json.loads(run_envtools("validate", case / "a", "--json").stdout)
    assert doc["exit_status"] == 0, doc

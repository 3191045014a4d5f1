"""Sealed env images (issue 39): seal, run, validate, clone and module of an image, on the
fixture env, as root (the kernel's squashfs) and as another uid (squashfuse in a user
namespace), and every bad input with its one-line error and nothing left mounted.

Everything is real: mksquashfs writes the image, squashfuse or the kernel mount it in
the command's own namespace, Lmod and Environment Modules load the modulefiles. A mount
is looked for in this (the host's) /proc/self/mountinfo and squashfuse among all
processes: none may outlive its command.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import ENVTOOLS, other_user, run_envtools
from envtools.image.manifest import host_platform
from fixtures import upstream_channel
from modtools import lmod_prelude, tcl_modules_prelude

pytestmark = pytest.mark.skipif(
    not (shutil.which("mksquashfs") and shutil.which("squashfuse") and shutil.which("unshare")),
    reason="needs squashfs-tools, squashfuse and util-linux (apt-get install squashfs-tools "
    "squashfuse fuse3)")

ROOT = os.geteuid() == 0


def _fuse_usable() -> str | None:
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse (apt-get install fuse3; modprobe fuse)"
    mode = os.stat("/dev/fuse").st_mode & 0o777
    if mode & 0o006 != 0o006 and ROOT:
        return (f"/dev/fuse is {mode:04o}: other uids cannot use FUSE (Debian's default is "
                "0666: chmod 0666 /dev/fuse)")
    return None


def needs_fuse_for_others() -> None:
    why = _fuse_usable()
    if why:
        pytest.skip(why)


def _rmtree(p: Path) -> None:
    for dirpath, _dirs, _files in os.walk(p):
        try:
            os.chmod(dirpath, 0o755)
        except OSError:
            pass
    shutil.rmtree(p, ignore_errors=True)


@pytest.fixture(scope="module")
def sealed(channel):
    """A root-owned env (the fixture's powerai) in a tree every uid can reach, its image,
    and another uid with a home of its own."""
    top = Path(tempfile.mkdtemp(prefix="envtools-image-", dir="/tmp"))
    try:
        os.chmod(top, 0o755)
        env = top / "site" / "envs" / "powerai"
        run_envtools("install", "--channel", channel, "--prefix", env, "demo-meta",
                     "demo-noarch")
        images = top / "images"
        images.mkdir(mode=0o755)
        img = images / "powerai.sqfs"
        run_envtools("seal", env, "--out", img)
        yield SimpleNamespace(top=top, env=env, img=img, channel=channel,
                              user=other_user(top / "home"))
    finally:
        _rmtree(top)


def tree_state(root: Path) -> dict:
    """Every entry of a tree with what a write would change (directories included)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for n in [".", *dirnames, *filenames]:
            p = os.path.join(dirpath, n)
            st = os.lstat(p)
            out[os.path.relpath(p, root)] = (st.st_mode, st.st_size, st.st_mtime_ns,
                                             st.st_ino, st.st_nlink)
    return out


def mounts_at(path: Path | str) -> list[str]:
    with open("/proc/self/mountinfo") as fh:
        return [ln for ln in fh if ln.split()[4] == str(path)]


def squashfuse_at(path: Path | str) -> list[int]:
    """Pids of squashfuse processes (any namespace) mounting at ``path``."""
    pids = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            argv = Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and os.path.basename(argv[0]) in (b"squashfuse", b"squashfuse_ll") \
                and str(path).encode() in argv:
            pids.append(int(d))
    return pids


def procs_with(arg: str) -> list[int]:
    pids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if arg.encode() in Path(f"/proc/{d}/cmdline").read_bytes().split(b"\0"):
                    pids.append(int(d))
            except OSError:
                pass
    return pids


def loops_of(image: Path | None) -> list[str]:
    """Loop devices backed by ``image`` (a kernel mount's; freed with its namespace)."""
    if image is None:
        return []
    found = []
    for f in Path("/sys/block").glob("loop*/loop/backing_file"):
        try:
            if f.read_text().strip() == str(image):
                found.append(f.parts[3])
        except OSError:
            pass
    return found


def assert_nothing_left(prefix: Path, wait_s: float = 10.0, image: Path | None = None) -> None:
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and (mounts_at(prefix) or squashfuse_at(prefix)
                                           or loops_of(image)):
        time.sleep(0.05)
    assert not mounts_at(prefix), mounts_at(prefix)
    assert not squashfuse_at(prefix)
    assert not loops_of(image), loops_of(image)


def one_error(p: subprocess.CompletedProcess, *words: str) -> str:
    """A bad input's answer: non-zero, one error line (and its hint) naming ``words``."""
    assert p.returncode != 0, p.stdout + p.stderr
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, p.stderr
    assert "Traceback" not in p.stderr
    for w in words:
        assert w in p.stderr, p.stderr
    return errors[0]


def user_run(sealed, *args, env: dict | None = None, **kw) -> subprocess.CompletedProcess:
    u = sealed.user
    return subprocess.run(u.envtools(*args), env={**u.env, **(env or {})},
                          capture_output=True, text=True, **kw)


# ------------------------------------------------------------------------------ seal

def test_help_of_the_image_commands():
    for sub in ("seal", "run", "mount"):
        p = run_envtools(sub, "--help")
        assert p.stdout.startswith(f"usage: envtools {sub} ") and "options:" in p.stdout
    for sub in ("validate", "clone", "module"):
        assert "image" in run_envtools(sub, "--help").stdout



def test_seal_writes_the_image_its_sha256_and_manifest(sealed):
    img = sealed.img
    sha_file, json_file = img.with_name(img.name + ".sha256"), img.with_name(img.name + ".json")
    data = img.read_bytes()
    assert data[:4] == b"hsqs"
    sha = hashlib.sha256(data).hexdigest()
    assert sha_file.read_text() == f"{sha}  {img.name}\n"
    m = json.loads(json_file.read_text())
    assert m["format"] == "envtools-image/1"
    assert m["prefix"] == str(sealed.env)
    assert m["platform"] == host_platform()
    assert m["image_sha256"] == sha and m["image_bytes"] == len(data)
    assert m["packages"] == len(list((sealed.env / "conda-meta").glob("*.json")))
    # every chunk's sha256, so a copy is checked on all cores
    chunk = m["chunk_bytes"]
    assert chunk == 4 << 20 and m["chunk_sha256"] == [
        hashlib.sha256(data[i:i + chunk]).hexdigest() for i in range(0, len(data), chunk)]
    # sha256sum -c checks a copy without envtools
    assert subprocess.run(["sha256sum", "-c", sha_file.name], cwd=img.parent,
                          capture_output=True).returncode == 0
    # the manifest inside is the same, less what only the outside can know
    inner = subprocess.run(["unsquashfs", "-cat", str(img), "conda-meta/envtools/image.json"],
                           capture_output=True, check=True).stdout
    assert json.loads(inner) == {k: v for k, v in m.items() if k not in (
        "image_sha256", "image_bytes", "chunk_bytes", "chunk_sha256")}
    # owners are root, no xattrs, and the files are the env's (listing matches)
    listing = subprocess.run(["unsquashfs", "-lln", str(img)], capture_output=True,
                             text=True, check=True).stdout
    assert all(" 0/0 " in ln for ln in listing.splitlines() if "squashfs-root" in ln)
    names = {ln.split("squashfs-root", 1)[1].split(" -> ")[0].lstrip("/")
             for ln in listing.splitlines()
             if "squashfs-root" in ln}
    assert {os.path.relpath(os.path.join(d, n), sealed.env) for d, ds, fs in os.walk(sealed.env)
            for n in ds + fs} | {"", "conda-meta/envtools/image.json"} == names


def test_seal_is_reproducible_and_writes_nothing_into_the_env(sealed, tmp_path):
    before = tree_state(sealed.env)
    a = tmp_path / "a.sqfs"
    b = tmp_path / "b.sqfs"
    run_envtools("seal", sealed.env, "--out", a)
    run_envtools("seal", sealed.env, "--out", b, env={**os.environ, "ENVTOOLS_WORKERS": "1"})
    assert a.read_bytes() == sealed.img.read_bytes() == b.read_bytes()
    assert tree_state(sealed.env) == before
    assert not [n for n in os.listdir(tmp_path) if ".envtools-tmp-" in n]


def test_another_uid_seals_the_site_env_to_the_same_bytes(sealed):
    before = tree_state(sealed.env)
    home = sealed.user.home
    p = user_run(sealed, "seal", sealed.env, "--out", home / "mine.sqfs")
    assert p.returncode == 0, p.stderr
    assert (home / "mine.sqfs").read_bytes() == sealed.img.read_bytes()
    assert tree_state(sealed.env) == before


def test_a_users_clone_with_add_and_pip_is_sealed_and_runs(sealed, tmp_path, wheel_factory):
    up = upstream_channel(sealed.channel)
    if not list((up / "noarch").glob("pip-*.conda")):
        pytest.skip("no pip wheel on this machine (apt-get install python3-pip-whl)")
    mine = tmp_path / "mine"
    run_envtools("clone", sealed.env, mine, "--add", "demo-extra")
    run_envtools("add", mine, "pip", "--channel", up)
    whl = wheel_factory("tinyw", "1.0", {"tinyw/__init__.py": "ANSWER = 42\n"})
    env = {**os.environ, "PYTHONNOUSERSITE": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([mine / "bin" / "python", "-m", "pip", "install", "--no-index",
                    "--no-deps", str(whl)], capture_output=True, check=True, env=env)
    img = tmp_path / "mine.sqfs"
    run_envtools("seal", mine, "--out", img)
    p = run_envtools("run", img, "--", "sh", "-c",
                     f"cat {mine}/share/demo-extra/info.txt; grep ' {mine} ' "
                     f"/proc/self/mountinfo; {mine}/bin/python -c 'import tinyw; "
                     "print(tinyw.ANSWER)'", check=False)
    assert p.returncode == 0, p.stderr
    assert f"extra at {mine}" in p.stdout and p.stdout.rstrip().endswith("42")
    assert " - squashfs " in p.stdout or " - fuse.squashfuse" in p.stdout
    v = run_envtools("validate", img, "--json", check=False)
    assert json.loads(v.stdout)["exit_status"] == 0, v.stdout
    assert_nothing_left(mine)


def test_seal_refuses_a_broken_env_unless_forced(sealed, tmp_path):
    clone = tmp_path / "broken"
    run_envtools("clone", sealed.env, clone)
    readme = clone / "share" / "demo-meta" / "README"
    readme.unlink()
    readme.write_text("changed behind its record\n")
    p = run_envtools("seal", clone, "--out", tmp_path / "b.sqfs", check=False)
    line = one_error(p, "refusing to seal", "share/demo-meta/README", "--force")
    assert "validate finds" in line
    assert not (tmp_path / "b.sqfs").exists()
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".b.sqfs")]
    run_envtools("seal", clone, "--out", tmp_path / "b.sqfs", "--force")
    assert (tmp_path / "b.sqfs").exists()


def test_a_file_the_sealer_cannot_read_is_an_error_not_an_empty_file(sealed):
    """mksquashfs itself would store an unreadable file as empty, and exit 0."""
    needs_fuse_for_others()
    if not ROOT:
        pytest.skip("needs root to make a file another uid cannot read")
    top = Path(tempfile.mkdtemp(dir=sealed.top))
    os.chmod(top, 0o755)
    env = top / "env"
    run_envtools("clone", sealed.env, env)
    os.chmod(env / "share" / "demo-meta" / "README", 0o000)
    out = sealed.user.home / "unreadable.sqfs"
    for force in ([], ["--force"]):
        p = user_run(sealed, "seal", env, "--out", out, *force)
        one_error(p, "cannot be read by you", "share/demo-meta/README")
        assert not out.exists()
    assert not [n for n in os.listdir(out.parent) if ".envtools-tmp-" in n]
    _rmtree(top)


def test_seal_refuses_an_out_inside_the_env_or_existing(sealed, tmp_path):
    p = run_envtools("seal", sealed.env, "--out", sealed.env / "x.sqfs", check=False)
    one_error(p, "inside the env")
    (tmp_path / "link").symlink_to(sealed.env / "share")
    p = run_envtools("seal", sealed.env, "--out", tmp_path / "link" / "x.sqfs", check=False)
    one_error(p, "inside the env")
    out = tmp_path / "taken.sqfs"
    out.write_text("someone's file\n")
    p = run_envtools("seal", sealed.env, "--out", out, check=False)
    one_error(p, "already exists")
    assert out.read_text() == "someone's file\n"
    assert not out.with_name("taken.sqfs.sha256").exists()
    p = run_envtools("seal", tmp_path, "--out", tmp_path / "n.sqfs", check=False)
    one_error(p)
    assert not (tmp_path / "n.sqfs").exists()


# ------------------------------------------------------------------------------- run

def test_run_gives_the_env_at_its_prefix_and_the_commands_status(sealed):
    script = (f"grep ' {sealed.env} ' /proc/self/mountinfo; {sealed.env}/bin/demo; "
              f"{sealed.env}/bin/python -c 'import demo_py, sys; print(demo_py.where())'; exit 7"
              )
    p = run_envtools("run", sealed.img, "--", "sh", "-c", script, check=False)
    assert p.returncode == 7, p.stderr
    kind = " - squashfs " if ROOT else " - fuse.squashfuse"  # (or fuse.squashfuse_ll)
    assert kind in p.stdout
    assert f"prefix={sealed.env}" in p.stdout
    assert_nothing_left(sealed.env)


def test_run_with_squashfuse_as_root_too(sealed):
    p = run_envtools("run", "--mount-with", "fuse", sealed.img, "--", "sh", "-c",
                     f"grep ' {sealed.env} ' /proc/self/mountinfo", check=False)
    assert p.returncode == 0, p.stderr
    assert " - fuse.squashfuse" in p.stdout
    assert_nothing_left(sealed.env)


def test_run_as_another_uid(sealed):
    needs_fuse_for_others()
    u = sealed.user
    p = user_run(sealed, "run", sealed.img, "--", "sh", "-c",
                 f"id -u; id -g; grep ' {sealed.env} ' /proc/self/mountinfo; {sealed.env}/bin/demo;"
                 f" touch {u.home}/written; exit 3")
    assert p.returncode == 3, p.stderr
    ids = p.stdout.split()[:2]
    assert ids == [str(u.uid), str(u.gid)]
    assert " - fuse.squashfuse" in p.stdout
    assert f"prefix={sealed.env}" in p.stdout
    st = os.stat(u.home / "written")  # files it writes outside the image are its own
    assert (st.st_uid, st.st_gid) == (u.uid, u.gid)
    assert_nothing_left(sealed.env)


def test_stdin_reaches_the_command(sealed):
    p = run_envtools("run", sealed.img, "--", "sh", "-c", "tr a-z A-Z", input="hello\n")
    assert p.stdout == "HELLO\n"


@pytest.mark.parametrize("who", ["root", "user", "root-fuse"])
def test_killed_command_leaves_no_mount(sealed, who):
    if who == "user":
        needs_fuse_for_others()
    args = ["run", *(["--mount-with", "fuse"] if who == "root-fuse" else []), sealed.img, "--",
            "sh", "-c", "kill -9 $$"]
    p = user_run(sealed, *args) if who == "user" else run_envtools(*args, check=False)
    assert p.returncode == 128 + signal.SIGKILL, p.stderr
    assert_nothing_left(sealed.env, image=sealed.img)


@pytest.mark.parametrize("who", ["root", "user", "root-kernel"])
def test_killed_envtools_takes_the_command_and_mount_with_it(sealed, who, tmp_path):
    if who == "user":
        needs_fuse_for_others()
        ready = sealed.user.home / f"ready-{os.getpid()}"
        argv, env = sealed.user.envtools("run", "--mount-with", "fuse", sealed.img), sealed.user.env
    elif who == "root-kernel":
        if not ROOT or not Path("/dev/loop-control").exists():
            pytest.skip("the kernel's squashfs needs root and loop devices")
        ready = tmp_path / "ready"
        argv, env = [*ENVTOOLS, "run", "--mount-with", "kernel", sealed.img], None
    else:
        ready = tmp_path / "ready"
        argv, env = [*ENVTOOLS, "run", "--mount-with", "fuse", sealed.img], None
    marker = f"{time.time():.6f}"  # a sleep argument nothing else has
    proc = subprocess.Popen([*argv, "--", "sh", "-c", f"touch {ready}; exec sleep {marker}"],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ready.exists(), proc.stderr.read() if proc.poll() is not None else "no start"
        assert procs_with(marker)
        assert loops_of(sealed.img) if who == "root-kernel" else squashfuse_at(sealed.env)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert_nothing_left(sealed.env, image=sealed.img)
        deadline = time.monotonic() + 10
        while procs_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not procs_with(marker), "the command outlived envtools"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_sigterm_to_envtools_reaches_the_command(sealed, tmp_path):
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [*ENVTOOLS, "run", sealed.img, "--", "sh", "-c",
         f'trap "echo got-term; exit 42" TERM; touch {ready}; while :; do sleep 0.05; done'],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while not ready.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 42, err
    assert "got-term" in out
    assert_nothing_left(sealed.env)


# ------------------------------------------------------------- validate, clone, module

def test_validate_image(sealed):
    p = run_envtools("validate", sealed.img, "--json", check=False)
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["prefix"] == str(sealed.env) and doc["exit_status"] == 0
    assert doc["checked"]["imports"] >= 1
    assert "sha256 ok" in p.stderr
    assert_nothing_left(sealed.env)


def test_validate_image_as_another_uid(sealed):
    needs_fuse_for_others()
    p = user_run(sealed, "validate", sealed.img)
    assert p.returncode == 0, p.stderr
    assert "0 errors" in p.stderr


@pytest.mark.parametrize("who", ["root", "user"])
def test_clone_from_image_is_an_ordinary_env(sealed, who, tmp_path):
    if who == "user":
        needs_fuse_for_others()
        dest = sealed.user.home / "from-image"
        p = user_run(sealed, "clone", sealed.img, dest)
    else:
        dest = tmp_path / "from-image"
        p = run_envtools("clone", sealed.img, dest, check=False)
    assert p.returncode == 0, p.stderr
    assert_nothing_left(sealed.env)
    out = subprocess.run([str(dest / "bin" / "demo")], capture_output=True, text=True).stdout
    assert f"prefix={dest}" in out
    if who == "user":
        st = os.stat(dest / "bin" / "demo")
        assert st.st_uid == sealed.user.uid
        v = user_run(sealed, "validate", dest)
    else:
        v = run_envtools("validate", dest, check=False)
    assert v.returncode == 0, v.stderr
    assert "0 errors" in v.stderr


def test_clone_from_image_refuses_a_dest_in_its_prefix(sealed, tmp_path):
    p = run_envtools("clone", sealed.img, sealed.env / "sub", check=False)
    one_error(p, "inside the image's prefix")
    assert_nothing_left(sealed.env)
    p = run_envtools("clone", sealed.img, tmp_path / "d", "--link-mode", "dirs", check=False)
    one_error(p, "cannot link to an image")
    assert not (tmp_path / "d").exists()


def test_clone_from_image_with_add(sealed, tmp_path):
    dest = tmp_path / "more"
    run_envtools("clone", sealed.img, dest, "--add", "demo-extra")
    assert (dest / "share" / "demo-extra" / "info.txt").read_text() == f"extra at {dest}\n"
    assert run_envtools("validate", dest, check=False).returncode == 0
    assert_nothing_left(sealed.env)


def _module_systems():
    return [pytest.param(lmod_prelude, id="lmod"), pytest.param(tcl_modules_prelude, id="tcl")]


@pytest.fixture(scope="module")
def image_modulefiles(sealed):
    out = sealed.top / "modulefiles"  # (every uid may read it)
    run_envtools("module", sealed.img, "--name", "powerai/1.0", "--out", out)
    assert_nothing_left(sealed.env)
    return out


def _bash(prelude: str, modulepath: Path, body: str) -> list[str]:
    script = f"{prelude}\nexport MODULEPATH={modulepath}\n{body}\n"
    return ["env", "-i", "HOME=/tmp", "PATH=/usr/local/bin:/usr/bin:/bin", "TERM=dumb",
            "bash", "--noprofile", "--norc", "-c", script]


@pytest.mark.parametrize("system", _module_systems())
def test_module_of_an_image_loads_where_it_is_mounted(sealed, image_modulefiles, system):
    prelude, why = system()
    if prelude is None:
        pytest.skip(why)
    body = "module load powerai/1.0 && command -v demo && demo && echo CP=$CONDA_PREFIX"
    # not mounted on this "node" (the prefix holds the plain env, not the image)
    p = subprocess.run(_bash(prelude, image_modulefiles, body), capture_output=True, text=True)
    said = " ".join((p.stdout + p.stderr).split())  # (Modules wraps its messages)
    assert p.returncode != 0 and "not mounted at" in said, said
    assert f"envtools mount {sealed.img}" in said and f"envtools run {sealed.img}" in said
    assert "CP=" not in p.stdout
    # mounted: load works as for the prefix
    p = run_envtools("run", sealed.img, "--", *_bash(prelude, image_modulefiles, body),
                     check=False)
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{sealed.env}/bin/demo" in p.stdout
    assert f"prefix={sealed.env}" in p.stdout and f"CP={sealed.env}" in p.stdout


@pytest.mark.skipif(not ROOT, reason="envtools mount is for root")
def test_admin_mounts_for_the_node_and_module_load_works(sealed, image_modulefiles):
    """What a job prolog does (in a private mount namespace here, standing in for a node:
    the host's mounts stay untouched)."""
    prelude, why = lmod_prelude()
    if prelude is None:
        pytest.skip(why)
    bash = _bash(prelude, image_modulefiles, "module load powerai/1.0 && demo")
    et = " ".join(map(str, ENVTOOLS))
    script = (f"set -e; {et} mount {sealed.img}; {et} mount {sealed.img}; "
              f"grep ' {sealed.env} ' /proc/self/mountinfo; "
              f"setpriv --reuid={sealed.user.uid} --regid={sealed.user.gid} --clear-groups -- "
              + " ".join(f"'{a}'" for a in bash)
              + f"; {et} mount --umount {sealed.img}; grep -c ' {sealed.env} ' /proc/self/mountinfo"
              " || true")
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "already mounted" in p.stderr
    assert " - squashfs " in p.stdout
    assert f"prefix={sealed.env}" in p.stdout
    assert p.stdout.rstrip().endswith("0")  # unmounted by the epilog
    assert_nothing_left(sealed.env)


def test_mount_as_a_user_is_refused(sealed):
    needs_fuse_for_others()
    one_error(user_run(sealed, "mount", sealed.img), "for root", "envtools run")


# -------------------------------------------------------------------------- bad input

def _copy_image(sealed, dest_dir: Path) -> Path:
    dest = dest_dir / sealed.img.name
    for suffix in ("", ".sha256", ".json"):
        shutil.copyfile(f"{sealed.img}{suffix}", f"{dest}{suffix}")
    return dest


def test_truncated_image_is_refused_before_mounting(sealed, tmp_path):
    img = _copy_image(sealed, tmp_path)
    with open(img, "r+b") as fh:
        fh.truncate(os.path.getsize(img) // 2)
    one_error(run_envtools("run", img, "--", "true", check=False), "truncated")
    one_error(run_envtools("run", "--hashed-by-caller", img, "--", "true", check=False),
              "truncated")  # (only the whole-file hash is the caller's)
    one_error(run_envtools("validate", img, check=False), "truncated")
    p = run_envtools("validate", img, "--json", check=False)
    assert p.returncode == 2
    doc = json.loads(p.stdout)
    assert doc["exit_status"] == 2 and "truncated" in doc["error"] and doc["hint"]
    assert_nothing_left(sealed.env)


def test_altered_image_is_refused_before_mounting(sealed, tmp_path):
    img = _copy_image(sealed, tmp_path)
    with open(img, "r+b") as fh:
        fh.seek(os.path.getsize(img) // 2)
        b = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([b[0] ^ 0xFF]))
    one_error(run_envtools("run", img, "--", "true", check=False), "altered",
              "it was not mounted")
    assert_nothing_left(sealed.env)
    img.with_name(img.name + ".sha256").unlink()
    one_error(run_envtools("run", img, "--", "true", check=False), ".sha256 is missing")


def _edit_manifest(img: Path, edit) -> None:
    json_file = img.with_name(img.name + ".json")
    doc = json.loads(json_file.read_text())
    edit(doc)
    json_file.write_text(json.dumps(doc))


def test_an_altered_chunk_is_named_and_a_bad_chunk_list_refused(sealed, tmp_path):
    """The image is checked chunk by chunk (on every core); the one that differs is named,
    the last one too, and a chunk list that is not one sha256 per chunk is refused."""
    img = _copy_image(sealed, tmp_path)
    chunk = 4 << 20
    size = os.path.getsize(img)
    with open(img, "r+b") as fh:
        fh.seek(size - 1)
        b = fh.read(1)
        fh.seek(size - 1)
        fh.write(bytes([b[0] ^ 1]))
    one_error(run_envtools("run", img, "--", "true", check=False), "altered",
              f"offset {(size - 1) // chunk * chunk}", "it was not mounted")
    _edit_manifest(img, lambda d: d["chunk_sha256"].pop())
    one_error(run_envtools("validate", img, check=False), "not one sha256 per chunk")
    _edit_manifest(img, lambda d: d.update(chunk_bytes=3 << 20))
    one_error(run_envtools("validate", img, check=False), "'chunk_bytes' is out of range")
    assert_nothing_left(sealed.env)


def test_an_image_sealed_before_chunks_is_checked_whole(sealed, tmp_path):
    img = _copy_image(sealed, tmp_path)
    _edit_manifest(img, lambda d: [d.pop("chunk_bytes"), d.pop("chunk_sha256")])
    assert run_envtools("run", img, "--", "true").returncode == 0
    with open(img, "r+b") as fh:
        fh.seek(100)
        b = fh.read(1)
        fh.seek(100)
        fh.write(bytes([b[0] ^ 1]))
    one_error(run_envtools("run", img, "--", "true", check=False), "altered",
              "its sha256 is")
    assert_nothing_left(sealed.env)


def test_not_an_image(sealed, tmp_path):
    fake = tmp_path / "fake.sqfs"
    fake.write_bytes(b"not squashfs")
    one_error(run_envtools("run", fake, "--", "true", check=False), "is missing")
    one_error(run_envtools("run", tmp_path / "nothing.sqfs", "--", "true", check=False),
              "does not exist")
    one_error(run_envtools("run", sealed.img, check=False), "no command")


def test_image_for_another_platform_is_refused(sealed, tmp_path):
    env = tmp_path / "other"
    run_envtools("clone", sealed.env, env)
    for rec in (env / "conda-meta").glob("*.json"):
        doc = json.loads(rec.read_text())
        if doc.get("subdir") not in (None, "noarch"):
            doc["subdir"] = "linux-ppc64le" if os.uname().machine != "ppc64le" else "linux-64"
        os.chmod(rec, 0o644)
        rec.write_text(json.dumps(doc))
    img = tmp_path / "other.sqfs"
    run_envtools("seal", env, "--out", img, "--force")
    line = one_error(run_envtools("run", img, "--", "true", check=False), "is an image for")
    assert "this node is" in line
    one_error(run_envtools("validate", img, check=False), "is an image for")
    assert_nothing_left(env)


@pytest.fixture
def unmountable(sealed):
    """An image of an env whose prefix is then taken away (in a directory every uid can
    reach)."""
    tmp_path = Path(tempfile.mkdtemp(dir=sealed.top))
    os.chmod(tmp_path, 0o755)
    base = tmp_path / "gone"
    env = base / "envs" / "p"
    run_envtools("clone", sealed.env, env)
    img = tmp_path / "p.sqfs"
    run_envtools("seal", env, "--out", img)
    _rmtree(base)
    yield SimpleNamespace(img=img, base=base, prefix=env)
    if base.is_file():
        base.unlink()
    _rmtree(tmp_path)


def test_missing_prefix_is_made_and_removed_again(sealed, unmountable):
    p = run_envtools("run", unmountable.img, "--", "sh", "-c",
                     f"{unmountable.prefix}/bin/demo", check=False)
    assert p.returncode == 0, p.stderr
    assert f"prefix={unmountable.prefix}" in p.stdout
    assert not unmountable.base.exists()  # the mountpoint it made is gone again


def test_prefix_that_cannot_be_made(sealed, unmountable):
    needs_fuse_for_others()
    if not ROOT:
        pytest.skip("needs root to own the directory the other uid cannot write")
    unmountable.base.mkdir(mode=0o755)  # root's: the other uid cannot make envs/p in it
    p = user_run(sealed, "run", unmountable.img, "--", "true")
    one_error(p, "does not exist here and cannot be made", "mkdir -p")
    assert os.listdir(unmountable.base) == []
    unmountable.base.rmdir()
    unmountable.base.write_text("a file where a directory should be\n")
    p = run_envtools("run", unmountable.img, "--", "true", check=False)
    one_error(p, "cannot be made")
    assert_nothing_left(unmountable.prefix)


def test_prefix_that_is_a_file(sealed, unmountable):
    unmountable.prefix.parent.mkdir(parents=True)
    unmountable.prefix.write_text("not a directory\n")
    one_error(run_envtools("run", unmountable.img, "--", "true", check=False),
              "not a directory")


def test_prefix_linked_to_a_system_directory_is_refused(sealed, unmountable):
    unmountable.prefix.parent.mkdir(parents=True)
    unmountable.prefix.symlink_to("/usr/share")
    one_error(run_envtools("run", unmountable.img, "--", "true", check=False),
              "leads to /usr/share")
    assert not mounts_at("/usr/share")


def test_missing_squashfuse_names_the_package(sealed, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("unshare", "sh", "mount", "unsquashfs"):
        if shutil.which(tool):
            (bin_dir / tool).symlink_to(shutil.which(tool))
    env = {**os.environ, "PATH": str(bin_dir)}
    p = run_envtools("run", "--mount-with", "fuse", sealed.img, "--", "true", check=False,
                     env=env)
    one_error(p, "squashfuse is not installed", "apt-get install squashfuse")


@pytest.mark.skipif(not ROOT, reason="needs root to hide /dev/fuse in a private mount ns")
@pytest.mark.parametrize("case", ["missing", "0600"])
def test_unusable_dev_fuse_names_the_fix(sealed, case, tmp_path):
    if case == "missing":
        hide = ("mkdir -p {t}/dev && mount --bind /dev {t}/dev && mount -t tmpfs none /dev && "
                "touch /dev/null && mount --bind {t}/dev/null /dev/null")
        words = ["/dev/fuse does not exist", "apt-get install fuse3"]
        who = ""
    else:
        hide = "touch {t}/fuse && chmod 0600 {t}/fuse && mount --bind {t}/fuse /dev/fuse"
        words = ["/dev/fuse is not readable and writable", "chmod 0666 /dev/fuse"]
        u = sealed.user
        who = f"setpriv --reuid={u.uid} --regid={u.gid} --clear-groups -- "
    py = sealed.user.python[0] if case == "0600" else sys.executable
    script = (hide.format(t=tmp_path) + f" && {who}{py} -m envtools run --mount-with fuse "
              f"{sealed.img} -- true")
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                       capture_output=True, text=True, env=sealed.user.env if who else None)
    one_error(p, *words)
    assert_nothing_left(sealed.env)

"""``python -m envtools.bench``: clone and validate timings against their baselines.

Measured in one run, so the ratios compare like with like on a noisy machine (medians
of ``--repeat`` runs; every command is a fresh process, timed by wall clock; the page
cache is warm for all of them, since dropping it would disturb other users). Each
command starts after a ``sync`` (not timed): otherwise it would pay for writing back the
previous command's data (``cp -a`` leaves ~0.7 GB dirty), and which command follows
which would decide the figures. Nor does any timed figure include writing its own data
back, which flatters ``cp -a`` most, as the one that writes the most data.

Nothing is deleted between the commands of a round: each destination is moved aside,
and the round's trees are removed before the next round, followed by ``--settle``
seconds of rest. ext4 without a journal (this VM's root filesystem, and common on
node-local disks) will not reuse an inode freed in the last 30 s, and each inode
allocation scans past those, so for half a minute after a large delete every new file
or directory costs 100-250 us instead of 10. A command run just after the previous
one's tree was removed pays that per inode it creates; ``cp -a`` creates ten times as
many as a clone, so removing trees between commands made the clone look about twice as
fast against ``cp -a`` as it is.

* ``cp -a SRC DEST`` and a fresh py-rattler install of the same records from the same
  package cache (the baselines);
* ``envtools clone`` with the package cache, as a non-root owner of the cache (a user
  namespace drops root's privileges; hardlinks are used, root never hardlinks), and as
  root (which copies unless the filesystem can reflink);
* ``envtools clone --no-cache`` (copy and relocate);
* ``envtools validate --no-imports`` (stat cache) and ``validate --full --no-imports``
  (hash everything); ``--validate`` measures validate with its import smoke test against
  ``pip check`` and ``ldd`` instead (:mod:`envtools.bench.validate`);
* ``cp -al`` for reference: GNU cp hardlinking every file, as root, in one process. It
  relocates nothing and writes no records, so it is not a clone, but it is about the
  least a clone that links its files can cost;
* a **non-owner**: a real uid other than the cache's owner (as root, one without an
  account, through ``setpriv``: see asuser.py), cloning the root-owned env as users of a
  site do (a symlink per file to the cache: cachelinks.py), with ``--link-mode dirs``
  (whole directories linked: layers.py) and with ``--link-mode copy`` (what such users
  got before), against ``cp -a``, ``cp -as`` (a symlink per file: the least a
  clone that symlinks every file can cost) and ``cp -al`` by the same user (refused by
  the kernel under ``fs.protected_hardlinks=1``), and ``validate`` of that user's clone;
* with ``--add``, instead: ``envtools add`` and ``drop`` of one small noarch package in a
  clone of the env against a py-rattler install of it into the same env
  (:mod:`envtools.bench.add`);
* a fresh ``envtools install`` of the env's specs from its channel (a new prefix and
  package cache), with the time it spent checking every archive's sha256 against the
  repodata (``ENVTOOLS_TIMINGS``), and for comparison a py-rattler install of the same
  records from the channel into a fresh cache, which checks nothing (what ``envtools
  install`` did before it verified archives). ``--no-install`` leaves these out.

By default it generates an environment of ``--files`` files in ``--packages`` packages
(with rattler-build, cached in ~/.cache/ddl-ce/envtools-bench): mostly small files (70%
under 8 KiB, 0.5% of 1-4 MiB), ~2% text files and 0.5% binaries carrying the prefix;
``--large-libs 8`` adds eight 64-256 MiB libraries, like the few huge ones (libtorch_cuda,
libcudnn, libcublasLt, libnccl...) that make up most of a real PyTorch/TensorFlow env.
``--prefix envs/powerai`` measures an existing env installed by ``envtools install``;
with ``--read-only-source`` nothing of it or its cache is changed (the py-rattler row,
which needs a writable cache, is left out).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path

from envtools.base.progress import get_console
from envtools.bench import add as bench_add
from envtools.bench import asuser
from envtools.bench.measure import print_medians, rm_tree, run_timed, time_cmd
from envtools.bench.startup import main as startup_main
from envtools.bench.validate import main as validate_main
from envtools.errors import EnvtoolsError
from envtools.prefix.readonly import make_readonly, make_writable, read_marker, read_prefix_info

GEN = r'''
import os, random, sys
prefix, idx, nfiles = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(idx)
pool = random.Random(12345).randbytes(1 << 22)  # 4 MiB of noise to slice from
def size():
    r = rng.random()
    if r < 0.70: return rng.randint(512, 8 << 10)
    if r < 0.95: return rng.randint(8 << 10, 64 << 10)
    if r < 0.995: return rng.randint(64 << 10, 512 << 10)
    return rng.randint(1 << 20, 4 << 20)
for i in range(nfiles):
    sub = ("lib/python3.11/site-packages/pkg%d/mod%d" % (idx, i % 23) if i % 3 else
           "share/pkg%d/data%d" % (idx, i % 11))
    d = os.path.join(prefix, sub)
    os.makedirs(d, exist_ok=True)
    if i % 50 == 0:  # a text file that records the prefix (like a config or a script)
        with open(os.path.join(d, "f%d.cfg" % i), "w") as fh:
            fh.write(("prefix = %s\n" % prefix) * (1 + i % 7) + "x" * rng.randint(100, 4000))
    elif i % 200 == 1:  # a binary with the prefix in a C string (like a compiled library)
        n = size()
        off = rng.randrange(len(pool) - n)
        s = pool[off:off + n]
        with open(os.path.join(d, "lib%d.so" % i), "wb") as fh:
            fh.write(b"\0" + prefix.encode() + b"/lib\0" + s)
    else:
        n = size()
        off = rng.randrange(len(pool) - n)
        with open(os.path.join(d, "f%d.bin" % i), "wb") as fh:
            fh.write(pool[off:off + n])
'''


GEN_LARGE = r'''
import os, random, sys
prefix, n = sys.argv[1], int(sys.argv[2])
pool = random.Random(54321).randbytes(1 << 24)  # 16 MiB of noise, written repeatedly
names = ["libtorch_cuda", "libcudnn_engines", "libcublasLt", "libtensorflow_cc",
         "libnccl", "libtorch_cpu", "libcusparse", "libcufft", "libxla", "libcurand"]
os.makedirs(os.path.join(prefix, "lib"), exist_ok=True)
for i in range(n):
    size = (64 + 192 * ((i * 7) % n) // max(1, n - 1)) << 20  # 64 .. 256 MiB
    with open(os.path.join(prefix, "lib", "%s.so.%d" % (names[i % len(names)], i)), "wb") as f:
        left = size
        while left > 0:
            k = min(left, len(pool))
            f.write(pool[:k])
            left -= k
'''


def _recipe(i: int, nfiles: int, gen: Path) -> str:
    return (
        f"package:\n  name: bench-pkg{i:03d}\n  version: 1.0.0\n"
        f"build:\n  number: 0\n  script:\n"
        f"    - {sys.executable} {gen} $PREFIX {i} {nfiles}\n"
    )


def _meta_recipe(n: int, large: int) -> str:
    deps = "".join(f"    - bench-pkg{i:03d}\n" for i in range(n))
    if large:
        deps += "    - bench-large\n"
    return (
        "package:\n  name: bench-env\n  version: 1.0.0\n"
        "build:\n  number: 0\n  script:\n    - mkdir -p $PREFIX/share && echo bench > "
        "$PREFIX/share/bench-env.txt\n"
        f"requirements:\n  run:\n{deps}"
    )


def build_bench_channel(files: int, packages: int, large: int = 0) -> Path:
    """Generate (once; cached by parameters) a channel whose env has ``files`` files
    (plus ``large`` framework-sized libraries of 64-256 MiB, in one more package)."""
    import rattler
    import rattler_build

    per = max(1, files // packages)
    key = hashlib.sha256(
        f"{files}:{packages}:{large}:{GEN}:{GEN_LARGE}:{_recipe(0, per, Path('g'))}".encode())
    base = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "ddl-ce"
    root = base / "envtools-bench" / key.hexdigest()[:16]
    channel = root / "channel"
    if (channel / "linux-64" / "repodata.json").exists():
        return channel
    shutil.rmtree(root, ignore_errors=True)
    (root / "recipes").mkdir(parents=True)
    gen = root / "gen.py"
    gen.write_text(GEN)
    recipes = []
    for i in range(packages):
        d = root / "recipes" / f"bench-pkg{i:03d}"
        d.mkdir()
        (d / "recipe.yaml").write_text(_recipe(i, per, gen))
        recipes.append(str(d / "recipe.yaml"))
    if large:
        (root / "gen_large.py").write_text(GEN_LARGE)
        d = root / "recipes" / "bench-large"
        d.mkdir()
        (d / "recipe.yaml").write_text(
            "package:\n  name: bench-large\n  version: 1.0.0\nbuild:\n  number: 0\n"
            f"  script:\n    - {sys.executable} {root / 'gen_large.py'} $PREFIX {large}\n")
        recipes.append(str(d / "recipe.yaml"))
    d = root / "recipes" / "bench-env"
    d.mkdir()
    (d / "recipe.yaml").write_text(_meta_recipe(packages, large))
    recipes.append(str(d / "recipe.yaml"))
    get_console().print(f"building {len(recipes)} bench packages ({per} files each"
                  f"{f', {large} large libraries' if large else ''}), once...")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        rattler_build.build_recipes(recipes, output_dir=str(root / "out"), test="skip",
                                    package_format="conda:1", compression_threads=2)
    for sub in ("linux-64", "noarch"):
        (channel / sub).mkdir(parents=True, exist_ok=True)
        for pkg in (root / "out" / sub).glob("*.conda"):
            os.link(pkg, channel / sub / pkg.name)
    asyncio.run(rattler.index.index_fs(channel, write_zst=False, write_shards=False))
    shutil.rmtree(root / "out" / "bld", ignore_errors=True)
    return channel


def _findings(cmd: list[str], env: dict | None = None) -> tuple[int, set[tuple]]:
    """``validate --json``'s exit status and its errors and warnings, for comparing two
    envs (a clone's notes say more: which directories are links to the cache)."""
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    doc = json.loads(p.stdout)
    return doc["exit_status"], {(f["check"], f["severity"], tuple(f["paths"]))
                                for f in doc.get("findings", []) if f["severity"] != "info"}


def _non_owner(work: Path, src: Path, cache: str | None) -> tuple[asuser.User | None, str]:
    """The user whose clones the non-owner rows time, or None and why not."""
    if not cache:
        return None, "the env has no package cache"
    if os.geteuid() != 0 and os.stat(cache).st_uid == os.geteuid():
        return None, "we own the package cache: run the bench as root, or as another user"
    try:
        user = asuser.unprivileged(work / "non-owner")
    except EnvtoolsError as e:
        return None, e.message
    if user.run(user.cmd("test", "-r", src / "conda-meta")).returncode != 0:
        return None, f"uid {user.uid} cannot read {src} (a parent directory is private?)"
    return user, ""


RATTLER_INSTALL = r'''
import asyncio, glob, sys, time, rattler
src, dest, cache = sys.argv[1:4]
recs = [rattler.PrefixRecord.from_path(p) for p in sorted(glob.glob(src + "/conda-meta/*.json"))]
t = time.perf_counter()
asyncio.run(rattler.install(recs, target_prefix=dest, cache_dir=cache, show_progress=False))
print(time.perf_counter() - t)
'''


def _time_install(cmd: list[str]) -> tuple[float, float]:
    """A whole ``envtools install``: (seconds, of which verifying archive sha256s)."""
    import re

    dt, p = run_timed(cmd, {**os.environ, "ENVTOOLS_TIMINGS": "1"})
    m = re.search(r"verified \d+ archive bytes in ([0-9.]+)s", p.stderr)
    if not m:
        raise RuntimeError(f"{' '.join(cmd)} printed no verify time:\n{p.stderr[-3000:]}")
    return dt, float(m.group(1))


NON_OWNER_CLONE = "envtools clone (cache, non-owner: a symlink per file)"
NON_OWNER_DIRS = "envtools clone (cache, non-owner, --link-mode dirs: linked directories)"


def _sysctl(name: str) -> str:
    try:
        return Path("/proc/sys", name).read_text().strip()
    except OSError:
        return "?"


def _count_files(p: Path) -> tuple[int, int]:
    n = size = 0
    for dirpath, _d, files in os.walk(p):
        for f in files:
            fp = os.path.join(dirpath, f)
            if not os.path.islink(fp):
                n += 1
                size += os.lstat(fp).st_size
    return n, size


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m envtools.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=Path, help="bench an existing envtools-installed env")
    ap.add_argument("--files", type=int, default=20000)
    ap.add_argument("--packages", type=int, default=40)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--large-libs", type=int, default=0, metavar="N",
                    help="add N framework-sized libraries (64-256 MiB each, like libtorch_cuda "
                    "or libcudnn), for an env shaped like a real PyTorch/TensorFlow one")
    ap.add_argument("--workdir", type=Path, help="where clones go [default: a temp dir in "
                    "the env's parent, same filesystem]")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--no-install", action="store_true",
                    help="leave out the fresh-install rows (envtools install vs py-rattler)")
    ap.add_argument("--settle", type=float, default=35.0, metavar="SECONDS",
                    help="rest after removing each round's trees, so no command pays for "
                    "the removal (see above) [default: 35]")
    ap.add_argument("--read-only-source", action="store_true",
                    help="change nothing in the env or its cache (leaves out the py-rattler "
                    "install, which needs a writable cache)")
    ap.add_argument("--only", choices=("all", "non-owner", "non-owner-clones"),
                    default="all",
                    help="non-owner: only cp -a (as root) and the non-owner rows; "
                    "non-owner-clones: only the non-owner's cp -a, clones, cp -as and cp -al "
                    "(no copies to delete but cp -a's: on a filesystem mounted with "
                    "discard, deleting each round's copied trees takes minutes)")
    ap.add_argument("--add", action="store_true",
                    help="measure envtools add and drop of one small noarch package in a "
                    "clone of the env, against a py-rattler install of it into the same "
                    "env (envtools.bench.add)")
    ap.add_argument("--validate", action="store_true",
                    help="measure validate instead, against pip check and ldd, and with "
                    "--breaks compare them on planted breaks (python -m envtools.bench "
                    "--validate --help)")
    ap.add_argument("--startup", action="store_true",
                    help="measure a job's start-up with the env on an emulated shared "
                    "filesystem, conda-packed, and staged by ddlrun --env (python -m "
                    "envtools.bench --startup --help)")
    args = sys.argv[1:] if argv is None else list(argv)
    if "--startup" in args:
        return startup_main([x for x in args if x != "--startup"])
    if "--validate" in args:
        return validate_main([x for x in args if x != "--validate"])
    a = ap.parse_args(args)
    envtools = [sys.executable, "-m", "envtools"]
    # envtools runs byte-compiled, as an installed package does (pip and conda compile at
    # install); with PYTHONDONTWRITEBYTECODE set (CI shells) a source checkout would
    # otherwise compile every module again in every timed command, ~20 ms each
    import compileall

    import envtools as _pkg

    compileall.compile_dir(str(Path(_pkg.__file__).parent), quiet=2)
    userns = ["unshare", "--user", "--"] if os.geteuid() == 0 and shutil.which("unshare") else []

    tmp_root = None
    install_from: tuple[str, list[str]] | None = None  # (channel, specs) for the install rows
    if a.prefix:
        src = a.prefix.absolute()

        marker = read_marker(src) or {}
        if marker.get("channel") and marker.get("specs"):
            install_from = (marker["channel"], list(marker["specs"]))
    else:
        channel = build_bench_channel(a.files, a.packages, a.large_libs)
        install_from = (str(channel), ["bench-env"])
        tmp_root = Path(tempfile.mkdtemp(prefix="envtools-bench-", dir=a.workdir or "/tmp"))
        os.chmod(tmp_root, 0o755)  # (the non-owner reads the env)
        src = tmp_root / "site" / "envs" / "bench"
        get_console().print(f"installing the bench env into {src}")
        subprocess.run([*envtools, "install", "--channel", str(channel), "--prefix", str(src),
                        "bench-env"], check=True)
    if a.add:
        work = Path(tempfile.mkdtemp(prefix="add-", dir=a.workdir or src.parent))
        try:
            get_console().print(f"env: {src} ({_count_files(src)[0]} files); "
                                f"{a.repeat} rounds")
            fig = bench_add.run(src, work, a.repeat)
            bench_add.report(fig, get_console())
            if a.json:
                a.json.write_text(json.dumps(fig, indent=2) + "\n")
        finally:
            rm_tree(work)
            if tmp_root:
                rm_tree(tmp_root)
        return 0

    cache = read_prefix_info(src).get("package_cache")
    work = Path(tempfile.mkdtemp(prefix="clones-", dir=a.workdir or src.parent))
    # a round's trees are several GB: a run that fails half-way (a full disk, a command
    # that fails) must not leave them beside the env
    atexit.register(rm_tree, work)
    if tmp_root is not None:
        atexit.register(rm_tree, tmp_root)
    os.chmod(work, 0o755)
    user, why_not = _non_owner(work, src, cache)
    if user is None:
        get_console().print(f"no non-owner rows: {why_not}")
    else:
        ud = user.home / "dest"
        get_console().print(f"non-owner: uid {user.uid}, running {' '.join(user.python)}")
    nfiles, nbytes = _count_files(src)
    load_start = os.getloadavg()
    get_console().print(f"env: {src}: {nfiles} files, {nbytes / 2**20:.0f} MiB; cache: {cache}")

    results: dict[str, list[float]] = {}

    d = work / "dest"
    script = work / "rattler_install.py"
    script.write_text(RATTLER_INSTALL)
    clone_label = ("envtools clone (cache, non-root owner)" if userns
                   else "envtools clone (cache)")

    trash = work / "trash"

    def set_aside(dest: Path) -> None:
        """Move a finished destination out of the way; :func:`settle` removes it."""
        if dest.exists():
            trash.mkdir(exist_ok=True)
            dest.rename(trash / f"{len(list(trash.iterdir()))}")

    def settle() -> None:
        if full:  # (non-owner-clones: every tree is kept until the end, then removed;
            rm_tree(trash)  # on a filesystem mounted with discard a 3 GB tree takes minutes)
        os.sync()
        time.sleep(a.settle)

    def timed(name: str, cmd: list[str], dest: Path | None, env: dict | None = None) -> None:
        results.setdefault(name, []).append(time_cmd(cmd, env))
        if dest is not None:
            set_aside(dest)

    notes: list[str] = []
    cp_al_refused: list[str] = []
    full = a.only != "non-owner-clones"  # (the rows that copy or validate too)

    def non_owner_round(first: bool) -> None:
        """The non-owner's commands (see the module docstring), into their own directory."""
        assert user is not None
        env = user.env
        timed("cp -a (non-owner)", user.cmd("cp", "-a", src, ud), ud, env)
        clone = user.envtools("clone", src, ud)
        timed(NON_OWNER_CLONE, clone, None, env)
        if first and full:  # (untimed) does it validate as cleanly as the env's own?
            mine = _findings(user.envtools("validate", "--json", ud), env)
            site = _findings(user.envtools("validate", "--json", src), env)
            extra, gone = mine[1] - site[1], site[1] - mine[1]
            notes.append(f"validate of the non-owner's clone: exit status {mine[0]} (the "
                         f"env's own: {site[0]}), {len(mine[1])} errors and warnings: "
                         + ("the same as the env's" if not extra and not gone else
                            f"{len(extra)} not in the env's, {len(gone)} of the env's "
                            f"missing: {sorted(extra)[:3]} {sorted(gone)[:3]}"))
        if full:
            timed("envtools validate (the non-owner's clone)", user.envtools("validate", ud),
                  None, env)
        set_aside(ud)
        timed(NON_OWNER_DIRS, user.envtools("clone", "--link-mode", "dirs", src, ud), ud,
              env)
        if full:
            timed("envtools clone (cache, non-owner, --link-mode copy)",
                  user.envtools("clone", "--link-mode", "copy", src, ud), ud, env)
        timed("(cp -as: a symlink per file, non-owner)", user.cmd("cp", "-as", src, ud), ud,
              env)
        if first or not cp_al_refused:
            os.sync()
            t = time.perf_counter()
            p = user.run(user.cmd("cp", "-al", src, ud))
            dt = time.perf_counter() - t
            if p.returncode == 0:
                results.setdefault("(cp -al: hardlinks only, non-owner)", []).append(dt)
            else:
                cp_al_refused.append((p.stderr.strip().splitlines() or ["?"])[0])
            set_aside(ud)
        timed("(python -m envtools --help as the non-owner: start-up)",
              user.envtools("--help"), None, env)

    def rattler_install() -> None:
        # py-rattler refuses a read-only cache ("no eligible writable layers"), so the cache
        # is made writable for this run only; as root it then hardlinks from it. Both the
        # whole process (python, import, install) and the install call alone are kept.

        make_writable(Path(cache))
        try:
            os.sync()
            t = time.perf_counter()
            out = subprocess.run([sys.executable, str(script), str(src), str(d), cache],
                                 capture_output=True, text=True)
            whole = time.perf_counter() - t
            if not out.stdout.strip():  # (it may abort at exit after printing: py-rattler)
                raise RuntimeError(out.stderr[-3000:])
        finally:
            for lock in Path(cache).glob("*.lock"):
                lock.unlink()
            (Path(cache) / ".cache.lock").unlink(missing_ok=True)
            make_readonly(Path(cache))
        results.setdefault("py-rattler install (same cache), whole process", []).append(whole)
        results.setdefault("py-rattler install (same cache), install() call", []).append(
            float(out.stdout.strip().splitlines()[-1]))
        set_aside(d)

    def fresh_installs() -> None:
        """envtools install (verifying) and py-rattler's (not), each into a new prefix
        and a new package cache, from the channel."""
        assert install_from is not None
        inst = work / "inst"
        whole, verify = _time_install([*envtools, "install", "--channel", install_from[0],
                                       "--prefix", str(inst), *install_from[1]])
        results.setdefault("envtools install (fresh prefix and cache)", []).append(whole)
        results.setdefault("(of which: sha256 of the archives)", []).append(verify)
        set_aside(inst)
        set_aside(work / "inst.pkgs")
        os.sync()
        t = time.perf_counter()
        out = subprocess.run([sys.executable, str(fresh), str(src), str(d), str(work / "rc")],
                             capture_output=True, text=True)
        if not out.stdout.strip():
            raise RuntimeError(out.stderr[-3000:])
        results.setdefault("py-rattler install from the channel, fresh cache (unverified)",
                           []).append(time.perf_counter() - t)
        set_aside(d)
        set_aside(work / "rc")

    fresh = work / "rattler_fresh.py"
    fresh.write_text(RATTLER_INSTALL)
    if a.no_install or a.only != "all":
        install_from = None
    # rounds interleave every command, so load from other users hits them all alike
    for i in range(a.repeat):
        get_console().print(f"round {i + 1}/{a.repeat} (after {a.settle:.0f} s to settle)")
        settle()
        if full:
            timed("cp -a", ["cp", "-a", str(src), str(d)], d)
        if user is not None:
            non_owner_round(i == 0)
        if a.only != "all":
            continue
        if cache and not a.read_only_source:
            rattler_install()
        if cache:
            timed(clone_label, [*userns, *envtools, "clone", str(src), str(d)], d)
            if userns:
                timed("envtools clone (cache, as root: copies)",
                      [*envtools, "clone", str(src), str(d)], d)
        timed("envtools clone --no-cache", [*envtools, "clone", "--no-cache", str(src), str(d)],
              d)
        # file checks only: the import smoke test has its own bench (--validate)
        timed("envtools validate", [*envtools, "validate", "--no-imports", str(src)], None)
        timed("envtools validate --full", [*envtools, "validate", "--full", "--no-imports",
                                           str(src)], None)
        # python + envtools start-up, included in every envtools figure above
        timed("(python -m envtools --help: start-up)", [*envtools, "--help"], None)
        timed("(cp -al: hardlinks only, as root)", ["cp", "-al", str(src), str(d)], d)
        if install_from:
            fresh_installs()

    load_end = os.getloadavg()
    med = {k: statistics.median(v) for k, v in results.items()}
    out = print_medians(f"envtools bench: {nfiles} files, {nbytes / 2**20:.0f} MiB, "
              f"median of {a.repeat}, {os.cpu_count()} CPUs, load average "
              f"{load_start[0]:.1f} -> {load_end[0]:.1f}", results, med)
    cpa = med.get("cp -a", 0.0)
    lines = []

    def rounds(base: str, key: str) -> str:
        per = [x / y for x, y in zip(results[base], results[key], strict=True)]
        return (f"round by round {' '.join(f'{x:.1f}' for x in per)}, median "
                f"{statistics.median(per):.1f}x")

    clone_key = next((k for k in med if k.startswith("envtools clone (cache, non-root")
                      or k == "envtools clone (cache)"), None)
    if clone_key:
        c = med[clone_key]
        rattler = med.get("py-rattler install (same cache), whole process")
        lines.append(f"clone with cache: {cpa / c:.1f}x faster than cp -a (target >= 10x; "
                     f"{rounds('cp -a', clone_key)})" + (
                         f"; {c / rattler:.2f}x the time of a py-rattler install from the "
                         f"same cache, whole processes (target <= 1.0x)" if rattler else ""))
        floor = med["(cp -al: hardlinks only, as root)"]
        lines.append(f"(cp -al, hardlinks only, one process: {cpa / floor:.1f}x faster than "
                     f"cp -a; the clone takes {c / floor:.2f}x its time)")
    def per_round(base: str, key: str) -> str:
        """The project's figure on a shared machine: the median of the ratios of one
        round's two commands (same moment, same load), then the ratio of the medians."""
        per = [x / y for x, y in zip(results[base], results[key], strict=True)]
        return (f"{statistics.median(per):.1f}x faster than cp -a by the same user, median "
                f"of per-round ratios (target >= 10x; rounds "
                f"{' '.join(f'{x:.1f}' for x in per)}; ratio of medians "
                f"{med[base] / med[key]:.1f}x)")

    if user is not None:
        ucpa = med["cp -a (non-owner)"]
        c = med[NON_OWNER_CLONE]
        lines.append(f"non-owner clone (uid {user.uid}; a symlink per file to the root-owned "
                     f"cache): {per_round('cp -a (non-owner)', NON_OWNER_CLONE)}")
        lines.append(f"non-owner clone with linked directories (--link-mode dirs): "
                     f"{per_round('cp -a (non-owner)', NON_OWNER_DIRS)}")
        ccopy = med.get("envtools clone (cache, non-owner, --link-mode copy)")
        if ccopy:
            lines.append(f"non-owner clone with copies (--link-mode copy, what non-owners "
                         f"got before): {ucpa / ccopy:.1f}x faster than cp -a by the same user")
        cpas = med["(cp -as: a symlink per file, non-owner)"]
        lines.append(f"(cp -as by that user, a symlink per file, nothing relocated, no "
                     f"records: {ucpa / cpas:.1f}x faster than cp -a; the clone takes "
                     f"{c / cpas:.2f}x its time)")
        al = med.get("(cp -al: hardlinks only, non-owner)")
        lines.append(f"(cp -al by that user: {ucpa / al:.1f}x faster than cp -a)" if al else
                     f"(cp -al by that user: refused: {cp_al_refused[0]}; "
                     f"fs.protected_hardlinks={_sysctl('fs/protected_hardlinks')})")
        lines += notes
    if "envtools clone --no-cache" in med:
        n = med["envtools clone --no-cache"]
        lines.append(f"clone without cache: {n / cpa:.2f}x the time of cp -a (target <= 1.5x)")
        lines.append(f"validate: {med['envtools validate']:.2f} s (target <= 3 s); "
                     f"--full: {med['envtools validate --full']:.2f} s")
    if install_from:
        inst = med["envtools install (fresh prefix and cache)"]
        ver = med["(of which: sha256 of the archives)"]
        per_round = [v / w for v, w in zip(results["(of which: sha256 of the archives)"],
                                           results["envtools install (fresh prefix and cache)"],
                                           strict=True)]
        lines.append(
            f"install: checking every archive's sha256 took {ver:.3f} s, "
            f"{100 * ver / inst:.1f}% of a fresh envtools install ({inst:.2f} s) (target "
            f"<= 10%; round by round {' '.join(f'{100 * x:.1f}%' for x in per_round)}); a "
            f"py-rattler install from the channel into a fresh cache, unverified: "
            f"{med['py-rattler install from the channel, fresh cache (unverified)']:.2f} s")
    for line in lines:
        out.print(line)
    if a.json:
        a.json.write_text(json.dumps({"files": nfiles, "bytes": nbytes, "runs": results,
                                      "median": med, "summary": lines}, indent=2))
    rm_tree(trash)
    rm_tree(work)
    if tmp_root is not None:
        rm_tree(tmp_root)
    return 0


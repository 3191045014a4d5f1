"""Bytecode for ``noarch: python`` packages, compiled once at install (as conda does).

A noarch package ships sources only; the installer is expected to compile them for the
env's python. Without that, the site env's read-only prefix has no ``.pyc`` for keras,
sympy, networkx and the like: every user's import compiles them again (keras 3.5-4.9 s
with bytecode, 10 s without), and an import by root writes ``__pycache__`` into the
shared env, changing it behind its records.

So ``envtools install`` compiles them, with the env's own python, into checked-hash pycs
(PEP 552): valid whatever the files' timestamps (a copy, a clone, a backup restore), and
never silently stale, since python compares the source's hash at each import. Each pyc
is then a file of its package: listed in its record as conda lists compiled files
(``path_type: pyc_file``), with its sha256, so validate checks it and python never has a
reason to rewrite it. ``co_filename`` is the path in the prefix (``-d``), not the
staging directory's.

The same goes for a package's source that install relocates (python's own
``_sysconfigdata*.py`` holds the prefix): the bytecode the package shipped for it no
longer matches, and the first import by root would rewrite it. Install removes that
shipped bytecode from the env and its record and compiles the relocated source instead.

A noarch: python package's pycs are the same for every prefix (they name their source
by its path in the prefix; python puts the real path in at import), so install writes
them into the package's cache entry and hardlinks them into the env. A clone with
``--link-mode dirs`` takes them from there like the package's own files, which lets it
link the package's directories whole (layers.py: a directory is linked only when each
``.py`` has its ``.pyc``); other clones leave the installer's bytecode out (see
:func:`drop_compiled`) and the clone's python compiles into the clone, its user's.
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

from envtools.errors import EnvtoolsError
from envtools.place import linking
from envtools.prefix import confine
from envtools.prefix.hashing import file_key, hash_many, store_stat_part
from envtools.prefix.noarch import cache_rel

#: conda's path type for bytecode the installer compiled
PYC_FILE = "pyc_file"

#: run by the env's python: compile (source, name shown, output) triples read as JSON
#: lines from stdin, print each (source, output written or None, problem). Run with
#: PYTHONHASHSEED=0: a frozenset constant (``x in {"a", "b"}``) is marshalled in hash
#: order, so without a fixed seed two compilations of one source differ in bytes
_COMPILER = r"""
import json, py_compile, sys
mode = py_compile.PycInvalidationMode.CHECKED_HASH
for line in sys.stdin:
    src, shown, out = json.loads(line)
    try:
        py_compile.compile(src, cfile=out, dfile=shown, doraise=True, invalidation_mode=mode)
    except (py_compile.PyCompileError, SyntaxError, ValueError) as e:
        print(json.dumps([src, None, str(e).splitlines()[-1] if str(e) else type(e).__name__]))
        continue
    print(json.dumps([src, out, None]), flush=False)
"""


def _sources(record: dict) -> list[str]:
    """The ``.py`` files a noarch: python record installed (relative paths)."""
    paths = (record.get("paths_data") or {}).get("paths") or []
    return [e["_path"] for e in paths
            if e["_path"].endswith(".py") and e.get("path_type", "hardlink") != PYC_FILE]


def _is_noarch_python(record: dict) -> bool:
    na = record.get("noarch")
    return na == "python" or (isinstance(na, dict) and na.get("type") == "python")


def _cache_tag(staging: Path) -> str | None:
    """``cpython-311`` for the env's python (from its record), as in pyc file names."""
    for fp in (staging / "conda-meta").glob("python-3*.json"):
        parts = fp.name.split("-")[1].split(".")
        if len(parts) >= 2 and parts[1].isdigit():
            return f"cpython-{parts[0]}{parts[1]}"
    return None


def _drop_stale(data: dict, staging: Path, tag: str) -> list[str]:
    """Remove the bytecode a package shipped for sources that install relocated (from
    the env and from ``data``, its record); returns those sources."""
    paths = (data.get("paths_data") or {}).get("paths") or []
    relocated = [e["_path"] for e in paths
                 if e.get("prefix_placeholder") and e["_path"].endswith(".py")]
    if not relocated:
        return []
    stale: set[str] = set()
    for rel in relocated:
        d, _, name = rel.rpartition("/")
        lead = f"{d}/__pycache__/{name[:-3]}.{tag}." if d else f"__pycache__/{name[:-3]}.{tag}."
        stale.update(e["_path"] for e in paths
                     if e["_path"].startswith(lead) and e["_path"].endswith(".pyc"))
    if not stale:
        return []
    confine.check_paths(sorted(stale), "shipped bytecode")
    for rel in stale:
        if not confine.is_real(str(staging), rel.rpartition("/")[0]):
            continue  # (not through a link; makedirs refuses to write there, clearly)
        try:
            os.unlink(staging / rel)
        except FileNotFoundError:
            pass
    data["paths_data"]["paths"] = [e for e in paths if e["_path"] not in stale]
    data["files"] = [f for f in data.get("files") or [] if f not in stale]
    return relocated


def pyc_of(rel: str, tag: str) -> str:
    """Where python looks for the bytecode of the source ``rel`` (``importlib.util.
    cache_from_source`` for the env's python, whose cache tag is ``tag``)."""
    d, _, name = rel.rpartition("/")
    stem = name[:-3] if name.endswith(".py") else name
    return f"{d}/__pycache__/{stem}.{tag}.pyc" if d else f"__pycache__/{stem}.{tag}.pyc"


def _in_cache(data: dict, cache: Path | None) -> str | None:
    """The package cache directory of a record, when it is an entry of ``cache`` (the
    install's verified cache: archives.check_linked compared every record with it)."""
    epd = data.get("extracted_package_dir")
    if not cache or not isinstance(epd, str) or not epd.startswith("/"):
        return None
    return epd if Path(epd).parent == cache else None


def _move(src: str, dst: str) -> None:
    """Rename ``src`` to ``dst`` (a regular file there is replaced, never followed; a
    directory or anything else is refused); a copy across filesystems. A file of ours
    already there with the same bytes (an earlier install into the same cache compiled
    it) is kept: other envs hardlinked to it, and their clones vouch for it by its
    inode."""
    try:
        st = os.lstat(dst)
    except FileNotFoundError:
        pass
    else:
        if not stat.S_ISREG(st.st_mode):
            raise confine.UnsafePath(f"{dst} is not a regular file: refusing to compile "
                                     "bytecode over it")
        if st.st_uid == os.geteuid() and st.st_size == os.path.getsize(src):
            old = confine.read_regular(dst)
            if old is not None and old == confine.read_regular(src):
                os.unlink(src)
                return
    try:
        os.rename(src, dst)
    except OSError as e:
        if e.errno != errno.EXDEV:
            raise
        shutil.copyfile(src, f"{dst}.envtools-new", follow_symlinks=False)
        os.rename(f"{dst}.envtools-new", dst)


def compile_installed(staging: Path, final: Path, cache: Path | None = None,
                      workers: int | None = None, noarch: bool = True,
                      stat_part: str | None = None) -> int:
    """Compile, in the env being installed at ``staging`` (it will live at ``final``),
    every noarch: python package's sources and every relocated source whose shipped
    bytecode no longer matches (that bytecode is removed), and add the pycs to their
    records. Returns the number of pycs written. A file python cannot compile (a syntax
    error in a package, py2-only code) gets none, as with conda.

    A noarch: python source is the same file in every prefix, so its pyc is too when it
    names the source by its path in the prefix (``co_filename``; python replaces that
    with the module's real path when it loads the pyc: importlib's ``_fix_co_filename``).
    Such a pyc is written into the package's entry in ``cache`` (beside its source there)
    and hardlinked into the env, as rattler links the package's own files: a clone then
    finds a package directory complete, bytecode included, and can link it whole
    (layers.py) instead of a file at a time. A relocated source's pyc holds the prefix
    (its source's hash does): it is written into the env only.

    ``noarch=False`` compiles only the relocated sources: a clone does (see
    :func:`drop_compiled`), since its noarch: python packages' bytecode is already theirs;
    ``stat_part`` names the stat cache part to write for the pycs (validate then need
    not hash them again; install hashes the whole env instead)."""
    meta = staging / "conda-meta"
    python = staging / "bin" / "python"
    tag = _cache_tag(staging)
    if not python.exists() or tag is None:
        return 0  # (no python in the env: nothing would import them)
    cache = Path(os.path.abspath(cache)) if cache else None
    records: dict[Path, dict] = {}
    todo: dict[Path, list[str]] = {}
    in_cache: dict[Path, str] = {}  # record -> its cache entry (noarch: python ones)
    for fp in sorted(meta.glob("*.json")):
        data = json.loads(confine.read_regular(str(fp)) or b"{}")
        if _is_noarch_python(data):
            if not noarch:
                continue
            listed = {e["_path"] for e in (data.get("paths_data") or {}).get("paths") or []}
            srcs = [rel for rel in _sources(data) if pyc_of(rel, tag) not in listed]
            epd = _in_cache(data, cache)
            if epd:
                in_cache[fp] = epd
        else:
            srcs = _drop_stale(data, staging, tag)
        if srcs:
            records[fp], todo[fp] = data, srcs
    if not records:
        return 0
    rels = [rel for srcs in todo.values() for rel in srcs]
    confine.check_paths(rels, "python sources")
    where = {rel: fp for fp, srcs in todo.items() for rel in srcs}
    # each pyc is compiled into a private directory first (plain numbered names, no
    # directory of the package's on the way), then moved where it belongs: nothing of
    # the package's (a __pycache__ it ships as a link) decides where a pyc is written
    out_dir = Path(tempfile.mkdtemp(prefix=".envtools-pyc-", dir=cache or staging))
    try:
        made = _compile(python, staging, final, rels, where, in_cache, out_dir, workers)
        placed: dict[str, str] = {}  # source rel -> pyc rel in the env
        for rel, tmp in made.items():
            fp = where[rel]
            pyc = pyc_of(rel, tag)
            epd = in_cache.get(fp)
            confine.makedirs(str(staging), pyc.rpartition("/")[0])
            if epd:
                in_pkg = cache_rel(True, pyc)
                confine.makedirs(epd, in_pkg.rpartition("/")[0])
                _move(tmp, f"{epd}/{in_pkg}")
                try:
                    os.link(f"{epd}/{in_pkg}", staging / pyc)
                except OSError as e:
                    if e.errno == errno.EEXIST:
                        raise confine.UnsafePath(f"{staging / pyc} exists already: refusing "
                                                 "to compile bytecode over it") from None
                    linking.copy(f"{epd}/{in_pkg}", str(staging / pyc))
            else:
                _move(tmp, str(staging / pyc))
            placed[rel] = pyc
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)
    hashes = hash_many(str(staging / rel) for rel in placed.values())
    if stat_part:  # (the entry without a hash: the file has its record's sha256)
        store_stat_part(staging, stat_part, {pyc: file_key(os.lstat(staging / pyc))
                                             for pyc in placed.values()})
    for fp, data in records.items():
        entries = []
        for rel in todo[fp]:
            pyc = placed.get(rel)
            if pyc is None:
                continue
            full = str(staging / pyc)
            entries.append({"_path": pyc, "path_type": PYC_FILE, "sha256": hashes[full],
                            "size_in_bytes": os.path.getsize(full)})
        data.setdefault("paths_data", {"paths": [], "paths_version": 1})["paths"] += entries
        data["files"] = list(data.get("files") or []) + [e["_path"] for e in entries]
        tmp = fp.with_name(f".{fp.name}.envtools-pyc")
        confine.write_new(str(tmp), json.dumps(data).encode())
        os.replace(tmp, fp)
    return len(placed)


def _compile(python: Path, staging: Path, final: Path, rels: list[str],
             where: dict[str, Path], in_cache: dict[Path, str], out_dir: Path,
             workers: int | None) -> dict[str, str]:
    """Compile ``rels`` with the env's python into ``out_dir``, in a few processes;
    returns source rel -> the pyc written. A noarch: python source is named by its path
    in the prefix (the same pyc for every prefix: see compile_installed), a relocated one
    by its installed path."""
    n = max(1, min(workers or os.cpu_count() or 1, 8, len(rels) // 200 + 1))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    env.pop("PYTHONPATH", None)
    procs = []
    # (-S: no site-packages, whose .pth files run code at start-up: setuptools'
    # distutils-precedence.pth imports _distutils_hack, and python would write its
    # bytecode into the env; -B: the compiler's own imports write none either)
    for w in range(n):
        chunk = range(w, len(rels), n)
        p = subprocess.Popen([str(python), "-I", "-S", "-B", "-c", _COMPILER],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, env=env)
        feed = "".join(json.dumps([str(staging / rels[i]),
                                   rels[i] if where[rels[i]] in in_cache
                                   else str(final / rels[i]),
                                   str(out_dir / f"{i}.pyc")]) + "\n" for i in chunk)
        procs.append((p, feed))
    made: dict[str, str] = {}
    base, out_base = str(staging) + "/", str(out_dir) + "/"
    for p, feed in procs:
        out, err = p.communicate(feed)
        if p.returncode != 0:
            raise EnvtoolsError(f"compiling the python packages' bytecode failed: "
                                f"{(err.strip().splitlines() or ['no output'])[-1]}",
                                "check that the env's python runs (bin/python -c pass)")
        for line in out.splitlines():
            src, pyc, _problem = json.loads(line)
            if pyc and src.startswith(base) and pyc.startswith(out_base):
                made[src[len(base):]] = pyc
    return made


#: run by the env's python: print each source path read from stdin that it cannot compile
_CHECKER = r"""
import sys
for line in sys.stdin:
    path = line.rstrip("\n")
    try:
        with open(path, "rb") as fh:
            compile(fh.read(), path, "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        print(path)
"""


def uncompilable(python: Path, sources: list[str]) -> set[str]:
    """Which of ``sources`` (file paths) the env's ``python`` cannot compile: python
    never writes bytecode for them (each import fails), so a directory holding one
    needs no ``.pyc`` for it. Empty when that python does not run."""
    if not sources or not python.exists():
        return set()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    try:
        p = subprocess.run([str(python), "-I", "-S", "-B", "-c", _CHECKER],
                           input="".join(s + "\n" for s in sources), capture_output=True,
                           text=True, env=env, timeout=300)
    except (OSError, subprocess.TimeoutExpired):
        return set()
    return set(p.stdout.splitlines()) & set(sources) if p.returncode == 0 else set()


def has_compiled(plan_fields: list[tuple]) -> bool:
    """Does a record (its plan fields) list bytecode the installer compiled?"""
    return any(f[1] == PYC_FILE for f in plan_fields)


def drop_compiled(data: dict) -> None:
    """Leave the installer's bytecode out of a record copied into a clone (in place).

    A noarch: python package's goes (the clone's python compiles it into the clone, its
    user's). The bytecode compiled for a relocated source stays listed: it replaced a pyc
    the package ships (in its info/paths.json, which conda-pack and conda doctor read), and
    a clone must hold that file too; the clone compiles it for its own prefix
    (``compile_installed(..., noarch=False)``), which replaces these entries."""
    pd = data.get("paths_data") or {}
    paths = pd.get("paths")
    if not paths or not _is_noarch_python(data):
        return
    gone = {e["_path"] for e in paths if e.get("path_type") == PYC_FILE}
    if gone:
        pd["paths"] = [e for e in paths if e["_path"] not in gone]
        data["files"] = [f for f in data.get("files") or [] if f not in gone]

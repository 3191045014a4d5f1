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
reason to rewrite it. ``co_filename`` is the installed path (``-d``), not the staging
directory's.

The same goes for a package's source that install relocates (python's own
``_sysconfigdata*.py`` holds the prefix): the bytecode the package shipped for it no
longer matches, and the first import by root would rewrite it. Install removes that
shipped bytecode from the env and its record and compiles the relocated source instead.

A clone leaves them out (see :func:`drop_compiled`): they are the installer's output for
one prefix, and the clone's python compiles into the clone, which is its user's.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from envtools import confine
from envtools.errors import EnvtoolsError
from envtools.hashing import hash_many

#: conda's path type for bytecode the installer compiled
PYC_FILE = "pyc_file"

#: run by the env's python: compile (source, installed path) pairs read as JSON lines
#: from stdin, print each pyc written (relative to the prefix, as the source is given)
_COMPILER = r"""
import importlib.util, json, py_compile, sys
mode = py_compile.PycInvalidationMode.CHECKED_HASH
for line in sys.stdin:
    src, shown = json.loads(line)
    try:
        out = py_compile.compile(src, dfile=shown, doraise=True, invalidation_mode=mode)
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
        try:
            os.unlink(staging / rel)
        except FileNotFoundError:
            pass
    data["paths_data"]["paths"] = [e for e in paths if e["_path"] not in stale]
    data["files"] = [f for f in data.get("files") or [] if f not in stale]
    return relocated


def compile_installed(staging: Path, final: Path, workers: int | None = None) -> int:
    """Compile, in the env being installed at ``staging`` (it will live at ``final``),
    every noarch: python package's sources and every relocated source whose shipped
    bytecode no longer matches (that bytecode is removed), and add the pycs to their
    records. Returns the number of pycs written. A file python cannot compile (a syntax
    error in a package, py2-only code) gets none, as with conda."""
    meta = staging / "conda-meta"
    python = staging / "bin" / "python"
    tag = _cache_tag(staging)
    if not python.exists() or tag is None:
        return 0  # (no python in the env: nothing would import them)
    records: dict[Path, dict] = {}
    todo: dict[Path, list[str]] = {}
    for fp in sorted(meta.glob("*.json")):
        data = json.loads(confine.read_regular(str(fp)) or b"{}")
        srcs = _sources(data) if _is_noarch_python(data) else _drop_stale(data, staging, tag)
        if srcs:
            records[fp], todo[fp] = data, srcs
    if not records:
        return 0
    rels = [rel for srcs in todo.values() for rel in srcs]
    confine.check_paths(rels, "noarch: python sources")
    n = max(1, min(workers or os.cpu_count() or 1, 8, len(rels) // 200 + 1))
    chunks = [rels[i::n] for i in range(n)]
    procs = []
    for chunk in chunks:
        p = subprocess.Popen([str(python), "-I", "-c", _COMPILER], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        feed = "".join(json.dumps([str(staging / rel), str(final / rel)]) + "\n"
                       for rel in chunk)
        procs.append((p, feed))
    made: dict[str, str] = {}  # source rel -> pyc rel
    base = str(staging) + "/"
    for p, feed in procs:
        out, err = p.communicate(feed)
        if p.returncode != 0:
            raise EnvtoolsError(f"compiling the noarch: python packages' bytecode failed: "
                                f"{(err.strip().splitlines() or ['no output'])[-1]}",
                                "check that the env's python runs (bin/python -c pass)")
        for line in out.splitlines():
            src, pyc, _problem = json.loads(line)
            if pyc and src.startswith(base) and pyc.startswith(base):
                made[src[len(base):]] = pyc[len(base):]
    confine.check_paths(list(made.values()), "compiled bytecode")
    hashes = hash_many(str(staging / rel) for rel in made.values())
    for fp, data in records.items():
        entries = []
        for rel in todo[fp]:
            pyc = made.get(rel)
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
    return len(made)


def has_compiled(plan_fields: list[tuple]) -> bool:
    """Does a record (its plan fields) list bytecode the installer compiled?"""
    return any(f[1] == PYC_FILE for f in plan_fields)


def drop_compiled(data: dict) -> None:
    """Leave the installer's bytecode out of a record copied into a clone (in place)."""
    pd = data.get("paths_data") or {}
    paths = pd.get("paths")
    if not paths:
        return
    gone = {e["_path"] for e in paths if e.get("path_type") == PYC_FILE}
    if gone:
        pd["paths"] = [e for e in paths if e["_path"] not in gone]
        data["files"] = [f for f in data.get("files") or [] if f not in gone]

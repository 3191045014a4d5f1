"""``python -m envtools.bench --validate --prefix P``: validate's figures, and what
validate, ``pip check`` and an lddtree-style check each find on the same planted breaks.

Timings (median of ``--repeat`` rounds, every command a fresh process, page cache warm):
``envtools validate --no-imports`` (target <= 1.5 s on powerai) and ``envtools
validate`` with the import smoke test (target <= 10 s), beside what a user would run
otherwise, measured in the same rounds: ``pip check`` (pip's ``--python`` pointed at
the env) and ``ldd`` over every ELF file of the env (what auditwheel's lddtree-style
checks amount to: every DT_NEEDED resolved by the system loader, one file at a time).

``--breaks`` then clones P once per break (as root: a copy, so nothing is shared with
P's package cache), plants one break, and runs the three tools on it. A tool *finds* a
break when it reports something it did not report on the pristine clone (for ldd: a
``not found`` line that was not there before; pip check: exit status or output). P is
only read.

``--sibling-clone`` measures instead what a second clone costs validate of the first:
as the owner of P's files without root's privileges (a user namespace, so that clones
hardlink P's package cache, as the cache owner's do), it clones P to FIRST, times plain
``validate --no-imports`` of FIRST (the baseline: nothing changed since its clone), then
each round clones P to SECOND (every cache file gets a new link: new ctime, link count
+1), times validate of FIRST with FIRST's stat cache written three ways, and removes
SECOND: ``new`` (the stat cache as clone wrote it: hashing.file_key, a ctime change
excused by a link count change), ``old`` (the same entries without ctime and link count,
as stat cache version 4 wrote them: size, mtime, inode), ``naive ctime`` (the same
entries with the link count set to each file's current one, so that only ctime decides:
what a (size, mtime, inode, ctime) key does). Before each run FIRST's stat cache is put
back as that variant (validate stores refreshed keys in an env its user may write), and
``validate --full`` gives the hash-everything bound. P's files are only linked to.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

from envtools.base import elf
from envtools.base.progress import get_console
from envtools.bench.measure import print_medians, rm_tree, run_timed, time_cmd
from envtools.prefix.hashing import STAT_CACHE
from envtools.validate.binaries import elf_candidates

ENVTOOLS = [sys.executable, "-m", "envtools"]


def _elf_files(root: Path) -> list[str]:

    return [p for p in elf_candidates(root, set(), {}) if not os.path.islink(p) and elf.is_elf(p)]


def ldd_missing(root: Path) -> tuple[set[str], int]:
    """lddtree-style: ``ldd`` every ELF file; (``file: lib`` not found, files ldd refused).
    ldd stops at a file its loader crashes on, so the rest of a batch is run again."""
    files = _elf_files(root)
    missing: set[str] = set()
    refused = 0
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    i = 0
    while i < len(files):
        chunk = files[i:i + 200]
        p = subprocess.run(["ldd", *chunk], capture_output=True, text=True, env=env)
        # (ldd names each file only when it is given more than one)
        current = os.path.relpath(chunk[0], root) if len(chunk) == 1 else None
        seen = 0
        for line in (p.stdout + "\n" + p.stderr).splitlines():
            if line.endswith(":") and not line.startswith("\t") and line[:-1] in chunk:
                current = os.path.relpath(line[:-1], root)
                seen = chunk.index(line[:-1]) + 1
            elif "not found" in line and current:
                missing.add(f"{current}: {line.split('=>')[0].strip()}")
            elif any(w in line for w in ("not a dynamic executable", "error while loading",
                                         "file too short", "unknown exit code")):
                refused += 1
        i += seen if 0 < seen < len(chunk) else len(chunk)
    return missing, refused


def pip_check(root: Path, env: dict | None = None) -> tuple[int, str]:
    p = subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check",
                        "--python", str(root / "bin" / "python"), "check"],
                       capture_output=True, text=True, env=env)
    return p.returncode, (p.stdout + p.stderr).strip()


def validate_doc(root: Path, *extra: str, env: dict | None = None) -> dict:
    p = subprocess.run([*ENVTOOLS, "validate", str(root), "--json", *extra],
                       capture_output=True, text=True, env=env)
    try:
        return json.loads(p.stdout)
    except ValueError:
        return {"exit_status": p.returncode, "findings": [], "error": p.stderr[-500:]}


def _wheel(dest: Path, name: str, version: str, files: dict[str, str],
           requires: tuple[str, ...] = ()) -> Path:
    """A minimal pure-Python wheel, as a user would pip install one."""
    dist = name.replace("-", "_")
    di = f"{dist}-{version}.dist-info"
    files = dict(files)
    files[f"{di}/METADATA"] = "".join(
        [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
         *(f"Requires-Dist: {r}\n" for r in requires)])
    files[f"{di}/WHEEL"] = "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    rec = []
    for path, text in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        rec.append(f"{path},sha256={h.decode()},{len(text.encode())}")
    files[f"{di}/RECORD"] = "\n".join([*rec, f"{di}/RECORD,,"]) + "\n"
    whl = dest / f"{dist}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return whl


def _pip_install(env: Path, whl: Path) -> None:
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q",
                    "--disable-pip-version-check", "--prefix", str(env), str(whl)],
                   check=True, capture_output=True, env={**os.environ, "PYTHONNOUSERSITE": "1"})


def _record_of(env: Path, name: str) -> tuple[Path, dict]:
    rec = next((env / "conda-meta").glob(f"{name}-[0-9]*.json"))
    return rec, json.loads(rec.read_text())


def _site(env: Path) -> Path:
    return next(env.glob("lib/python*/site-packages"))


def _replace(fp: Path, data: bytes) -> None:
    """Write a new file in place of ``fp`` (never through a possible hardlink)."""
    fp.unlink()
    fp.write_bytes(data)


# ---------------------------------------------------------------- the planted breaks
# each takes (env, scratch dir) and returns extra environment variables for the tools
def b_missing_file(env: Path, tmp: Path) -> dict:
    (_site(env) / "requests" / "api.py").unlink()
    return {}


def b_altered_file(env: Path, tmp: Path) -> dict:
    fp = _site(env) / "requests" / "api.py"
    _replace(fp, fp.read_bytes().replace(b"def get(", b"def get_(", 1))
    return {}


def b_foreign_arch(env: Path, tmp: Path) -> dict:
    data = bytearray((env / "lib" / "libmpi.so.40").resolve().read_bytes())
    data[18:20] = (21).to_bytes(2, "little")  # e_machine: EM_PPC64
    (env / "lib" / "libforeign.so").write_bytes(bytes(data))
    return {}


def b_python_abi(env: Path, tmp: Path) -> dict:
    ext = next((_site(env) / "markupsafe").glob("_speedups.cpython-*.so"))
    shutil.copy(ext, ext.parent / "_speedups.cpython-39-x86_64-linux-gnu.so")
    ext.unlink()
    return {}


def b_pip_shadowing(env: Path, tmp: Path) -> dict:
    _pip_install(env, _wheel(tmp, "idna", "0.1", {"idna/__init__.py": "VERSION = 'pip'\n"}))
    return {}


def b_pip_requires(env: Path, tmp: Path) -> dict:
    _pip_install(env, _wheel(tmp, "needy", "1.0", {"needy.py": ""},
                             ("not-there>=1", "numpy<2")))
    return {}


def b_removed_package(env: Path, tmp: Path) -> dict:
    rec, data = _record_of(env, "idna")  # requests depends on it
    for e in data["paths_data"]["paths"]:
        (env / e["_path"]).unlink(missing_ok=True)
    rec.unlink()
    return {}


def b_shadowed_import(env: Path, tmp: Path) -> dict:
    (tmp / "shadow" / "requests").mkdir(parents=True)
    (tmp / "shadow" / "requests" / "__init__.py").write_text("VERSION = 'shadow'\n")
    return {"PYTHONPATH": str(tmp / "shadow")}


def b_truncated_library(env: Path, tmp: Path) -> dict:
    fp = env / "lib" / "libddl.so.1"
    data = fp.resolve().read_bytes()
    _replace(fp.resolve(), data[: len(data) // 2])
    return {}


def b_missing_libmpi(env: Path, tmp: Path) -> dict:
    (env / "lib" / "libmpi.so.40").resolve().unlink()
    return {}


BREAKS: list[tuple[str, Callable[[Path, Path], dict]]] = [
    ("missing file", b_missing_file),
    ("altered file", b_altered_file),
    ("foreign-arch library", b_foreign_arch),
    ("wrong python ABI", b_python_abi),
    ("pip shadowing (pip over a conda package)", b_pip_shadowing),
    ("unmet pip requirement", b_pip_requires),
    ("package removed behind conda's back", b_removed_package),
    ("shadowed import (PYTHONPATH)", b_shadowed_import),
    ("truncated library", b_truncated_library),
    ("missing libmpi", b_missing_libmpi),
]


def run_breaks(src: Path, work: Path) -> list[dict]:
    """Plant each break in a fresh clone; what each tool reports beyond the pristine clone."""

    rows = []
    base = work / "pristine"
    subprocess.run([*ENVTOOLS, "clone", str(src), str(base)], check=True, capture_output=True)
    v0 = validate_doc(base)
    ldd0, refused0 = ldd_missing(base)
    pip0 = pip_check(base)
    rows.append({"break": "(pristine clone)", "validate": v0.get("exit_status"),
                 "validate_checks": sorted({f["check"] for f in v0["findings"]
                                            if f["severity"] == "error"}),
                 "pip_check": pip0[0], "ldd_not_found": len(ldd0), "ldd_refused": refused0})
    rm_tree(base)
    for label, plant in BREAKS:
        case = work / "case"
        tmp = work / "scratch"
        tmp.mkdir()
        subprocess.run([*ENVTOOLS, "clone", str(src), str(case)], check=True,
                       capture_output=True)
        extra = plant(case, tmp)
        env = {**os.environ, **extra}
        doc = validate_doc(case, env=env)
        errs = [f for f in doc["findings"] if f["severity"] == "error"]
        rc, out = pip_check(case, env)
        missing, refused = ldd_missing(case)
        new = sorted(missing - {m.replace(str(base), str(case)) for m in ldd0})
        rows.append({
            "break": label, "validate": doc.get("exit_status"),
            "validate_checks": sorted({f["check"] for f in errs}),
            "validate_packages": sorted({p for f in errs for p in f["packages"]}),
            "pip_check": rc, "pip_check_output": out[:300],
            "ldd_new_not_found": len(new), "ldd_examples": new[:3],
            "ldd_new_refused": max(0, refused - refused0)})
        rm_tree(case)
        rm_tree(tmp)
    return rows


def breaks_table(rows: list[dict]) -> list[str]:
    """The README's comparison table (markdown)."""
    pristine = rows[0]
    refused0 = f", {pristine['ldd_refused']} files refused" if pristine["ldd_refused"] else ""
    out = ["| planted break | envtools validate | pip check | ldd over every ELF file |",
           "| --- | --- | --- | --- |",
           f"| (pristine env: false alarms) | exit {pristine['validate']}"
           f"{', ' + ', '.join(pristine['validate_checks']) if pristine['validate_checks'] else ''}"
           f" | exit {pristine['pip_check']} | {pristine['ldd_not_found']} `not found`"
           f"{refused0} |"]
    for r in rows[1:]:
        v = (f"**found** (exit {r['validate']}: {', '.join(r['validate_checks'])}; "
             f"names {', '.join(r['validate_packages'])})" if r["validate"] == 1
             else f"missed (exit {r['validate']})")
        pc = "**found**" if r["pip_check"] != 0 else "missed"
        what = [f"{r['ldd_new_not_found']} new `not found`" if r["ldd_new_not_found"] else "",
                f"{r['ldd_new_refused']} more files refused" if r["ldd_new_refused"] else ""]
        what = [w for w in what if w]
        ld = f"**found** ({', '.join(what)})" if what else "missed"
        out.append(f"| {r['break']} | {v} | {pc} | {ld} |")
    return out


def _validate_timed(cmd: list[str]) -> tuple[float, dict]:
    """(seconds, ``validate --json``'s document) of one validate run, a fresh process."""
    dt, p = run_timed(cmd, ok=(0, 1))
    return dt, json.loads(p.stdout)


def _stat_cache_variants(first: Path) -> dict[str, Callable[[], dict[str, bytes]]]:
    """FIRST's stat cache parts as clone wrote them, per variant (see the module
    docstring): name -> a function giving ``{part file name: bytes}`` (the naive one
    reads the link counts when it is called, after SECOND was made)."""
    import marshal

    d = first / STAT_CACHE
    parts = {fp.name: marshal.loads(fp.read_bytes()) for fp in sorted(d.glob("*.marshal"))}

    def new() -> dict[str, bytes]:
        return {n: marshal.dumps(v) for n, v in parts.items()}

    def old() -> dict[str, bytes]:
        return {n: marshal.dumps((4, {k: e[:3] + e[5:] if len(e) >= 5 else e
                                      for k, e in entries.items()}))
                for n, (_v, entries) in parts.items()}

    def naive() -> dict[str, bytes]:
        out = {}
        for n, (v, entries) in parts.items():
            now = {}
            for k, e in entries.items():
                try:
                    nlink = os.stat(k if k.startswith("/") else first / k).st_nlink
                except OSError:
                    nlink = e[4] if len(e) >= 5 else 0
                now[k] = (*e[:4], nlink, *e[5:]) if len(e) >= 5 else e
            out[n] = marshal.dumps((v, now))
        return out

    return {"new key (excused by a link count change)": new,
            "old key (size, mtime, inode)": old, "naive ctime key": naive}


def _put_stat_cache(first: Path, parts: dict[str, bytes]) -> None:
    d = first / STAT_CACHE
    for fp in d.iterdir():
        fp.unlink()
    for name, data in parts.items():
        (d / name).write_bytes(data)


def sibling_clone(src: Path, work: Path, repeat: int) -> tuple[dict, list[str]]:
    """The ``--sibling-clone`` figures (module docstring): per row, the runs' seconds
    and files hashed; and the lines to print. Each round clones FIRST afresh, so that
    its keys are its clone's."""
    userns = ["unshare", "--user", "--"] if os.geteuid() == 0 else []
    first, second = work / "first", work / "second"
    validate = [*userns, *ENVTOOLS, "validate", "--no-imports", "--json", str(first)]
    rows: dict[str, dict[str, list]] = {}
    new = "new key (excused by a link count change)"

    def clone(dest: Path) -> tuple[float, str]:
        t = time.perf_counter()
        p = subprocess.run([*userns, *ENVTOOLS, "clone", str(src), str(dest)],
                           capture_output=True, text=True)
        dt = time.perf_counter() - t
        if p.returncode != 0:
            raise RuntimeError(f"clone of {src} failed:\n{p.stderr[-3000:]}")
        return dt, (p.stderr.strip().splitlines() or [""])[-1]

    def run(name: str, cmd: list[str], parts: dict[str, bytes] | None) -> None:
        if parts is not None:
            _put_stat_cache(first, parts)
        dt, doc = _validate_timed(cmd)
        row = rows.setdefault(name, {"s": [], "hashed": [], "files": [], "exit": []})
        row["s"].append(dt)
        row["hashed"].append(doc.get("checked", {}).get("hashed"))
        row["files"].append(doc.get("checked", {}).get("files"))
        row["exit"].append(doc.get("exit_status"))

    clone_s: list[float] = []
    first_s: list[float] = []
    how = ""
    for i in range(repeat):
        get_console().print(f"round {i + 1}/{repeat}")
        dt, how = clone(first)
        first_s.append(dt)
        variants = _stat_cache_variants(first)
        run(f"baseline: no clone since FIRST's ({new})", validate, variants[new]())
        dt, _how = clone(second)
        clone_s.append(dt)
        for name, parts in variants.items():
            run(f"after SECOND: {name}", validate, parts())
        run("after SECOND: validate --full (hash everything)",
            [*validate[:-1], "--full", str(first)], None)
        rm_tree(second)
        run(f"after SECOND was removed again: {new}", validate, variants[new]())
        run("after that (keys refreshed by the run before)", validate, None)
        rm_tree(first)
    med = {k: statistics.median(v["s"]) for k, v in rows.items()}
    lines = [f"{k}: {med[k]:.2f} s median ({' '.join(f'{x:.2f}' for x in v['s'])}), "
             f"hashed {'/'.join(map(str, sorted(set(v['hashed']))))} of "
             f"{v['files'][0]} files, exit {'/'.join(map(str, sorted(set(v['exit']))))}"
             for k, v in rows.items()]
    lines.append(f"clone of SECOND: {statistics.median(clone_s):.2f} s median "
                 f"({' '.join(f'{x:.2f}' for x in clone_s)}); of FIRST, round by round (from "
                 f"round 2 on, right after the last clones of P were removed): "
                 f"{' '.join(f'{x:.2f}' for x in first_s)}; FIRST: {how}")
    return {"rows": rows, "median": med, "clone_s": clone_s, "first_s": first_s}, lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m envtools.bench --validate", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=Path, required=True, help="the env to measure (read only)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--breaks", action="store_true",
                    help="also plant each break in a clone and compare the tools")
    ap.add_argument("--workdir", type=Path, help="where the clones go [default: /tmp]")
    ap.add_argument("--json", type=Path, help="also write the figures to this file")
    ap.add_argument("--sibling-clone", action="store_true",
                    help="measure instead validate of a clone right after a second clone "
                    "linked the same cache files, with the stat cache keyed three ways")
    a = ap.parse_args(argv)

    src = a.prefix.absolute()
    if a.sibling_clone:
        work = Path(tempfile.mkdtemp(prefix="envtools-sibling-", dir=a.workdir or "/tmp"))
        load = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
        try:
            doc, lines = sibling_clone(src, work, a.repeat)
        finally:
            rm_tree(work)
        lines = [f"validate of FIRST, a clone of {src}, {os.cpu_count()} CPUs, median of "
                 f"{a.repeat}; uptime before: {load}", *lines,
                 "uptime after: " + subprocess.run(["uptime"], capture_output=True,
                                                   text=True).stdout.strip()]
        for line in lines:
            print(line)
        if a.json:
            a.json.write_text(json.dumps({**doc, "summary": lines}, indent=2))
        return 0
    results: dict[str, list[float]] = {}
    py = str(src / "bin" / "python")
    cmds = {
        "envtools validate --no-imports": [*ENVTOOLS, "validate", "--no-imports", str(src)],
        "envtools validate (with the import smoke test)": [*ENVTOOLS, "validate", str(src)],
        "pip check (--python the env's)": [sys.executable, "-m", "pip",
                                           "--disable-pip-version-check", "--python", py,
                                           "check"],
    }
    load_start = os.getloadavg()
    for i in range(a.repeat):
        get_console().print(f"round {i + 1}/{a.repeat}")
        for name, cmd in cmds.items():
            results.setdefault(name, []).append(time_cmd(cmd))
        t = time.perf_counter()
        ldd_missing(src)
        results.setdefault("ldd over every ELF file (lddtree-style)", []).append(
            time.perf_counter() - t)
    med = {k: statistics.median(v) for k, v in results.items()}
    doc = validate_doc(src)
    out = print_medians(f"envtools validate bench: {src}, median of {a.repeat}, {os.cpu_count()} "
              f"CPUs, load average {load_start[0]:.1f} -> {os.getloadavg()[0]:.1f}", results, med)
    s = doc.get("summary", {})
    lines = [
        f"validate --no-imports: {med['envtools validate --no-imports']:.2f} s (target <= "
        f"1.5 s); with the import smoke test ({doc.get('checked', {}).get('imports', 0)} "
        f"modules): {med['envtools validate (with the import smoke test)']:.2f} s (target <= "
        f"10 s); exit {doc.get('exit_status')}: {s.get('error')} errors, {s.get('warning')} "
        f"warnings, {s.get('info')} notes",
    ]
    for line in lines:
        out.print(line)
    rows = []
    if a.breaks:
        work = Path(tempfile.mkdtemp(prefix="envtools-breaks-", dir=a.workdir or "/tmp"))
        try:
            rows = run_breaks(src, work)
        finally:
            rm_tree(work)
        for line in breaks_table(rows):
            out.print(line, soft_wrap=True)
    if a.json:
        a.json.write_text(json.dumps({"runs": results, "median": med, "summary": lines,
                                      "breaks": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

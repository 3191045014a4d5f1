"""The import smoke test: can the env's python import what its packages provide?

Files and records can all be right and ``import numpy`` still fail or load the wrong
thing: a ``.pth`` file or PYTHONPATH puts another copy first, an extension was built
against another numpy ABI, a library it loads is gone. Only importing tells. Each
package's top-level modules (from its record, or a pip distribution's RECORD) are
imported by the env's own interpreter in a child process:

* with ``-B``, so validating never writes ``__pycache__`` into the env (root could);
* with the caller's environment (PYTHONPATH included: that is what the user runs with);
* one module at a time, reporting each over a pipe of its own (what modules print does
  not matter); a module that kills the interpreter (a segfault in an extension) or runs
  past the time limit is reported, and the rest go on in a fresh process;
* a module that imports but from somewhere other than the files its package installed is
  *shadowed*: the finding names the sys.path entry and what put it there (PYTHONPATH, or
  the ``.pth`` file and its owner).
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

#: top-level names that are not the package's API (tests, build helpers)
SKIP = {"test", "tests", "testing", "conftest", "setup", "benchmarks", "examples", "docs"}
#: modules imported after all others in the shared process: ``import pip`` switches
#: setuptools' distutils shim off (pip wants the stdlib's), after which ``import
#: setuptools`` fails its own check (AssertionError naming distutils/core.py), a failure
#: of the order, not of the env (each imports fine on its own)
IMPORTED_LAST = frozenset({"pip"})
#: messages numpy prints or raises for an extension built against another numpy ABI
NUMPY_ABI = re.compile(r"compiled (using|against) NumPy|module compiled against (ABI|API) "
                       r"version|numpy\.core\.multiarray failed to import|_ARRAY_API not found|"
                       r"numpy\.dtype size changed", re.I)

WORKER = r"""
import importlib, json, os, sys, time, traceback
out = os.fdopen(int(sys.argv[1]), "w", buffering=1)
out.write(json.dumps({"path": sys.path}) + "\n")
for name in sys.argv[2:]:
    out.write(json.dumps({"start": name}) + "\n")
    t = time.monotonic()
    try:
        m = importlib.import_module(name)
        where = getattr(m, "__file__", None)
        paths = list(getattr(m, "__path__", []) or [])
        out.write(json.dumps({"name": name, "ok": True, "file": where, "paths": paths,
                              "s": time.monotonic() - t}) + "\n")
    except BaseException as e:
        tb = traceback.extract_tb(e.__traceback__)
        out.write(json.dumps({"name": name, "ok": False, "type": type(e).__name__,
                              "error": str(e)[:500],
                              "missing": getattr(e, "name", None),
                              "where": tb[-1].filename if tb else None,
                              "s": time.monotonic() - t}) + "\n")
"""


@dataclass
class Outcome:
    name: str
    ok: bool = False
    file: str | None = None
    paths: list[str] = field(default_factory=list)
    kind: str = ""  # error type, "crash" or "timeout"
    error: str = ""
    missing: str | None = None
    where: str | None = None  # the file the exception came from
    stderr: str = ""


@dataclass
class Run:
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    sys_path: list[str] = field(default_factory=list)
    seconds: float = 0.0
    #: why the interpreter could not run at all (then no module was tried)
    unusable: str | None = None


def top_level(rel_paths: list[str], site_rel: str) -> set[str]:
    """Importable top-level names among a package's files under ``site_rel``."""
    names: set[str] = set()
    pre = site_rel + "/"
    for rel in rel_paths:
        if not rel.startswith(pre):
            continue
        part = rel[len(pre):]
        head, sep, rest = part.partition("/")
        if sep:
            if rest == "__init__.py" and head.isidentifier():
                names.add(head)
        elif part.endswith(".py"):
            names.add(part[:-3])
        elif part.endswith(".so"):
            names.add(part.split(".", 1)[0])
    return {n for n in names if n.isidentifier() and not n.startswith("_") and n not in SKIP}


def run(python: str, modules: list[str], timeout: float, per_module: float) -> Run:
    """Import ``modules`` in children of ``python``; never raises for what they do."""
    res = Run()
    t0 = time.monotonic()
    left = sorted(modules, key=lambda m: m in IMPORTED_LAST)
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    while left:
        if time.monotonic() - t0 > timeout:
            for name in left:
                res.outcomes[name] = Outcome(name, kind="timeout",
                                             error=f"not tried: the {timeout:.0f} s limit "
                                             "for the whole import test was reached")
            break
        first = not res.sys_path
        left = _one_process(python, left, env, res, t0, timeout, per_module)
        if first and not res.sys_path:  # it never got as far as its first line
            o = res.outcomes.get(modules[0])
            res.unusable = (o.error + (f": {o.stderr.strip().splitlines()[-1]}"
                                       if o.stderr.strip() else "")) if o else "no output"
            res.outcomes.clear()
            break
    res.seconds = time.monotonic() - t0
    return res


def _one_process(python: str, modules: list[str], env: dict, res: Run, t0: float,
                 timeout: float, per_module: float) -> list[str]:
    """Import until done or the child dies; returns the modules still to try."""
    r, w = os.pipe()
    try:
        proc = subprocess.Popen(
            [python, "-B", "-c", WORKER, str(w), *modules], pass_fds=(w,), env=env,
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            start_new_session=True)
    except OSError as e:
        os.close(r)
        os.close(w)
        for name in modules:
            res.outcomes[name] = Outcome(name, kind="crash",
                                         error=f"cannot run {python}: {e.strerror}")
        return []
    os.close(w)
    buf = b""
    current: str | None = None
    started = time.monotonic()
    done: set[str] = set()
    err_chunks: list[bytes] = []
    fds = [r, proc.stderr.fileno()]
    eof = False
    try:
        while not eof:
            now = time.monotonic()
            limit = min(started + per_module, t0 + timeout) - now
            if limit <= 0:
                os.killpg(proc.pid, signal.SIGKILL)
                if current is not None:
                    res.outcomes[current] = Outcome(
                        current, kind="timeout",
                        error=f"import did not finish within {per_module:.0f} s")
                    done.add(current)
                break
            ready, _, _ = select.select(fds, [], [], limit)
            for fd in ready:
                chunk = os.read(fd, 65536)
                if fd != r:
                    if chunk:
                        err_chunks.append(chunk)
                    else:
                        fds.remove(fd)
                    continue
                if not chunk:
                    eof = True
                    break
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    try:
                        msg = json.loads(line)
                    except ValueError:  # (a module wrote into our pipe: ignore it)
                        continue
                    if not isinstance(msg, dict):
                        continue
                    if "path" in msg:
                        res.sys_path = msg["path"]
                    elif "start" in msg:
                        current = msg["start"]
                        started = time.monotonic()
                        err_chunks.clear()
                    else:
                        o = Outcome(msg["name"], ok=msg["ok"], file=msg.get("file"),
                                    paths=msg.get("paths") or [], kind=msg.get("type") or "",
                                    error=msg.get("error") or "", missing=msg.get("missing"),
                                    where=msg.get("where"))
                        o.stderr = b"".join(err_chunks).decode(errors="replace")[-2000:]
                        res.outcomes[o.name] = o
                        done.add(o.name)
                        current = None
    finally:
        os.close(r)
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    if current is not None and current not in done:
        rc = proc.returncode
        if rc is not None and rc < 0:
            try:
                why = f"killed by signal {-rc} ({signal.Signals(-rc).name})"
            except ValueError:
                why = f"killed by signal {-rc}"
        else:
            why = f"exited with status {rc}"
        res.outcomes[current] = Outcome(
            current, kind="crash", error=f"the interpreter {why} while importing it",
            stderr=b"".join(err_chunks).decode(errors="replace")[-2000:])
        done.add(current)
    return [m for m in modules if m not in done]


def cause_of(entry: str, root: Path, site_dirs: list[Path]) -> tuple[str, str | None]:
    """Why ``entry`` is on sys.path: ("PYTHONPATH", None) or ("<pth rel path>", line)."""
    pp = [os.path.realpath(p) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    real = os.path.realpath(entry)
    if real in pp:
        return "PYTHONPATH", None
    for site in site_dirs:
        try:
            pths = sorted(site.glob("*.pth"))
        except OSError:
            continue
        for pth in pths:
            try:
                lines = pth.read_text(errors="replace").splitlines()
            except OSError:
                continue
            for line in lines:
                s = line.strip()
                if not s or s.startswith("#"):
                    continue
                if s.startswith(("import ", "import\t")):  # code run at start-up
                    if entry in s or real in s:
                        return str(pth.relative_to(root)), s
                elif os.path.realpath(os.path.join(site, s)) == real:
                    return str(pth.relative_to(root)), s
    return "", None

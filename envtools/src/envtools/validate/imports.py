"""The import smoke test as a check: which modules the env's packages provide, imported
by the env's python beside the other checks (validate.smoke)."""

from __future__ import annotations

import os
from collections import defaultdict
from pathlib import Path

from envtools.base import elf
from envtools.base.progress import task
from envtools.validate import smoke
from envtools.validate.binaries import env_python
from envtools.validate.findings import Context
from envtools.validate.pip import norm_name, read_metadata


def _optional_requirements(ctx: Context, rec_paths: list[str]) -> set[str]:
    """Normalized names a package's dist-info lists only under an extra (optional)."""
    from packaging.requirements import InvalidRequirement, Requirement

    out: set[str] = set()
    for rel in rec_paths:
        if not rel.endswith(".dist-info/METADATA"):
            continue
        for req_s in read_metadata(ctx.prefix.root / rel[: -len("/METADATA")])["requires"]:
            try:
                req = Requirement(req_s)
            except InvalidRequirement:
                continue
            if req.marker is not None and "extra" in str(req.marker):
                out.add(norm_name(req.name))
    return out


def _conda_modules(ctx: Context) -> tuple[dict[str, str], dict[str, list[str]]]:
    """module -> owning package, and package -> its files, for the conda packages."""

    owner: dict[str, str] = {}
    files: dict[str, list[str]] = {}
    site_rel = _site_rel(ctx.prefix.root)
    for r in ctx.prefix.records:
        rels = [e["_path"] for e in r.paths]
        files[r.name] = rels
        if site_rel:
            for mod in sorted(smoke.top_level(rels, site_rel)):
                owner.setdefault(mod, r.name)
    return owner, files


def _site_rel(root: Path) -> str | None:
    sites = sorted(root.glob("lib/python*/site-packages"))
    return str(sites[0].relative_to(root)) if sites else None


def _runs_here(ctx: Context) -> bool:
    """Can this machine run the env's binaries at all (a linux-ppc64le env validated
    on x86_64 cannot: its import test is left out, with a note)?"""
    want = elf.SUBDIR_MACHINE.get(ctx.subdir)
    here = {"x86_64": "linux-64", "ppc64le": "linux-ppc64le", "aarch64": "linux-aarch64",
            "s390x": "linux-s390x"}.get(os.uname().machine)
    return want is None or here is None or elf.SUBDIR_MACHINE.get(here) == want


def start_imports(ctx: Context) -> None:
    """Start the import smoke test of the conda packages' modules in a thread, so the
    interpreter imports while the other checks read and hash files."""
    if not ctx.imports or env_python(ctx.prefix.root) is None or not _runs_here(ctx):
        return
    import threading


    owner, _ = _conda_modules(ctx)
    mods = sorted(owner)
    # Two interpreters, each importing every other module in sorted order (powerai on 2
    # cores at load 1-2: 8.1 s instead of 9.1 s). Always two, whatever the load: what a
    # module finds already imported can decide whether it imports (tensorflow_probability
    # fails after tensorflow), so the split must not change from run to run.
    # ENVTOOLS_IMPORT_WORKERS=N sets another number.
    try:
        n = int(os.environ.get("ENVTOOLS_IMPORT_WORKERS", "0"))
    except ValueError:
        n = 0
    n = max(1, n) if n else (2 if len(mods) >= 8 else 1)
    shares = [share for share in (mods[i::n] for i in range(n)) if share]
    box: dict = {"runs": []}

    def work(share: list[str]) -> None:
        box["runs"].append(smoke.run(env_python(ctx.prefix.root), share,
                                       timeout=max(600.0, ctx.import_timeout),
                                       per_module=ctx.import_timeout))

    threads = [threading.Thread(target=work, args=(sh,), name="imports", daemon=True)
               for sh in shares]
    for th in threads:
        th.start()
    ctx.import_job = (threads, box, set(owner))


def check_imports(ctx: Context) -> None:
    """Import every package's top-level modules in the env's python (see
    :mod:`envtools.validate.smoke`): failures, crashes, numpy ABI mismatches, shadowed modules."""
    if not ctx.imports:
        return

    root = ctx.prefix.root
    python = env_python(root)
    sites = sorted(root.glob("lib/python*/site-packages"))
    if python is None or not sites:
        return
    if not _runs_here(ctx):
        ctx.add("import-skipped", "info", f"the import test was left out: the env is for "
                f"{ctx.subdir} and this machine is {os.uname().machine}", ["python"],
                hint=f"validate on a {ctx.subdir} node to import its modules")
        return
    site_rel = str(sites[0].relative_to(root))
    owner, files = _conda_modules(ctx)
    pip_files: dict[str, list[str]] = defaultdict(list)
    for rel, dist in ctx.pip_owned.items():
        pip_files[dist].append(rel)
    for dist, rels in sorted(pip_files.items()):
        for mod in sorted(smoke.top_level(rels, site_rel)):
            owner[mod] = f"pip:{dist}"  # pip's copy is what python finds
    if not owner:
        return
    with task("importing modules", None):
        run = smoke.Run()
        tried: set[str] = set()
        if ctx.import_job is not None:
            threads, box, tried = ctx.import_job
            for th in threads:
                th.join()
            for part in box["runs"]:
                run.outcomes.update(part.outcomes)
                run.sys_path = run.sys_path or part.sys_path
                run.unusable = run.unusable or part.unusable
        rest = sorted(set(owner) - tried)
        if rest and not run.unusable:
            more = smoke.run(python, rest, timeout=max(600.0, ctx.import_timeout),
                               per_module=ctx.import_timeout)
            run.outcomes.update(more.outcomes)
            run.sys_path = run.sys_path or more.sys_path
            run.unusable = more.unusable
    if run.unusable:
        ctx.add("import-skipped", "error", f"the env's python ({os.path.relpath(python, root)}) "
                f"cannot run: {run.unusable}", ["python"], [os.path.relpath(python, root)],
                hint="reinstall python (clone the env again); no module could be imported")
        return
    ctx.checked["imports"] = len(owner)
    ctx.import_outcomes = dict(run.outcomes)
    numpy = ctx.prefix.by_name().get("numpy")

    def env_rel(path: str) -> str | None:
        """``path`` relative to the env, as python found it (a clone's file may be a link
        to its package cache: its real path is the cache's), else by its real path."""
        for p, base in ((os.path.abspath(path), os.path.abspath(root)),
                        (os.path.realpath(path), os.path.realpath(root))):
            if p.startswith(base + os.sep):
                return os.path.relpath(p, base)
        return None

    def package_of(path: str | None) -> str | None:
        rel = env_rel(path) if path else None
        if rel in ctx.owners:
            return ctx.owners[rel][0].name
        if rel in ctx.pip_owned:
            return f"pip:{ctx.pip_owned[rel]}"
        return None

    def fix(pkg: str) -> str:
        if pkg.startswith("pip:"):
            return f"pip install --force-reinstall {pkg[4:]}"
        return f"reinstall {pkg} (clone the env again, or envtools clone --add it)"

    for mod, o in sorted(run.outcomes.items()):
        pkg = owner[mod]
        if o.ok:
            where = o.file or (o.paths[0] if o.paths else None)
            if where is None:
                continue
            real = os.path.realpath(where)
            rel = env_rel(where)
            if rel is not None and rel.startswith(site_rel + "/") and \
                    rel[len(site_rel) + 1:].split("/")[0].split(".")[0] == mod:
                continue
            entry = next((e for e in run.sys_path if e and real.startswith(
                os.path.realpath(e) + os.sep)), os.path.dirname(real))
            cause, line = smoke.cause_of(entry, root, sites)
            pkgs = [pkg]
            if cause == "PYTHONPATH":
                why = f"{entry} is on PYTHONPATH"
                hint = f"unset PYTHONPATH (or remove {entry} from it)"
            elif cause:
                by = ctx.owners.get(cause)
                who = by[0].name if by else (f"pip:{ctx.pip_owned[cause]}"
                                             if cause in ctx.pip_owned else "(untracked)")
                pkgs.append(who)
                why = f"{cause} ({who}) puts {entry} first ({line!r})"
                hint = f"remove {cause}" + ("" if who == "(untracked)" else
                                            f" (uninstall {who.removeprefix('pip:')})")
            elif "/.local/lib/python" in entry:
                why = f"{entry} is the user site-packages (pip install --user), which comes first"
                hint = (f"python -m pip uninstall {mod} as that user (or set PYTHONNOUSERSITE=1 "
                        "when using the env)")
            else:
                why = f"{entry} comes before site-packages on sys.path"
                hint = f"remove {entry} from sys.path (user site, sitecustomize, PYTHONPATH)"
            ctx.add("import-shadowed", "error",
                    f"import {mod} loads {where}, not {pkg}'s copy in {site_rel}: {why}",
                    pkgs, [os.path.relpath(real, root) if real.startswith(str(root))
                           else real], hint=hint)
            continue
        culprit = package_of(o.where) or pkg
        text = f"{o.kind}: {o.error}" if o.kind not in ("crash", "timeout") else o.error
        blob = f"{o.error}\n{o.stderr}"
        if o.kind == "timeout":
            ctx.add("import-timeout", "warning", f"import {mod} ({pkg}): {o.error}", [pkg],
                    hint="a busy machine? rerun with a larger --import-timeout; if it hangs, "
                    f"{fix(pkg)}")
        elif smoke.NUMPY_ABI.search(blob):
            have = f"numpy {numpy.version}" if numpy else "the installed numpy"
            ctx.add("numpy-abi", "error",
                    f"import {mod} ({pkg}) fails: an extension was built against another "
                    f"numpy ABI than {have}: {text[:300]}", [pkg, "numpy"],
                    hint=f"install a {pkg} built for {have}, or the numpy {pkg} was built "
                    "for (envtools clone --add, or conda install)")
        elif o.kind == "ModuleNotFoundError" and o.missing and \
                o.missing.split(".")[0] not in owner and \
                norm_name(o.missing.split(".")[0]) in _optional_requirements(
                    ctx, files.get(pkg, [])):
            ctx.add("import-optional", "info",
                    f"import {mod} ({pkg}) needs {o.missing}, an optional dependency of "
                    f"{pkg} that is not installed", [pkg],
                    hint=f"install {o.missing.replace('_', '-')} if you use {mod} that way")
        elif o.kind == "crash":
            ctx.add("import-crash", "error", f"import {mod} ({pkg}): {o.error}",
                    [pkg], hint=f"{fix(pkg)}; the interpreter's last words: "
                    f"{o.stderr.strip().splitlines()[-1] if o.stderr.strip() else '(none)'}")
        else:
            who = culprit if culprit == pkg else f"{culprit} (where it failed)"
            ctx.add("import-error", "error", f"import {mod} ({pkg}) fails: {text[:400]}",
                    [pkg] if culprit == pkg else [pkg, culprit],
                    hint=f"{fix(culprit)}" + ("" if culprit == pkg else
                                             f"; then validate again ({who})"))

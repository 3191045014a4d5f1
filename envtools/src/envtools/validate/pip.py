"""Checks of what pip installed: duplicates of conda packages, unmet requirements, files
pip overwrote, editable installs."""

from __future__ import annotations

import os
import re
from pathlib import Path

from envtools.prefix.untracked import find_editables
from envtools.validate.findings import Context


# ---------------------------------------------------------------- pip
def norm_name(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_metadata(d: Path) -> dict:
    """Name, version and Requires-Dist from a dist-info METADATA / egg-info PKG-INFO."""
    fp = d / ("METADATA" if d.suffix == ".dist-info" else "PKG-INFO")
    meta: dict = {"name": None, "version": None, "requires": []}
    try:
        text = fp.read_text(errors="replace")
    except OSError:
        return meta
    for line in text.split("\n\n", 1)[0].splitlines():
        k, _, v = line.partition(":")
        v = v.strip()
        if k == "Name":
            meta["name"] = v
        elif k == "Version":
            meta["version"] = v
        elif k == "Requires-Dist":
            meta["requires"].append(v)
    try:
        extra = (d / "requires.txt").read_text(errors="replace") if d.suffix == ".egg-info" \
            else ""
    except OSError:
        extra = ""
    if extra:
        for line in extra.splitlines():
            if line.startswith("["):
                break
            if line.strip():
                meta["requires"].append(line.strip())
    return meta


def check_pip(ctx: Context) -> None:
    """pip-installed distributions against conda ones."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    root = ctx.prefix.root
    conda_names = {norm_name(r.name): r.name for r in ctx.prefix.records}
    dists: dict[str, dict] = {}  # normalized name -> info (conda or pip)
    pip_dists = []
    for site in sorted(root.glob("lib/python*/site-packages")):
        for d in sorted(site.iterdir()):
            if d.suffix not in (".dist-info", ".egg-info") or not d.is_dir():
                continue
            meta = read_metadata(d)
            if not meta["name"]:
                continue
            rel = str(d.relative_to(root))
            owner = ctx.owners.get(rel + "/METADATA") or ctx.owners.get(rel + "/PKG-INFO")
            info = {"dir": d, "rel": rel, **meta,
                    "conda": owner[0].name if owner else None}
            n = norm_name(meta["name"])
            if owner is None:
                pip_dists.append(info)
                other = dists.get(n)
                conda_pkg = conda_names.get(n)
                if (other and other["conda"]) or conda_pkg:
                    pkg = other["conda"] if other and other["conda"] else conda_pkg
                    ctx.add("pip-duplicate", "error",
                            f"{meta['name']} {meta['version']} was installed by pip over the "
                            f"conda package {pkg}", [pkg, f"pip:{meta['name']}"], [rel],
                            hint=f"pip uninstall {meta['name']}, then install the version you "
                            f"need with envtools clone --add / conda install")
                elif other:
                    ctx.add("pip-duplicate", "error",
                            f"{meta['name']} is installed twice by pip ({other['rel']}, {rel})",
                            [f"pip:{meta['name']}"], [other["rel"], rel],
                            hint="pip uninstall it until only one copy remains")
            dists.setdefault(n, info)
            if owner is not None:
                dists[n] = info
    for n, r in conda_names.items():  # conda packages without a dist-info still count
        dists.setdefault(n, {"name": r, "version": ctx.prefix.by_name()[r].version,
                             "conda": r, "rel": None})
    pyver = ctx.python_version()
    env = {"extra": ""}
    if pyver:
        env.update(python_version=f"{pyver[0]}.{pyver[1]}",
                   python_full_version=ctx.prefix.by_name()["python"].version)
    for info in pip_dists:
        for req_s in info["requires"]:
            try:
                req = Requirement(req_s)
            except InvalidRequirement:
                continue
            try:
                if req.marker is not None and not req.marker.evaluate(env):
                    continue
            except Exception:
                continue
            have = dists.get(norm_name(req.name))
            if have is None:
                ctx.add("pip-requires", "error",
                        f"{info['name']} {info['version']} (pip) requires {req_s!r} but "
                        f"{req.name} is not installed", [f"pip:{info['name']}", req.name],
                        [info["rel"]], hint=f"install {req.name} (prefer the conda package: "
                        f"envtools clone --add {req.name}), or pip uninstall {info['name']}")
                continue
            try:
                ok = not req.specifier or req.specifier.contains(Version(have["version"]),
                                                                 prereleases=True)
            except InvalidVersion:
                ok = True
            if not ok:
                who = f"conda package {have['conda']}" if have.get("conda") else "pip"
                ctx.add("pip-requires", "error",
                        f"{info['name']} {info['version']} (pip) requires {req_s!r} but "
                        f"{have['name']} {have['version']} is installed (from {who})",
                        [f"pip:{info['name']}", have.get("conda") or req.name], [info["rel"]],
                        hint=f"pip install a {info['name']} compatible with {have['name']} "
                        f"{have['version']}, or change {have['name']}")
        # pip files written over conda files
        try:
            record_text = (info["dir"] / "RECORD").read_text(errors="replace")
        except OSError:
            record_text = None
        if record_text is not None:
            site_rel = str(info["dir"].parent.relative_to(root))
            clobbered = []
            for line in record_text.splitlines():
                path = line.rsplit(",", 2)[0] if line.count(",") >= 2 else line
                rel = os.path.normpath(os.path.join(site_rel, path))
                ctx.pip_owned[rel] = info["name"]
                if rel in ctx.owners:
                    clobbered.append(rel)
            if clobbered:
                pkgs = sorted({o.name for rel in clobbered for o in ctx.owners[rel]})
                ctx.add("pip-overwrote", "error",
                        f"pip's {info['name']} {info['version']} wrote {len(clobbered)} file(s) "
                        f"that belong to conda package(s) {', '.join(pkgs)}",
                        [f"pip:{info['name']}", *pkgs], clobbered[:20],
                        hint=f"pip uninstall {info['name']} and reinstall {', '.join(pkgs)}")
    ctx.checked["pip_distributions"] = len(pip_dists)
    # altered-file findings that pip explains are reported once, as pip-overwrote
    pip_over = {p for f in ctx.findings if f.check == "pip-overwrote" for p in f.paths}
    ctx.findings = [f for f in ctx.findings
                    if not (f.check == "altered-file" and set(f.paths) <= pip_over)]

    for e in find_editables(root):
        ctx.add("editable-install", "info", f"editable install: {e}",
                hint="it runs code from outside the env; clones share that source directory")

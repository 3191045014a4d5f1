"""Checks of the ELF files: the platform, whole files, libraries resolved the way ld.so
loads them, one MPI and NCCL, the python ABI of extensions."""

from __future__ import annotations

import os
import re
import stat
from collections import defaultdict
from pathlib import Path

from envtools.base import elf
from envtools.validate import loader
from envtools.validate.findings import Context

#: libraries the GPU driver provides; unresolved only means "no driver on this node"
DRIVER_LIBS = re.compile(r"^lib(cuda|nvidia-ml|nvidia-[\w-]+|nvcuvid|nvidia)\.so")


DUP_FAMILIES = {"nccl": re.compile(r"^libnccl\.so"), "mpi": re.compile(r"^libmpi\.so")}


EXT_RE = re.compile(r"\.(cpython-(\d)(\d+)[a-z]*)-[\w-]+\.so$")


# ---------------------------------------------------------------- binaries
#: top-level directories with no ELF files worth checking (their links are still found)
_NO_ELF = ("include", "share", "man", "doc")


def elf_candidates(root: Path, cache_links: set[str],
                    linked_dirs: dict[str, str]) -> list[str]:
    """Files that may be ELF objects (``.so`` in the name, or executable). A clone's links
    to the package cache (``cache_links``, accepted by check_files) count as the files
    they lead to, and its directory links (``linked_dirs``: layers.py) are walked by the
    clone's path, where a library in one is opened (its $ORIGIN is the clone's). No
    other link is followed: a package's own links are checked at their targets, and
    anything else is data (see the module docstring)."""
    out: list[str] = []
    roots = str(root)
    cut = len(roots) + 1
    stack = [(roots, False)]
    while stack:
        dirpath, quiet = stack.pop()
        try:
            it = os.scandir(dirpath)
        except OSError:
            continue
        with it:
            for entry in it:
                fp = entry.path
                top = dirpath == roots
                if top and entry.name == "conda-meta":
                    continue
                skip = quiet or (top and entry.name in _NO_ELF)
                try:
                    if entry.is_dir(follow_symlinks=False):
                        stack.append((fp, skip))
                        continue
                    if entry.is_symlink():
                        rel = fp[cut:]
                        if rel in linked_dirs:
                            stack.append((fp, skip))
                            continue
                        if skip or rel not in cache_links:
                            continue
                        st = None if ".so" in entry.name else os.stat(fp)
                    elif skip or ".so" in entry.name:
                        st = None
                    else:
                        st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if skip:
                    continue
                if ".so" in entry.name or (
                        st is not None and stat.S_ISREG(st.st_mode) and st.st_mode & 0o111
                        and not entry.name.endswith((".py", ".sh", ".txt"))):
                    out.append(fp)
    return out


def env_python(root: Path) -> str | None:
    """The env's interpreter, ``bin/python`` as users run it (a venv-style env finds its
    pyvenv.cfg through that path); its real path is the program ld.so loads."""
    for name in ("python", "python3"):
        fp = root / "bin" / name
        if os.path.lexists(fp):  # (a dangling link is a python that cannot run: reported)
            return str(fp)
    return None


def _for_platform(owners: list[str], what: str) -> str:
    """The hint for a file built for the wrong platform or python, naming its package."""
    if owners == ["(untracked)"]:
        return f"remove it (no package owns it), or reinstall what put it there for {what}"
    pip = [o[4:] for o in owners if o.startswith("pip:")]
    if pip:
        return f"pip install --force-reinstall {pip[0]} (the wheel for {what})"
    return f"reinstall {', '.join(owners)} built for {what}"


def check_binaries(ctx: Context) -> None:
    """ELF arch, damaged ELF files, what ld.so would not find (see :mod:`envtools.validate.loader`),
    duplicate NCCL/MPI, wrong python ABI."""
    root = ctx.prefix.root
    real_root = os.path.realpath(root)
    want = elf.SUBDIR_MACHINE.get(ctx.subdir)
    sysdirs = elf.system_library_dirs()

    def rel_of(path: str) -> str:
        return os.path.relpath(path, real_root)

    def owner_of(path: str) -> list[str]:
        rel = rel_of(path)
        if rel in ctx.owners:
            return [o.name for o in ctx.owners[rel]]
        if rel in ctx.pip_owned:
            return [f"pip:{ctx.pip_owned[rel]}"]
        return ["(untracked)"]

    def reinstall(path: str) -> str:
        who = owner_of(path)
        if who == ["(untracked)"]:
            return "remove it, or reinstall whatever put it there"
        pip = [w[4:] for w in who if w.startswith("pip:")]
        if pip:
            return f"pip install --force-reinstall {pip[0]}"
        return f"reinstall {', '.join(who)} (clone the env again, or restore the file)"

    elves: dict[str, elf.ElfInfo] = {}
    # a package file linked to the cache is checked where it is used: a library's
    # $ORIGIN is the directory it is opened in (the link's); a program's, its real one.
    # (A package's own links inside the env are checked at their targets.)
    real_dir: dict[str, str] = {}
    aliases: dict[str, str] = {}
    for fp in elf_candidates(root, ctx.cache_links, ctx.linked_dirs):
        info = elf.read_elf(fp)
        if info is not None:
            key = real_root + fp[len(str(root)):]  # (the path it is opened by)
            elves[key] = info
            if os.path.islink(fp):
                aliases[os.path.realpath(fp)] = key
                if info.program:
                    real_dir[key] = os.path.dirname(os.path.realpath(fp))
    ctx.checked["elf_files"] = len(elves)
    linked = ctx.linked_dirs
    if linked:
        by_pkg: dict[str, list[str]] = {}
        caches = [(r.extracted_package_dir + "/", r.name) for r in ctx.prefix.records
                  if r.extracted_package_dir]
        for d, target in linked.items():
            owner = next((name for c, name in caches if target.startswith(c)), "?")
            by_pkg.setdefault(owner, []).append(d)
        names = sorted(by_pkg)
        ctx.add("linked-directories", "info",
                f"{len(linked)} directories of {len(names)} packages are links to the site's "
                f"package cache (read-only): {', '.join(names[:12])}"
                + (" ..." if len(names) > 12 else ""), names, sorted(linked)[:50],
                hint=f"pip and conda cannot remove or replace these packages' files; first "
                f"run: envtools detach {root} PACKAGE")
    for fp, info in list(elves.items()):
        rel = rel_of(fp)
        if info.damaged:
            ctx.add("elf-damaged", "error", f"{rel} is not a loadable ELF file ({info.damaged})",
                    owner_of(fp), [rel], hint=reinstall(fp))
        elif want and (info.machine, info.endian) != want:
            ctx.add("elf-arch", "error",
                    f"{rel} is built for {info.machine_name}, not {ctx.subdir}", owner_of(fp),
                    [rel], hint=f"{_for_platform(owner_of(fp), ctx.subdir)}")
        else:
            continue
        del elves[fp]  # ld.so would refuse it: not loaded, not searched further
    python = env_python(root)
    res = loader.simulate(real_root, elves, sysdirs, python and os.path.realpath(python),
                          origins=real_dir, aliases=aliases)
    try:
        in_envlib = set(os.listdir(os.path.join(real_root, "lib")))
    except OSError:
        in_envlib = set()
    seen: set[tuple[str, str]] = set()
    plugins: dict[str, list[str]] = defaultdict(list)
    dlopened = dlopened_libraries(elves, rel_of)
    env_names = {os.path.basename(k) for k in elves}
    for m in res.misses:
        if (m.obj, m.need) in seen:
            continue
        seen.add((m.obj, m.need))
        rel = rel_of(m.obj)
        via = "" if m.root == m.obj else f" (loaded from {rel_of(m.root)})"
        if m.kind == "plugin" or ((loader.capability(m.need) or m.need in env_names)
                                  and dlopened(m.root)):
            plugins[m.root].append(m.need)
        elif m.kind == "flavour":
            have = sorted({i.soname for i in elves.values() if i.soname in loader.MPI_FLAVOURS})
            ctx.add("elf-mpi-flavour", "info",
                    f"{rel} is built for {loader.MPI_FLAVOURS[m.need]} ({m.need}); this env's "
                    f"MPI is {', '.join(f'{loader.MPI_FLAVOURS[h]} ({h})' for h in have)}, "
                    "for which its sibling module is built", owner_of(m.obj), [rel],
                    hint="nothing to do: it is used only with that MPI")
        elif DRIVER_LIBS.match(m.need):
            ctx.add("elf-unresolved", "warning",
                    f"{rel} needs the driver library {m.need}, not found on this node{via}",
                    owner_of(m.obj), [rel],
                    hint="expected on nodes without a GPU driver; run on a GPU node")
        elif m.need in in_envlib:
            ctx.add("elf-unresolved", "warning",
                    f"{rel} needs {m.need}, which is in the env's lib/ but not on its RPATH{via}",
                    owner_of(m.obj), [rel],
                    hint="it only loads with LD_LIBRARY_PATH set; rebuild with "
                    "-Wl,-rpath,'$ORIGIN/../lib'")
        else:
            ctx.add("elf-unresolved", "error",
                    f"{rel} needs {m.need}, which is neither in the env nor on the system{via}",
                    owner_of(m.obj), [rel],
                    hint=f"install the package that provides {m.need} (conda), or the system "
                    f"library; if {rel} itself is stale: {reinstall(m.obj)}")
    for plugin, needs in plugins.items():
        rel = rel_of(plugin)
        needs = sorted(set(needs))
        what = sorted({loader.capability(n) or "" for n in needs} - {""}) or ["its feature"]
        ctx.add("elf-optional", "info",
                f"{' and '.join(what)} unavailable: {', '.join(needs)} not found "
                f"(optional plugin {rel}, loaded by its host only when wanted)",
                owner_of(plugin), [rel],
                hint=f"only on nodes with that hardware or service: install the system "
                f"package that provides {', '.join(needs)} there")
    resolved_system = {fam: {p for n, ps in res.system_hits.items() if pat.match(n) for p in ps}
                       for fam, pat in DUP_FAMILIES.items()}
    # two copies of libnccl / libmpi reachable
    for fam, pat in DUP_FAMILIES.items():
        copies = sorted({fp for fp in elves if pat.match(os.path.basename(fp))})
        if copies and resolved_system.get(fam):
            copies += sorted(resolved_system[fam])
        if len(copies) > 1:
            ours = [c for c in copies if c.startswith(real_root + os.sep)]
            rels = [rel_of(c) if c in ours else c for c in copies]
            owners = sorted({o for c in ours for o in owner_of(c)})
            ctx.add("duplicate-library", "error",
                    f"{len(copies)} copies of lib{fam} are reachable: {', '.join(rels)}",
                    owners, rels,
                    hint=f"keep one lib{fam}: uninstall the pip wheel (e.g. nvidia-{fam}-cu12) or "
                    "the conda package that brings the other")
    # compiled extensions for another python ABI
    pyver = ctx.python_version()
    if pyver:
        for fp in elves:
            m = EXT_RE.search(fp)
            if m and (int(m.group(2)), int(m.group(3))) != pyver:
                rel = rel_of(fp)
                ctx.add("python-abi", "error",
                        f"{rel} is a compiled extension for CPython {m.group(2)}.{m.group(3)}, "
                        f"but the env's python is {pyver[0]}.{pyver[1]}", owner_of(fp), [rel],
                        hint=_for_platform(owner_of(fp), f"python {pyver[0]}.{pyver[1]}"))


# ---------------------------------------------------------------- imports
def _has_pyinit(fp: str) -> bool:
    """Whether a library named like an extension module exports its ``PyInit_<name>``
    (triton ships dlopened plugins with importable names)."""
    import mmap

    stem = os.path.basename(fp).split(".", 1)[0]
    try:
        with open(fp, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return mm.find(b"PyInit_" + stem.encode() + b"\0") >= 0
    except (OSError, ValueError):
        return True  # unreadable: keep calling it an extension, as before


def dlopened_libraries(elves: dict[str, elf.ElfInfo], rel_of):  # noqa: ANN001, ANN202
    """A predicate: whether a library is one a wheel's host dlopens at run time, as Open
    MPI does its plugins (NVSHMEM's transports, cuFile's RDMA layer, triton's MLIR
    plugins and what they link): under site-packages, not an extension module Python
    imports, and linked by nothing but such libraries. A hardware library one misses, or
    a library of the env it expects its host to have loaded already, is then the plugin's
    note, not an error. Decided only for the files asked about (a miss's root)."""
    linkers: dict[str, set[str]] = defaultdict(set)
    for fp, e in elves.items():
        for n in e.needed:
            linkers[n].add(fp)
    memo: dict[str, bool] = {}

    def dlopened(fp: str) -> bool:
        if fp in memo:
            return memo[fp]
        memo[fp] = False  # (a cycle of links: not a plugin)
        info = elves.get(fp)
        rel = rel_of(fp)
        if info is None or info.program or "/site-packages/" not in rel or (
                loader.is_extension(rel) and _has_pyinit(fp)):
            return False
        by = linkers.get(os.path.basename(fp), set()) | (
            linkers.get(info.soname, set()) if info.soname else set())
        memo[fp] = all(dlopened(b) for b in by)
        return memo[fp]

    return dlopened

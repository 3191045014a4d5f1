"""What the dynamic loader (glibc's ld.so) would do with an environment's ELF files.

validate used to resolve each file's DT_NEEDED on its own, which is stricter than ld.so
and called pristine envs broken: auditwheel's ``*.libs`` libraries have no RPATH (they
are found through the RPATH of the extension that loads them), Python extensions rely
on ``bin/python``'s RPATH, Open MPI's plugins need hardware libraries only present on
nodes with that hardware. Here each file is judged the way it is loaded:

* **Chains.** Loading starts at a *root* (a program, a Python extension imported by the
  env's python, or a library nothing in the env links: something dlopens it) and goes
  breadth first through DT_NEEDED, as ld.so does. A name is satisfied by an object this
  load already has, by the requested name or its DT_SONAME, before any search.
* **Search order** for a name needed by object L: if L has no DT_RUNPATH, the DT_RPATH
  of L, then of the object that loaded L, and so on up the chain, then the program's
  DT_RPATH (``bin/python`` for extensions and dlopened libraries); then L's own
  DT_RUNPATH (never inherited); then the system (``ld.so.conf`` and the default
  directories). ``$ORIGIN`` is the directory of the object whose entry it is. A file of
  another machine or ELF class is skipped, as ld.so skips it. LD_LIBRARY_PATH is not
  used: an env must not need it.
* **Plugins** (:func:`plugin_tree`): a shared library in a subdirectory of ``lib/``
  (``lib/openmpi/``, ``lib/openmpi/ucx/``, ``lib/ucx/``...) that nothing links is a
  plugin its host dlopens when the feature is wanted and skips when it cannot be loaded.
  A system library it misses is a note naming what the plugin would enable.
* **MPI flavours**: an extension that needs another MPI's ``libmpi`` than the env has,
  beside a sibling built for the env's one (mpi4py's ``MPI.mpich`` next to
  ``MPI.openmpi``), is never loaded here: a note.
* **Test programs** (``test_*``, ``*_test``, or under ``test/``/``tests/`` in
  ``lib/``) are not the env's API and are not roots.
"""

from __future__ import annotations

import os
import re
from collections import deque
from dataclasses import dataclass, field

from envtools.base import elf

#: what a missing system library means for an optional plugin
CAPABILITIES: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(p), what) for p, what in (
        (r"^libibverbs\.so", "InfiniBand/RoCE (verbs) transport"),
        (r"^libmlx5\.so", "NVIDIA/Mellanox ConnectX (mlx5) transport"),
        (r"^librdmacm\.so", "RDMA connection manager (RoCE/iWARP) transport"),
        (r"^libefa\.so", "AWS EFA transport"),
        (r"^libpsm2\.so", "Omni-Path (PSM2) transport"),
        (r"^libpsm_infinipath\.so", "TrueScale (PSM) transport"),
        (r"^libcxi\.so", "HPE Slingshot (CXI) transport"),
        (r"^libxpmem\.so", "XPMEM shared-memory transport"),
        (r"^libknem\.so", "KNEM shared-memory transport"),
        (r"^libhcoll\.so", "HCOLL hardware collectives"),
        (r"^libfabric\.so", "libfabric (OFI) transport"),
        (r"^lib(ucp|ucs|uct)\.so", "UCX transport"),
        (r"^liboshmem\.so", "OpenSHMEM bootstrap"),
        (r"^lib(cuda|cudart|nvidia-ml)\.so", "CUDA support"),
        (r"^lib(amdhip64|hsa-runtime64|rocm_smi64)\.so", "ROCm support"),
        (r"^libze_loader\.so", "Intel GPU (Level Zero) support"),
        (r"^lib(slurm|pmi2?)\.so", "Slurm/PMI launch"),
        (r"^lib(torque|pbs)\.so", "PBS/Torque launch"),
        (r"^liblustreapi\.so", "Lustre support"),
        (r"^libgpfs\.so", "GPFS support"),
    )
)
#: libmpi sonames and the MPI family that uses them
MPI_FLAVOURS = {"libmpi.so.40": "Open MPI", "libmpi.so.12": "MPICH ABI (MPICH, Intel MPI, "
                "Cray MPICH, MVAPICH)", "libmpi_abi.so.0": "the MPI standard ABI"}
EXT_NAME = re.compile(r"^[A-Za-z_]\w*(\.[\w-]+)?\.so$")
TEST_NAME = re.compile(r"^(test_.*|.*_test|test)$")
TEST_DIRS = {"test", "tests", "testing"}


def capability(lib: str) -> str | None:
    return next((what for pat, what in CAPABILITIES if pat.match(lib)), None)


def plugin_tree(rel: str) -> str | None:
    """``lib/X/...`` -> ``X`` for a file in a subdirectory of lib/ (not lib/pythonX.Y)."""
    parts = rel.split("/")
    if len(parts) >= 3 and parts[0] == "lib" and not parts[1].startswith("python"):
        return parts[1]
    return None


def is_extension(rel: str) -> bool:
    """A module Python imports: under lib/pythonX.Y/, an importable name + ``.so``."""
    parts = rel.split("/")
    return (len(parts) >= 3 and parts[0] == "lib" and parts[1].startswith("python")
            and not any(p.endswith(".libs") for p in parts[:-1])
            and EXT_NAME.match(parts[-1]) is not None)


def is_test_program(rel: str, info: elf.ElfInfo) -> bool:
    if not info.program:
        return False
    parts = rel.split("/")
    return parts[0] == "lib" and (TEST_NAME.match(parts[-1]) is not None
                                  or any(p in TEST_DIRS for p in parts[:-1]))


@dataclass
class Miss:
    """One DT_NEEDED that no load of ``obj`` could satisfy."""

    obj: str  # absolute path of the object whose entry it is
    need: str
    root: str  # the root whose load it was
    kind: str  # "root": an ordinary root; "plugin": under a plugin; "flavour": other MPI


@dataclass
class Result:
    misses: list[Miss] = field(default_factory=list)
    #: realpaths of system libraries some load used, by basename
    system_hits: dict[str, set[str]] = field(default_factory=dict)
    roots: int = 0
    tests_skipped: int = 0


class Loader:
    """Simulates ld.so over ``elves`` (absolute path -> ElfInfo, regular files only)."""

    def __init__(self, root: str, elves: dict[str, elf.ElfInfo], sysdirs: list[str],
                 python: str | None, origins: dict[str, str] | None = None,
                 aliases: dict[str, str] | None = None):
        self.root = root
        self.elves = elves
        self.origins = origins or {}
        self.aliases = aliases or {}
        self.sysdirs = sysdirs
        self._names: dict[str, set[str]] = {}
        self._sysinfo: dict[str, elf.ElfInfo | None] = {}
        self.python = python
        self.python_info = elf.read_elf(python) if python else None
        self._preloaded: dict[str, str] = {}
        if self.python_info:  # what the program itself loaded, before any extension
            for need in self.python_info.needed:
                hit = self._search(need, self._dirs([], self.python_info, python, {}), python)
                if hit:
                    self._preloaded[need] = self.key(hit)

    # ------------------------------------------------------------------ searching
    def key(self, path: str) -> str:
        """The object ``path`` opens: the env file it names (following the env's own
        symlinks, libfoo.so -> libfoo.so.1, but not a clone's link to its package cache,
        which is the file as far as $ORIGIN goes), else its real path."""
        p = os.path.normpath(path)
        for _ in range(40):  # (ld.so's limit on link chains is the kernel's: 40)
            if p in self.elves:
                return p
            try:
                target = os.readlink(p)
            except OSError:
                break
            p = os.path.normpath(os.path.join(os.path.dirname(p), target))
        real = os.path.realpath(path)
        return self.aliases.get(real, real)

    def names_in(self, d: str) -> set[str]:
        got = self._names.get(d)
        if got is None:
            try:
                got = set(os.listdir(d))
            except OSError:
                got = set()
            self._names[d] = got
        return got

    def _fits(self, path: str, want: elf.ElfInfo) -> bool:
        """ld.so skips a candidate of another machine or class and searches on."""
        real = self.key(path)
        info = self.elves.get(real)
        if info is None:
            if real not in self._sysinfo:
                self._sysinfo[real] = elf.read_elf(real)
            info = self._sysinfo[real]
        if info is None:  # not ELF (a linker script), unreadable: skipped
            return False
        if info.damaged:  # found; ld.so then fails on it (reported as elf-damaged)
            return True
        return (info.machine, info.elfclass) == (want.machine, want.elfclass)

    def _expand(self, paths: list[str], obj: str) -> list[str]:
        # $ORIGIN: a library's is the directory it was opened in; a program's, the real
        # one (the kernel's /proc/self/exe), given in ``origins`` where they differ
        origin = self.origins.get(obj) or os.path.dirname(obj)
        return [os.path.normpath(p.replace("${ORIGIN}", origin).replace("$ORIGIN", origin))
                for p in paths]

    def _dirs(self, chain: list[str], info: elf.ElfInfo, obj: str,
              infos: dict[str, elf.ElfInfo]) -> list[str]:
        """The directories ld.so searches for a name ``obj`` needs (see the module doc);
        ``chain`` is obj's loaders, nearest first."""
        dirs: list[str] = []
        if not info.runpath:
            dirs += self._expand(info.rpath, obj)
            for up in chain:
                ui = infos[up]
                if not ui.runpath:
                    dirs += self._expand(ui.rpath, up)
            py = self.python_info
            if py is not None and obj != self.python and not py.runpath:
                dirs += self._expand(py.rpath, self.python)
        dirs += self._expand(info.runpath, obj)
        return dirs + self.sysdirs

    def _search(self, need: str, dirs: list[str], obj: str) -> str | None:
        want = self.elves.get(obj) or self.python_info
        for d in dirs:
            if need in self.names_in(d):
                p = os.path.join(d, need)
                if want is None or self._fits(p, want):
                    return p
        return None

    # ------------------------------------------------------------------ loading
    def load(self, start: str, program: bool, res: Result, kind: str,
             visited: set[str]) -> None:
        """One load of ``start`` (a program, or dlopened into the env's python)."""
        parent: dict[str, str | None] = {start: None}
        loaded: dict[str, str] = {} if program else dict(self._preloaded)
        info0 = self.elves[start]
        if info0.soname:
            loaded[info0.soname] = start
        loaded[os.path.basename(start)] = start
        queue = deque([start])
        saved_python = self.python_info
        if program:  # a program's own RPATH plays python's part
            self.python_info = None
        try:
            while queue:
                obj = queue.popleft()
                visited.add(obj)
                info = self.elves[obj]
                chain = []
                up = parent[obj]
                while up is not None:
                    chain.append(up)
                    up = parent[up]
                dirs = None
                for need in info.needed:
                    if need in loaded:
                        continue
                    if "/" in need:
                        hit = need if os.path.isabs(need) and os.path.exists(need) else None
                    else:
                        if dirs is None:
                            dirs = self._dirs(chain, info, obj, self.elves)
                        hit = self._search(need, dirs, obj)
                    if hit is None:
                        res.misses.append(Miss(obj, need, start, kind))
                        continue
                    real = self.key(hit)
                    loaded[need] = real
                    sub = self.elves.get(real)
                    if sub is None:
                        res.system_hits.setdefault(need, set()).add(real)
                        continue
                    if sub.soname:
                        loaded[sub.soname] = real
                    if real not in parent and not sub.damaged:
                        # $ORIGIN of what it loads is the directory it was found in
                        parent[real] = obj
                        queue.append(real)
        finally:
            self.python_info = saved_python


def simulate(root: str, elves: dict[str, elf.ElfInfo], sysdirs: list[str],
             python: str | None, origins: dict[str, str] | None = None,
             aliases: dict[str, str] | None = None) -> Result:
    """Load every root of the env (see the module doc) and collect what ld.so would miss.

    ``elves`` is keyed by the path each file is opened by: its real path, except a
    clone's links to its package cache (a non-owner's clone), which ld.so opens by the
    link's path and whose $ORIGIN is the link's directory; ``origins``: the real
    directory of each program among those (the kernel resolves a program's links);
    ``aliases``: the cache file behind each such link -> the link, so that a program run
    from the cache, which loads its package's libraries there, loads the env's file.
    """
    ld = Loader(root, elves, sysdirs, python, origins, aliases)
    res = Result()
    linked: set[str] = set()
    for info in elves.values():
        linked.update(info.needed)
    visited: set[str] = set()
    rels = {p: os.path.relpath(p, root) for p in elves}
    roots: list[tuple[str, bool, str]] = []
    later: list[str] = []
    for p, info in elves.items():
        rel = rels[p]
        if info.damaged or p == python:
            continue
        if is_test_program(rel, info):
            res.tests_skipped += 1
            continue
        if info.program:
            roots.append((p, True, "root"))
        elif is_extension(rel):
            roots.append((p, False, "root"))
        elif (info.soname or os.path.basename(p)) not in linked and \
                os.path.basename(p) not in linked:
            roots.append((p, False, "plugin" if plugin_tree(rel) else "root"))
        else:
            later.append(p)
    for p, program, kind in roots:
        ld.load(p, program, res, kind, visited)
    for p in later:  # linked by name, but no load reached it: judge it on its own
        if p not in visited:
            ld.load(p, False, res, "plugin" if plugin_tree(rels[p]) else "root", visited)
    res.roots = len(roots)
    _flavours(res, elves)
    return res


def _flavours(res: Result, elves: dict[str, elf.ElfInfo]) -> None:
    """Mark misses of another MPI's libmpi by an extension whose sibling uses the env's."""
    env_mpi = {info.soname for info in elves.values()
               if info.soname in MPI_FLAVOURS}
    if not env_mpi:
        return
    for m in res.misses:
        if m.need in MPI_FLAVOURS and m.need not in env_mpi and m.obj == m.root:
            d = os.path.dirname(m.obj)
            if any(os.path.dirname(p) == d and set(i.needed) & env_mpi
                   for p, i in elves.items()):
                m.kind = "flavour"

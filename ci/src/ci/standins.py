"""The offline upstream: a stand-in channel for what conda-forge would provide.

Built once into ``~/.cache/ddl-ce/upstream-channel`` and reused:

* ``recipes/upstream/*/recipe.yaml`` (python from the CPython source tarball) with
  rattler-build, sources from the verified source mirror;
* the wheels named in ``recipes/upstream/wheels.yaml`` and their dependency closure
  (resolved by pip for the *target* python and platform), converted to ``.conda``.

The main channel only depends on the stand-ins' names and versions, never on how they
were made, so a connected site simply uses conda-forge instead.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import yaml
from packaging.utils import canonicalize_name, parse_wheel_filename
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from ci.config import Settings, host_subdir
from ci.index import index_channel, packages_in
from ci.wheel2conda import (
    CONVERTER_VERSION,
    SUBDIR_MACHINE,
    WheelError,
    convert_wheel,
    mutex_dep,
)

if TYPE_CHECKING:
    from ci.build import ForeignTest, RunResult

console = Console(stderr=True)
WHEEL_STATE = ".wheels-state.json"


def resolve_channel_url(name: str) -> str:
    """A channel name or URL as rattler resolves it (no host names written here)."""
    if "://" in name or name.startswith("/"):
        return name
    from rattler import Channel

    return str(Channel(name).base_url)


def upstream_reachable(channels: list[str], timeout: float = 5.0) -> bool:
    """True when every configured upstream channel answers for ``noarch/repodata.json``."""
    if not channels:
        return False
    for ch in channels:
        url = resolve_channel_url(ch).rstrip("/")
        if url.startswith("/"):
            if not (Path(url) / "noarch" / "repodata.json").exists():
                return False
            continue
        try:
            req = urllib.request.Request(url + "/noarch/repodata.json", method="HEAD")
            with urllib.request.urlopen(req, timeout=timeout):
                pass
        except Exception:  # noqa: BLE001 - unreachable for whatever reason
            return False
    return True


def _fill_pins(reqs: list, pins: dict[str, str], path: Path, which: str) -> list[str]:
    """Each requirement with ``{key}`` filled from the pins. A key the pins lack is named
    with the file and the section (``which``), since the fix is in conda_build_config.yaml."""
    out = []
    for r in reqs:
        try:
            out.append(str(r).format(**pins))
        except KeyError as exc:
            raise KeyError(
                f"{path}: {which} requirement {r!r} names {exc}, which conda_build_config.yaml "
                "does not define; add the key there or write the version out."
            ) from None
    return out


def load_wheel_spec(recipes_dir: Path, pins: dict[str, str]) -> dict:
    """recipes/upstream/wheels.yaml with ``{key}`` filled from conda_build_config pins."""
    path = recipes_dir / "upstream" / "wheels.yaml"
    if not path.exists():
        return {"requirements": [], "platforms": {}, "python": "3.11"}
    spec = yaml.safe_load(path.read_text()) or {}
    spec["requirements"] = _fill_pins(spec.get("requirements") or [], pins, path, "a")
    for subdir, plat in (spec.get("platforms") or {}).items():
        if plat.get("requirements") is not None:
            plat["requirements"] = _fill_pins(plat["requirements"], pins, path, f"a {subdir}")
    cuda = spec.get("cuda") or {}
    if cuda:
        creqs = _fill_pins(cuda.get("requirements") or [], pins, path, "a cuda")
        if not cuda.get("version"):
            raise KeyError(f"{path}: the cuda section needs version: (the release's CUDA, "
                           "e.g. \"13.0\"), which its builds require of the driver")
        spec["cuda"] = {"version": str(cuda["version"]), "requirements": creqs,
                        "builds": [str(b) for b in cuda.get("builds") or []]}
    return spec


def _pip_platform_args(arch: str, glibc: str) -> list[str]:
    """``--platform`` for every manylinux tag up to ``glibc`` (pip does not expand them)."""
    major, minor = (int(x) for x in glibc.split("."))
    tags = [f"manylinux_{major}_{m}_{arch}" for m in range(minor, 4, -1)]
    tags += [f"manylinux2014_{arch}"]
    if arch in ("x86_64", "i686"):
        tags += [f"manylinux2010_{arch}", f"manylinux1_{arch}"]
    return [a for t in tags for a in ("--platform", t)]


def download_wheels(spec: dict, subdir: str, dest: Path, *, what: str = "") -> list[Path]:
    """pip-download the requirements' closure for ``subdir`` (skipped when unchanged)."""
    plat = (spec.get("platforms") or {}).get(subdir)
    if not plat:
        return []
    python = str(spec.get("python", "3.11"))
    dest.mkdir(parents=True, exist_ok=True)
    key = hashlib.sha256(json.dumps([spec["requirements"], plat, python]).encode()).hexdigest()[:16]
    stamp = dest / f".complete-{key}"
    listing = dest / f".wheels-{key}.txt"
    if stamp.exists() and listing.exists():
        files = [dest / n for n in listing.read_text().split()]
        if all(f.exists() for f in files):
            return files
    before = set(dest.glob("*.whl"))
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--disable-pip-version-check",
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        "cp" + python.replace(".", ""),
        "--abi",
        "abi3",
        "--abi",
        "none",
        *_pip_platform_args(plat["arch"], str(plat.get("glibc", "2.28"))),
        "-d",
        str(dest),
        *spec["requirements"],
    ]
    console.print(
        f"[bold]stand-ins[/]: pip download {len(spec['requirements'])} {what}requirements "
        f"and their closure for {subdir} (python {python})"
    )
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(
            "pip could not download the stand-in wheels:\n"
            + proc.stderr[-3000:]
            + "\nCheck that a PyPI index (or a local wheel directory via PIP_FIND_LINKS) "
            "is reachable."
        )
    # pip names every file of the closure: "Saved <path>" or "File was already downloaded <path>"
    names = []
    for line in proc.stdout.splitlines():
        line = line.strip()
        for lead in ("Saved ", "File was already downloaded "):
            if line.startswith(lead) and line.endswith(".whl"):
                names.append(Path(line[len(lead) :]).name)
    files = [dest / n for n in dict.fromkeys(names) if (dest / n).exists()]
    if not files:
        files = sorted(set(dest.glob("*.whl")) - before) or sorted(dest.glob("*.whl"))
    listing.write_text("\n".join(f.name for f in files))
    stamp.touch()
    return files


#: wheels above this size are compressed at zstd level 1 instead of 3: the CUDA set is
#: ~3 GB of wheels, and level 1 converts it in about half the time for ~10% more bytes
HUGE = 100 << 20


def convert_all(wheels: list[Path], subdir: str, channel: Path, python: str,
                cuda: dict | None = None, extras_from: list[Path] | None = None) -> list[dict]:
    """Convert wheels not yet in the stand-in channel; staging then atomic move + index.

    ``cuda`` (wheels.yaml's cuda section): the distributions in its ``builds`` become CUDA
    builds (see wheel2conda.convert_wheel). ``extras_from``: the wheels whose
    ``X[extra]`` requirements count (default: ``wheels``)."""
    from ci.wheel2conda import marker_env, requested_extras

    cuda_builds = {str(canonicalize_name(b)) for b in (cuda or {}).get("builds", [])}
    extras = requested_extras(extras_from or wheels, marker_env(python, subdir))
    state_path = channel / WHEEL_STATE
    state = json.loads(state_path.read_text()) if state_path.exists() else {}
    have = packages_in(channel)
    def lacks_mutex(w: Path) -> bool:
        """An MPI package converted before it depended on the MPI mutex: its depends
        change, so it is converted again (patching the info part cannot add them)."""
        return (mutex_dep(state[w.name]["name"]) or "") not in [*state[w.name]["depends"], ""]

    todo = [
        w
        for w in wheels
        if not (
            w.name in state
            and state[w.name]["key"] in have
            and state[w.name].get("converter") == CONVERTER_VERSION
            and not lacks_mutex(w)
        )
    ]
    # packages of the previous converter only lack link.json and a timestamp: patched in
    # place (their sha256 changes, so the channel is indexed again from scratch)
    from ci.wheel2conda import PATCHABLE_CONVERTER, upgrade_converted

    patch = [w for w in todo if w.name in state and state[w.name]["key"] in have
             and state[w.name].get("converter") == PATCHABLE_CONVERTER and not lacks_mutex(w)]
    for w in patch:
        upgrade_converted(have[state[w.name]["key"]], w)
        state[w.name]["converter"] = CONVERTER_VERSION
    todo = [w for w in todo if w not in patch]
    staging = channel.parent / f".standins-staging-{os.getpid()}"
    if patch and not todo:
        index_channel(channel, [subdir], force=True)
        state_path.write_text(json.dumps(state, indent=1, sort_keys=True))
    reconverted = any(w.name in state for w in todo)
    if todo:
        with Progress(
            TextColumn("[bold]stand-ins[/] converting wheels"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.description}"),
            console=console,
        ) as prog:
            task = prog.add_task("", total=len(todo))
            for w in sorted(todo, key=lambda p: -p.stat().st_size):
                prog.update(task, description=w.name[:60])
                dist = str(canonicalize_name(str(parse_wheel_filename(w.name)[0])))
                try:
                    pkg = convert_wheel(
                        w, staging, subdir=subdir, python=python,
                        compression_level=1 if w.stat().st_size > HUGE else 3,
                        extras=extras.get(dist, frozenset()),
                        cuda=cuda["version"] if cuda and dist in cuda_builds else None)
                except WheelError:
                    raise
                except Exception as exc:  # noqa: BLE001
                    raise WheelError(f"{w}: conversion failed: {exc}") from exc
                dest = channel / pkg.subdir / pkg.path.name
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(pkg.path, dest)
                state[w.name] = {
                    "key": f"{pkg.subdir}/{pkg.path.name}",
                    "name": pkg.name,
                    "version": pkg.version,
                    "depends": pkg.depends,
                    "license": pkg.license,
                    "converter": CONVERTER_VERSION,
                }
                prog.advance(task)
                if not console.is_terminal:  # logs (CI, make > file) get plain lines
                    done = int(prog.tasks[0].completed)
                    console.print(f"stand-ins: converted {done}/{len(todo)} {pkg.path.name}")
        shutil.rmtree(staging, ignore_errors=True)
        # (a package converted again keeps its file name: re-read them all)
        index_channel(channel, [subdir], force=bool(patch) or reconverted)
        state_path.write_text(json.dumps(state, indent=1, sort_keys=True))
    return [state[w.name] for w in wheels if w.name in state]


def check_closure(converted: list[dict], channel: Path) -> list[str]:
    """Dependencies that no package in the stand-in channel provides (should be none)."""
    names = {k.split("/")[1].rsplit("-", 2)[0] for k in packages_in(channel)}
    missing = []
    for c in converted:
        for d in c["depends"]:
            if d.startswith("__"):
                continue  # virtual packages (__cuda): the machine provides them
            if d.split()[0] not in names:
                missing.append(f"{c['name']} needs {d}")
    return missing


def cuda_wanted() -> bool:
    """Whether the CUDA stand-ins are made: yes, unless DDLCE_CUDA=0 (a CPU-only site, or a
    quick local run; the CUDA builds of powerai then drop out of the render with a reason)."""
    return os.environ.get("DDLCE_CUDA", "1").strip() not in ("0", "no", "off", "false")


def build_source_standins(settings: Settings, platform: str, *,
                          foreign_test: ForeignTest | None = None) -> RunResult:
    """The stand-ins built from source (recipes/upstream: python) for ``platform`` into the
    stand-in channel; a package already there is kept. For a foreign platform the cross
    sysroot must be prepared (DDLCE_SYSROOT) and ``foreign_test`` runs each package's
    cross_test.sh under emulation; there a failure is reported, not raised, so the other
    platforms still build."""
    from ci.build import run_builds
    from ci.graph import build_graph
    from ci.mirror import SourceMirror
    from ci.render import find_recipes, render_all

    # one python: the stand-in's own version (wheels.yaml's), which numpy and mpi4py
    # are built for; the other values need an upstream that has them
    python = str(load_wheel_spec(settings.recipes_dir, settings.pins()).get("python", "3.11"))
    variants = {**settings.variants, "python": [python]}
    nodes = render_all(find_recipes(settings.recipes_dir, upstream=True), variants, [platform])
    return run_builds(
        build_graph(nodes),
        variants=variants,
        channel_dir=settings.upstream_dir,
        work_dir=settings.work_dir / "upstream",
        channels=[],
        mirror=SourceMirror(settings.mirror_dir),
        continue_on_failure=foreign_test is not None,
        foreign_test=foreign_test,
    )


def build_standins(settings: Settings, *, platforms: list[str] | None = None) -> dict:
    """Ensure the stand-in channel exists and is complete; return a summary for the report."""
    from ci.render import find_recipes

    t0 = time.monotonic()
    up = settings.upstream_dir
    here = host_subdir()
    index_channel(up, [here])
    summary: dict = {"channel": str(up), "recipes": [], "wheels": [], "unavailable": {}}
    # 1. source-built stand-ins (python), for this platform only: they are native builds
    if find_recipes(settings.recipes_dir, upstream=True):
        res = build_source_standins(settings, here)
        if res.failed:
            raise RuntimeError(
                "stand-in build failed: "
                + "; ".join(f"{o.node.name}: {o.error or o.test_status}" for o in res.failed)
            )
        summary["recipes"] = [o.node.key for o in res.outcomes]
        summary["recipe_stages"] = res.stages
        summary["recipe_outcomes"] = res.outcomes
    # 2. wheel stand-ins
    spec = load_wheel_spec(settings.recipes_dir, settings.pins())
    python = str(spec.get("python", "3.11"))
    for subdir in platforms or settings.target_platforms:
        if subdir not in (spec.get("platforms") or {}) or SUBDIR_MACHINE.get(subdir) is None:
            summary["unavailable"][subdir] = "no wheel platform configured"
            continue
        plat = spec["platforms"][subdir]
        # a platform may list its own requirements: those PyPI has wheels of there (the
        # rest is built from source, recipes/upstream)
        pspec = {**spec, "requirements": plat.get("requirements") or spec["requirements"]}
        t1 = time.monotonic()
        wheels = download_wheels(pspec, subdir, settings.wheels_dir / subdir)
        t2 = time.monotonic()
        converted = convert_all(wheels, subdir, up, python)
        summary["wheels"] += converted
        summary.setdefault("stages", {})[f"download ({subdir})"] = t2 - t1
        summary["stages"][f"convert ({subdir})"] = time.monotonic() - t2
        cuda = spec.get("cuda") if plat.get("cuda", True) else None
        if cuda and cuda_wanted():
            t1 = time.monotonic()
            cwheels = download_wheels({**spec, "requirements": cuda["requirements"]}, subdir,
                                      settings.wheels_dir / subdir, what="CUDA ")
            local = [w for w in cwheels if str(canonicalize_name(
                str(parse_wheel_filename(w.name)[0]))) in cuda["builds"] and
                parse_wheel_filename(w.name)[1].local]
            if local:
                raise RuntimeError(
                    f"the CUDA set got {local[0].name}, a local-version (+cpu) build: pin the "
                    "framework with === in wheels.yaml's cuda requirements (torch==={pytorch}"
                    "), since pip ranks 2.13.0+cpu above 2.13.0 and == matches both")
            t2 = time.monotonic()
            cconv = convert_all(cwheels, subdir, up, python, cuda=cuda,
                                extras_from=wheels + cwheels)
            summary["wheels"] += [c for c in cconv if c not in summary["wheels"]]
            summary["stages"][f"download CUDA set ({subdir})"] = t2 - t1
            summary["stages"][f"convert CUDA set ({subdir})"] = time.monotonic() - t2
            summary["cuda"] = {"version": cuda["version"],
                               "packages": sorted({c["name"] for c in cconv})}
            converted = converted + cconv
        missing = check_closure(converted, up)
        if missing:
            raise RuntimeError("stand-in closure incomplete: " + "; ".join(missing[:20]))
    summary["seconds"] = time.monotonic() - t0
    return summary

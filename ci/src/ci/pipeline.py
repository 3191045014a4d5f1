"""The channel pipeline: render -> graph -> build -> test -> publish -> install -> report.

Each stage is a function of :class:`~ci.config.Settings` and the previous stage's result,
so a test (or another front end) can run one alone; :func:`build` and :func:`channel`
chain them the way `python -m ci build` and `make channel` do and return a
:class:`PipelineResult`. Stages raise :class:`~ci.errors.CiError` for what stops a run
(bad input: a recipe that does not render, a cycle, a missing cross toolchain; an
upstream that cannot be built) and only ever *report* package failures, in the result.
Nothing here prints an error and exits: the command line (ci.cli) does that, once.
"""

from __future__ import annotations

import functools
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from pathlib import Path

import networkx as nx
from rich.console import Console

from ci.build import ForeignTest, RunResult, release_cuda
from ci.config import Settings, host_subdir
from ci.errors import CiError

console = Console(stderr=True)

#: modules that must import in the installed powerai (envtools validate imports them)
POWERAI_IMPORTS = [
    "ddl_core", "numpy", "mpi4py", "torch", "tensorflow", "keras", "sklearn", "h5py",
    "xgboost", "horovod",
]
POWERAI_COMMANDS = [["envtools", "--help"], ["ddlrun", "--help"]]
_NOT_NATIVE = (
    "python, numpy, pytorch, tensorflow and the Python packages built on them need a native build"
)


@dataclass
class Options:
    """What to build: the command line's choices, with `make channel`'s defaults."""

    packages: list[str] | None = None
    platforms: list[str] = field(default_factory=lambda: [host_subdir()])
    continue_on_failure: bool = False
    tests: bool = True
    force: bool = False
    #: channels overriding upstream_channels (a folder or a name)
    upstream: list[str] | None = None


@dataclass
class Rendered:
    """The render and graph stages' result: what will be built, in which order."""

    graph: nx.DiGraph
    variants: dict
    recipes: list[Path]
    #: variant values and recipes not built here, each with its reason
    dropped: list[str] = field(default_factory=list)
    #: recipes that did not render (only with continue_on_failure; else CiError)
    errors: list[str] = field(default_factory=list)


@dataclass
class PipelineResult:
    """Everything a run did: the packages' outcomes, per-stage times and what the report
    and the command line show."""

    run: RunResult
    graph: nx.DiGraph | None = None
    stages: dict[str, float] = field(default_factory=dict)
    #: the stand-in summary when the offline upstream was used (else None)
    upstream: dict | None = None
    dropped: list[str] = field(default_factory=list)
    #: platform -> what is not built for it, and why
    unavailable: dict[str, str] = field(default_factory=dict)
    graph_png: Path | None = None
    #: the installed powerai's facts and checks (`make channel` only)
    install: dict[str, str] | None = None
    report: Path | None = None

    @property
    def install_ok(self) -> bool:
        return not any(v.startswith("FAILED") for v in (self.install or {}).values())

    @property
    def ok(self) -> bool:
        return self.run.ok and self.install_ok

    def absorb(self, other: PipelineResult, platform: str) -> None:
        """Add a run for another platform (a cross build) to this one."""
        if other.graph is not None:
            self.graph = other.graph if self.graph is None else nx.compose(self.graph, other.graph)
        self.run.outcomes += other.run.outcomes
        self.run.published += other.run.published
        self.run.recipe_errors += [e for e in other.run.recipe_errors
                                   if e not in self.run.recipe_errors]
        for k, v in other.stages.items():
            if k not in ("upstream", "report"):
                self.stages[k if platform in k else f"{k} ({platform})"] = v
        # what its render dropped, and why (linux-aarch64: build_type=cpu, mpi=mpich)
        self.dropped += [f"{platform}: {d}" for d in other.dropped
                         if f"{platform}: {d}" not in self.dropped and d not in self.dropped]


class _Timer:
    """``with _Timer(stages, "render"):`` records the block's wall time under a name."""

    def __init__(self, stages: dict[str, float], name: str) -> None:
        self.stages, self.name = stages, name

    def __enter__(self) -> None:
        self.t = time.monotonic()

    def __exit__(self, *exc: object) -> None:
        self.stages[self.name] = time.monotonic() - self.t


# ---- upstream ----------------------------------------------------------------------------


def has_package_factory(
    channels: list[str], platforms: list[str]
) -> Callable[..., bool] | None:
    """has_package(spec, build=None) over local channel folders, for ``platforms`` (+ noarch).

    Remote channels are assumed to have everything (conda-forge does), so None is
    returned when any channel is remote, or when none is known yet (nothing to filter by).
    """
    from rattler import MatchSpec, Version, VersionSpec

    local = [Path(c) for c in channels if Path(c).is_dir()]
    if not channels or len(local) < len(channels):
        return None
    records = []
    for ch in local:
        for sub in [*platforms, "noarch"]:
            rd = ch / sub / "repodata.json"
            if not rd.exists():
                continue
            data = json.loads(rd.read_text())
            for section in ("packages", "packages.conda"):
                records += [(r["name"], r["version"], r.get("build", ""))
                            for r in (data.get(section) or {}).values()]

    def has(spec: str, build: str | None = None) -> bool:
        """Whether some package matches ``spec`` (and the build-string glob ``build``)."""
        ms = MatchSpec(spec)
        return any(
            n == ms.name.normalized
            and (ms.version is None or VersionSpec(str(ms.version)).matches(Version(v)))
            and (build is None or fnmatchcase(b, build))
            for n, v, b in records
        )

    return has


def resolve_upstream(s: Settings, upstream: list[str] | None, platforms: list[str]) -> dict | None:
    """Set ``s.channels`` to what builds solve against: the given channels, the configured
    upstream when it answers, else the stand-in channel (built once, then reused), whose
    summary is returned for the report."""
    from ci.standins import build_standins, upstream_reachable

    if upstream:
        s.channels = [str(Path(u).resolve()) if Path(u).exists() else u for u in upstream]
        return None
    if upstream_reachable(s.upstream_channels):
        s.channels = list(s.upstream_channels)
        console.print(f"[bold]upstream[/]: {', '.join(s.channels)}")
        return None
    console.print(
        f"[bold]upstream[/]: {', '.join(s.upstream_channels) or '(none configured)'} "
        f"not reachable: using the stand-in channel {s.upstream_dir} (built once, then reused)"
    )
    try:
        summary = build_standins(s, platforms=platforms)
    except (CiError, RuntimeError, KeyError) as exc:
        raise CiError(
            f"the offline upstream could not be built: {exc}",
            f"logs: {s.work_dir / 'upstream' / 'logs'}",
            code=1,
        ) from None
    s.channels = [str(s.upstream_dir)]
    return summary


# ---- cross -------------------------------------------------------------------------------


def prepare_foreign(s: Settings, platforms: list[str], stages: dict[str, float]) -> ForeignTest:
    """Check the cross toolchain of every foreign platform, unpack its sysroot, and return
    the emulated test for cross-built packages; an unknown platform or a missing tool is a
    CiError naming what to install."""
    from ci.cross import CROSS_PLATFORMS, emulated_test, missing_tools, prepare

    for p in platforms:
        if p == host_subdir():
            continue
        if p not in CROSS_PLATFORMS:
            raise CiError(
                f"no cross toolchain known for {p}",
                f"cross builds know {', '.join(sorted(CROSS_PLATFORMS))}; build {p} on a "
                "native runner (python -m ci matrix writes such jobs)",
            )
        lacking = missing_tools(p)
        if lacking:
            raise CiError(
                f"cross-building for {p} needs {', '.join(lacking)}",
                f"install them: apt-get install {' '.join(_apt_names(p, lacking))}",
            )
        with _Timer(stages, f"sysroot ({p})"):
            prepare(s.cache, p)
    # the env of an emulated test is one of a GPU node with a driver for the release's
    # CUDA, where the CUDA builds (linux-aarch64's pytorch) install
    return functools.partial(emulated_test, cuda=release_cuda(s.variants))


def _apt_names(platform: str, tools: list[str]) -> list[str]:
    """The Debian packages that provide ``tools`` (a cross gcc, qemu-user, file, dpkg)."""
    out = []
    for t in tools:
        if t.endswith(("-gcc", "-g++")):
            triplet, _, compiler = t.rpartition("-")
            out.append(f"{compiler}-{triplet}")
        elif t.startswith("qemu-"):
            out.append("qemu-user")
        else:
            out.append(t)
    return list(dict.fromkeys(out))


# ---- render + graph ----------------------------------------------------------------------


def render_graph(
    s: Settings,
    platforms: list[str],
    *,
    packages: list[str] | None = None,
    continue_on_failure: bool = False,
) -> Rendered:
    """Render every recipe for every variant the upstream can satisfy and ``platforms``,
    and order the outputs in a DAG (only ``packages`` and what they need, if given).
    A recipe that does not render raises RecipeError, unless ``continue_on_failure``:
    then it is listed in ``errors`` and the others go on. A cycle raises CycleError."""
    from ci.graph import build_graph, select
    from ci.render import filter_variants, find_recipes, render_all

    variants, dropped = filter_variants(s, has_package_factory(s.channels, platforms),
                                        cross=any(p != host_subdir() for p in platforms))
    recipes = find_recipes(s.recipes_dir)
    if not recipes:
        raise CiError(
            f"no */recipe.yaml under {s.recipes_dir}",
            "--recipes takes a folder of recipe folders, each with a recipe.yaml",
        )
    errors: list[str] = []
    skipped: list[str] = []
    nodes = render_all(recipes, variants, platforms, skipped,
                       errors if continue_on_failure else None)
    g = build_graph(nodes)
    if packages:
        g = select(g, packages)
    return Rendered(g, variants, recipes, dropped + [f"recipe {x}" for x in skipped], errors)


def plan(s: Settings, platforms: list[str]) -> Rendered:
    """`python -m ci render`: every output of every recipe for every variant (no upstream
    filter) and platform, in build order."""
    return render_graph(s, platforms)


# ---- build + test + publish --------------------------------------------------------------


def build_test_publish(
    s: Settings, r: Rendered, opts: Options, foreign_test: ForeignTest | None
) -> RunResult:
    """The build, test and publish steps over the rendered graph (ci.build)."""
    from ci.build import build_step, open_batch, publish_step, test_step
    from ci.mirror import SourceMirror

    b = open_batch(r.graph, channel_dir=s.channel_dir, work_dir=s.work_dir, channels=s.channels)
    build_step(b, variants=r.variants, mirror=SourceMirror(s.mirror_dir), force=opts.force,
               continue_on_failure=opts.continue_on_failure)
    test_step(b, run_tests=opts.tests, foreign_test=foreign_test)
    res = publish_step(b, continue_on_failure=opts.continue_on_failure)
    res.recipe_errors = list(r.errors)
    return res


def run(s: Settings, opts: Options, *, foreign_test: ForeignTest | None = None) -> PipelineResult:
    """upstream -> (cross set-up) -> render -> graph -> build -> test -> publish; no report
    (see :func:`write_report`)."""
    stages: dict[str, float] = {}
    with _Timer(stages, "upstream"):
        up = resolve_upstream(s, opts.upstream, opts.platforms)
    if foreign_test is None and any(p != host_subdir() for p in opts.platforms):
        foreign_test = prepare_foreign(s, opts.platforms, stages)
    with _Timer(stages, "render"):
        r = render_graph(s, opts.platforms, packages=opts.packages,
                         continue_on_failure=opts.continue_on_failure)
    for err in r.errors:
        console.print(f"[red]render FAILED[/]: {err}", highlight=False)
    dropped = f" (dropped: {'; '.join(r.dropped)})" if r.dropped else ""
    console.print(
        f"[bold]render[/]: {len(r.recipes)} recipes -> {r.graph.number_of_nodes()} outputs for "
        f"{', '.join(opts.platforms)}{dropped}"
    )
    res = build_test_publish(s, r, opts, foreign_test)
    stages.update(res.stages)
    return PipelineResult(
        run=res,
        graph=r.graph,
        stages=stages,
        upstream=up,
        dropped=r.dropped,
        unavailable=dict((up or {}).get("unavailable") or {}),
    )


def cross_build(s: Settings, res: PipelineResult, *, continue_on_failure: bool) -> None:
    """Every foreign target platform, cross-built and tested under emulation, added to
    ``res``: libddl always; offline, the source stand-ins (python, and where PyPI has no
    wheels numpy and mpi4py); then, where the upstream has python and numpy for the
    platform, ddl and powerai, and where it has pytorch too (linux-aarch64) ddl-torch,
    so powerai there pins the whole set. A platform that cannot be cross-built here is
    named as unavailable; a failure is that platform's, and the others still publish."""
    from ci.cross import CROSS_PLATFORMS, missing_tools
    from ci.standins import build_source_standins

    here = host_subdir()
    for p in s.target_platforms:
        if p == here:
            continue
        if p not in CROSS_PLATFORMS or missing_tools(p) or not res.run.ok:
            lacking = ", ".join(missing_tools(p)) if p in CROSS_PLATFORMS else "a cross toolchain"
            res.unavailable[p] = (
                f"{_NOT_NATIVE}; libddl not cross-built either "
                f"(missing: {lacking or 'a clean native build'})"
            )
            continue
        foreign_test = prepare_foreign(s, [p], res.stages)
        if s.channels == [str(s.upstream_dir)]:  # offline: the source stand-ins, cross-built
            console.print(f"[bold]cross[/]: stand-ins from source for {p} (qemu-user tests)")
            with _Timer(res.stages, f"cross stand-ins ({p})"):
                up = build_source_standins(s, p, foreign_test=foreign_test)
            _show_cross_standins(res, up)
            # and the platform's wheel stand-ins (wheels.yaml), before asking what the
            # upstream has for it: they decide which of ddl, ddl-torch and powerai follow
            with _Timer(res.stages, f"wheel stand-ins ({p})"):
                resolve_upstream(s, None, [p])
        has = has_package_factory(s.channels, [p])
        python_stack = has is None or (has("python") and has("numpy"))
        frameworks = has is None or has("pytorch")
        packages = ["libddl", "ddl", "powerai"] if python_stack else ["libddl"]
        if python_stack and frameworks:  # ddl_torch._C, built against the target's torch
            packages.insert(2, "ddl-torch")
        console.print(f"[bold]cross[/]: {', '.join(packages)} for {p} (cross gcc, target "
                      "sysroot, qemu-user tests)")
        opts = Options(packages=packages, platforms=[p], continue_on_failure=continue_on_failure)
        res.absorb(run(s, opts, foreign_test=foreign_test), p)
        if python_stack and frameworks:
            res.unavailable.pop(p, None)
        elif python_stack:
            res.unavailable[p] = (
                "pytorch, tensorflow, keras, pytorch-ddl, tensorflow-ddl and the companions "
                "(PyPI has no wheels of them for this platform; a native build or conda-forge "
                "provides them); powerai here pins python, numpy, mpi4py, ddl, envtools and "
                "horovod-ddl, all tested under qemu-user")
        else:
            have = "python and libddl are" if has is not None and has("python") else "libddl is"
            res.unavailable[p] = (f"{_NOT_NATIVE}; {have} cross-built here and tested under "
                                  "qemu-user (the upstream has no numpy for this platform)")


def _show_cross_standins(res: PipelineResult, up: RunResult) -> None:
    """The cross-built stand-ins' outcomes, in the console and the report's upstream part
    (a failure there is that platform's, and the others still publish)."""
    rows = (res.upstream if res.upstream is not None else {}).setdefault("cross", [])
    for o in up.outcomes:
        rows.append(f"{o.node.key}: {o.status}, emulated test {o.test_status}")
        good = o.status in ("built", "skipped") and o.test_status != "failed"
        colour = "green" if good else "red"
        console.print(f"[{colour}]cross stand-in[/] {o.node.key}: {o.status} "
                      f"(test: {o.test_status})", highlight=False)
        if o.test_status == "failed" or o.error:
            console.print((o.error or o.test_output or "")[-2000:], highlight=False)


# ---- install -----------------------------------------------------------------------------


def install(s: Settings, res: PipelineResult, prefix: Path) -> dict[str, str]:
    """Make the channel self-contained, publish the stand-ins (offline), install powerai
    into the read-only ``prefix`` with envtools and check it: imports, CLIs, one libddl,
    envtools module + validate. Returns the facts and checks shown in the report; a
    failed envtools install raises its error (CiError)."""
    from ci.install import check_env, install_powerai, one_libddl
    from ci.vendor import publish_upstream, vendor_closure

    here = host_subdir()
    version = next((o.node.version for o in res.run.outcomes if o.node.name == "powerai"), "0")
    platforms = list(dict.fromkeys([here, *s.target_platforms]))
    # every platform's powerai (a cross-built one too) gets its upstream closure, so each
    # channel/<subdir> installs on its own
    with _Timer(res.stages, "vendor upstream closure"):
        added = sum(vendor_closure(s.channel_dir, s.channels, p) for p in platforms)
    if added:
        console.print(f"[bold]channel[/]: {added} upstream packages copied in (self-contained)")
    upstream_chans = list(s.channels)
    if s.channels == [str(s.upstream_dir)]:  # offline: the stand-ins, published
        pub = s.root / "channel-upstream"
        with _Timer(res.stages, "publish channel-upstream"):
            n = publish_upstream(s.upstream_dir, pub, platforms)
        console.print(f"[bold]channel-upstream[/]: {pub} ({n} packages added or replaced)")
        upstream_chans = [str(pub.resolve())]
    with _Timer(res.stages, "install powerai"):
        inst = install_powerai([str(s.channel_dir.resolve()), *upstream_chans], prefix)
    with _Timer(res.stages, "check powerai"):
        checks = check_env(prefix, f"powerai/{version}", s.root / "modulefiles",
                           POWERAI_IMPORTS, POWERAI_COMMANDS)
        checks["one libddl"] = one_libddl(prefix)
    cuda_builds = [o for o in res.run.outcomes
                   if o.node.name == "powerai" and o.node.variant.get("build_type") == "cuda"]
    if cuda_builds and os.environ.get("DDLCE_CUDA_ENV", "1") != "0":
        # the CUDA build, installed as on a login node without a GPU: the solver takes
        # it because a driver is described, then the same checks (torch imports fine
        # without a GPU; validate says no driver is here, as a note)
        cuda = cuda_builds[0].node.variant.get("cuda_compiler_version", "")
        cprefix = prefix.with_name(prefix.name + "-cuda")
        with _Timer(res.stages, "install powerai (CUDA build)"):
            cinst = install_powerai([str(s.channel_dir.resolve()), *upstream_chans], cprefix,
                                    cuda=cuda)
        with _Timer(res.stages, "check powerai (CUDA build)"):
            cchecks = check_env(cprefix, f"powerai/{version}-cuda", s.root / "modulefiles",
                                ["ddl_core", "torch", "tensorflow", "horovod"],
                                [["ddlrun", "--help"]])
            cchecks["one libddl"] = one_libddl(cprefix)
        checks.update({f"cuda: {k}": v for k, v in cchecks.items()})
        checks["cuda: prefix"] = (
            f"{cprefix} ({cinst.packages} packages, --virtual __cuda={cuda}, "
            + ("up to date" if cinst.skipped else f"installed in {cinst.install_seconds:.1f} s")
            + ")")
    return {
        "prefix": str(prefix),
        "installed with": "envtools",
        "packages": str(inst.packages),
        "solve (s)": f"{inst.solve_seconds:.2f}",
        "install (s)": "up to date" if inst.skipped else f"{inst.install_seconds:.1f}",
        **checks,
    }


# ---- report ------------------------------------------------------------------------------


def draw(s: Settings, res: PipelineResult) -> None:
    """channel/build-graph.png of every platform's graph; redrawn only when the graph
    changed (matplotlib alone costs seconds of a rerun's 20 s)."""
    from ci.report import draw_graph, graph_key

    if res.graph is None:
        return
    png = s.channel_dir / "build-graph.png"
    key_file = s.work_dir / "build-graph.key"
    key = graph_key(res.graph)
    try:
        if not (png.exists() and key_file.exists() and key_file.read_text() == key):
            draw_graph(res.graph, png)
            key_file.parent.mkdir(parents=True, exist_ok=True)
            key_file.write_text(key)
        res.graph_png = png
    except Exception as exc:  # noqa: BLE001 - a missing picture must not fail the build
        console.print(f"[yellow]graph picture not drawn: {exc}")


def write_report(s: Settings, res: PipelineResult) -> Path:
    """channel/build-graph.png and channel/REPORT.md for this run; sets and returns
    ``res.report``."""
    from ci.report import write_report as _write

    with _Timer(res.stages, "report"):
        draw(s, res)
    res.report = _write(
        s.channel_dir,
        res.run,
        graph_png=res.graph_png.name if res.graph_png else None,
        stages=res.stages,
        dropped=res.dropped,
        unavailable=res.unavailable,
        upstream=res.upstream,
        install=res.install,
    )
    return res.report


# ---- the two chains ----------------------------------------------------------------------


def build(s: Settings, opts: Options) -> PipelineResult:
    """`python -m ci build`: render -> graph -> build -> test -> publish -> report."""
    res = run(s, opts)
    write_report(s, res)
    return res


def channel(s: Settings, prefix: Path, *, continue_on_failure: bool = False) -> PipelineResult:
    """`make channel`: the native build, the cross builds, then (when all is well) powerai
    installed into ``prefix`` and checked, then the report."""
    res = run(s, Options(continue_on_failure=continue_on_failure))
    cross_build(s, res, continue_on_failure=continue_on_failure)
    if res.run.ok:
        try:
            res.install = install(s, res, prefix if prefix.is_absolute() else s.root / prefix)
        except CiError as exc:
            # the report says why there is no env; then the error ends the run, as any
            # stage's does
            res.install = {"install": f"FAILED: {exc}"}
            write_report(s, res)
            raise
    write_report(s, res)
    return res

"""`python -m ci`: the channel pipeline's command line.

`channel` is what `make channel` runs (stand-ins if needed, build, test, index, install
powerai, report); the other commands run one stage each so a site can rebuild a single
package (`build --packages ddl`), regenerate the CI matrix or time the pipeline.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from ci.config import Settings, host_subdir, load_settings

VARIANT_AXES = ("python", "mpi", "build_type", "cuda_compiler_version")
app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__)
console = Console(stderr=True)

RecipesOpt = Annotated[
    Path | None, typer.Option("--recipes", help="recipes folder (default: recipes/)")
]
ChannelOpt = Annotated[
    Path | None, typer.Option("--channel", help="output channel (default: channel/)")
]
ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="variant config (default: conda_build_config.yaml)")
]
UpstreamOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--upstream", help="upstream channel(s), overriding upstream_channels (a dir or a name)"
    ),
]
PlatformOpt = Annotated[
    list[str] | None,
    typer.Option("--platform", help="target platform(s) (default: this machine's)"),
]


def repo_root() -> Path:
    """The checkout ci works in: the nearest folder holding conda_build_config.yaml."""
    here = Path.cwd()
    for p in [here, *here.parents]:
        if (p / "conda_build_config.yaml").exists():
            return p
    return here


def _settings(recipes: Path | None, channel: Path | None, config: Path | None) -> Settings:
    root = repo_root()
    try:
        s = load_settings(root, recipes_dir=recipes, cbc_path=config, channel_dir=channel)
    except (FileNotFoundError, ValueError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    if recipes is not None:
        s.work_dir = (channel or s.channel_dir).parent / ".ci-work"
    return s


def _has_package_factory(channels: list[str], platforms: list[str]):
    """has_package(spec) over local channel folders, for ``platforms`` (+ noarch).

    Remote channels are assumed to have everything (conda-forge does), so None is
    returned when any channel is remote.
    """
    from rattler import MatchSpec

    local = [Path(c) for c in channels if Path(c).is_dir()]
    if len(local) < len(channels):
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
        from fnmatch import fnmatchcase

        ms = MatchSpec(spec)
        return any(
            n == ms.name.normalized and (ms.version is None or _vs(ms.version).matches(_v(v)))
            and (build is None or fnmatchcase(b, build))
            for n, v, b in records
        )

    return has


def _vs(spec: str):
    from rattler import VersionSpec

    return VersionSpec(spec)


def _v(v: str):
    from rattler import Version

    return Version(v)


def resolve_upstream(
    s: Settings, upstream: list[str] | None, *, platforms: list[str]
) -> dict | None:
    """Pick the channels builds solve against; build the stand-ins when offline."""
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
        "not reachable: "
        f"using the stand-in channel {s.upstream_dir} (built once, then reused)"
    )
    from ci.mirror import ChecksumError, MirrorMiss
    from ci.wheel2conda import WheelError

    try:
        summary = build_standins(s, platforms=platforms)
    except (RuntimeError, WheelError, ChecksumError, MirrorMiss, KeyError) as exc:
        console.print(f"[red]error:[/] the offline upstream could not be built: {exc}")
        console.print(f"logs: {s.work_dir / 'upstream' / 'logs'}")
        raise typer.Exit(1) from None
    s.channels = [str(s.upstream_dir)]
    return summary


def run_pipeline(
    s: Settings,
    *,
    packages: list[str] | None,
    platforms: list[str],
    continue_on_failure: bool,
    tests: bool,
    force: bool,
    upstream: list[str] | None,
    stages: dict[str, float],
    foreign_test=None,
):
    """render -> graph -> build/test/publish -> report; returns (RunResult, graph, summary)."""
    from ci.build import run_builds
    from ci.graph import CycleError, build_graph, select
    from ci.mirror import SourceMirror
    from ci.render import RecipeError, filter_variants, find_recipes, render_all
    from ci.report import draw_graph, write_report

    t = time.monotonic()
    up_summary = resolve_upstream(s, upstream, platforms=platforms)
    stages["upstream"] = time.monotonic() - t
    foreign = [p for p in platforms if p != host_subdir()]
    if foreign and foreign_test is None:
        from ci.cross import CROSS_PLATFORMS, emulated_test, missing_tools, prepare

        for p in foreign:
            if p not in CROSS_PLATFORMS:
                console.print(f"[red]error:[/] no cross toolchain known for {p}")
                raise typer.Exit(2)
            lacking = missing_tools(p)
            if lacking:
                console.print(
                    f"[red]error:[/] cross-building for {p} needs {', '.join(lacking)}: "
                    "apt-get install gcc-powerpc64le-linux-gnu qemu-user file"
                )
                raise typer.Exit(2)
            t = time.monotonic()
            prepare(s.cache, p)
            stages[f"sysroot ({p})"] = time.monotonic() - t
        foreign_test = emulated_test

    t = time.monotonic()
    variants, dropped = filter_variants(s, _has_package_factory(s.channels, platforms))
    recipes = find_recipes(s.recipes_dir)
    if not recipes:
        console.print(f"[red]error:[/] no */recipe.yaml under {s.recipes_dir}")
        raise typer.Exit(2)
    render_errors: list[str] = []
    try:
        skipped: list[str] = []
        nodes = render_all(recipes, variants, platforms, skipped,
                           render_errors if continue_on_failure else None)
        dropped += [f"recipe {x}" for x in skipped]
        g = build_graph(nodes)
        if packages:
            g = select(g, packages)
    except (RecipeError, CycleError, KeyError) as exc:
        console.print(f"[red]error:[/] {exc}")
        raise typer.Exit(2) from None
    stages["render"] = time.monotonic() - t
    for err in render_errors:
        console.print(f"[red]render FAILED[/]: {err}", highlight=False)
    console.print(
        f"[bold]render[/]: {len(recipes)} recipes -> {g.number_of_nodes()} outputs for "
        f"{', '.join(platforms)}" + (f" (dropped: {'; '.join(dropped)})" if dropped else "")
    )
    res = run_builds(
        g,
        variants=variants,
        channel_dir=s.channel_dir,
        work_dir=s.work_dir,
        channels=s.channels,
        mirror=SourceMirror(s.mirror_dir),
        continue_on_failure=continue_on_failure,
        run_tests=tests,
        force=force,
        foreign_test=foreign_test,
    )
    res.recipe_errors = render_errors
    stages.update(res.stages)
    t = time.monotonic()
    png = s.channel_dir / "build-graph.png"
    try:
        draw_graph(g, png)
    except Exception as exc:  # noqa: BLE001 - a missing picture must not fail the build
        console.print(f"[yellow]graph picture not drawn: {exc}")
    stages["report"] = time.monotonic() - t
    unavailable = dict((up_summary or {}).get("unavailable") or {})
    return res, g, up_summary, dropped, unavailable, png, write_report


def _summary_table(res) -> Table:
    t = Table(title="channel build")
    for c in ("package", "subdir", "status", "build s", "test"):
        t.add_column(c)
    for err in res.recipe_errors:
        t.add_row(err.split(":", 1)[0], "-", "[red]failed to render", "-", "-")
    for o in res.outcomes:
        colour = {"built": "green", "skipped": "dim", "failed": "red", "blocked": "yellow"}[
            o.status
        ]
        t.add_row(
            f"{o.node.name} {o.node.version} {o.node.build_string}",
            o.node.subdir,
            f"[{colour}]{o.status}",
            f"{o.seconds:.1f}",
            o.test_status or "-",
        )
    return t


@app.command()
def build(
    packages: Annotated[
        list[str] | None, typer.Option("--packages", "-p", help="only these (and what they need)")
    ] = None,
    continue_on_failure: Annotated[
        bool, typer.Option("--continue-on-failure", help="keep going past failures")
    ] = False,
    no_test: Annotated[bool, typer.Option("--no-test", help="skip recipe tests")] = False,
    force: Annotated[
        bool, typer.Option("--force", help="rebuild even if the package exists")
    ] = False,
    recipes: RecipesOpt = None,
    channel: ChannelOpt = None,
    config: ConfigOpt = None,
    upstream: UpstreamOpt = None,
    platform: PlatformOpt = None,
) -> None:
    """Render, build (topological order, skipping what exists), test, index, report."""
    s = _settings(recipes, channel, config)
    stages: dict[str, float] = {}
    platforms = platform or [host_subdir()]
    res, g, up, dropped, unavail, png, write_report = run_pipeline(
        s,
        packages=packages,
        platforms=platforms,
        continue_on_failure=continue_on_failure,
        tests=not no_test,
        force=force,
        upstream=upstream,
        stages=stages,
    )
    report = write_report(
        s.channel_dir,
        res,
        graph_png=png.name if png.exists() else None,
        stages=stages,
        dropped=dropped,
        unavailable=unavail,
        upstream=up,
        install=None,
    )
    console.print(_summary_table(res))
    console.print(f"report: {report}")
    if not res.ok:
        console.print(
            f"[red]{len(res.failed)} package(s) and {len(res.recipe_errors)} recipe(s) "
            f"failed[/]; published: {len(res.published)}"
        )
        raise typer.Exit(1)


@app.command()
def standins(
    config: ConfigOpt = None,
    platform: PlatformOpt = None,
) -> None:
    """Build (or reuse) the offline stand-in upstream channel."""
    from ci.standins import build_standins

    s = _settings(None, None, config)
    summary = build_standins(s, platforms=platform or [host_subdir()])
    console.print(
        f"stand-in channel {summary['channel']}: {len(summary['wheels'])} wheels, "
        f"{len(summary['recipes'])} source builds, {summary['seconds']:.1f} s"
    )


@app.command()
def render(
    recipes: RecipesOpt = None,
    config: ConfigOpt = None,
    platform: PlatformOpt = None,
) -> None:
    """Print every output of every recipe for every variant and platform (no build)."""
    from ci.graph import CycleError, build_graph, build_order
    from ci.render import RecipeError, filter_variants, find_recipes, render_all

    s = _settings(recipes, None, config)
    variants, dropped = filter_variants(s)
    try:
        nodes = render_all(find_recipes(s.recipes_dir), variants, platform or s.target_platforms)
        g = build_graph(nodes)
    except (RecipeError, CycleError) as exc:
        console.print(f"[red]error:[/] {exc}", highlight=False)
        raise typer.Exit(2) from None
    print(f"{len(nodes)} outputs, build order:")
    for n in build_order(g):
        needs = sorted({g.nodes[a]["node"].name for a in g.predecessors(n.key)})
        shown = {k: v for k, v in n.variant.items() if k in VARIANT_AXES}
        print(f"  {n.key:70s} {json.dumps(shown):45s} needs: {', '.join(needs) or '-'}")
    for d in dropped:
        console.print(f"[dim]not built here: {d}")


@app.command()
def matrix(
    out: Annotated[Path, typer.Option("--out", help="where .ci_support/ and .github/ go")] = Path(
        "build/matrix"
    ),
    ppc64le: Annotated[
        str, typer.Option("--ppc64le", help="native (runner label) or cross")
    ] = "native",
    config: ConfigOpt = None,
) -> None:
    """Write one variant file per CI job and a GitHub Actions workflow running them."""
    from ci.matrix import write_matrix

    if ppc64le not in ("native", "cross"):
        console.print("[red]error:[/] --ppc64le must be 'native' or 'cross'")
        raise typer.Exit(2)
    s = _settings(None, None, config)
    for p in write_matrix(s, out, ppc64le):
        print(p)


@app.command()
def channel(
    continue_on_failure: Annotated[bool, typer.Option("--continue-on-failure")] = False,
    prefix: Annotated[Path, typer.Option("--prefix", help="read-only powerai prefix")] = Path(
        "envs/powerai"
    ),
) -> None:
    """Everything `make channel` does: stand-ins, build, cross-build, test, index, install."""
    from ci.install import envtools_post, install_powerai, smoke_check
    from ci.vendor import publish_upstream, vendor_closure

    t_all = time.monotonic()
    s = _settings(None, None, None)
    stages: dict[str, float] = {}
    here = host_subdir()
    res, g, up, dropped, unavail, png, write_report = run_pipeline(
        s,
        packages=None,
        platforms=[here],
        continue_on_failure=continue_on_failure,
        tests=True,
        force=False,
        upstream=None,
        stages=stages,
    )
    for p in s.target_platforms:
        if p == here:
            continue
        from ci.cross import CROSS_PLATFORMS, missing_tools

        why = (
            "python, numpy, pytorch, tensorflow and the Python packages built on them "
            "need a native build"
        )
        if p not in CROSS_PLATFORMS or missing_tools(p) or not res.ok:
            lacking = ", ".join(missing_tools(p)) if p in CROSS_PLATFORMS else "a cross toolchain"
            unavail[p] = (
                f"{why}; libddl not cross-built either "
                f"(missing: {lacking or 'a clean native build'})"
            )
            continue
        console.print(
            f"[bold]cross[/]: libddl for {p} (Debian cross gcc, ppc64el sysroot, qemu-user test)"
        )
        cross_stages: dict[str, float] = {}
        res_x, *_ = run_pipeline(
            s,
            packages=["libddl"],
            platforms=[p],
            continue_on_failure=continue_on_failure,
            tests=True,
            force=False,
            upstream=None,
            stages=cross_stages,
        )
        res.outcomes += res_x.outcomes
        res.published += res_x.published
        res.recipe_errors += [e for e in res_x.recipe_errors if e not in res.recipe_errors]
        for k, v in cross_stages.items():
            if k not in ("upstream", "report"):
                stages[k if p in k else f"{k} ({p})"] = v
        unavail[p] = f"{why}; libddl is cross-built here and tested under qemu-user"
    install_info: dict[str, str] = {}
    ok = res.ok
    if ok:
        prefix = prefix if prefix.is_absolute() else s.root / prefix
        version = next((o.node.version for o in res.outcomes if o.node.name == "powerai"), "0")
        t = time.monotonic()
        added = vendor_closure(s.channel_dir, s.channels, here)
        stages["vendor upstream closure"] = time.monotonic() - t
        if added:
            console.print(f"[bold]channel[/]: {added} upstream packages copied in (self-contained)")
        upstream_chans = list(s.channels)
        if s.channels == [str(s.upstream_dir)]:  # offline: the stand-ins, published
            t = time.monotonic()
            pub = s.root / "channel-upstream"
            n = publish_upstream(s.upstream_dir, pub, [here])
            stages["publish channel-upstream"] = time.monotonic() - t
            console.print(f"[bold]channel-upstream[/]: {pub} ({n} packages added or replaced)")
            upstream_chans = [str(pub.resolve())]
        t = time.monotonic()
        inst = install_powerai([str(s.channel_dir.resolve()), *upstream_chans], prefix, here)
        stages["install powerai"] = time.monotonic() - t
        t = time.monotonic()
        checks = smoke_check(
            prefix,
            [
                "ddl_core",
                "numpy",
                "mpi4py",
                "torch",
                "tensorflow",
                "keras",
                "sklearn",
                "h5py",
                "xgboost",
                "horovod",
            ],
            [["envtools", "--help"], ["ddlrun", "--help"]],
        )
        checks.update(envtools_post(prefix, f"powerai/{version}", s.root / "modulefiles"))
        stages["check powerai"] = time.monotonic() - t
        cuda_builds = [o for o in res.outcomes if o.node.name == "powerai"
                       and o.node.variant.get("build_type") == "cuda"]
        if cuda_builds and os.environ.get("DDLCE_CUDA_ENV", "1") != "0":
            # the CUDA build, installed as on a login node without a GPU: the solver takes
            # it because a driver is described, then the same checks (torch imports fine
            # without a GPU; validate says no driver is here, as a note)
            t = time.monotonic()
            cuda = cuda_builds[0].node.variant.get("cuda_compiler_version", "")
            cprefix = prefix.with_name(prefix.name + "-cuda")
            cinst = install_powerai([str(s.channel_dir.resolve()), *upstream_chans], cprefix,
                                    here, cuda=cuda)
            stages["install powerai (CUDA build)"] = time.monotonic() - t
            t = time.monotonic()
            cchecks = smoke_check(cprefix, ["ddl_core", "torch", "tensorflow", "horovod"],
                                  [["ddlrun", "--help"]])
            cchecks.update(envtools_post(cprefix, f"powerai/{version}-cuda",
                                         s.root / "modulefiles"))
            stages["check powerai (CUDA build)"] = time.monotonic() - t
            checks.update({f"cuda: {k}": v for k, v in cchecks.items()})
            checks["cuda: prefix"] = (
                f"{cprefix} ({cinst.packages} packages, --virtual __cuda={cuda}, "
                + ("up to date" if cinst.skipped else f"installed in {cinst.install_seconds:.1f} s")
                + ")")
        install_info = {
            "prefix": str(prefix),
            "installed with": inst.tool,
            "packages": str(inst.packages),
            "solve (s)": f"{inst.solve_seconds:.2f}",
            "install (s)": "up to date" if inst.skipped else f"{inst.install_seconds:.1f}",
            **checks,
            **{f"note {i}": n for i, n in enumerate(inst.notes)},
        }
        ok = all(v == "ok" or not v.startswith("FAILED") for v in checks.values())
    report = write_report(
        s.channel_dir,
        res,
        graph_png=png.name if png.exists() else None,
        stages=stages,
        dropped=dropped,
        unavailable=unavail,
        upstream=up,
        install=install_info or None,
    )
    console.print(_summary_table(res))
    for k, v in install_info.items():
        colour = "red" if v.startswith("FAILED") else "default"
        console.print(f"  [{colour}]{k}: {v}")
    console.print(
        f"\n[bold]channel[/] {s.channel_dir}  report {report}  "
        f"total {time.monotonic() - t_all:.1f} s"
    )
    if not ok:
        console.print(
            "[red]make channel failed[/]: see the report and the logs under build/ci/logs/"
        )
        raise typer.Exit(1)
    console.print(
        "\nNext:\n"
        f"  {prefix}/bin/python -c 'import ddl_core'      # use the read-only powerai environment\n"
        "  module use $PWD/modulefiles && module load powerai   # once envtools wrote modulefiles\n"
        "  conda install -c file://$PWD/channel powerai         # or any conda client\n"
    )


@app.command()
def bench(
    prefix: Annotated[Path, typer.Option("--prefix")] = Path("envs/powerai"),
    fresh: Annotated[
        bool,
        typer.Option(
            "--fresh",
            help="also time a first run: a clean clone with empty caches (takes minutes)",
        ),
    ] = False,
) -> None:
    """Time `make channel` (rerun, and with --fresh a first run) and the powerai solve."""
    import os
    import shutil
    import subprocess

    from ci.install import solve

    s = _settings(None, None, None)
    cmd = (
        ["make", "-s", "channel"]
        if (s.root / "Makefile").exists()
        else [sys.executable, "-m", "ci", "channel", "--prefix", str(prefix)]
    )
    figures: list[str] = []
    if fresh:
        scratch = s.root / "build" / "bench"
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        clone = scratch / "clone"
        branch = subprocess.run(
            ["git", "rev-parse", "--abbrev-ref", "HEAD"],
            cwd=s.root,
            capture_output=True,
            text=True,
        ).stdout.strip()
        subprocess.run(["git", "clone", "-q", "-b", branch, str(s.root), str(clone)], check=True)
        env = {
            **os.environ,
            "DDLCE_CACHE": str(scratch / "cache"),
            "RATTLER_CACHE_DIR": str(scratch / "rattler-cache"),
        }
        console.print(
            f"[bold]bench[/]: first run in {clone} with empty caches ({os.cpu_count()} CPUs)"
        )
        t = time.monotonic()
        proc = subprocess.run(cmd, cwd=clone, env=env, capture_output=True, text=True)
        first = time.monotonic() - t
        (scratch / "first-run.log").write_text(proc.stdout + proc.stderr)
        figures.append(
            f"first make channel (fresh clone, empty caches): {first / 60:.1f} min "
            f"(target <= 30 min)  rc={proc.returncode}  log {scratch / 'first-run.log'}"
        )
        report = clone / "channel" / "REPORT.md"
        if report.exists():
            figures.append(f"per-stage times of the first run: {report}")
    # make sure the channel here is built, then time a rerun with nothing changed
    subprocess.run(cmd, cwd=s.root, capture_output=True, text=True)
    t = time.monotonic()
    proc = subprocess.run(cmd, cwd=s.root, capture_output=True, text=True)
    rerun = time.monotonic() - t
    figures.append(
        f"make channel rerun (nothing changed): {rerun:.1f} s  (target <= 20 s)  "
        f"rc={proc.returncode}"
    )
    chans = [str(s.channel_dir.resolve())]
    times = [solve(chans, ["powerai"], host_subdir())[1] for _ in range(5)]
    figures.append(
        f"solve powerai for {host_subdir()} from channel/: best {min(times):.3f} s, "
        f"median {sorted(times)[2]:.3f} s  (target <= 2 s)"
    )
    load = os.getloadavg()
    figures.append(f"machine: {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f}")
    for f in figures:
        print(f)

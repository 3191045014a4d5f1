"""`python -m ci`: the channel pipeline's command line.

`channel` is what `make channel` runs (stand-ins if needed, build, test, index, install
powerai, report); the other commands run one stage each so a site can rebuild a single
package (`build --packages ddl`), regenerate the CI matrix or time the pipeline.
"""

# Only parsing and dispatching live here: the stages are ci.pipeline's, and a CiError from
# any of them is printed (problem, then hint) and turned into the exit code in one place,
# _Group.invoke.

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from typer.core import TyperGroup

from ci.config import Settings, host_subdir, load_settings
from ci.errors import CiError

console = Console(stderr=True)


class _Group(TyperGroup):
    """Runs a command; a CiError becomes its message, its hint and its exit code."""

    def invoke(self, ctx):  # noqa: ANN001, ANN201 - click's signature
        try:
            return super().invoke(ctx)
        except CiError as exc:
            console.print(f"[red]error:[/] {exc.msg}", highlight=False)
            if exc.hint:
                console.print(f"hint: {exc.hint}", highlight=False)
            raise typer.Exit(exc.code) from None


app = typer.Typer(cls=_Group, add_completion=False, no_args_is_help=True, help=__doc__)

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
    try:
        s = load_settings(repo_root(), recipes_dir=recipes, cbc_path=config, channel_dir=channel)
    except (FileNotFoundError, ValueError) as exc:
        raise CiError(str(exc), "run ci inside a DDL-CE checkout or pass --config") from None
    if recipes is not None:
        s.work_dir = (channel or s.channel_dir).parent / ".ci-work"
    return s


def _show(res, *, what: str) -> None:
    """The summary table, the install checks and the report path; exit 1 on failure."""
    from ci.report import failure_tail, summary_table

    console.print(summary_table(res.run))
    for k, v in (res.install or {}).items():
        console.print(f"  [{'red' if v.startswith('FAILED') else 'default'}]{k}: {v}")
    console.print(f"report: {res.report}")
    if not res.ok:
        # the why again, last: a CI log is often read from its tail
        for o in res.run.failed:
            console.print(f"[red]{o.node.key}[/]: {o.status}, tests {o.test_status or '-'}",
                          highlight=False)
            for line in failure_tail(o, 12):
                console.print(f"    {line[:300]}", markup=False, highlight=False)
            for log in o.logs:
                console.print(f"    log: {log}", highlight=False)
        console.print(
            f"[red]{what} failed[/]: {len(res.run.failed)} package(s) and "
            f"{len(res.run.recipe_errors)} recipe(s) failed, published: "
            f"{len(res.run.published)}; see the report and the logs under build/ci/logs/"
        )
        raise typer.Exit(1)


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
    from ci import pipeline

    opts = pipeline.Options(
        packages=packages,
        platforms=platform or [host_subdir()],
        continue_on_failure=continue_on_failure,
        tests=not no_test,
        force=force,
        upstream=upstream,
    )
    _show(pipeline.build(_settings(recipes, channel, config), opts), what="build")


@app.command()
def standins(
    config: ConfigOpt = None,
    platform: PlatformOpt = None,
) -> None:
    """Build (or reuse) the offline stand-in upstream channel."""
    from ci.standins import build_standins

    summary = build_standins(_settings(None, None, config), platforms=platform or [host_subdir()])
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
    from ci.pipeline import plan
    from ci.report import plan_lines

    s = _settings(recipes, None, config)
    r = plan(s, platform or s.target_platforms)
    print("\n".join(plan_lines(r.graph)))
    for d in r.dropped:
        console.print(f"[dim]not built here: {d}")


@app.command()
def matrix(
    out: Annotated[Path, typer.Option("--out", help="where .ci_support/ and .github/ go")] = Path(
        "build/matrix"
    ),
    ppc64le: Annotated[
        str,
        typer.Option("--ppc64le", help="native: native runner jobs beside the cross ones; cross: "
                     "cross jobs only"),
    ] = "native",
    aarch64: Annotated[
        str,
        typer.Option("--aarch64", help="native: native runner jobs beside the cross ones; cross: "
                     "cross jobs only"),
    ] = "native",
    config: ConfigOpt = None,
) -> None:
    """Write one variant file per CI job and a GitHub Actions workflow running them."""
    from ci.matrix import write_matrix

    for p in write_matrix(_settings(None, None, config), out, ppc64le, aarch64=aarch64):
        print(p)


@app.command()
def channel(
    continue_on_failure: Annotated[bool, typer.Option("--continue-on-failure")] = False,
    prefix: Annotated[Path, typer.Option("--prefix", help="read-only powerai prefix")] = Path(
        "envs/powerai"
    ),
) -> None:
    """Everything `make channel` does: stand-ins, build, cross-build, test, index, install."""
    import time

    from ci import pipeline

    t = time.monotonic()
    s = _settings(None, None, None)
    res = pipeline.channel(s, prefix, continue_on_failure=continue_on_failure)
    console.print(f"\n[bold]channel[/] {s.channel_dir}  total {time.monotonic() - t:.1f} s")
    _show(res, what="make channel")
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
    from ci.bench import bench as run_bench

    for line in run_bench(_settings(None, None, None), prefix, fresh=fresh):
        print(line)

"""channel/REPORT.md and the build-graph picture.

Everything in the report is read from what is on disk (the channel's repodata, package
sizes, ci's state file) plus this run's outcomes, so it describes the channel as
published, not as intended.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import networkx as nx

from ci.build import Outcome, RunResult, _before_epilogue
from ci.graph import AXES
from ci.index import world_readable
from ci.state import load_state


def draw_graph(g: nx.DiGraph, out: Path) -> None:
    """The build graph as a PNG (one box per package name, edges = needs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = nx.DiGraph()
    for a, b in g.edges:
        names.add_edge(g.nodes[a]["node"].name, g.nodes[b]["node"].name)
    for k in g.nodes:
        names.add_node(g.nodes[k]["node"].name)
    for layer, nodes in enumerate(nx.topological_generations(names)):
        for n in nodes:
            names.nodes[n]["layer"] = layer
    pos = nx.multipartite_layout(names, subset_key="layer", align="horizontal", scale=2)
    pos = {k: (x, -y) for k, (x, y) in pos.items()}
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(names)), 4 + names.number_of_nodes() * 0.1))
    nx.draw_networkx(
        names,
        pos,
        ax=ax,
        node_color="#cfe2f3",
        node_size=2600,
        node_shape="s",
        font_size=9,
        arrows=True,
        arrowsize=14,
        edge_color="#555555",
    )
    ax.set_title("DDL-CE build graph (arrow: is needed by)")
    ax.axis("off")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=90)
    plt.close(fig)


def graph_key(g: nx.DiGraph) -> str:
    """What the picture shows (package names and their edges), as a digest."""
    import hashlib

    names = sorted({g.nodes[k]["node"].name for k in g.nodes})
    edges = sorted({(g.nodes[a]["node"].name, g.nodes[b]["node"].name) for a, b in g.edges})
    return hashlib.sha256(json.dumps([names, edges]).encode()).hexdigest()


def _repodata(channel: Path) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for rd in sorted(channel.glob("*/repodata.json")):
        data = json.loads(rd.read_text())
        for section in ("packages", "packages.conda"):
            for fn, rec in (data.get(section) or {}).items():
                out[f"{rd.parent.name}/{fn}"] = rec
    return out


def variant_sizes(channel: Path, recs: dict[str, dict],
                  meta: str = "powerai") -> list[tuple[str, str, str, int, float]]:
    """Each ``meta`` build's solved closure from the (self-contained) channel: build,
    subdir, what it needs of the machine, package count, MB of archives. A CUDA build is
    solved as on a node with its driver. Builds that do not solve are left out."""
    from envtools.api import cuda_need

    from ci.install import solve

    out = []
    for key, rec in sorted(recs.items()):
        if rec.get("name") != meta:
            continue
        sub = key.split("/")[0]
        cuda = cuda_need(rec.get("depends") or [])
        try:
            records, _ = solve([str(channel.resolve())],
                               [f"{meta} =={rec['version']} {rec['build']}"], sub, cuda)
        except Exception:  # noqa: BLE001 - a report line, not a failure
            continue
        total = sum(int(getattr(r, "size", 0) or 0) for r in records)
        out.append((rec["build"], sub, f"__cuda >={cuda}" if cuda else "-", len(records),
                    total / 1e6))
    return out


def write_report(
    channel: Path,
    run: RunResult,
    *,
    graph_png: str | None,
    stages: dict[str, float],
    dropped: list[str],
    unavailable: dict[str, str],
    upstream: dict | None,
    install: dict | None,
) -> Path:
    """Write channel/REPORT.md; returns its path."""
    state = load_state(channel)
    recs = _repodata(channel)
    outcome = {o.node.key: o for o in run.outcomes}
    lines = [
        "# DDL-CE channel report",
        "",
        f"Generated {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `python -m ci`.",
        "",
        "## Stages (this run)",
        "",
        "| stage | seconds |",
        "| --- | ---: |",
    ]
    lines += [f"| {k} | {v:.1f} |" for k, v in stages.items()]
    lines += [f"| **total** | **{sum(stages.values()):.1f}** |", ""]
    lines += [
        "## Packages",
        "",
        "| package | version | build | subdir | size (MB) | this run | build s | test | license |",
        "| --- | --- | --- | --- | ---: | --- | ---: | --- | --- |",
    ]
    for key in sorted(recs):
        rec = recs[key]
        st = state.get(key, {})
        o = outcome.get(key)
        size = (channel / key).stat().st_size / 1e6 if (channel / key).exists() else 0
        this = o.status if o else ("upstream copy" if st.get("origin") == "upstream" else "-")
        test = (o.test_status if o and o.test_status else st.get("test", "")) or "-"
        bsec = o.seconds if o and o.status == "built" else st.get("build_seconds", 0)
        lines.append(
            f"| {rec['name']} | {rec['version']} | {rec['build']} | {key.split('/')[0]} "
            f"| {size:.2f} "
            f"| {this} | {bsec:.1f} | {test} | {rec.get('license') or st.get('license') or '?'} |"
        )
    failed = [
        o for o in run.outcomes if o.status in ("failed", "blocked") or o.test_status == "failed"
    ]
    lines += ["", "## Failures (this run)", ""]
    for err in run.recipe_errors:
        path, _, why = err.partition(": ")
        lines.append(f"- recipe `{path}`: failed to render: {why}")
    if failed:
        for o in failed:
            why = failure_tail(o, 1)
            lines.append(f"- `{o.node.key}`: {o.status}, tests {o.test_status or '-'}: "
                         f"{why[0] if why else 'see the log'}")
            lines += [f"  log: `{log}`" for log in o.logs]
    elif not run.recipe_errors:
        lines.append("None.")
    lines += ["", "## Variants", ""]

    def axes(o) -> str:
        shown = {k: v for k, v in o.node.variant.items() if k in AXES or k == "target_platform"}
        return json.dumps(shown, sort_keys=True)

    variants = sorted({axes(o) for o in run.outcomes})
    for v in variants:
        users = sorted({o.node.name for o in run.outcomes if axes(o) == v})
        lines.append(f"- `{v}`: {', '.join(users)}")
    if dropped:
        lines += ["", "Variant values not built here:", ""] + [f"- {d}" for d in dropped]
    lines += ["", "## Not available offline on every platform", ""]
    if unavailable:
        lines += [
            f"- **{k}**: {v}. Left to a native build (see `python -m ci matrix`)."
            for k, v in unavailable.items()
        ]
    else:
        lines.append("Nothing.")
    licenses: dict[str, list[str]] = {}
    for rec in recs.values():
        licenses.setdefault(rec.get("license") or "?", []).append(rec["name"])
    lines += [
        "",
        "## Licenses (from each package's about section)",
        "",
        "| license | packages |",
        "| --- | --- |",
    ]
    for lic in sorted(licenses):
        lines.append(f"| {lic} | {', '.join(sorted(set(licenses[lic])))} |")
    if upstream:
        lines += ["", "## Upstream", "", f"- channel: `{upstream.get('channel')}`"]
        if upstream.get("wheels"):
            lines.append(f"- {len(upstream['wheels'])} stand-ins converted from PyPI wheels")
        for k, v in (upstream.get("stages") or {}).items():
            lines.append(f"- {k}: {v:.1f} s")
        for row in upstream.get("cross") or []:
            lines.append(f"- cross-built stand-in {row}")
    sizes = variant_sizes(channel, recs)
    if sizes:
        lines += ["", "## Sizes per variant (what installing each powerai build downloads)", "",
                  "| powerai build | subdir | needs | packages | MB |",
                  "| --- | --- | --- | ---: | ---: |"]
        lines += [f"| {b} | {sub} | {need} | {n} | {mb:.0f} |" for b, sub, need, n, mb in sizes]
    if install:
        lines += ["", "## powerai environment", ""]
        lines += [f"- {k}: {v}" for k, v in install.items()]
    if graph_png:
        lines += ["", "## Build graph", "", f"![build graph]({graph_png})"]
    out = channel / "REPORT.md"
    out.write_text("\n".join(lines) + "\n")
    world_readable(channel)
    return out


def failure_tail(o: Outcome, n: int) -> list[str]:
    """The last ``n`` non-blank lines that say why ``o`` failed: its build error, else the
    end of its tests' output (without rattler-build's "run it manually" epilogue)."""
    text = o.error or o.test_output
    useful = [ln.rstrip() for ln in _before_epilogue(text.splitlines()) if ln.strip()][-n:]
    if useful and not o.error:
        useful[0] = "tests failed: " + useful[0].strip()
    return useful


def summary_table(run: RunResult):
    """The console's view of a run: one row per recipe that failed to render and per
    package, with its status, build time and test result."""
    from rich.table import Table

    t = Table(title="channel build")
    for c in ("package", "subdir", "status", "build s", "test"):
        t.add_column(c)
    for err in run.recipe_errors:
        t.add_row(err.split(":", 1)[0], "-", "[red]failed to render", "-", "-")
    colours = {"built": "green", "skipped": "dim", "failed": "red", "blocked": "yellow"}
    for o in run.outcomes:
        t.add_row(
            f"{o.node.name} {o.node.version} {o.node.build_string}",
            o.node.subdir,
            f"[{colours[o.status]}]{o.status}",
            f"{o.seconds:.1f}",
            o.test_status or "-",
        )
    return t


VARIANT_AXES = ("python", "mpi", "build_type", "cuda_compiler_version")


def plan_lines(g: nx.DiGraph) -> list[str]:
    """`ci render`'s listing: each output in build order, its variant axes and what it needs."""
    from ci.graph import build_order

    lines = [f"{g.number_of_nodes()} outputs, build order:"]
    for n in build_order(g):
        needs = sorted({g.nodes[a]["node"].name for a in g.predecessors(n.key)})
        shown = {k: v for k, v in n.variant.items() if k in VARIANT_AXES}
        lines.append(f"  {n.key:70s} {json.dumps(shown):45s} needs: {', '.join(needs) or '-'}")
    return lines

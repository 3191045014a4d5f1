"""The build graph: an edge A -> B when B needs A (build, host or run requirement).

Only edges between packages this channel builds matter for ordering; everything else
comes from the upstream channel.
"""

from __future__ import annotations

import networkx as nx

from ci.errors import CiError
from ci.render import Node


class CycleError(CiError):
    """The recipes depend on each other in a loop (the message names it)."""


# variant axes on which two outputs must agree for one to be built against the other
AXES = ("python", "mpi", "build_type", "cuda_compiler_version")


def _variants_clash(a: Node, b: Node) -> bool:
    """True when ``a`` and ``b`` were rendered for different values of a shared axis."""
    return any(k in a.variant and k in b.variant and a.variant[k] != b.variant[k] for k in AXES)


def build_graph(nodes: list[Node]) -> nx.DiGraph:
    """A DiGraph over node keys; a cycle raises :class:`CycleError` naming its members."""
    g = nx.DiGraph()
    by_name: dict[str, list[Node]] = {}
    for n in nodes:
        g.add_node(n.key, node=n)
        by_name.setdefault(n.name, []).append(n)
    for n in nodes:
        for dep in n.all_dep_names():
            for provider in by_name.get(dep, []):
                if provider.key == n.key:
                    continue
                # a platform package needs providers of its own platform (or noarch)
                if _variants_clash(provider, n):
                    continue
                if provider.noarch or n.noarch or provider.subdir == n.subdir:
                    if (
                        n.noarch
                        and not provider.noarch
                        and provider.target_platform != n.target_platform
                    ):
                        continue
                    g.add_edge(provider.key, n.key)
    try:
        cycle = nx.find_cycle(g)
    except nx.NetworkXNoCycle:
        return g
    names = [g.nodes[a]["node"].name for a, _ in cycle] + [g.nodes[cycle[0][0]]["node"].name]
    raise CycleError(
        "dependency cycle between recipes: " + " -> ".join(names) + ".",
        "Break it by removing one of these requirements (or by splitting an output).",
    )


def build_order(g: nx.DiGraph) -> list[Node]:
    """Topological order, ties broken by name so runs are reproducible."""
    return [g.nodes[k]["node"] for k in nx.lexicographical_topological_sort(g)]


def select(g: nx.DiGraph, packages: list[str]) -> nx.DiGraph:
    """The subgraph of the named packages and everything they need (transitively)."""
    wanted = {k for k in g.nodes if g.nodes[k]["node"].name in packages}
    missing = set(packages) - {g.nodes[k]["node"].name for k in wanted}
    if missing:
        known = sorted({g.nodes[k]["node"].name for k in g.nodes})
        raise CiError(
            f"unknown package(s) {', '.join(sorted(missing))}",
            f"--packages takes recipe outputs; the recipes provide: {', '.join(known)}",
        )
    keep = set(wanted)
    for k in wanted:
        keep |= nx.ancestors(g, k)
    return g.subgraph(keep).copy()


def dependents(g: nx.DiGraph, key: str) -> set[str]:
    """Everything that needs ``key`` (skipped when ``key`` fails)."""
    return nx.descendants(g, key)

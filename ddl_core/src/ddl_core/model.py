"""The allreduce cost model in Python, and its projection to cluster scale.

    python -m ddl_core.model project --preset summit --params 25.6e6 --step-time 0.1 \\
        --plot docs/bench/projection-summit.png
    python -m ddl_core.model project --tune-file ~/.cache/ddl-ce/tune-2x2.txt --nodes-per-rack 4

Why: we can measure DDL on a handful of emulated hosts, but its claims are about clusters
of thousands of GPUs. The same alpha-beta model that picks algorithms inside libddl
(csrc/model.c; `hierarchical` here is a line-by-line port, and a test checks the two
agree) is checked against measurement on the emulated cluster (tools/: ddl_tools.clusterbench),
then evaluated on a fabric description: levels innermost first, each with ranks per level,
alpha (seconds per message) and beta (seconds per byte for one flow using the whole link).

The formulas (per level with p ranks, n bytes at that level, gamma = seconds per byte
reduced):
  ring reduce-scatter + allgather   2(p-1) a + (p-1)/p n (2b + g)
  Rabenseifner (p a power of two)   2 log2(p) a + (p-1)/p n (2b + g)
  recursive doubling                ceil(log2 p)(a + n b + n g) [+ 2(a + n b) if p not 2^k]
Concurrent flows: every rank of the inner levels crosses an outer level's link at the same
time, so level l sees b_eff = b_l x prod(p_0..p_{l-1}). The topology-aware allreduce
reduce-scatters level by level innermost first (n shrinks by p_l each level) and
allgathers back; a header-only recursive doubling over all P ranks (ceil(log2 P) a_top)
checks the call first.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from . import settings

GAMMA_DEFAULT = 1.0 / 8e9
MAX_LEVELS = 8  # DDL_MAX_LEVELS


@dataclass
class Level:
    name: str
    ranks: int  # ranks per instance of this level (0 = as many as needed)
    alpha: float  # s per message
    # s per byte through the link that one group of the inner levels shares (a node's NIC
    # for the node level, a rack's uplinks for the rack level), as one flow alone sees it
    beta: float


@dataclass
class Fabric:
    levels: list[Level]
    gamma: float = GAMMA_DEFAULT
    notes: list[str] = field(default_factory=list)

    def describe(self) -> str:
        return "; ".join(f"L{i} {lv.name} x{lv.ranks or 'n'}: a={lv.alpha * 1e6:.1f}us "
                         f"{1 / lv.beta / 1e6:.1f} MB/s" for i, lv in enumerate(self.levels)) \
            + f"; reduce {1 / self.gamma / 1e9:.1f} GB/s"

    @classmethod
    def from_tune_file(cls, path: str | Path) -> Fabric:
        """alpha/beta per level as `python -m ddl_core.bench tune` measured them, read line by
        line as libddl's ddl_model_load reads them (model.c), with its number rule: the
        same file gives the same figures, or the same error naming the file and line."""
        topo, gamma, found = "", GAMMA_DEFAULT, {}
        arity = {"topology": 1, "gamma": 1, "level": 3}
        for no, raw in enumerate(Path(path).read_text().splitlines(), 1):
            w = raw.split("#", 1)[0].split()
            if not w or w[0] not in arity:
                continue
            if len(w) - 1 != arity[w[0]]:
                raise ValueError(f"tuning file {path} line {no}: '{w[0]}' takes {arity[w[0]]} "
                                 f"value(s), not {len(w) - 1}: rewrite it with python -m "
                                 "ddl_core.bench.tune")
            where = f"tuning file {path} line {no}"
            if w[0] == "topology":
                topo = w[1]
            elif w[0] == "gamma":
                gamma = settings.number(f"{where}: gamma", w[1], 0, 1e6)
            else:
                i = int(settings.number(f"{where}: level", w[1], 0, MAX_LEVELS - 1, integer=True))
                found[i] = (settings.number(f"{where}: alpha", w[2], 0, 1e6),
                            settings.number(f"{where}: beta", w[3], 0, 1e6))
        if not found:
            raise ValueError(f"{path}: no 'level' lines; write it with "
                             "python -m ddl_core.bench tune")
        dims = [int(d) for d in topo.lower().split("x")] if topo else []
        levels = [Level(f"tuned level {i}", dims[i] if i < len(dims) else 0, a, b)
                  for i, (a, b) in sorted(found.items())]
        return cls(levels, gamma, [f"measured: {path}"])


def ceil_log2(p: int) -> int:
    return max(0, math.ceil(math.log2(p))) if p > 1 else 0


def is_pow2(p: int) -> bool:
    return p > 0 and p & (p - 1) == 0


def rd_cost(p: int, a: float, b: float, g: float, n: float) -> float:
    if p <= 1:
        return 0.0
    t = ceil_log2(p) * (a + n * b + n * g)
    if not is_pow2(p):
        t += 2.0 * (a + n * b)
    return t


def level_cost(algo: str, p: int, a: float, b: float, g: float, n: float) -> tuple[float, bool]:
    """(seconds, whole): whole = the level reduced the whole segment (nothing gathered)."""
    f = (p - 1) / p
    if algo == "ring":
        return 2.0 * (p - 1) * a + f * n * (2.0 * b + g), False
    if algo == "rabenseifner":
        if is_pow2(p):
            return 2.0 * ceil_log2(p) * a + f * n * (2.0 * b + g), False
        return 2.0 * ceil_log2(p) * a + f * n * (2.0 * b + g) + 2.0 * (a + n * b), True
    return rd_cost(p, a, b, g, n), True


SEGMENT_DEFAULT = 2 << 20  # DDL_SEGMENT's default


def pipeline_segments(nbytes: float, p0: int, segment: float = SEGMENT_DEFAULT) -> int:
    """Segments of the node-leader pipeline (csrc/model.c ddl_pipeline_segments, es = 1)."""
    seg = max(1, int(segment))
    k = max(math.ceil(int(nbytes) / seg), p0 - 1)
    return max(1, min(k, int(nbytes)))


def hierarchical(fab: Fabric, dims: list[int], nbytes: float,
                 algos: tuple[str, ...] = ("ring", "rabenseifner", "recdoubling"),
                 allow_flat: bool = True, leader: bool = True,
                 segment: float = SEGMENT_DEFAULT) -> tuple[float, list[str]]:
    """Predicted seconds and per-level algorithms of DDL's allreduce (as csrc/model.c).

    dims[l] ranks at level l use fab.levels[l]'s alpha and beta. leader: the node-leader
    pipeline (DDL_NODE_LEADER=1, libddl's default on host buffers) in segments of about
    `segment` bytes: a chain of the node's ranks reduces each segment to the node's first
    rank, which runs the outer levels on it (one flow per node link) while the chain
    reduces the next segments and passes earlier results back."""
    P = math.prod(dims)
    if P <= 1:
        return 0.0, ["-"] * len(dims)
    top = len(dims) - 1
    lv = fab.levels
    lead = leader and len(dims) > 1 and dims[0] > 1
    K = pipeline_segments(nbytes, dims[0], segment) if lead else 1
    total, n, conc, plan = 0.0, float(nbytes) / K, 1.0, ["ring"] if lead else []
    for i, p in enumerate(dims):
        if lead and i == 0:
            continue
        b = lv[i].beta * (conc if i > 0 else 1.0)
        best = min(((level_cost(a, p, lv[i].alpha, b, fab.gamma, n), a) for a in algos),
                   key=lambda x: x[0][0])
        (t, whole), name = best
        plan.append(name)
        total += t
        if not whole:
            n /= p
        conc *= p
    if lead:
        p0, S = dims[0], float(nbytes) / K
        hop = lv[0].alpha + S * lv[0].beta
        chain = 2.0 * hop + (S * fab.gamma if p0 > 2 else 0.0)
        step = max(S * fab.gamma + total, chain)
        total = (p0 - 1) * hop + (p0 - 2) * S * fab.gamma + (p0 - 1) * hop + K * step
    total += ceil_log2(P) * lv[top].alpha
    if allow_flat:
        t = rd_cost(P, lv[top].alpha, lv[top].beta, fab.gamma, float(nbytes))
        if t <= total:
            return t, ["recdoubling(flat)"] * len(dims)
    return total, plan


def flat_ring_on(fab: Fabric, dims: list[int], nbytes: float) -> float:
    """A flat ring over all ranks placed level-major (as ddlrun places them): 2(P-1) steps
    of n/P bytes; in each step every link carries one flow, so a step takes the slowest
    level's alpha + (n/P) beta (the outermost level with more than one member)."""
    P = math.prod(dims)
    if P <= 1:
        return 0.0
    outer = max(i for i, d in enumerate(dims) if d > 1)
    slow = max(range(outer + 1), key=lambda i: fab.levels[i].alpha + nbytes / P *
               fab.levels[i].beta)
    a, b = fab.levels[slow].alpha, fab.levels[slow].beta
    return 2 * (P - 1) * (a + nbytes / P * b) + (P - 1) / P * nbytes * fab.gamma


def han_like(fab: Fabric, dims: list[int], nbytes: float) -> float:
    """Open MPI coll/han's allreduce, roughly: reduce to a leader inside the node, an
    allreduce of the whole buffer among the leaders (one flow per node link), broadcast
    inside the node; no overlap between the phases is assumed (han pipelines segments, so
    this is an upper bound)."""
    if len(dims) < 2:
        return hierarchical(fab, dims, nbytes)[0]
    r, lv0 = dims[0], fab.levels[0]
    intra = 2 * (ceil_log2(r) * lv0.alpha + nbytes * lv0.beta) + nbytes * fab.gamma
    outer = Fabric(fab.levels[1:], fab.gamma)
    inter = hierarchical(outer, dims[1:], nbytes, allow_flat=True)[0]
    return intra + inter


def link_bound(nbytes: float, hosts: int, link_bps: float) -> float:
    """The least time any allreduce can take over hosts joined by links of link_bps: each
    host must send (and receive) 2(H-1)/H of the buffer through its own link."""
    if hosts <= 1:
        return 0.0
    return 2 * (hosts - 1) / hosts * nbytes * 8 / link_bps


# ---- projection ------------------------------------------------------------------------

PRESETS = {
    # Summit (OLCF): 6 V100 per node on NVLink 2 (50 GB/s per direction GPU to GPU),
    # dual-rail EDR InfiniBand (2 x 12.5 GB/s) per node, 18 nodes per rack, non-blocking
    # fat tree. alpha: a few microseconds per message through NCCL/MPI.
    "summit": Fabric([Level("NVLink2 in a node", 6, 3e-6, 1 / 45e9),
                      Level("dual-rail EDR IB in a rack", 18, 5e-6, 1 / 23e9),
                      Level("fat tree between racks", 0, 7e-6, 1 / (18 * 23e9))],
                     gamma=1 / 300e9,
                     notes=["6 GPUs/node, 18 nodes/rack, non-blocking fat tree (Summit); "
                            "powers of two fill 4 GPUs/node, 16 nodes/rack",
                            "NVLink 45 GB/s, IB 23 GB/s per node effective, GPU reduction "
                            "300 GB/s"]),
    # The same nodes with the rack uplinks tapered 2:1, as many clusters are built.
    "tapered": Fabric([Level("NVLink2 in a node", 6, 3e-6, 1 / 45e9),
                       Level("dual-rail EDR IB in a rack", 18, 5e-6, 1 / 23e9),
                       Level("2:1 tapered uplinks between racks", 0, 8e-6,
                             1 / (18 * 23e9 / 2))],
                      gamma=1 / 300e9,
                      notes=["as summit, but rack uplinks 2:1 oversubscribed"]),
}


def fit(P: int, fab: Fabric) -> list[int]:
    """Split P ranks over the fabric's levels innermost first: each level takes the
    largest divisor of what is left that fits its size; the outermost takes the rest."""
    dims, left = [], P
    for i, lv in enumerate(fab.levels):
        if i == len(fab.levels) - 1 or lv.ranks == 0:
            dims.append(left)
            left = 1
            break
        d = max(k for k in range(1, min(lv.ranks, left) + 1) if left % k == 0)
        dims.append(d)
        left //= d
    dims += [1] * (len(fab.levels) - len(dims))
    if left != 1:
        dims[-1] *= left
    return dims


def decompositions(fab: Fabric, P: int, nbytes: float) -> dict[str, tuple[float, list[int]]]:
    """Predicted allreduce seconds for flat ring, two-level and three-level.

    Two-level merges every level above the node into one: its alpha is the largest of
    theirs, its beta the smallest share of each level's link that falls to one node."""
    dims = fit(P, fab)
    out: dict[str, tuple[float, list[int]]] = {}
    out["flat ring"] = (flat_ring_on(fab, dims, nbytes), [P])
    if len(fab.levels) >= 2:
        outer = fab.levels[1:]
        share, nodes = [], 1
        for lv, d in zip(outer, dims[1:], strict=True):
            share.append(lv.beta * nodes)  # that link is shared by `nodes` nodes
            nodes *= d
        used = [i for i, d in enumerate(dims[1:]) if d > 1] or [0]
        worst = Level("outer", 0, max(outer[i].alpha for i in used), max(share[i] for i in used))
        two = Fabric([fab.levels[0], worst], fab.gamma)
        d2 = [dims[0], math.prod(dims[1:])]
        out["two-level"] = (hierarchical(two, d2, nbytes, allow_flat=False, leader=False)[0], d2)
    if len(fab.levels) >= 3:
        out["three-level"] = (hierarchical(fab, dims, nbytes, allow_flat=False,
                                           leader=False)[0], dims)
    return out


def project(fab: Fabric, params: float, step_time: float, max_gpus: int = 4096,
            bytes_per_param: int = 4) -> list[dict[str, object]]:
    nbytes = params * bytes_per_param
    rows = []
    P = 1
    while P <= max_gpus:
        dec = decompositions(fab, P, nbytes)
        row: dict[str, object] = {"gpus": P, "grid": "x".join(map(str, fit(P, fab)))}
        for k, (t, _) in dec.items():
            row[k] = t
            row[k + " eff"] = step_time / (step_time + t)
        rows.append(row)
        P *= 2
    return rows


PUBLISHED = [
    ("IBM DDL (Cho et al. 2017)", "ResNet-50, 256 P100 GPUs (64 Minsky nodes)", "95%"),
    ("Horovod (Sergeev & Del Balso 2018)", "ResNet-101, 512 Pascal GPUs", "90%"),
]


def print_projection(fab: Fabric, params: float, step_time: float, rows: list[dict[str, object]],
                     file: object = sys.stdout) -> None:
    nb = params * 4
    pr = lambda *a: print(*a, file=file)  # type: ignore[arg-type]  # noqa: E731
    pr(f"# allreduce of {params / 1e6:.1f} M float32 parameters ({nb / 2**20:.1f} MiB), "
       f"compute {step_time * 1e3:.0f} ms per step")
    pr(f"# fabric: {fab.describe()}")
    for note in fab.notes:
        pr(f"#   {note}")
    names = [k for k in rows[-1] if isinstance(rows[-1][k], float) and not k.endswith("eff")]
    pr(f"# {'GPUs':>5} {'grid':>10} | " + " | ".join(f"{n:>11} ms  eff" for n in names))
    for r in rows:
        cells = []
        for n in names:
            if n in r:
                cells.append(f"{float(r[n]) * 1e3:>14.2f} {100 * float(r[n + ' eff']):>4.1f}%")
            else:
                cells.append(f"{'-':>14} {'':>5}")
        pr(f"  {r['gpus']:>5} {r['grid']:>10} | " + " | ".join(cells))
    pr("# eff = compute / (compute + allreduce): no overlap of communication with the "
       "backward pass (a lower bound; DDL and Horovod overlap part of it)")
    pr("# published, for comparison:")
    for who, what, eff in PUBLISHED:
        pr(f"#   {who}: {eff} scaling efficiency, {what}")


def plot(rows: list[dict[str, object]], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    names = [k for k in rows[-1] if isinstance(rows[-1][k], float) and not k.endswith("eff")]
    for n, style in zip(names, ("o-", "s-", "^-"), strict=False):
        pts = [r for r in rows if n in r]
        a1.plot([r["gpus"] for r in pts], [float(r[n]) * 1e3 for r in pts], style, label=n)
        a2.plot([r["gpus"] for r in pts], [100 * float(r[n + " eff"]) for r in pts], style,
                label=n)
    a2.plot([256], [95], "k*", ms=12, label="DDL published (ResNet-50, 256 GPUs)")
    a2.plot([512], [90], "kx", ms=10, label="Horovod published (ResNet-101, 512 GPUs)")
    for a in (a1, a2):
        a.set_xscale("log", base=2)
        a.set_xlabel("GPUs")
        a.grid(True, which="both", alpha=0.3)
    a1.set_yscale("log")
    a1.set_ylabel("predicted allreduce time (ms)")
    a2.set_ylabel("scaling efficiency (%)")
    a2.legend(fontsize=7)
    a1.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)


def parse_level(text: str) -> Level:
    """NAME:RANKS:ALPHA_US:GBPS, e.g. nvlink:6:3:45 (RANKS 0 = as many as needed)."""
    parts = text.split(":")
    if len(parts) != 4:
        raise argparse.ArgumentTypeError(f"--level {text!r}: write NAME:RANKS:ALPHA_US:GB_PER_S")
    name, ranks, a, gbps = parts
    return Level(name, int(ranks), float(a) * 1e-6, 1 / (float(gbps) * 1e9))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_core.model", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("project", help="predicted allreduce time and scaling, 1..N GPUs")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--preset", choices=sorted(PRESETS), default=None)
    src.add_argument("--tune-file", help="alpha/beta measured by python -m ddl_core.bench tune")
    src.add_argument("--level", action="append", type=parse_level,
                     help="NAME:RANKS:ALPHA_US:GB_PER_S, innermost first (repeat)")
    p.add_argument("--nodes-per-rack", type=int, default=0,
                   help="with --tune-file: group nodes into racks of this many, joined "
                   "non-blocking (a third level)")
    p.add_argument("--params", type=float, default=25.6e6, help="model parameters "
                   "(ResNet-50: 25.6e6)")
    p.add_argument("--step-time", type=float, default=0.1, help="compute seconds per step "
                   "per GPU (ResNet-50, batch 32 per V100: ~0.1)")
    p.add_argument("--max-gpus", type=int, default=4096)
    p.add_argument("--plot", help="write a PNG")
    args = ap.parse_args(argv)
    if args.tune_file:
        try:
            fab = Fabric.from_tune_file(args.tune_file)
        except (OSError, ValueError) as e:  # unreadable, or a bad line: one clear error
            ap.error(str(e))
        if args.nodes_per_rack:
            last = fab.levels[-1]
            fab.levels[-1] = Level(last.name, args.nodes_per_rack, last.alpha, last.beta)
            # non-blocking between racks: a rack's uplinks carry all its nodes' links
            fab.levels.append(Level("racks (non-blocking)", 0, last.alpha,
                                    last.beta / args.nodes_per_rack))
        fab.levels[-1].ranks = 0
    elif args.level:
        fab = Fabric(args.level, notes=["levels given on the command line"])
    else:
        fab = PRESETS[args.preset or "summit"]
    rows = project(fab, args.params, args.step_time, args.max_gpus)
    print_projection(fab, args.params, args.step_time, rows)
    if args.plot:
        Path(args.plot).parent.mkdir(parents=True, exist_ok=True)
        plot(rows, args.plot, f"{args.params / 1e6:.1f} M params, {fab.describe()[:110]}")
        print(f"# plot: {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

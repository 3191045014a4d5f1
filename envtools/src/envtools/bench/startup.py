"""``python -m envtools.bench --startup``: a job's start-up with the env on a shared filesystem,
conda-packed to each node, and staged as a sealed image by ``ddlrun --env``.

Why: at scale it is the shared filesystem's metadata server that stops a Python job from
starting (every rank looks up every module along every search path, and the server
answers one request after another). The shared filesystem is emulated by metafs (the
repository's tools/metafs: a FUSE passthrough whose metadata requests are served by one
server at ``--latency-us``, default 500 us, and counted), the nodes by the emulated
cluster (network namespaces: ddl_tools.cluster). Every row is one job of ``--ranks`` ranks
on ``--hosts`` hosts running ``python -c "import torch, ddl_core"`` in every rank
(``--code``), timed by wall clock from ddlrun's start to its end (median of ``--reps``),
with the requests the shared filesystem served during it. ddlrun starts on the job's first
host, as a batch script's does on a real cluster (so that node is one of the job's, not an
extra node that would stage an image of its own):

* ``local``: the env where it is, on local disk (the baseline: no metadata server);
* ``(a) shared``: the same env seen through metafs at its own prefix (a bind mount in
  the job's private mount namespace, so every rank on every host reads it through the
  one server);
* ``(b) conda-pack``: ``conda-pack`` of the env (a tar on the shared filesystem), unpacked
  on each node into node-local storage and ``conda-unpack``-ed, as OLCF documents; the
  unpack (and the requests it makes: reading the tar) is measured once per host count
  and shown apart, the rows time the job from the unpacked copies;
* ``(c) ddlrun --env``: the sealed image (``envtools seal``) on the shared filesystem,
  staged by ``ddlrun --env`` (its copy and sha256 check on every node are inside the
  row's time).

Needs root (namespaces, mounts), /dev/fuse, libfuse3's headers (metafs is compiled on
first use), the repository's tools (ddl_tools) and conda-pack for (b).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

MODES = ("local", "a", "b", "c")
LABEL = {"local": "local disk", "a": "(a) shared FS", "b": "(b) conda-pack",
         "c": "(c) ddlrun --env"}
#: (hosts, ranks) rows: 1, 4 and 8 ranks on one host; 2, 4 and 8 on two
CONFIGS = ((1, 1), (1, 4), (1, 8), (2, 2), (2, 4), (2, 8))


@dataclass
class Row:
    mode: str
    hosts: int
    ranks: int
    seconds: list[float] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    stage_s: float | None = None  # (b): the unpack per node; (c): a plain copy's time
    staging: list[float] = field(default_factory=list)  # (c): ddlrun's staging, per job

    @property
    def median_s(self) -> float:
        return statistics.median(self.seconds) if self.seconds else float("nan")

    @property
    def median_staging(self) -> float:
        return statistics.median(self.staging) if self.staging else float("nan")

    @property
    def median_requests(self) -> int:
        return int(statistics.median(self.requests)) if self.requests else 0


def _bin(name: str) -> str:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else (shutil.which(name) or name)


def _run(argv: list[str], timeout: float = 1800, env: dict[str, str] | None = None) -> float:
    return _run_err(argv, timeout, env)[0]


def _run_err(argv: list[str], timeout: float = 1800,
             env: dict[str, str] | None = None) -> tuple[float, str]:
    """Seconds ``argv`` took, and its stderr."""
    t = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})
    dt = time.monotonic() - t
    if proc.returncode != 0:
        raise RuntimeError(f"{shlex.join(argv[:6])} ... failed ({proc.returncode}):\n"
                           f"{proc.stderr[-3000:]}")
    return dt, proc.stderr


def _prepare_image(prefix: Path, image: Path | None, work: Path) -> Path:
    """The sealed image on the (to be) shared directory, with its sidecars."""
    dest = work / "shared-src" / "env.sqsh"
    if image:
        for side in ("", ".sha256", ".json"):
            os.link(str(image) + side, str(dest) + side) if _same_fs(image, dest) else \
                shutil.copyfile(str(image) + side, str(dest) + side)
        return dest
    print(f"# sealing {prefix} (envtools seal)", flush=True)
    _run([_bin("envtools"), "seal", str(prefix), "--out", str(dest)])
    return dest


def _same_fs(a: Path, b: Path) -> bool:
    return os.stat(a).st_dev == os.stat(b.parent).st_dev


def _prepare_pack(prefix: Path, pack: Path | None, work: Path) -> Path:
    dest = work / "shared-src" / "env.tar"
    if pack:
        if _same_fs(pack, dest):
            os.link(pack, dest)
        else:
            shutil.copyfile(pack, dest)
        return dest
    print(f"# packing {prefix} (conda-pack)", flush=True)
    _run([_bin("conda-pack"), "-p", str(prefix), "-o", str(dest), "--format", "tar",
          "--quiet"])
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m envtools.bench --startup", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prefix", type=Path, help="the env (default: envs/powerai of this "
                    "repository, made by make channel; read, never written)")
    ap.add_argument("--image", type=Path, help="a sealed image of it (default: seal it now)")
    ap.add_argument("--pack", type=Path, help="a conda-pack tar of it (default: pack it now)")
    ap.add_argument("--latency-us", type=int, default=500,
                    help="the emulated metadata server's latency per request [500]")
    ap.add_argument("--reps", type=int, default=3, help="jobs per row (median) [3]")
    ap.add_argument("--modes", default="local,a,b,c", help="rows to run [local,a,b,c]")
    ap.add_argument("--configs", default=",".join(f"{h}x{r}" for h, r in CONFIGS),
                    help="HOSTSxRANKS rows [1x1,1x4,1x8,2x2,2x4,2x8]")
    ap.add_argument("--code", default="import torch, ddl_core", help="what every rank runs")
    ap.add_argument("--workdir", type=Path, help="scratch space (node-local) [a temp dir]")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--plot", type=Path, help="write a PNG of the start-up times here")
    a = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("envtools.bench --startup: needs root (network namespaces, mounts)",
              file=sys.stderr)
        return 2
    try:
        from ddl_tools import cluster, metafs
    except ImportError:
        print("envtools.bench --startup: needs the repository's tools (pip install -e tools)",
              file=sys.stderr)
        return 2
    repo = Path(__file__).resolve().parents[4]
    prefix = (a.prefix or repo / "envs" / "powerai").absolute()
    if not (prefix / "conda-meta").is_dir():
        print(f"envtools.bench --startup: {prefix} is not an env (make channel makes "
              "envs/powerai; or give --prefix)", file=sys.stderr)
        return 2
    modes = [m for m in a.modes.split(",") if m]
    configs = [tuple(int(x) for x in c.split("x")) for c in a.configs.split(",")]
    work = Path(tempfile.mkdtemp(prefix="startup-", dir=a.workdir))
    (work / "shared-src").mkdir()
    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    print(f"# envtools.bench --startup: {shlex.join(sys.argv)}\n# env {prefix}; code "
          f"{a.code!r}; metadata latency {a.latency_us} us (one server); {a.reps} jobs per "
          f"row; {os.cpu_count()} cores; load {load0[0]:.2f} {load0[1]:.2f} {load0[2]:.2f}; "
          f"{started}", flush=True)
    image = _prepare_image(prefix, a.image, work) if "c" in modes else None
    pack = _prepare_pack(prefix, a.pack, work) if "b" in modes else None
    code = a.code
    rows: list[Row] = []
    ok = True
    with cluster.running(f"su{os.getpid() % 100000}"[:8],
                         hosts=max(h for h, _ in configs)) as c:
        # a fresh metafs for every job: what one job's nodes ask the server, with no
        # directory cached from the job before
        def shared(src: Path, at: Path):
            return metafs.mounted(src, at, a.latency_us)

        unpacked: dict[int, tuple[float, int]] = {}
        copied: dict[int, float] = {}  # hosts -> a plain copy of the image to each
        # configuration by configuration, every mode in turn: the rows compared with each
        # other ran minutes apart at most, under the same load
        for hosts, ranks in configs:
            for mode in modes:
                if ranks % hosts:
                    continue
                row = Row(mode, hosts, ranks)
                names = c.hosts[:hosts]
                base = [_bin("ddlrun"), *c.ddlrun_args(), "-H", ",".join(names),
                        "--accelerators", str(ranks // hosts)]
                if mode == "b" and hosts not in unpacked:
                    with shared(work / "shared-src", work / "shared") as fs:
                        unpacked[hosts] = (_unpack(c, names, work, pack),  # type: ignore
                                           fs.counts()["metadata"])
                argv = c.exec_argv(names[0], _job(mode, base, prefix, work, image, code))
                for _ in range(a.reps):
                    src = {"a": prefix, "c": work / "shared-src"}.get(mode)
                    at = work / ("shared-env" if mode == "a" else "shared")
                    try:
                        if src is None:
                            row.seconds.append(_run(argv, env={"DDL_TIMEOUT": "600"}))
                            row.requests.append(unpacked[hosts][1] if mode == "b" else 0)
                        else:
                            with shared(src, at) as fs:
                                before = fs.counts()["metadata"]
                                dt, err = _run_err(argv, env={"DDL_TIMEOUT": "600"})
                                row.seconds.append(dt)
                                row.requests.append(fs.counts()["metadata"] - before)
                            if mode == "c":
                                row.staging.append(_staged_s(err))
                    except RuntimeError as e:
                        print(f"# {LABEL[mode]} {hosts}x{ranks}: {e}", flush=True)
                        ok = False
                        break
                if mode == "b":
                    row.stage_s = unpacked[hosts][0]
                if mode == "c":
                    if hosts not in copied:
                        with shared(work / "shared-src", work / "shared"):
                            copied[hosts] = _plain_copy(c, names, work, image)  # type: ignore
                    row.stage_s = copied[hosts]
                rows.append(row)
                print(_line(row, rows), flush=True)
                if a.json:  # after every row: a run cut short keeps what it measured
                    _write_json(a, prefix, code, started, load0, rows)
    load1 = os.getloadavg()
    print(_table(rows, a.latency_us, load0, load1))
    if a.json:
        _write_json(a, prefix, code, started, load0, rows)
    if a.plot:
        _plot(rows, a.plot, a.latency_us)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


def _write_json(a: argparse.Namespace, prefix: Path, code: str, started: str, load0,
                rows: list[Row]) -> None:
    a.json.write_text(json.dumps({
        "command": shlex.join(sys.argv), "prefix": str(prefix), "code": code,
        "latency_us": a.latency_us, "reps": a.reps, "started": started,
        "cores": os.cpu_count(), "load_start": load0, "load_now": os.getloadavg(),
        "rows": [asdict(r) | {"median_s": r.median_s} for r in rows]}, indent=1))


def _job(mode: str, base: list[str], prefix: Path, work: Path, image: Path | None,
         code: str) -> list[str]:
    py = str(prefix / "bin" / "python")
    if mode == "local":
        return [*base, py, "-c", code]
    if mode == "a":  # the job's own mount namespace sees the shared FS at the prefix
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh",
                str(work / "shared-env"), str(prefix), *base, py, "-c", code]
    if mode == "b":
        return [*base, "sh", "-c", f'exec "{work}/nodes/$(hostname)/env/bin/python" "$@"',
                "sh", "-c", code]
    return [*base[:1], "-v", "--env", str(work / "shared" / image.name),  # type: ignore
            *base[1:], "python", "-c", code]


def _staged_s(stderr: str) -> float:
    """ddlrun -v's own figure: how long staging took (every node's copy checked)."""
    m = re.search(r"^# --env .*: staged .* in ([0-9.]+) s", stderr, re.M)
    if not m:
        raise RuntimeError(f"ddlrun -v printed no staging time:\n{stderr[-2000:]}")
    return float(m.group(1))


def _plain_copy(c, hosts: list[str], work: Path, image: Path) -> float:
    """The baseline for staging: ``cp`` of the image from the shared FS to every node's
    local storage at once (what a job script would do by hand; no check), in seconds."""
    procs = []
    t = time.monotonic()
    for h in hosts:
        dest = work / "copies" / h
        dest.mkdir(parents=True, exist_ok=True)
        procs.append(subprocess.Popen(c.exec_argv(h, ["cp", str(work / "shared" / image.name),
                                                      str(dest / image.name)])))
    ok = all(p.wait() == 0 for p in procs)
    dt = time.monotonic() - t
    shutil.rmtree(work / "copies", ignore_errors=True)
    if not ok:
        raise RuntimeError("the plain copy of the image failed on a node")
    return dt


def _unpack(c, hosts: list[str], work: Path, pack: Path) -> float:
    """Unpack the conda-pack tar (read from the shared FS) on every node, in parallel, as
    a job's first step would; the seconds it took."""
    shared_tar = work / "shared" / pack.name
    procs = []
    t = time.monotonic()
    for h in hosts:
        dest = work / "nodes" / h / "env"
        if dest.exists():
            continue
        # 4 MiB records (as ddlrun streams an image): tar's default 10 KiB reads would each
        # cost the shared filesystem an attribute check
        script = (f'set -e; mkdir -p "{dest}"; tar -b 8192 -xf "{shared_tar}" -C "{dest}"; '
                  f'"{dest}/bin/python" "{dest}/bin/conda-unpack"')
        procs.append(subprocess.Popen(c.exec_argv(h, ["sh", "-c", script])))
    for p in procs:
        if p.wait() != 0:
            raise RuntimeError("conda-pack unpack failed on a node")
    return time.monotonic() - t


def _line(row: Row, rows: list[Row]) -> str:
    local = next((r for r in rows if r.mode == "local" and (r.hosts, r.ranks) ==
                  (row.hosts, row.ranks)), None)
    vs = f"{row.median_s / local.median_s:5.2f}x local" if local and local.median_s else ""
    stage = f"  unpack {row.stage_s:6.1f} s/job" if row.stage_s is not None else ""
    if row.mode == "c" and row.staging:
        stage = f"  {_staging_note(row, local)}"
    return (f"{LABEL[row.mode]:<18} {row.hosts} host(s) x {row.ranks // row.hosts} = "
            f"{row.ranks:2d} ranks  {row.median_requests:8d} req/job "
            f"{row.median_requests // row.hosts:8d} req/node  {row.median_s:7.1f} s  {vs}"
            f"{stage}")


def _staging_note(row: Row, local: Row | None) -> str:
    """(c)'s staging, against a plain copy of the image to the same nodes, and the job's
    start-up once staged against local disk (the figure the metadata server's cost is
    judged by; staging has its own: <= 2x a plain copy)."""
    st = row.median_staging
    note = f"staging {st:.1f} s, {st / row.stage_s:.2f}x a plain copy" if row.stage_s else \
        f"staging {st:.1f} s"
    if local and local.median_s:
        after = statistics.median(s - g for s, g in zip(row.seconds, row.staging, strict=True))
        note += f"; once staged {after:.1f} s = {after / local.median_s:.2f}x local"
    return note


def _table(rows: list[Row], latency_us: int, load0, load1) -> str:
    out = [f"\n# start-up of every rank, metadata latency {latency_us} us; load "
           f"{load0[0]:.1f} -> {load1[0]:.1f}",
           "| env | hosts x ranks/host | requests/job | requests/node | start-up s "
           "(median) | vs local |", "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        local = next((x for x in rows if x.mode == "local" and (x.hosts, x.ranks) ==
                      (r.hosts, r.ranks)), None)
        vs = f"{r.median_s / local.median_s:.2f}x" if local and local.median_s else "-"
        extra = f" (+{r.stage_s:.1f} s unpack)" if r.stage_s is not None else ""
        if r.mode == "c" and r.staging:
            extra = f" ({_staging_note(r, local)})"
        out.append(f"| {LABEL[r.mode]} | {r.hosts} x {r.ranks // r.hosts} | "
                   f"{r.median_requests} | {r.median_requests // r.hosts} | "
                   f"{r.median_s:.1f}{extra} | {vs} |")
    a8 = next((r for r in rows if r.mode == "a" and (r.hosts, r.ranks) == (2, 8)), None)
    c8 = next((r for r in rows if r.mode == "c" and (r.hosts, r.ranks) == (2, 8)), None)
    if a8 and c8 and c8.median_s:
        out.append(f"\n(a)/(c) at 8 ranks on 2 hosts: {a8.median_s / c8.median_s:.1f}x")
    return "\n".join(out)


def _plot(rows: list[Row], path: Path, latency_us: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("# no matplotlib: no plot", file=sys.stderr)
        return
    fig, ax = plt.subplots(figsize=(8, 4.5))
    keys = sorted({(r.hosts, r.ranks) for r in rows})
    width = 0.8 / max(1, len({r.mode for r in rows}))
    for i, mode in enumerate(m for m in MODES if any(r.mode == m for r in rows)):
        ys = [next((r.median_s + (r.stage_s or 0) for r in rows
                    if r.mode == mode and (r.hosts, r.ranks) == k), 0) for k in keys]
        ax.bar([j + i * width for j in range(len(keys))], ys, width, label=LABEL[mode]
               + (" (incl. unpack)" if mode == "b" else ""))
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(keys))],
                  [f"{h} host{'s' if h > 1 else ''}\n{r} ranks" for h, r in keys])
    ax.set_ylabel("job start-up, s (median)")
    ax.set_title(f"python -c 'import torch, ddl_core' in every rank; metadata server "
                 f"{latency_us} us/request")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    sys.exit(main())

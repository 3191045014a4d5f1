"""Build nodes in topological order into a staging channel, test them, then publish.

Three steps over one :class:`Batch` (the graph, its staging channel and what has failed
so far), each callable alone: :func:`build_step`, :func:`test_step`, :func:`publish_step`.
The published channel only changes in the last, and only with packages that built *and*
passed their tests (and whose in-run dependencies did too): every build writes into
``<work>/staging-<id>/``, which is indexed after each package so later packages in the
same run can use it. Without ``--continue-on-failure`` the first failure stops the run and
nothing is published, so a failed build leaves ``channel/`` exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
import rattler_build as rb
import yaml
from rich.console import Console

from ci.config import host_subdir
from ci.errors import CiError
from ci.graph import build_order
from ci.index import index_channel
from ci.mirror import ChecksumError, SourceMirror
from ci.render import Node, render_recipe
from ci.state import load_state, save_state

console = Console(stderr=True)


@dataclass
class Outcome:
    """What happened to one node in this run."""

    node: Node
    status: str  # built | skipped | failed | blocked
    seconds: float = 0.0
    error: str = ""
    path: Path | None = None
    test_status: str = ""  # passed | failed | none | skipped
    test_seconds: float = 0.0
    test_output: str = ""
    log: Path | None = None
    #: the whole output of the package's tests (``test_output`` keeps only its tail)
    test_log: Path | None = None

    @property
    def logs(self) -> list[Path]:
        """The build and test logs this run wrote for the package."""
        return [p for p in (self.log, self.test_log) if p]


@dataclass
class RunResult:
    """All outcomes plus per-stage wall times."""

    outcomes: list[Outcome] = field(default_factory=list)
    stages: dict[str, float] = field(default_factory=dict)
    published: list[str] = field(default_factory=list)
    #: recipes that did not render (only with --continue-on-failure: else the run stops)
    recipe_errors: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failed and not self.recipe_errors

    @property
    def failed(self) -> list[Outcome]:
        return [
            o
            for o in self.outcomes
            if o.status in ("failed", "blocked") or o.test_status == "failed"
        ]


class _LogCallback:
    """Streams rattler-build's events into a per-package log file and a status line."""

    def __init__(self, log: Path, status) -> None:
        self.f = log.open("w")
        self.status = status

    def on_build_step(self, event) -> None:
        self.f.write(f"== {event.step_name}: {event.message}\n")
        if self.status is not None:
            self.status(event.step_name)

    def on_log(self, event) -> None:
        self.f.write(f"[{event.level}] {event.message}\n")

    def on_download_start(self, event) -> None:
        self.f.write(f"download {event.url}\n")

    def on_download_progress(self, event) -> None:
        pass

    def on_download_complete(self, event) -> None:
        pass

    def close(self) -> None:
        self.f.close()


def _lines(output: object) -> str:
    """A test's output as text (rattler-build returns a list of lines)."""
    if isinstance(output, (list, tuple)):
        return "\n".join(str(x) for x in output)
    return str(output)


def _log_tail(log: Path, n: int = 20) -> list[str]:
    """The lines of a build log that explain a failure (before rattler-build's epilogue)."""
    if not log.exists():
        return []
    lines = _before_epilogue(log.read_text(errors="replace").splitlines())
    return [ln[:300] for ln in lines[-n:]]


def _before_epilogue(lines: list[str]) -> list[str]:
    """Drop rattler-build's "Script execution failed ... to run manually" epilogue."""
    for i, line in enumerate(lines):
        if "Script execution failed" in line:
            return lines[:i]
    return lines


def _local_sources(node: Node, mirror: SourceMirror, work: Path, variants: dict) -> Node:
    """Satisfy url sources from the source mirror (sha256 verified), re-rendering the node.

    The recipe keeps its official URL; a copy of the recipe folder in the work dir gets a
    ``file://`` URL to the verified mirror file instead, and relative ``path:`` sources
    are made absolute so the copy still finds them.
    """
    url_sources = [s for s in node.sources if "url" in s]
    if not url_sources:
        return node
    local = {}
    for s in url_sources:
        url = s["url"][0] if isinstance(s["url"], list) else s["url"]
        sha = s.get("sha256")
        if not sha:
            raise ChecksumError(Path(url), "<a sha256 in the recipe>", "none given")
        local[url] = mirror.fetch(url, sha)
    src_dir = node.recipe_path.parent
    dst_dir = work / "recipes" / f"{node.name}-{node.build_string}"
    if dst_dir.exists():
        shutil.rmtree(dst_dir)
    shutil.copytree(src_dir, dst_dir)
    data = yaml.safe_load(node.recipe_path.read_text())
    raw = data.get("source")
    raw_list = raw if isinstance(raw, list) else [raw]
    url_iter = iter(local.values())
    for entry in raw_list:
        if isinstance(entry, dict) and "url" in entry:
            entry["url"] = next(url_iter).resolve().as_uri()
        elif isinstance(entry, dict) and "path" in entry:
            entry["path"] = str((src_dir / entry["path"]).resolve())
    (dst_dir / "recipe.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for n in render_recipe(dst_dir / "recipe.yaml", variants, node.target_platform):
        if n.build_string == node.build_string and n.name == node.name:
            n.digest = node.digest
            n.recipe_path = node.recipe_path
            return n
    raise RuntimeError(f"{node.key}: re-rendering with local sources changed the build hash")


@contextlib.contextmanager
def _cuda_override(node: Node):
    """A CUDA build's test environment is solved as on a node with a driver for its CUDA
    (rattler reads CONDA_OVERRIDE_CUDA), so it can be tested on a build host without a
    GPU: imports and CPU-side checks run, device code is left to a GPU node."""
    cuda = node.variant.get("cuda_compiler_version", "")
    if node.variant.get("build_type") != "cuda" or not cuda or cuda == "None":
        yield
        return
    old = os.environ.get("CONDA_OVERRIDE_CUDA")
    os.environ["CONDA_OVERRIDE_CUDA"] = cuda
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CONDA_OVERRIDE_CUDA", None)
        else:
            os.environ["CONDA_OVERRIDE_CUDA"] = old


#: runs a cross-built package's emulated test, installing it from the channels given:
#: (status, output)
ForeignTest = Callable[[Outcome, list[str]], tuple[str, str]]


@dataclass
class Batch:
    """One run's packages on their way to the channel: the graph in build order, the
    staging channel they are built into, and what has failed so far (``bad``: node keys).
    """

    graph: nx.DiGraph
    order: list[Node]
    channel_dir: Path
    staging: Path
    logs: Path
    chans: list[str]
    subdirs: list[str]
    state: dict[str, dict]
    by_key: dict[str, Outcome] = field(default_factory=dict)
    bad: set[str] = field(default_factory=set)
    #: the first failure stopped the run (no --continue-on-failure)
    stopped: bool = False
    result: RunResult = field(default_factory=RunResult)

    def log_path(self, node: Node, suffix: str) -> Path:
        """Where this run keeps one of ``node``'s logs (``log``: the build's, ``test.log``:
        its tests' whole output), named for the package file."""
        return self.logs / f"{node.name}-{node.version}-{node.build_string}.{suffix}"

    @property
    def built(self) -> list[Outcome]:
        """Outcomes built in this run, in build order."""
        return [self.by_key[n.key] for n in self.order
                if n.key in self.by_key and self.by_key[n.key].status == "built"]


def open_batch(g: nx.DiGraph, *, channel_dir: Path, work_dir: Path, channels: list[str]) -> Batch:
    """A fresh, indexed staging channel for ``g``; builds solve against staging, the
    channel and ``channels`` (the upstream), in that order."""
    order = build_order(g)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    staging = work_dir / f"staging-{stamp}-{os.getpid()}"
    logs = work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    subdirs = sorted({n.subdir for n in order} | {"noarch"})
    index_channel(staging, subdirs)
    if not (channel_dir / "noarch" / "repodata.json").exists():
        index_channel(channel_dir, subdirs)
    return Batch(
        graph=g,
        order=order,
        channel_dir=channel_dir,
        staging=staging,
        logs=logs,
        chans=[str(staging.resolve()), str(channel_dir.resolve()), *channels],
        subdirs=subdirs,
        state=load_state(channel_dir),
    )


def _build_one(b: Batch, node: Node, head: str, variants: dict, mirror: SourceMirror) -> Outcome:
    """rattler-build one node into staging; a failure is an outcome, not an exception."""
    log = b.log_path(node, "log")
    t0 = time.monotonic()
    cb = None
    try:
        with console.status(f"{head}: building") as st:
            cb = _LogCallback(log, lambda step, st=st, head=head: st.update(f"{head}: {step}"))
            ready = _local_sources(node, mirror, b.staging.parent, variants)
            if node.subdir not in ("noarch", host_subdir()):
                packages = _build_cross(ready, b, log, cuda=release_cuda(variants))
            else:
                packages = ready.rendered.run_build(  # type: ignore[union-attr]
                    tool_config=rb.ToolConfiguration(
                        test_strategy="skip", compression_threads=2, skip_existing="none"
                    ),
                    output_dir=str(b.staging),
                    channels=b.chans,
                    progress_callback=cb,
                    no_build_id=False,
                    package_format="conda:3",
                    env_isolation=rb.EnvironmentIsolation.CONDA_BUILD,
                ).packages
        pkg = next((p for p in packages or () if Path(p).name == node.filename), None)
        if pkg is None:
            raise RuntimeError(f"rattler-build produced {packages}, expected {node.filename}")
        index_channel(b.staging, b.subdirs)
        size = Path(pkg).stat().st_size / 1e6
        console.print(f"[green]{head}: built in {time.monotonic() - t0:.1f} s ({size:.1f} MB)")
        return Outcome(node, "built", time.monotonic() - t0, path=Path(pkg), log=log)
    except CiError as exc:  # a source's checksum, a mirror miss: the message says it all
        console.print(f"[red]{head}: FAILED: {exc}")
        return Outcome(node, "failed", time.monotonic() - t0, error=str(exc), log=log)
    except Exception as exc:  # noqa: BLE001 - any build error is reported, not raised
        msg = str(exc).strip().splitlines()
        console.print(f"[red]{head}: FAILED after {time.monotonic() - t0:.1f} s, log: {log}")
        for line in _log_tail(log) or msg[-15:]:
            console.print(f"    {line}", markup=False, highlight=False)
        return Outcome(
            node, "failed", time.monotonic() - t0, error=" ".join(msg[-3:])[:600], log=log
        )
    finally:
        if cb is not None:
            cb.close()


def release_cuda(variants: dict) -> str | None:
    """The release's CUDA: conda_build_config.yaml's one cuda_compiler_version not None."""
    return next((str(v) for v in variants.get("cuda_compiler_version") or []
                 if str(v) != "None"), None)


def _build_cross(node: Node, b: Batch, log: Path, *, cuda: str | None = None) -> list[Path]:
    """Cross-build ``node`` through rattler-build's recipe entry point: a rendered
    variant's build (py-rattler-build 0.73) solves the host env for the build platform
    whatever host_platform says, so a cross build's host env would hold the build host's
    python. The variant is the node's own, so the hash (and file name) is the same.

    ``cuda``: the target's host env is solved as on a GPU node with a driver for that CUDA
    (CONDA_OVERRIDE_CUDA, for this build only): linux-aarch64's pytorch, which ddl-torch
    builds against, is a CUDA build alone."""
    import warnings

    from rattler_build.cli_api import build_recipes

    recipe = Path(getattr(node.rendered, "recipe_path", None) or node.recipe_path)
    out_log = b.staging / "rattler-build-log.txt"  # its build dirs (JSON), not wanted
    out_log.unlink(missing_ok=True)
    before = set((b.staging / "bld").glob(f"rattler-build_{node.name}_*"))
    saved = os.environ.get("CONDA_OVERRIDE_CUDA")
    if cuda:
        os.environ["CONDA_OVERRIDE_CUDA"] = cuda
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            build_recipes(
                [recipe], target_platform=node.target_platform,
                host_platform=node.target_platform, build_platform=host_subdir(),
                channel=b.chans, output_dir=b.staging, test="skip",
                variant_overrides={k: [v] for k, v in node.variant.items()
                                   if k != "target_platform"},
                ignore_recipe_variants=True, package_format="conda:3", compression_threads=2,
                skip_existing="none")
    except Exception:
        # this entry point logs nothing: the build scripts' own logs (*.log in the work
        # dir, which a failed build keeps) say what went wrong
        for bld in set((b.staging / "bld").glob(f"rattler-build_{node.name}_*")) - before:
            with log.open("a") as f:
                for part in sorted((bld / "work").glob("*.log")):
                    f.write(f"==> {part}\n" + part.read_text(errors="replace")[-20000:])
        raise
    finally:
        out_log.unlink(missing_ok=True)
        if saved is None:
            os.environ.pop("CONDA_OVERRIDE_CUDA", None)
        else:
            os.environ["CONDA_OVERRIDE_CUDA"] = saved
    return [b.staging / node.subdir / node.filename]


def build_step(
    b: Batch,
    *,
    variants: dict,
    mirror: SourceMirror,
    force: bool = False,
    continue_on_failure: bool = False,
) -> None:
    """Build every node of the batch into staging in topological order.

    A node whose file is in the channel with an unchanged recipe digest is skipped (unless
    ``force``); one needing a failed node is blocked; the first failure blocks everything
    after it unless ``continue_on_failure``. The channel itself is not touched.
    """
    t_build = time.monotonic()
    for i, node in enumerate(b.order, 1):
        head = f"[{i}/{len(b.order)}] {node.key}"
        if b.stopped:
            b.by_key[node.key] = Outcome(node, "blocked", error="run stopped at an earlier failure")
            continue
        blockers = [a for a in nx.ancestors(b.graph, node.key) if a in b.bad]
        if blockers:
            b.by_key[node.key] = Outcome(
                node, "blocked", error="needs failed " + ", ".join(sorted(blockers))
            )
            b.bad.add(node.key)
            console.print(f"[yellow]{head}: blocked (needs {', '.join(sorted(blockers))})")
            continue
        published = b.channel_dir / node.subdir / node.filename
        prev = b.state.get(node.key, {})
        if not force and published.exists() and prev.get("digest") == node.digest:
            b.by_key[node.key] = Outcome(
                node, "skipped", path=published, test_status=prev.get("test", "")
            )
            console.print(f"[dim]{head}: up to date, skipped")
            continue
        o = _build_one(b, node, head, variants, mirror)
        b.by_key[node.key] = o
        if o.status == "failed":
            b.bad.add(node.key)
            b.stopped = not continue_on_failure
    b.result.stages["build"] = time.monotonic() - t_build


def _report_test(o: Outcome, head: str, how: str = "") -> None:
    colour = {"passed": "green", "none": "yellow"}.get(o.test_status, "red")
    console.print(f"[{colour}]{head}: {o.test_status}{how} ({o.test_seconds:.1f} s)")
    if o.test_status == "failed":
        for line in _before_epilogue(o.test_output.strip().splitlines())[-15:]:
            console.print(f"    {line}", markup=False, highlight=False)


def _keep_test_output(b: Batch, o: Outcome) -> None:
    """Write a test's whole output beside the build log (``<package>.test.log``), so a
    failure seen only as a summary can be read in full, and keep its tail in the outcome."""
    if o.test_output:
        o.test_log = b.log_path(o.node, "test.log")
        o.test_log.write_text(o.test_output)
        o.test_output = o.test_output[-4000:]


def test_step(b: Batch, *, run_tests: bool = True, foreign_test: ForeignTest | None = None) -> None:
    """Test every package built in this run, each in a fresh environment against staging +
    channel + upstream; a cross-built one runs its recipe's ``cross_test.sh`` through
    ``foreign_test`` (emulation) instead. A failure marks the package bad."""
    t_test = time.monotonic()
    built = b.built
    for i, o in enumerate(built, 1):
        if not run_tests or b.stopped:
            o.test_status = "skipped"
            continue
        head = f"[{i}/{len(built)}] test {o.node.key}"
        t0 = time.monotonic()
        if o.node.subdir not in ("noarch", host_subdir()):
            o.test_status, o.test_output = (foreign_test(o, b.chans) if foreign_test
                                            else ("none", ""))
            _keep_test_output(b, o)
            o.test_seconds = time.monotonic() - t0
            _report_test(o, head, " under emulation")
        else:
            try:
                with console.status(f"{head}: fresh environment"), _cuda_override(o.node):
                    pkg = rb.Package.from_file(str(o.path))
                    results = pkg.run_tests(channel=b.chans) if pkg.test_count else []
                outputs = "\n".join(_lines(getattr(r, "output", "")) for r in results)
                ok = all(r.success for r in results)
                o.test_status = ("passed" if ok else "failed") if results else "none"
                o.test_output = outputs
            except Exception as exc:  # noqa: BLE001 - a crashing test is a failing test
                o.test_status, o.test_output = "failed", str(exc)
            _keep_test_output(b, o)
            o.test_seconds = time.monotonic() - t0
            _report_test(o, head)
        if o.test_status == "failed":
            b.bad.add(o.node.key)
    b.result.stages["test"] = time.monotonic() - t_test


def publish_step(b: Batch, *, continue_on_failure: bool = False) -> RunResult:
    """Move what built and passed into the channel (atomically per file), re-index it and
    record the digests; with any failure and no ``continue_on_failure`` nothing moves.
    Returns the batch's :class:`RunResult` (all outcomes, in build order)."""
    built = b.built
    # packages needing something that failed its tests are not published either
    for o in built:
        if o.node.key not in b.bad and any(a in b.bad for a in nx.ancestors(b.graph, o.node.key)):
            o.status, o.error = "blocked", "needs a package that failed its tests"
            b.bad.add(o.node.key)
    t_pub = time.monotonic()
    chosen = [] if (b.bad and not continue_on_failure) else [
        o for o in built if o.node.key not in b.bad
    ]
    replaced = False
    for o in chosen:
        dest = b.channel_dir / o.node.subdir / o.node.filename
        replaced |= dest.exists()
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(o.path), dest.with_suffix(".conda.part"))
        os.chmod(dest.with_suffix(".conda.part"), 0o644)  # (rattler-build may write 0600)
        os.replace(dest.with_suffix(".conda.part"), dest)
        o.path = dest
        b.state[o.node.key] = {
            "digest": o.node.digest,
            "build_seconds": round(o.seconds, 1),
            "test": o.test_status,
            "test_seconds": round(o.test_seconds, 1),
            "recipe": str(o.node.recipe_path.parent.name),
            "variant": o.node.variant,
            "license": o.node.license,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        b.result.published.append(o.node.key)
    if chosen:
        # a rebuilt package keeps its file name: only a full re-index sees its new hash
        index_channel(b.channel_dir, b.subdirs, force=replaced)
        save_state(b.channel_dir, b.state)
    b.result.stages["publish"] = time.monotonic() - t_pub
    if not b.bad:
        shutil.rmtree(b.staging, ignore_errors=True)
    b.result.outcomes = [b.by_key[n.key] for n in b.order]
    return b.result


def run_builds(
    g: nx.DiGraph,
    *,
    variants: dict,
    channel_dir: Path,
    work_dir: Path,
    channels: list[str],
    mirror: SourceMirror,
    continue_on_failure: bool = False,
    run_tests: bool = True,
    force: bool = False,
    foreign_test: ForeignTest | None = None,
) -> RunResult:
    """Build, test and publish every node of ``g``: the three steps in a row."""
    b = open_batch(g, channel_dir=channel_dir, work_dir=work_dir, channels=channels)
    build_step(b, variants=variants, mirror=mirror, force=force,
                continue_on_failure=continue_on_failure)
    test_step(b, run_tests=run_tests, foreign_test=foreign_test)
    return publish_step(b, continue_on_failure=continue_on_failure)

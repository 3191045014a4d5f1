"""Build nodes in topological order into a staging channel, test them, then publish.

The published channel only changes at the very end, and only with packages that built
*and* passed their tests (and whose in-run dependencies did too): every build writes into
``<work>/staging-<id>/``, which is indexed after each package so later packages in the
same run can use it. Without ``--continue-on-failure`` the first failure stops the run and
nothing is published, so a failed build leaves ``channel/`` exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import networkx as nx
import rattler_build as rb
import yaml
from rich.console import Console

from ci.config import host_subdir
from ci.graph import build_order
from ci.index import index_channel
from ci.mirror import ChecksumError, MirrorMiss, SourceMirror
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
    foreign_test=None,
) -> RunResult:
    """Build, test and publish every node of ``g``; see the module docstring."""
    result = RunResult()
    order = build_order(g)
    state = load_state(channel_dir)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    staging = work_dir / f"staging-{stamp}-{os.getpid()}"
    logs = work_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    subdirs = sorted({n.subdir for n in order} | {"noarch"})
    index_channel(staging, subdirs)
    chans = [str(staging.resolve()), str(channel_dir.resolve())] + channels
    if not (channel_dir / "noarch" / "repodata.json").exists():
        index_channel(channel_dir, subdirs)
    bad: set[str] = set()
    by_key: dict[str, Outcome] = {}
    t_build = time.monotonic()
    stop = False
    for i, node in enumerate(order, 1):
        head = f"[{i}/{len(order)}] {node.key}"
        if stop:
            by_key[node.key] = Outcome(node, "blocked", error="run stopped at an earlier failure")
            continue
        blockers = [a for a in nx.ancestors(g, node.key) if a in bad]
        if blockers:
            by_key[node.key] = Outcome(
                node, "blocked", error="needs failed " + ", ".join(sorted(blockers))
            )
            bad.add(node.key)
            console.print(f"[yellow]{head}: blocked (needs {', '.join(sorted(blockers))})")
            continue
        published = channel_dir / node.subdir / node.filename
        prev = state.get(node.key, {})
        if not force and published.exists() and prev.get("digest") == node.digest:
            by_key[node.key] = Outcome(
                node, "skipped", path=published, test_status=prev.get("test", "")
            )
            console.print(f"[dim]{head}: up to date, skipped")
            continue
        log = logs / f"{node.name}-{node.version}-{node.build_string}.log"
        t0 = time.monotonic()
        cb = None
        try:
            with console.status(f"{head}: building") as st:
                cb = _LogCallback(log, lambda step, st=st, head=head: st.update(f"{head}: {step}"))
                ready = _local_sources(node, mirror, work_dir, variants)
                res = ready.rendered.run_build(  # type: ignore[union-attr]
                    tool_config=rb.ToolConfiguration(
                        test_strategy="skip", compression_threads=2, skip_existing="none"
                    ),
                    output_dir=str(staging),
                    channels=chans,
                    progress_callback=cb,
                    no_build_id=False,
                    package_format="conda:3",
                    env_isolation=rb.EnvironmentIsolation.CONDA_BUILD,
                )
            pkg = (
                next(p for p in res.packages if Path(p).name == node.filename)
                if res.packages
                else None
            )
            if pkg is None:
                raise RuntimeError(
                    f"rattler-build produced {res.packages}, expected {node.filename}"
                )
            index_channel(staging, subdirs)
            by_key[node.key] = Outcome(
                node, "built", time.monotonic() - t0, path=Path(pkg), log=log
            )
            size = Path(pkg).stat().st_size / 1e6
            console.print(f"[green]{head}: built in {time.monotonic() - t0:.1f} s ({size:.1f} MB)")
        except (ChecksumError, MirrorMiss) as exc:
            by_key[node.key] = Outcome(
                node, "failed", time.monotonic() - t0, error=str(exc), log=log
            )
            bad.add(node.key)
            console.print(f"[red]{head}: FAILED: {exc}")
        except Exception as exc:  # noqa: BLE001 - any build error is reported, not raised
            msg = str(exc).strip().splitlines()
            by_key[node.key] = Outcome(
                node, "failed", time.monotonic() - t0, error=" ".join(msg[-3:])[:600], log=log
            )
            bad.add(node.key)
            console.print(f"[red]{head}: FAILED after {time.monotonic() - t0:.1f} s, log: {log}")
            for line in _log_tail(log) or msg[-15:]:
                console.print(f"    {line}", markup=False, highlight=False)
        finally:
            if cb is not None:
                cb.close()
        if node.key in bad and not continue_on_failure:
            stop = True
    result.stages["build"] = time.monotonic() - t_build

    t_test = time.monotonic()
    built = [by_key[n.key] for n in order if by_key[n.key].status == "built"]
    for i, o in enumerate(built, 1):
        if not run_tests or stop:
            o.test_status = "skipped"
            continue
        head = f"[{i}/{len(built)}] test {o.node.key}"
        t0 = time.monotonic()
        if o.node.subdir not in ("noarch", host_subdir()):
            # a cross-built package cannot run here; its recipe's cross_test.sh (if any)
            # runs it under emulation instead
            o.test_status, o.test_output = foreign_test(o) if foreign_test else ("none", "")
            o.test_seconds = time.monotonic() - t0
            colour = {"passed": "green", "none": "yellow"}.get(o.test_status, "red")
            console.print(
                f"[{colour}]{head}: {o.test_status} under emulation ({o.test_seconds:.1f} s)"
            )
            if o.test_status == "failed":
                bad.add(o.node.key)
                for line in o.test_output.strip().splitlines()[-15:]:
                    console.print(f"    {line}", markup=False, highlight=False)
            continue
        try:
            with console.status(f"{head}: fresh environment"), _cuda_override(o.node):
                pkg = rb.Package.from_file(str(o.path))
                results = pkg.run_tests(channel=chans) if pkg.test_count else []
            outputs = "\n".join(_lines(getattr(r, "output", "")) for r in results)
            ok = all(r.success for r in results)
            o.test_status = ("passed" if ok else "failed") if results else "none"
            o.test_output = outputs[-4000:]
        except Exception as exc:  # noqa: BLE001 - a crashing test is a failing test
            o.test_status, o.test_output = "failed", str(exc)[-4000:]
        o.test_seconds = time.monotonic() - t0
        colour = {"passed": "green", "none": "yellow"}.get(o.test_status, "red")
        console.print(f"[{colour}]{head}: {o.test_status} ({o.test_seconds:.1f} s)")
        if o.test_status == "failed":
            bad.add(o.node.key)
            for line in _before_epilogue(o.test_output.strip().splitlines())[-15:]:
                console.print(f"    {line}", markup=False, highlight=False)
    result.stages["test"] = time.monotonic() - t_test

    # packages needing something that failed its tests are not published either
    for o in built:
        if o.node.key not in bad and any(a in bad for a in nx.ancestors(g, o.node.key)):
            o.status, o.error = "blocked", "needs a package that failed its tests"
            bad.add(o.node.key)

    t_pub = time.monotonic()
    publish = (
        [] if (bad and not continue_on_failure) else [o for o in built if o.node.key not in bad]
    )
    replaced = False
    for o in publish:
        dest = channel_dir / o.node.subdir / o.node.filename
        replaced |= dest.exists()
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(o.path), dest.with_suffix(".conda.part"))
        os.chmod(dest.with_suffix(".conda.part"), 0o644)  # (rattler-build may write 0600)
        os.replace(dest.with_suffix(".conda.part"), dest)
        o.path = dest
        state[o.node.key] = {
            "digest": o.node.digest,
            "build_seconds": round(o.seconds, 1),
            "test": o.test_status,
            "test_seconds": round(o.test_seconds, 1),
            "recipe": str(o.node.recipe_path.parent.name),
            "variant": o.node.variant,
            "license": o.node.license,
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        result.published.append(o.node.key)
    if publish:
        # a rebuilt package keeps its file name: only a full re-index sees its new hash
        index_channel(channel_dir, subdirs, force=replaced)
        save_state(channel_dir, state)
    result.stages["publish"] = time.monotonic() - t_pub
    if not bad:
        shutil.rmtree(staging, ignore_errors=True)
    result.outcomes = [by_key[n.key] for n in order]
    return result

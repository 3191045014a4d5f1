"""The channel pipeline on a synthetic set of small recipes (real rattler-build builds).

tests/ci/data/ holds: a synthetic upstream (a tiny `python` wrapping the host's python3),
a C library with a run_export and a program linking it, a noarch Python package, a
meta-package, a dependency cycle, a recipe whose test fails; a bad-sha256 recipe is
written at run time (its URL must be absolute).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

DATA = Path(__file__).parent / "data"
ROOT = Path(__file__).resolve().parents[2]


def ci(*args: str, cwd: Path = ROOT, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `python -m ci` the way `make channel` does, capturing everything."""
    e = {**os.environ, "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "ci", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env=e,
        timeout=900,
    )


def snapshot(channel: Path) -> dict[str, str]:
    """sha256 of every file in a channel (packages, repodata, state, report excluded)."""
    out = {}
    for p in sorted(channel.rglob("*")):
        if p.is_file() and p.name not in ("REPORT.md", "build-graph.png"):
            out[str(p.relative_to(channel))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def repodata(channel: Path) -> dict[str, dict]:
    recs = {}
    for rd in channel.glob("*/repodata.json"):
        d = json.loads(rd.read_text())
        for fn, r in {**d.get("packages", {}), **d.get("packages.conda", {})}.items():
            recs[r["name"]] = {**r, "subdir": rd.parent.name, "fn": fn}
    return recs


@pytest.fixture(scope="session")
def upstream(tmp_path_factory) -> Path:
    """The synthetic upstream channel, built once by ci itself (empty upstream)."""
    base = tmp_path_factory.mktemp("upstream")
    empty = base / "empty"
    (empty / "noarch").mkdir(parents=True)
    (empty / "noarch" / "repodata.json").write_text(
        '{"info": {"subdir": "noarch"}, "packages": {}}'
    )
    chan = base / "channel"
    r = ci(
        "build",
        "--recipes",
        str(DATA / "upstream"),
        "--channel",
        str(chan),
        "--upstream",
        str(empty),
        "--no-test",
    )
    assert r.returncode == 0, r.stdout + r.stderr
    return chan


def build(recipes: Path, channel: Path, upstream: Path, *extra: str, env: dict | None = None):
    """`ci build` of a recipe folder into a channel against an upstream channel."""
    return ci(
        "build",
        "--recipes",
        str(recipes),
        "--channel",
        str(channel),
        "--upstream",
        str(upstream),
        *extra,
        env=env,
    )


@pytest.fixture
def good_channel(tmp_path, upstream) -> tuple[Path, subprocess.CompletedProcess]:
    chan = tmp_path / "channel"
    r = build(DATA / "good", chan, upstream)
    assert r.returncode == 0, r.stdout + r.stderr
    return chan, r


def test_build_order_run_exports_noarch_and_report(good_channel):
    chan, r = good_channel
    out = r.stderr
    # topological order: libfoo before fooapp before bundle; purepkg before bundle
    pos = {n: out.index(f"{n}-") for n in ("libfoo", "fooapp", "purepkg", "bundle")}
    assert pos["libfoo"] < pos["fooapp"] < pos["bundle"]
    assert pos["purepkg"] < pos["bundle"]
    recs = repodata(chan)
    assert set(recs) == {"libfoo", "fooapp", "purepkg", "bundle"}
    assert recs["purepkg"]["subdir"] == "noarch"
    assert recs["libfoo"]["subdir"] == "linux-64"
    # the run_export of libfoo landed in fooapp's run requirements
    assert any(d.startswith("libfoo >=1.2") and "<1.3" in d for d in recs["fooapp"]["depends"]), (
        recs["fooapp"]
    )
    report = (chan / "REPORT.md").read_text()
    for name in ("libfoo", "fooapp", "purepkg", "bundle"):
        line = next(ln for ln in report.splitlines() if ln.startswith(f"| {name} |"))
        assert "| built |" in line and (
            "| passed |" in line or name == "bundle" and "| passed |" in line
        ), line
    assert "| MIT | libfoo |" in report and "BSD-3-Clause" in report
    assert "| build |" in report and "| test |" in report  # per-stage times
    assert (chan / "build-graph.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_rerun_skips_and_changed_recipe_rebuilds(good_channel, upstream, tmp_path):
    chan, _ = good_channel
    before = snapshot(chan)
    r = build(DATA / "good", chan, upstream)
    assert r.returncode == 0, r.stderr
    assert r.stderr.count("up to date, skipped") == 4
    assert snapshot(chan) == before
    # a changed recipe (same version) is rebuilt; the others stay skipped
    recipes = tmp_path / "recipes"
    shutil.copytree(DATA / "good", recipes)
    p = recipes / "purepkg" / "recipe.yaml"
    p.write_text(p.read_text().replace('"VALUE = 7"', '"VALUE = 7; CHANGED = 1"'))
    r = build(recipes, chan, upstream)
    assert r.returncode == 0, r.stderr
    assert "purepkg-2.0.0" in r.stderr and r.stderr.count("up to date, skipped") == 3
    # the rebuilt file kept its name: repodata must describe the new bytes
    for rec in repodata(chan).values():
        data = (chan / rec["subdir"] / rec["fn"]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == rec["sha256"], rec["fn"]


def test_packages_builds_only_what_is_needed(tmp_path, upstream):
    chan = tmp_path / "channel"
    r = build(DATA / "good", chan, upstream, "--packages", "fooapp")
    assert r.returncode == 0, r.stderr
    assert set(repodata(chan)) == {"libfoo", "fooapp"}
    r = build(DATA / "good", chan, upstream, "--packages", "nosuch")
    assert r.returncode == 2 and "nosuch" in r.stderr and "libfoo" in r.stderr


def test_failing_test_leaves_channel_unchanged(good_channel, upstream, tmp_path):
    chan, _ = good_channel
    recipes = tmp_path / "recipes"
    shutil.copytree(DATA / "good", recipes)
    shutil.copytree(DATA / "failing" / "broken", recipes / "broken")
    # a changed library (so something is rebuilt) plus a failing recipe test
    p = recipes / "libfoo" / "recipe.yaml"
    p.write_text(p.read_text().replace("return 42", "return 42 /* v2 */"))
    before = snapshot(chan)
    r = build(recipes, chan, upstream)
    assert r.returncode == 1
    assert "broken" in r.stderr and "failed" in r.stderr
    assert snapshot(chan) == before, "a failed run must not touch the channel"
    # after the summary table, the why again (a CI log is read from its tail), with the
    # test's whole output kept in a log file beside the build's
    tail = (r.stdout + r.stderr).split("report: ")[-1]
    assert "broken-0.1.0" in tail and "tests failed" in tail, tail
    logs = re.findall(r"log: (\S+\.test\.log)", tail)
    assert logs and "broken.txt" in Path(logs[0]).read_text(), tail
    # keep going: everything that passed is published, the broken package is not
    r = build(recipes, chan, upstream, "--continue-on-failure")
    assert r.returncode == 1
    assert "broken" not in repodata(chan)
    assert snapshot(chan) != before  # the rebuilt libfoo was published
    report = (chan / "REPORT.md").read_text()
    assert "## Failures" in report and "linux-64/broken-0.1.0" in report


def test_cycle_is_an_error_naming_it(tmp_path, upstream):
    r = build(DATA / "cycle", tmp_path / "channel", upstream)
    assert r.returncode == 2
    assert "cycle" in r.stderr and (
        "cyc-a -> cyc-b -> cyc-a" in r.stderr or "cyc-b -> cyc-a -> cyc-b" in r.stderr
    )
    assert not (tmp_path / "channel" / "linux-64").exists() or not list(
        (tmp_path / "channel").glob("*/*.conda")
    )


def test_bad_sha256_is_refused_naming_file_and_hashes(tmp_path, upstream, good_channel):
    chan, _ = good_channel
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    (src / "pkg" / "hello.txt").write_text("hello\n")
    tarball = tmp_path / "hello-1.0.tar.gz"
    subprocess.run(["tar", "czf", str(tarball), "-C", str(src), "pkg"], check=True)
    actual = hashlib.sha256(tarball.read_bytes()).hexdigest()
    wrong = "0" * 64
    recipes = tmp_path / "recipes"
    (recipes / "hello").mkdir(parents=True)
    (recipes / "hello" / "recipe.yaml").write_text(
        yaml.safe_dump(
            {
                "package": {"name": "hello", "version": "1.0"},
                "source": {"url": tarball.as_uri(), "sha256": wrong},
                "build": {"script": ["mkdir -p $PREFIX/share", "cp hello.txt $PREFIX/share/"]},
            }
        )
    )
    before = snapshot(chan)
    r = build(recipes, chan, upstream, env={"DDLCE_CACHE": str(tmp_path / "cache")})
    assert r.returncode == 1
    msg = " ".join(r.stderr.split())
    assert "sha256 mismatch" in msg and "hello-1.0.tar.gz" in msg
    assert wrong in msg and actual in msg
    assert snapshot(chan) == before


def test_bad_yaml_with_continue_on_failure_and_world_readable_channel(tmp_path):
    """A recipe that does not parse stops a plain run before anything is built; with
    --continue-on-failure it is reported as failed and the other recipes are built,
    tested and published. Whatever the umask (077 here) and whatever rattler-build
    writes, everything in the published channel is world-readable."""
    empty = tmp_path / "empty"
    (empty / "noarch").mkdir(parents=True)
    (empty / "noarch" / "repodata.json").write_text(
        '{"info": {"subdir": "noarch"}, "packages": {}}'
    )
    chan = tmp_path / "channel"
    args = ["--recipes", str(DATA / "badyaml"), "--channel", str(chan), "--upstream", str(empty)]
    r = ci("render", "--recipes", str(DATA / "badyaml"))
    assert r.returncode == 2 and "bad/recipe.yaml" in r.stderr and "Traceback" not in r.stderr
    r = build(DATA / "badyaml", chan, empty)
    assert r.returncode == 2 and "bad/recipe.yaml" in r.stderr, r.stderr
    assert not list(chan.glob("*/*.conda"))
    r = subprocess.run(
        ["sh", "-c", 'umask 077 && exec "$0" -m ci build "$@" --continue-on-failure',
         sys.executable, *args],
        cwd=ROOT, capture_output=True, text=True, timeout=900,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert r.returncode == 1, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert "render FAILED" in r.stderr and "bad/recipe.yaml" in r.stderr
    assert set(repodata(chan)) == {"okpkg"}
    report = (chan / "REPORT.md").read_text()
    failures = report.split("## Failures (this run)")[1].split("##")[0]
    assert "bad/recipe.yaml" in failures and "failed to render" in failures, failures
    assert "| okpkg |" in report
    modes = {str(p.relative_to(chan)): oct(p.stat().st_mode & 0o777) for p in chan.rglob("*")}
    assert modes["noarch/repodata.json"] == "0o644"
    assert any(k.endswith(".conda") for k in modes)
    wrong = {k: m for k, m in modes.items()
             if m != ("0o755" if (chan / k).is_dir() else "0o644")}
    assert not wrong, wrong


# ---- the pipeline's parts, called alone (ci.pipeline, ci.build's three steps) ------------


def settings_for(recipes: Path, channel: Path, upstream: Path):
    """ci's settings for a recipe folder, a channel and an upstream, as `ci build` makes
    them from --recipes/--channel/--upstream."""
    from ci.config import load_settings

    s = load_settings(ROOT, recipes_dir=recipes, channel_dir=channel)
    s.work_dir = channel.parent / ".ci-work"
    s.channels = [str(upstream)]
    return s


def test_render_graph_orders_selects_and_names_bad_input(tmp_path, upstream):
    from ci.errors import CiError
    from ci.graph import CycleError, build_order
    from ci.pipeline import render_graph

    s = settings_for(DATA / "good", tmp_path / "channel", upstream)
    r = render_graph(s, ["linux-64"])
    names = [n.name for n in build_order(r.graph)]
    assert sorted(names) == ["bundle", "fooapp", "libfoo", "purepkg"]
    assert names.index("libfoo") < names.index("fooapp") < names.index("bundle")
    assert not r.errors
    # --packages: the named output and what it needs, nothing else
    r = render_graph(s, ["linux-64"], packages=["fooapp"])
    assert sorted(n.name for n in build_order(r.graph)) == ["fooapp", "libfoo"]
    with pytest.raises(CiError) as e:
        render_graph(s, ["linux-64"], packages=["nosuch"])
    assert "nosuch" in e.value.msg and "libfoo" in e.value.hint and e.value.code == 2
    # a cycle is a CiError naming it, with the fix as its hint
    with pytest.raises(CycleError) as e:
        render_graph(settings_for(DATA / "cycle", tmp_path / "c2", upstream), ["linux-64"])
    assert isinstance(e.value, CiError) and "cyc-a" in e.value.msg and "Break it" in e.value.hint
    # a recipe that does not render: an error, or with continue_on_failure a listed one
    bad = settings_for(DATA / "badyaml", tmp_path / "c3", upstream)
    with pytest.raises(CiError, match="bad/recipe.yaml"):
        render_graph(bad, ["linux-64"])
    r = render_graph(bad, ["linux-64"], continue_on_failure=True)
    assert [n.name for n in build_order(r.graph)] == ["okpkg"]
    assert len(r.errors) == 1 and "bad/recipe.yaml" in r.errors[0]


def test_build_test_publish_steps_one_at_a_time(tmp_path, upstream):
    """Each step alone: build leaves the channel untouched, test marks failures, publish
    moves only what passed (nothing at all after a failure), and a rerun skips."""
    from ci.build import build_step, open_batch, publish_step, test_step
    from ci.mirror import SourceMirror
    from ci.pipeline import render_graph

    recipes = tmp_path / "recipes"
    shutil.copytree(DATA / "good" / "libfoo", recipes / "libfoo")
    shutil.copytree(DATA / "failing" / "broken", recipes / "broken")
    chan = tmp_path / "channel"
    s = settings_for(recipes, chan, upstream)
    r = render_graph(s, ["linux-64"])

    def batch():
        return open_batch(r.graph, channel_dir=chan, work_dir=s.work_dir, channels=s.channels)

    b = batch()
    build_step(b, variants=r.variants, mirror=SourceMirror(tmp_path / "mirror"))
    assert {o.node.name: o.status for o in b.by_key.values()} == {
        "libfoo": "built", "broken": "built"}
    assert all(o.path.resolve().parent.parent == b.staging.resolve() for o in b.built)
    assert not list(chan.glob("*/*.conda")), "building must not touch the channel"
    test_step(b)
    status = {o.node.name: o.test_status for o in b.built}
    assert status == {"libfoo": "passed", "broken": "failed"}
    assert {k.split("/")[1].split("-")[0] for k in b.bad} == {"broken"}
    res = publish_step(b)
    assert not res.ok and res.published == [] and not list(chan.glob("*/*.conda"))
    # the same batch with continue_on_failure: libfoo goes in, broken does not
    b = batch()
    build_step(b, variants=r.variants, mirror=SourceMirror(tmp_path / "mirror"),
               continue_on_failure=True)
    test_step(b)
    res = publish_step(b, continue_on_failure=True)
    assert [k.split("/")[1].split("-")[0] for k in res.published] == ["libfoo"]
    assert set(repodata(chan)) == {"libfoo"}
    state = json.loads((chan / ".ci-state.json").read_text())
    assert [v["test"] for v in state.values()] == ["passed"]
    # a rerun: libfoo is up to date (same digest), only broken is built again
    b = batch()
    build_step(b, variants=r.variants, mirror=SourceMirror(tmp_path / "mirror"),
               continue_on_failure=True)
    assert {o.node.name: o.status for o in b.by_key.values()} == {
        "libfoo": "skipped", "broken": "built"}


def test_pipeline_result_ok_and_cross_runs_absorbed():
    """The result object: ok needs every package and every install check to pass; a cross
    run's outcomes, published files, stage times and dropped variants (named with the
    platform) join the native run's."""
    from ci.build import Outcome, RunResult
    from ci.pipeline import PipelineResult
    from ci.render import Node

    def node(name: str, subdir: str) -> Node:
        return Node(name=name, version="1", build_string="0", subdir=subdir,
                    target_platform=subdir, recipe_path=Path("r.yaml"), variant={})

    res = PipelineResult(run=RunResult(outcomes=[Outcome(node("a", "linux-64"), "built")],
                                       published=["linux-64/a"]), stages={"build": 2.0})
    assert res.ok
    cross = PipelineResult(
        run=RunResult(outcomes=[Outcome(node("a", "linux-ppc64le"), "failed")]),
        stages={"build": 1.0, "sysroot (linux-ppc64le)": 3.0, "upstream": 9.0},
        dropped=["mpi=mpich: a cross build is tested under qemu-user"],
    )
    res.absorb(cross, "linux-ppc64le")
    res.absorb(PipelineResult(run=RunResult(), dropped=cross.dropped), "linux-ppc64le")  # once
    assert res.dropped == ["linux-ppc64le: mpi=mpich: a cross build is tested under qemu-user"]
    assert [o.node.subdir for o in res.run.outcomes] == ["linux-64", "linux-ppc64le"]
    assert res.stages == {"build": 2.0, "build (linux-ppc64le)": 1.0,
                          "sysroot (linux-ppc64le)": 3.0}
    assert not res.ok and len(res.run.failed) == 1
    ok = PipelineResult(run=RunResult(), install={"import numpy": "ok", "one libddl": "ok"})
    assert ok.ok
    ok.install["one libddl"] = "FAILED: 2 copies of libddl"
    assert not ok.ok


def test_one_libddl_counts_files_not_links(tmp_path):
    from ci.install import libddl_copies, one_libddl

    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "libddl.so.2.0.0").write_bytes(b"\x7fELF")
    (lib / "libddl.so.1").symlink_to("libddl.so.2.0.0")
    (lib / "libddl.so").symlink_to("libddl.so.1")
    assert libddl_copies(tmp_path) == [Path("lib/libddl.so.2.0.0")]
    assert one_libddl(tmp_path).startswith("ok")
    site = lib / "python3.11" / "site-packages" / "ddl_core"
    site.mkdir(parents=True)
    (site / "libddl.so.2.0.0").write_bytes(b"\x7fELF")
    msg = one_libddl(tmp_path)
    assert msg.startswith("FAILED: 2 copies") and "site-packages/ddl_core/libddl.so.2.0.0" in msg


def test_install_stage_is_envtools_and_a_rerun_keeps_the_env(good_channel, upstream, tmp_path):
    """The install stage installs with envtools (its read-only env, its marker), leaves an
    env that holds exactly the solution alone on a rerun, and checks it with envtools:
    the curated imports come from validate's smoke test, the modulefiles from module."""
    from ci.install import check_env, install_powerai, installed_set

    from envtools import api

    chan, _ = good_channel
    prefix = tmp_path / "envs" / "bundle"
    res = install_powerai([str(chan), str(upstream)], prefix, spec="bundle")
    assert not res.skipped and res.packages == len(installed_set(prefix)) >= 5
    assert api.made_by_envtools(prefix)
    assert (prefix / "conda-meta" / "envtools" / "explicit.txt").is_file()
    assert os.stat(prefix).st_mode & 0o222 == 0  # read-only, as envtools makes it
    again = install_powerai([str(chan), str(upstream)], prefix, spec="bundle")
    assert again.skipped and again.packages == res.packages
    mods = tmp_path / "modulefiles"
    checks = check_env(prefix, "bundle/1.0", mods, ["purepkg", "nosuchmod"], [["fooapp"]])
    assert checks["import purepkg"] == "ok", checks
    assert checks["import nosuchmod"].startswith("FAILED: no installed package provides it")
    assert checks["fooapp"] == "ok" and checks["envtools module"] == "ok", checks
    assert (mods / "bundle" / "1.0.lua").is_file() and (mods / "bundle" / "1.0").is_file()
    doc = json.loads((prefix.parent / "bundle-validate.json").read_text())
    assert doc["schema"] == "envtools-validate/1" and doc["checked"]["imports"] >= 1
    assert checks["envtools validate"] == "ok" or checks["envtools validate"].startswith(
        "findings:"), checks


def test_a_failed_envtools_install_fails_the_stage_with_its_error(good_channel, upstream,
                                                                  tmp_path):
    """What envtools refuses or cannot do ends the install stage with envtools' own
    message and hint (a CiError, exit 1); nothing is installed any other way and nothing
    at the prefix is removed."""
    from ci.errors import CiError
    from ci.install import install_powerai

    from envtools import api

    chan, _ = good_channel
    chans = [str(chan), str(upstream)]
    taken = tmp_path / "taken"  # not an env: envtools refuses to install over it
    taken.mkdir()
    (taken / "keep.txt").write_text("mine")
    with pytest.raises(api.EnvtoolsError) as direct:
        api.install(chans, taken, ["bundle"])
    with pytest.raises(CiError) as err:
        install_powerai(chans, taken, spec="bundle")
    assert err.value.code == 1
    assert err.value.msg == f"envtools install of bundle into {taken} failed: " \
        f"{direct.value.message}"
    assert err.value.hint == direct.value.hint and "choose a new --prefix" in err.value.hint
    assert [p.name for p in taken.iterdir()] == ["keep.txt"]
    with pytest.raises(CiError) as err:  # a spec that does not solve
        install_powerai(chans, tmp_path / "env", spec="bundle >=9")
    assert err.value.msg.startswith("envtools solve failed: cannot solve bundle >=9 from")
    assert "check the package name and version" in err.value.hint
    assert not (tmp_path / "env").exists()


def test_solve_is_envtools_for_the_platform_asked(good_channel, upstream):
    """ci's solve (vendoring, the cross tests, the report) is envtools' for the platform
    given: the linux-64 python of the upstream serves linux-64 only."""
    from ci.errors import CiError
    from ci.install import solve

    chan, _ = good_channel
    records, _ = solve([str(chan), str(upstream)], ["purepkg"], "linux-64")
    assert {r.name.normalized for r in records} == {"purepkg", "python"}
    with pytest.raises(CiError) as err:
        solve([str(chan), str(upstream)], ["purepkg"], "linux-aarch64")
    assert "cannot solve purepkg for linux-aarch64" in err.value.msg


def test_ci_error_is_printed_once_with_its_hint(tmp_path, upstream):
    """A CiError from any stage: one `error:` line, one `hint:` line, its exit code, no
    traceback (the command line catches it in one place)."""
    r = build(DATA / "cycle", tmp_path / "channel", upstream)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("error:") == 1 and "hint: Break it" in " ".join(r.stderr.split())
    r = build(DATA / "good", tmp_path / "channel", upstream, "--platform", "linux-s390x")
    assert r.returncode == 2 and "no cross toolchain known for linux-s390x" in r.stderr
    assert "hint:" in r.stderr and "Traceback" not in r.stderr


def _standins() -> Path:
    from ci.config import cache_root

    return cache_root() / "upstream-channel"


@pytest.mark.skipif(
    not (_standins() / "linux-64" / "repodata.json").exists(),
    reason="needs the stand-in upstream channel that `make channel` builds once",
)
def test_env_with_libddl_and_ddl_holds_one_libddl(tmp_path):
    """The real libddl and ddl recipes (openmpi, python 3.11) built by ci, installed into
    a fresh env: one libddl file in it (lib/), and the one `import ddl_core` maps."""
    from ci.install import install_powerai, libddl_copies

    cbc = yaml.safe_load((ROOT / "conda_build_config.yaml").read_text())
    cbc.update(mpi=["openmpi"], python=["3.11"], target_platforms=["linux-64"])
    (tmp_path / "cbc.yaml").write_text(yaml.safe_dump(cbc))
    chan = tmp_path / "channel"
    r = ci("build", "--recipes", str(ROOT / "recipes"), "--config", str(tmp_path / "cbc.yaml"),
           "--channel", str(chan), "--upstream", str(_standins()), "--packages", "ddl",
           "--no-test")
    assert r.returncode == 0, r.stdout + r.stderr[-3000:]
    assert set(repodata(chan)) == {"libddl", "ddl"}
    prefix = tmp_path / "env"
    install_powerai([str(chan), str(_standins())], prefix, spec="ddl")
    version = yaml.safe_load((ROOT / "recipes" / "libddl" / "recipe.yaml").read_text())[
        "context"]["version"]
    assert libddl_copies(prefix) == [Path(f"lib/libddl.so.{version}")]
    p = subprocess.run(
        [str(prefix / "bin" / "python"), "-c",
         "import ddl_core, os\n"
         "maps = {l.split()[-1] for l in open('/proc/self/maps')}\n"
         "maps = {m for m in maps if os.path.basename(m).startswith('libddl')}\n"
         "print('\\n'.join(sorted(maps)))"],
        capture_output=True, text=True, env={"PATH": f"{prefix / 'bin'}:/usr/bin:/bin"},
    )
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [str((prefix / "lib" / f"libddl.so.{version}").resolve())], \
        p.stdout

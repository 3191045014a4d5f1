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

"""What conda reads from an env envtools made, and what envtools reads from an env conda
made, without a conda: records in conda's shape (sha256_in_prefix), conda's way of
recording a noarch: python package, the site env's PEP 668 / CEP 22 markers and the
package cache conda can use. The same with the real conda: tests/conda/."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import run_envtools
from envtools.prefix.readonly import FROZEN, SITE_ONLY, is_site_only
from test_validate import findings, validate


@pytest.fixture(scope="module")
def noarch_env(tmp_path_factory, channel) -> Path:
    """A read-only env with a noarch: python package beside the compiled ones."""
    prefix = tmp_path_factory.mktemp("site") / "envs" / "powerai"
    run_envtools("install", "--channel", channel, "--prefix", prefix, "demo-meta",
                 "demo-noarch")
    return prefix


def records(prefix: Path) -> list[dict]:
    return [json.loads(fp.read_text()) for fp in sorted((prefix / "conda-meta").glob("*.json"))]


def sha256(p: Path) -> str:
    return hashlib.sha256(p.read_bytes()).hexdigest()


def test_records_have_condas_sha256_in_prefix(noarch_env):
    """As conda writes them: every linked file has sha256_in_prefix (the package's sha256,
    or the file's hash after prefix replacement), no symlink has one."""
    seen = {"hardlink": 0, "softlink": 0, "placeholder": 0}
    for data in records(noarch_env):
        for e in data["paths_data"]["paths"]:
            pt = e.get("path_type")
            if pt == "softlink":
                assert "sha256_in_prefix" not in e, e
                seen["softlink"] += 1
            elif pt == "hardlink":
                fp = noarch_env / e["_path"]
                assert e.get("sha256_in_prefix") == sha256(fp), e
                if e.get("prefix_placeholder"):
                    seen["placeholder"] += 1
                    assert e["sha256_in_prefix"] != e["sha256"]
                else:
                    assert e["sha256_in_prefix"] == e["sha256"]
                seen["hardlink"] += 1
    assert all(seen.values()), seen  # (each kind is there to be checked)


def _conda_style(prefix: Path) -> Path:
    """Rewrite the noarch: python record of ``prefix`` as conda writes it: its own files
    in paths_data with the package's paths (site-packages/..., python-scripts/...),
    ``files`` and what conda made (bytecode) prefix-relative."""
    fp = next((prefix / "conda-meta").glob("demo-noarch-*.json"))
    data = json.loads(fp.read_text())
    site = next(f for f in data["files"] if "/site-packages/" in f).split("/site-packages/")[0]
    for e in data["paths_data"]["paths"]:
        p = e["_path"]
        if e.get("path_type") not in ("hardlink", "softlink"):
            continue  # (bytecode and entry points: what conda made, prefix-relative)
        if p.startswith(site + "/site-packages/"):
            e["_path"] = "site-packages/" + p[len(site) + len("/site-packages/"):]
        elif p.startswith("bin/"):
            e["_path"] = "python-scripts/" + p[len("bin/"):]
    assert any(e["_path"].startswith("site-packages/") for e in data["paths_data"]["paths"])
    os.chmod(fp, 0o644)
    fp.write_text(json.dumps(data))
    # (the record index and stat cache are envtools' own: a conda-made env has neither)
    shutil.rmtree(prefix / "conda-meta" / "envtools", ignore_errors=True)
    return fp


def test_validate_reads_condas_noarch_records(noarch_env, tmp_path):
    """An env whose noarch: python record conda wrote: no missing files, no pip
    duplicate, and an edit to one of its files is found."""
    env = tmp_path / "env"
    run_envtools("clone", noarch_env, env)
    _conda_style(env)
    doc = validate(env)
    errors = [f for f in doc["findings"] if f["severity"] == "error"]
    assert not errors, json.dumps(errors, indent=1)
    assert not findings(doc, "pip-duplicate")
    from envtools.prefix.records import Prefix

    rec = next(r for r in Prefix.load(env).records if r.name == "demo-noarch")
    assert all((env / e["_path"]).exists() for e in rec.paths)  # prefix paths again
    src = next(env / e["_path"] for e in rec.paths if e["_path"].endswith(".py"))
    os.chmod(src, 0o644)
    src.write_text(src.read_text() + "# edited\n")
    bad = [f for f in validate(env)["findings"] if f["severity"] == "error"]
    assert [f["check"] for f in bad] == ["altered-file"]
    assert bad[0]["packages"] == ["demo-noarch"]


def test_a_clone_of_a_conda_style_env_places_noarch_files(noarch_env, tmp_path):
    """envtools clone of an env conda made puts the noarch files where they belong."""
    a, b = tmp_path / "a", tmp_path / "b"
    run_envtools("clone", noarch_env, a)
    _conda_style(a)
    run_envtools("clone", a, b)
    assert not [f for f in validate(b)["findings"] if f["severity"] == "error"]
    assert not list(b.glob("site-packages"))


def test_site_env_is_frozen_and_closed_to_pip(noarch_env):
    frozen = noarch_env / FROZEN
    assert frozen.is_symlink() and frozen.is_file()
    msg = json.loads(frozen.read_text())["message"]
    assert f"--clone {noarch_env}" in msg and f"envtools clone {noarch_env}" in msg
    (marker,) = noarch_env.glob("lib/python3.*/EXTERNALLY-MANAGED")
    assert marker.is_symlink() and marker.read_text().startswith("[externally-managed]")
    for link in (frozen, marker):
        assert not os.path.isabs(os.readlink(link))
        assert Path(os.path.realpath(link)).parent == (noarch_env / SITE_ONLY).resolve()
        assert is_site_only(noarch_env, str(link.relative_to(noarch_env)))


def test_copies_that_skip_pkgs_are_open_to_pip_and_conda(noarch_env, tmp_path):
    """conda's clone and conda-pack copy every untracked file except a top-level pkgs/
    (and conda's clone all of conda-meta/): in such a copy the markers dangle, so pip
    and conda may change it; an envtools clone has neither."""
    copy = tmp_path / "copy"
    shutil.copytree(noarch_env, copy, symlinks=True,
                    ignore=lambda d, names: ["pkgs"] if Path(d) == noarch_env else [])
    (site_marker,) = noarch_env.glob("lib/python3.*/EXTERNALLY-MANAGED")
    marker = copy / site_marker.relative_to(noarch_env)  # (glob skips a dangling link)
    assert marker.is_symlink() and not os.path.isfile(marker)  # pip's own test
    assert not (copy / FROZEN).is_file()  # conda's (PrefixData.is_frozen)
    assert is_site_only(copy, str(marker.relative_to(copy)))
    clone = tmp_path / "clone"
    run_envtools("clone", copy, clone)  # (the dangling link is left out too)
    assert not os.path.lexists(clone / site_marker.relative_to(noarch_env))
    assert not (clone / "pkgs").exists() and not os.path.lexists(clone / FROZEN)


def test_package_cache_is_one_conda_can_read(noarch_env):
    """Each extracted package has conda's info/repodata_record.json (what conda matches
    a needed package against: url, size, md5), and the cache a urls.txt."""
    cache = noarch_env.parent / (noarch_env.name + ".pkgs")
    explicit = (noarch_env / "conda-meta" / "envtools" / "explicit.txt").read_text()
    urls = {ln.split("#")[0]: ln.split("#sha256:")[1] for ln in explicit.splitlines()
            if "#sha256:" in ln}
    listed = (cache / "urls.txt").read_text().split()
    assert sorted(listed) == sorted(urls)
    for data in records(noarch_env):
        entry = Path(data["extracted_package_dir"])
        assert entry.parent == cache
        rr = json.loads((entry / "info" / "repodata_record.json").read_text())
        assert rr["url"] == data["url"] and rr["sha256"] == urls[rr["url"]]
        for k in ("name", "version", "build", "md5", "size", "subdir", "fn", "channel"):
            assert rr.get(k) and rr[k] == data.get(k, rr[k]), k

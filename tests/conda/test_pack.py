"""conda-pack on envs envtools made (the site env and a clone), no flags: it reads each
package's noarch type from info/link.json, which ci's wheel conversion now writes; the
unpacked copy is open to pip (the site env's PEP 668 marker dangles there)."""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

import pytest
from conda_exes import ROOT, conda_pack_exe, envtools, fixture_channels, run, validate_errors

sys.path.insert(0, str(ROOT / "tests" / "ci"))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """A site env from the fixture channels plus a noarch package converted from a wheel
    by ci (the kind conda-pack refused without info/link.json)."""
    from ci.index import index_channel
    from ci.wheel2conda import convert_wheel
    from test_units import make_wheel

    tmp = tmp_path_factory.mktemp("pack")
    wheels = tmp / "wheels"
    wheels.mkdir()
    converted = tmp / "converted"
    convert_wheel(make_wheel(wheels, deps=False), converted, subdir="linux-64")
    index_channel(converted, ["linux-64"])
    ch, up = fixture_channels()
    prefix = tmp / "envs" / "powerai"
    envtools("install", "--channel", ch, "--channel", up, "--channel", converted,
             "--prefix", prefix, "demo-meta", "demo-noarch", "demo-pkg", "pip")
    return prefix


def pack_unpack(env: Path, tmp: Path) -> Path:
    out = tmp / "env.tar.gz"
    run([conda_pack_exe(), "-p", env, "-o", out, "-q"])
    dest = tmp / "unpacked"
    dest.mkdir()
    with tarfile.open(out) as tf:
        tf.extractall(dest, filter="fully_trusted")
    run([dest / "bin" / "conda-unpack"])
    return dest


@pytest.mark.parametrize("which", ["site", "clone"])
def test_conda_pack_takes_envtools_envs(site, tmp_path, which):
    """The clone too: it holds every file of each package's info/paths.json (the pyc the
    fixture python ships for its relocated _demo_where, compiled again for the clone)."""
    env = site
    if which == "clone":
        env = tmp_path / "clone"
        envtools("clone", site, env)
    dest = pack_unpack(env, tmp_path)
    # the wheel-made noarch package's files are where conda-pack put them: site-packages
    site_rel = next(p.relative_to(env) for p in env.glob("lib/python3.*/site-packages"))
    assert (dest / site_rel / "demo_pkg" / "__init__.py").is_file()
    assert not (dest / "site-packages").exists()
    marker = dest / site_rel.parent / "EXTERNALLY-MANAGED"
    assert not os.path.isfile(marker)  # pip's test: the copy is the user's
    assert not (dest / "conda-meta" / "frozen").is_file()  # conda's (CEP 22)
    # conda-unpack rewrites relocated files but not the records' sha256_in_prefix, so
    # only files without a prefix placeholder are expected to check out
    bad = [f for f in validate_errors(dest) if f["check"] != "altered-file"]
    assert not bad, bad

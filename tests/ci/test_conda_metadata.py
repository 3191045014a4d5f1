"""What conda and conda-pack read from the channel beyond what rattler needs: a noarch
package's ``info/link.json``, every record's ``timestamp``, the channel's
``channeldata.json``."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from ci.condainfo import read_info
from ci.index import index_channel
from ci.wheel2conda import convert_wheel, upgrade_converted, wheel_timestamp

sys.path.insert(0, str(Path(__file__).parent))
from test_units import make_wheel  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("zstd") is None,
                                reason="needs the zstd command (apt-get install zstd)")


def test_noarch_package_has_link_json_and_timestamp(tmp_path):
    whl = make_wheel(tmp_path, deps=False)
    pkg = convert_wheel(whl, tmp_path / "out", subdir="linux-64")
    info = read_info(pkg.path)
    assert json.loads(info["info/link.json"]) == {
        "noarch": {"type": "python"}, "package_metadata_version": 1}
    index = json.loads(info["info/index.json"])
    assert index["noarch"] == "python"
    assert index["timestamp"] == int(wheel_timestamp(whl).timestamp() * 1000) > 0
    # link.json is metadata: an installer must not link it into the prefix
    paths = [e["_path"] for e in json.loads(info["info/paths.json"])["paths"]]
    assert paths and not any(p.startswith("info/") for p in paths)
    # the archive still installs: rattler extracts it
    import rattler.package_streaming as ps

    ps.extract(str(pkg.path), str(tmp_path / "x"))
    assert (tmp_path / "x" / "info" / "link.json").is_file()
    assert (tmp_path / "x" / "site-packages").is_dir()


def test_binary_package_has_timestamp_no_link_json(tmp_path):
    pkg = convert_wheel(make_wheel(tmp_path, pure=False, deps=False), tmp_path / "out",
                        subdir="linux-64")
    info = read_info(pkg.path)
    assert "info/link.json" not in info
    assert json.loads(info["info/index.json"])["timestamp"] > 0


def test_conversion_is_reproducible(tmp_path):
    whl = make_wheel(tmp_path, deps=False)
    a = convert_wheel(whl, tmp_path / "a", subdir="linux-64").path.read_bytes()
    b = convert_wheel(whl, tmp_path / "b", subdir="linux-64").path.read_bytes()
    assert a == b


def test_upgrade_patches_an_old_conversion(tmp_path):
    """A package made without link.json and timestamp (converter 5) gets both, once."""
    import rattler_build

    files = tmp_path / "files" / "site-packages" / "demo"
    files.mkdir(parents=True)
    (files / "__init__.py").write_text("x = 1\n")
    whl = make_wheel(tmp_path, deps=False)
    out = rattler_build.assemble_package(
        name="demo-pkg", version="1.4.2", target_platform="noarch", build_string="pyh_0",
        output_dir=tmp_path / "out" / "noarch", files_dir=tmp_path / "files",
        noarch="python", detect_prefix=False)
    old = read_info(Path(out.path))
    assert "info/link.json" not in old and "timestamp" not in json.loads(old["info/index.json"])
    upgrade_converted(Path(out.path), whl)
    new = read_info(Path(out.path))
    assert json.loads(new["info/link.json"])["noarch"]["type"] == "python"
    assert json.loads(new["info/index.json"])["timestamp"] == int(
        wheel_timestamp(whl).timestamp() * 1000)
    assert new["info/paths.json"] == old["info/paths.json"]
    before = Path(out.path).read_bytes()
    upgrade_converted(Path(out.path), whl)  # a second time changes nothing
    assert Path(out.path).read_bytes() == before


def test_index_writes_channeldata_and_timestamps(tmp_path):
    ch = tmp_path / "channel"
    convert_wheel(make_wheel(tmp_path, deps=False), ch, subdir="linux-64")
    convert_wheel(make_wheel(tmp_path, pure=False, deps=False), ch, subdir="linux-64")
    index_channel(ch, ["linux-64"])
    for sub in ("noarch", "linux-64"):
        rd = json.loads((ch / sub / "repodata.json").read_text())
        recs = [*rd.get("packages", {}).values(), *rd.get("packages.conda", {}).values()]
        assert recs and all(r.get("timestamp") for r in recs), sub
    cd = json.loads((ch / "channeldata.json").read_text())
    assert cd["channeldata_version"] == 1
    assert set(cd["subdirs"]) == {"noarch", "linux-64"}
    assert cd["packages"]["demo-pkg"]["subdirs"] == ["linux-64", "noarch"]
    assert cd["packages"]["demo-pkg"]["version"] == "1.4.2"
    assert cd["packages"]["demo-pkg"]["license"] == "MIT"


def test_standins_patch_old_conversions_instead_of_redoing_them(tmp_path):
    """convert_all finds a converter-5 package in the stand-in channel: it is patched in
    place and the channel re-indexed (the new sha256 in repodata), not converted again."""
    import rattler_build
    from ci.standins import WHEEL_STATE, convert_all

    whl = make_wheel(tmp_path, deps=False)
    ch = tmp_path / "standins"
    files = tmp_path / "files" / "site-packages" / "demo"
    files.mkdir(parents=True)
    (files / "__init__.py").write_text("old = True\n")  # not what converting makes
    out = rattler_build.assemble_package(
        name="demo-pkg", version="1.4.2", target_platform="noarch", build_string="pyh_0",
        output_dir=ch / "noarch", files_dir=tmp_path / "files", noarch="python",
        detect_prefix=False)
    index_channel(ch, ["linux-64"])
    key = f"noarch/{Path(out.path).name}"
    (ch / WHEEL_STATE).write_text(json.dumps({whl.name: {
        "key": key, "name": "demo-pkg", "version": "1.4.2", "depends": ["python"],
        "license": "MIT", "converter": 5}}))
    convert_all([whl], "linux-64", ch, "3.11")
    info = read_info(ch / key)
    assert "info/link.json" in info
    state = json.loads((ch / WHEEL_STATE).read_text())
    from ci.wheel2conda import CONVERTER_VERSION

    assert state[whl.name]["converter"] == CONVERTER_VERSION
    rd = json.loads((ch / "noarch" / "repodata.json").read_text())
    rec = rd["packages.conda"][Path(out.path).name]
    import hashlib

    assert rec["sha256"] == hashlib.sha256((ch / key).read_bytes()).hexdigest()
    assert rec["timestamp"] == int(wheel_timestamp(whl).timestamp() * 1000)
    # patched, not reconverted: the old files are still the package's
    import rattler.package_streaming as ps

    ps.extract(str(ch / key), str(tmp_path / "x"))
    assert (tmp_path / "x" / "site-packages" / "demo" / "__init__.py").read_text() == "old = True\n"

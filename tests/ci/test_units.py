"""Small parts of ci on their own: wheel conversion, the source mirror, the CI matrix,
variant filtering."""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml
from ci.config import load_settings
from ci.matrix import write_matrix
from ci.mirror import ChecksumError, SourceMirror, debian_archive_uris, debian_orig_url
from ci.render import filter_variants
from ci.wheel2conda import convert_wheel, marker_env, requirement_to_conda

ROOT = Path(__file__).resolve().parents[2]


def make_wheel(tmp: Path, *, pure: bool = True, deps: bool = True) -> Path:
    """A tiny wheel with a module, a console script, a data file and dependencies."""
    tag = "py3-none-any" if pure else "cp311-cp311-manylinux_2_17_x86_64"
    whl = tmp / f"demo_pkg-1.4.2-{tag}.whl"
    meta = (
        "Metadata-Version: 2.1\nName: demo-pkg\nVersion: 1.4.2\nSummary: demo\nLicense: MIT\n"
        "Requires-Python: >=3.9\n"
    )
    if deps:
        meta += (
            "Requires-Dist: numpy>=1.21,<3\n"
            "Requires-Dist: pywin32; sys_platform == 'win32'\n"
            "Requires-Dist: torch~=2.1; extra == 'gpu'\n"
            "Requires-Dist: tensorflow-cpu==2.21.0\n"
        )
    with zipfile.ZipFile(whl, "w") as z:
        z.writestr("demo_pkg/__init__.py", "def main():\n    print('demo ok')\n    return 0\n")
        z.writestr("demo_pkg-1.4.2.dist-info/METADATA", meta)
        z.writestr("demo_pkg-1.4.2.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
        z.writestr(
            "demo_pkg-1.4.2.dist-info/entry_points.txt", "[console_scripts]\ndemo = demo_pkg:main\n"
        )
        z.writestr("demo_pkg-1.4.2.dist-info/RECORD", "")
        z.writestr("demo_pkg-1.4.2.data/data/share/demo/readme.txt", "hi\n")
    return whl


def read_conda(path: Path) -> dict:
    """info/*.json of a .conda package (zip of zstd tarballs), read with tar."""
    out = {}
    with zipfile.ZipFile(path) as z:
        info = next(n for n in z.namelist() if n.startswith("info-"))
        data = z.read(info)
    tmp = path.parent / "x"
    tmp.mkdir(exist_ok=True)
    (tmp / info).write_bytes(data)
    subprocess.run(["tar", "--zstd", "-xf", str(tmp / info), "-C", str(tmp)], check=True)
    for name in ("index.json", "paths.json", "about.json"):
        out[name] = json.loads((tmp / "info" / name).read_text())
    return out


def test_pure_wheel_becomes_noarch_python(tmp_path):
    pkg = convert_wheel(make_wheel(tmp_path), tmp_path / "out", subdir="linux-64")
    assert pkg.subdir == "noarch" and pkg.path.name == "demo-pkg-1.4.2-pyh_0.conda"
    info = read_conda(pkg.path)
    idx = info["index.json"]
    assert idx["noarch"] == "python"
    # markers evaluated for the target; extras never; conda names; PEP 440 -> conda specs
    assert idx["depends"][0] == "python >=3.9" and idx["depends"][2] == "tensorflow ==2.21.0"
    name, spec = idx["depends"][1].split()
    assert name == "numpy" and set(spec.split(",")) == {">=1.21", "<3"}
    assert len(idx["depends"]) == 3
    paths = {p["_path"] for p in info["paths.json"]["paths"]}
    assert "site-packages/demo_pkg/__init__.py" in paths
    assert "python-scripts/demo" in paths and "share/demo/readme.txt" in paths
    assert "site-packages/demo_pkg-1.4.2.dist-info/RECORD" in paths


def test_binary_wheel_installs_and_script_runs(tmp_path):
    """A converted binary wheel solves and installs with py-rattler; its script runs."""
    import rattler
    import rattler_build
    from ci.index import index_channel

    whl = make_wheel(tmp_path, pure=False, deps=False)
    pkg = convert_wheel(whl, tmp_path / "chan", subdir="linux-64")
    assert pkg.subdir == "linux-64" and pkg.depends == ["python 3.11.*"]
    assert pkg.path.name == "demo-pkg-1.4.2-py311_0.conda"
    # an empty `python` record to satisfy the dependency; its bin/python is linked below
    empty = tmp_path / "empty"
    empty.mkdir()
    rattler_build.assemble_package(
        "python", "3.11.2", "linux-64", "0", tmp_path / "chan" / "linux-64", files_dir=empty
    )
    index_channel(tmp_path / "chan", ["linux-64"])
    records = asyncio.run(
        rattler.solve(
            [rattler.Channel(str(tmp_path / "chan"))],
            ["demo-pkg"],
            platforms=["linux-64", "noarch"],
        )
    )
    prefix = tmp_path / "prefix"
    asyncio.run(rattler.install(records, target_prefix=prefix, show_progress=False))
    (prefix / "bin" / "python").symlink_to(sys.executable)
    site = prefix / "lib/python3.11/site-packages"
    assert (site / "demo_pkg" / "__init__.py").exists()
    assert (prefix / "share/demo/readme.txt").read_text() == "hi\n"
    # binary wheels ship bytecode: a read-only shared install could never write it
    assert list((site / "demo_pkg" / "__pycache__").glob("__init__.cpython-311*.pyc"))
    r = subprocess.run(
        [str(prefix / "bin" / "demo")],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0 and r.stdout.strip() == "demo ok", r.stderr


def test_requirement_markers():
    env = marker_env("3.11", "linux-ppc64le")
    assert requirement_to_conda("foo>=1; platform_machine=='x86_64'", env) is None
    assert requirement_to_conda("foo>=1; platform_machine=='ppc64le'", env) == "foo >=1"
    assert requirement_to_conda("Foo_Bar ~=1.4.2", env) == "foo-bar >=1.4.2,<1.5"
    assert requirement_to_conda("mdurl~=0.1", env) == "mdurl >=0.1,<1"
    assert requirement_to_conda("x==2.4.*", env) == "x >=2.4,<2.5"
    assert requirement_to_conda("xgboost-cpu==3.2.0", env) == "xgboost ==3.2.0"


def test_mirror_refuses_bad_sha256(tmp_path):
    src = tmp_path / "Python-3.11.2.tgz"
    src.write_bytes(b"not really python")
    actual = hashlib.sha256(b"not really python").hexdigest()
    expected = "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849"
    m = SourceMirror(tmp_path / "mirror")
    with pytest.raises(ChecksumError) as e:
        m.fetch(src.as_uri(), expected)
    msg = str(e.value)
    assert "Python-3.11.2.tgz" in msg and expected in msg and actual in msg
    assert not (tmp_path / "mirror" / "Python-3.11.2.tgz").exists()
    # a good file is kept and found again without fetching
    good = hashlib.sha256(src.read_bytes()).hexdigest()
    assert m.fetch(src.as_uri(), good).read_bytes() == b"not really python"
    src.unlink()
    assert m.fetch(src.as_uri(), good).exists()


def test_debian_orig_url_from_apt_sources(tmp_path):
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\nURIs: http://mirror.example/debian\nSuites: bookworm\n\n"
        "Types: deb\nURIs: http://mirror.example/debian-security\nSuites: bookworm-security\n"
    )
    uris = debian_archive_uris(apt)
    assert uris == ["http://mirror.example/debian"]
    assert debian_orig_url(uris[0], "python3.11", "3.11.2") == (
        "http://mirror.example/debian/pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz"
    )
    assert "/pool/main/libf/libffi/" in debian_orig_url(uris[0], "libffi", "3.4")


def test_matrix_files_and_workflow(tmp_path):
    s = load_settings(ROOT)
    files = write_matrix(s, tmp_path, "native")
    support = sorted((tmp_path / ".ci_support").glob("*.yaml"))
    per_platform = len(s.variants["mpi"]) * len(s.variants["python"])
    n = len(s.target_platforms) * per_platform
    assert len(support) == n
    one = yaml.safe_load(
        (tmp_path / ".ci_support" / "linux_64_mpiopenmpi_python3.11.yaml").read_text()
    )
    assert (
        one["mpi"] == ["openmpi"]
        and one["python"] == ["3.11"]
        and one["target_platforms"] == ["linux-64"]
    )
    assert one["zip_keys"] == s.variants["zip_keys"]
    wf = yaml.safe_load(files[-1].read_text())
    include = wf["jobs"]["build"]["strategy"]["matrix"]["include"]
    foreign = [p for p in s.target_platforms if p != "linux-64"]
    # a foreign platform's variant file runs twice: cross on x86_64 and on a native runner
    assert len(include) == n + len(foreign) * per_platform
    for job in include:
        assert (tmp_path / job["config"]).exists()
    assert len({j["job"] for j in include}) == len(include)  # artifact names stay unique
    ppc = [j for j in include if j["platform"] == "linux-ppc64le"]
    native = [j for j in ppc if not j["cross"]]
    cross = [j for j in ppc if j["cross"]]
    assert len(native) == len(cross) == per_platform
    assert all(j["runner"] == ["self-hosted", "linux", "ppc64le"] for j in native)
    assert all(j["runner"] == "ubuntu-24.04" and "gcc-powerpc64le-linux-gnu" in j["apt"]
               for j in cross)
    write_matrix(s, tmp_path, "cross")
    wf = yaml.safe_load((tmp_path / ".github/workflows/ddlce-channel.yml").read_text())
    assert all(
        j["cross"]
        for j in wf["jobs"]["build"]["strategy"]["matrix"]["include"]
        if j["platform"] == "linux-ppc64le"
    )


def test_matrix_native_aarch64_and_ppc64le_beside_cross(tmp_path):
    """With linux-aarch64 among the targets, each foreign variant file gets a cross job
    (x86_64, its own cross gcc) and a native one (Arm: GitHub's hosted arm runner)."""
    s = load_settings(ROOT)
    s.target_platforms = ["linux-64", "linux-ppc64le", "linux-aarch64"]
    s.variants["mpi"], s.variants["python"] = ["openmpi"], ["3.11"]
    wf_path = tmp_path / ".github/workflows/ddlce-channel.yml"
    write_matrix(s, tmp_path)
    wf = yaml.safe_load(wf_path.read_text())
    include = wf["jobs"]["build"]["strategy"]["matrix"]["include"]
    got = {(j["platform"], j["cross"]): j for j in include}
    assert set(got) == {("linux-64", False), ("linux-ppc64le", True), ("linux-ppc64le", False),
                        ("linux-aarch64", True), ("linux-aarch64", False)}
    assert got[("linux-aarch64", False)]["runner"] == "ubuntu-24.04-arm"
    assert "gcc-aarch64-linux-gnu" in got[("linux-aarch64", True)]["apt"]
    assert got[("linux-aarch64", True)]["runner"] == "ubuntu-24.04"
    step = next(st for st in wf["jobs"]["build"]["steps"] if st.get("if") == "${{ matrix.cross }}")
    assert "${{ matrix.apt }}" in step["run"]
    # a site without an Arm runner: cross only for aarch64, Power unchanged
    write_matrix(s, tmp_path, "native", aarch64="cross")
    include = yaml.safe_load(wf_path.read_text())["jobs"]["build"]["strategy"]["matrix"]["include"]
    kinds = {(j["platform"], j["cross"]) for j in include}
    assert ("linux-aarch64", False) not in kinds and ("linux-ppc64le", False) in kinds
    r = subprocess.run([sys.executable, "-m", "ci", "matrix", "--out", str(tmp_path),
                        "--ppc64le", "sometimes"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "--ppc64le 'sometimes'" in r.stderr and "hint:" in r.stderr
    assert "Traceback" not in r.stderr


def test_filter_variants_drops_what_upstream_lacks():
    s = load_settings(ROOT)
    v, reasons = filter_variants(
        s, lambda spec, build=None: not spec.startswith("python 3.12") and spec != "mpich"
        and build is None
    )
    assert v["python"] == ["3.11"] and v["mpi"] == ["openmpi", "external"]
    assert any("python=3.12" in r for r in reasons) and any("mpi=mpich" in r for r in reasons)
    # zip_keys move together
    assert len(v["build_type"]) == len(v["cuda_compiler_version"])


def test_cuda_variants_need_nvcc_or_an_upstream_cuda_pytorch(monkeypatch):
    """powerai's CUDA build only packages CUDA builds made upstream: without nvcc it is
    kept when the upstream has a CUDA pytorch, and dropped with the reason otherwise."""
    import ci.render

    monkeypatch.setattr(ci.render, "have_cuda_compiler", lambda: False)
    s = load_settings(ROOT)
    with_cuda = lambda spec, build=None: spec == "pytorch" and build == "cuda*"  # noqa: E731
    v, reasons = filter_variants(s, with_cuda)
    assert v["build_type"] == ["cpu", "cuda"] and v["cuda_compiler_version"][1] == "13.0"
    assert not any("build_type" in r for r in reasons)
    v, reasons = filter_variants(s, lambda spec, build=None: False)
    assert v["build_type"] == ["cpu"] and v["cuda_compiler_version"] == ["None"]
    assert any("build_type=cuda" in r and "no CUDA pytorch build upstream" in r
               for r in reasons), reasons


def test_cross_builds_take_external_mpi_and_a_cuda_only_pytorch_drops_cpu():
    """A cross build is tested under qemu: MPICH (whose launcher execs foreign proxies)
    goes, external and openmpi stay. Where the
    upstream's pytorch is a CUDA build alone (PyPI's linux-aarch64 torch), powerai's CPU
    build has nothing to pin and goes, with the reason; both stay where a CPU one exists."""
    s = load_settings(ROOT)

    def upstream(cpu_torch: bool):
        def has(spec, build=None):
            if spec == "pytorch":
                return build in (None, "cuda*") or (cpu_torch and build == "cpu*")
            return spec.startswith("python 3.11") or spec in ("openmpi", "mpich")
        return has

    v, reasons = filter_variants(s, upstream(cpu_torch=False), cross=True)
    assert v["mpi"] == ["openmpi", "external"]
    assert any("mpi=mpich" in r and "binfmt_misc" in r for r in reasons), reasons
    assert v["build_type"] == ["cuda"] and v["cuda_compiler_version"] == ["13.0"]
    assert any("build_type=cpu" in r and "CUDA build only" in r for r in reasons), reasons
    v, reasons = filter_variants(s, upstream(cpu_torch=True))
    assert v["mpi"] == ["openmpi", "mpich", "external"]
    assert v["build_type"] == ["cpu", "cuda"] and not any("build_type" in r for r in reasons)


def test_release_cuda_is_the_one_cuda_compiler_version():
    from ci.build import release_cuda

    assert release_cuda(load_settings(ROOT).variants) == "13.0"
    assert release_cuda({"cuda_compiler_version": ["None"]}) is None
    assert release_cuda({}) is None


def test_publish_upstream_is_a_standard_channel_kept_in_step(tmp_path):
    """The stand-ins published as channel-upstream/: linked, indexed, and in step with the
    cache (a package gone from it goes from the channel too)."""
    import os

    from ci.vendor import publish_upstream

    cache = tmp_path / "cache"
    pkg = convert_wheel(make_wheel(tmp_path), cache, subdir="linux-64")
    other = cache / "noarch" / "other-1.0-pyh_0.conda"
    os.link(pkg.path, other)  # (a second package file: only its name matters here)
    pub = tmp_path / "channel-upstream"
    assert publish_upstream(cache, pub, ["linux-64"]) == 2
    assert os.stat(pub / "noarch" / pkg.path.name).st_ino == os.stat(pkg.path).st_ino
    repodata = json.loads((pub / "noarch" / "repodata.json").read_text())
    assert pkg.path.name in repodata["packages.conda"]
    assert (pub / "linux-64" / "repodata.json").exists()
    assert publish_upstream(cache, pub, ["linux-64"]) == 0  # a rerun: nothing to do
    other.unlink()
    publish_upstream(cache, pub, ["linux-64"])
    assert not (pub / "noarch" / other.name).exists()
    repodata = json.loads((pub / "noarch" / "repodata.json").read_text())
    assert list(repodata["packages.conda"]) == [pkg.path.name]


def test_publish_upstream_follows_a_stand_in_converted_again(tmp_path):
    """A stand-in converted again keeps its file name (openmpi with the MPI mutex added):
    channel-upstream/ gets the new file and its record, not the old record of that name
    (the indexer knows a package by its file name); an index an earlier run left stale
    is mended by the next publish, with nothing to copy."""
    import os

    from ci.vendor import publish_upstream

    cache, pub = tmp_path / "cache", tmp_path / "channel-upstream"
    (tmp_path / "w1").mkdir()
    (tmp_path / "w2").mkdir()
    first = convert_wheel(make_wheel(tmp_path / "w1", deps=False), cache, subdir="linux-64")
    assert publish_upstream(cache, pub, ["linux-64"]) == 1
    rd = pub / "noarch" / "repodata.json"
    stale = rd.read_text()
    assert json.loads(stale)["packages.conda"][first.path.name]["depends"] == ["python >=3.9"]
    again = convert_wheel(make_wheel(tmp_path / "w2"), tmp_path / "staging", subdir="linux-64")
    assert again.path.name == first.path.name
    os.replace(again.path, first.path)  # (as standins.convert_all does)

    def record() -> dict:
        return json.loads(rd.read_text())["packages.conda"][first.path.name]

    assert publish_upstream(cache, pub, ["linux-64"]) == 1
    assert any(d.startswith("numpy") for d in record()["depends"]), record()
    assert record()["size"] == first.path.stat().st_size
    rd.write_text(stale)  # an index left stale by an earlier run
    assert publish_upstream(cache, pub, ["linux-64"]) == 0
    assert any(d.startswith("numpy") for d in record()["depends"]), record()


def _wheel(tmp: Path, name: str, version: str, requires: list[str],
           files: dict[str, bytes], tag: str = "py3-none-manylinux_2_17_x86_64") -> Path:
    """A small wheel of a CUDA-set shape (a made-up library where NVIDIA's would be)."""
    dist = name.replace("-", "_")
    whl = tmp / f"{dist}-{version}-{tag}.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nLicense: Other\n"
    meta += "".join(f"Requires-Dist: {r}\n" for r in requires)
    with zipfile.ZipFile(whl, "w") as z:
        for path, data in files.items():
            z.writestr(path, data)
        z.writestr(f"{dist}-{version}.dist-info/METADATA", meta)
        z.writestr(f"{dist}-{version}.dist-info/WHEEL", f"Wheel-Version: 1.0\nTag: {tag}\n")
        z.writestr(f"{dist}-{version}.dist-info/RECORD", "")
    return whl


def test_cuda_set_conversion_names_links_and_pins(tmp_path):
    """The CUDA set as wheel2conda makes it: NVIDIA's wheels under conda-forge's names with
    their libraries linked into lib/, extras requested by another wheel become plain
    dependencies, and the framework's CUDA build needs __cuda and outranks the CPU one;
    then a real solve picks it with a driver and the CPU build without."""
    import asyncio
    import os

    import rattler
    from ci.index import index_channel
    from ci.wheel2conda import requested_extras

    src = tmp_path / "whl"
    src.mkdir()
    nccl = _wheel(src, "nvidia-nccl-cu13", "2.29.7", [],
                  {"nvidia/nccl/lib/libnccl.so.2": b"\x7fELF fake nccl"})
    rt = _wheel(src, "nvidia-cuda-runtime", "13.0.96", [],
                {"nvidia/cu13/lib/libcudart.so.13": b"\x7fELF fake cudart"})
    kit = _wheel(src, "cuda-toolkit", "13.0.3", [
        "nvidia-cuda-runtime==13.0.96.*; extra == 'cudart'",
        "nvidia-cublas==13.1.*; extra == 'cublas'"], {}, tag="py3-none-any")
    fw_tag = "cp311-cp311-manylinux_2_28_x86_64"
    fw = _wheel(src, "demo-fw", "1.0", [
        "cuda-toolkit[cudart]==13.0.3; platform_system == 'Linux'",
        "nvidia-nccl-cu13==2.29.7"], {"demo_fw/__init__.py": b""}, tag=fw_tag)
    cpu = _wheel(src, "demo-fw", "1.0+cpu", [], {"demo_fw/__init__.py": b""}, tag=fw_tag)
    extras = requested_extras([nccl, rt, kit, fw, cpu])
    assert extras == {"cuda-toolkit": frozenset({"cudart"})}
    ch = tmp_path / "channel"
    pk = convert_wheel(kit, ch, subdir="linux-64", extras=extras["cuda-toolkit"])
    assert pk.depends == ["python", "cuda-cudart >=13.0.96,<13.0.97"]  # only the asked extra
    pn = convert_wheel(nccl, ch, subdir="linux-64")
    assert pn.name == "nccl" and pn.version == "2.29.7"
    pr = convert_wheel(rt, ch, subdir="linux-64")
    assert pr.name == "cuda-cudart"
    paths = {p["_path"]: p for p in read_conda(pn.path)["paths.json"]["paths"]}
    assert paths["lib/libnccl.so.2"]["path_type"] == "softlink"
    assert "lib/python3.11/site-packages/nvidia/nccl/lib/libnccl.so.2" in paths
    pf = convert_wheel(fw, ch, subdir="linux-64", cuda="13.0")
    assert pf.depends[-1] == "__cuda >=13.0" and "nccl ==2.29.7" in pf.depends
    assert pf.path.name == "demo-fw-1.0-cuda130_py311_1.conda"
    assert read_conda(pf.path)["index.json"]["build_number"] == 1
    pc = convert_wheel(cpu, ch, subdir="linux-64")
    assert pc.path.name == "demo-fw-1.0-cpu_py311_0.conda"
    # a python for the solve (the binary builds pin python 3.11.*)
    import rattler_build

    (tmp_path / "pyfiles").mkdir()
    (tmp_path / "pyfiles" / "README").write_text("stand-in\n")
    rattler_build.assemble_package(name="python", version="3.11.2", target_platform="linux-64",
                                   build_string="h0_0", output_dir=ch / "linux-64",
                                   files_dir=tmp_path / "pyfiles")
    index_channel(ch, ["linux-64"])
    os.chmod(ch, 0o755)

    def solve(cuda: str | None) -> dict[str, str]:
        virt = [rattler.GenericVirtualPackage(rattler.PackageName("__cuda"),
                                              rattler.Version(cuda), rattler.BuildString("0"))
                ] if cuda else []
        recs = asyncio.run(rattler.solve(
            sources=[rattler.Channel(str(ch))], specs=["demo-fw"],
            platforms=["linux-64", "noarch"], virtual_packages=virt))
        return {r.name.normalized: json.loads(r.to_json())["build"] for r in recs}

    with_driver = solve("13.0")
    assert with_driver["demo-fw"] == "cuda130_py311_1" and "nccl" in with_driver
    assert "cuda-cudart" in with_driver  # through cuda-toolkit's requested extra
    assert solve(None)["demo-fw"] == "cpu_py311_0"
    assert solve("12.4")["demo-fw"] == "cpu_py311_0"  # a driver too old for it


def test_vendored_copy_is_replaced_by_a_newer_upstream_build(tmp_path):
    """channel/ vendors the upstream part of powerai's solution; when the upstream
    rebuilds a package (a higher build number, same version), the next vendoring takes
    the new build and drops the copy nothing uses any more, rather than keep solving to
    the stale copy because channel/ is searched first."""
    import rattler_build
    from ci.index import index_channel
    from ci.state import load_state, save_state
    from ci.vendor import vendor_closure

    files = tmp_path / "files"
    files.mkdir()
    (files / "README").write_text("stand-in\n")
    up, ch = tmp_path / "upstream", tmp_path / "channel"

    def pkg(where: Path, name: str, build_number: int, depends=()) -> Path:
        out = rattler_build.assemble_package(
            name=name, version="1.0", target_platform="linux-64",
            build_string=f"h0_{build_number}", build_number=build_number,
            output_dir=where / "linux-64", files_dir=files, depends=list(depends),
            compression_level=1)
        return Path(out.path)

    old = pkg(up, "libx", 0)
    pkg(ch, "powerai", 0, ["libx 1.0.*"])
    index_channel(up, ["linux-64"])
    index_channel(ch, ["linux-64"])
    assert vendor_closure(ch, [str(up)], "linux-64") == 1
    assert (ch / "linux-64" / old.name).exists()
    outside = tmp_path / "outside.conda"
    outside.write_text("not the channel's\n")
    state = load_state(ch)
    state["linux-64/../../outside.conda"] = {"origin": "upstream", "test": "-"}
    save_state(ch, state)  # a tampered state file names a path out of the channel
    new = pkg(up, "libx", 1)  # the upstream rebuilds libx
    index_channel(up, ["linux-64"])
    assert vendor_closure(ch, [str(up)], "linux-64") == 1
    assert (ch / "linux-64" / new.name).exists() and not (ch / "linux-64" / old.name).exists()
    repodata = json.loads((ch / "linux-64" / "repodata.json").read_text())
    assert sorted(repodata["packages.conda"]) == sorted([new.name, "powerai-1.0-h0_0.conda"])
    state = load_state(ch)
    assert f"linux-64/{new.name}" in state and f"linux-64/{old.name}" not in state
    assert outside.exists() and "linux-64/../../outside.conda" not in state
    assert vendor_closure(ch, [str(up)], "linux-64") == 0  # a rerun: nothing to do


def test_sysroot_absolute_links_point_inside_it(tmp_path):
    """Debian's absolute library links (libz.so -> /lib/<triplet>/...) are rewritten to the
    same path inside the sysroot, so a cross link never reaches the build host's files."""
    from ci.sysroot import relative_links

    root = tmp_path / "sysroot"
    (root / "lib" / "tri").mkdir(parents=True)
    (root / "usr" / "lib" / "tri").mkdir(parents=True)
    (root / "lib" / "tri" / "libz.so.1.2.13").write_text("target")
    (root / "usr" / "lib" / "tri" / "libz.so").symlink_to("/lib/tri/libz.so.1.2.13")
    (root / "usr" / "lib" / "tri" / "libffi.so").symlink_to("libffi.so.8")  # relative: kept
    assert relative_links(root) == 1
    link = root / "usr" / "lib" / "tri" / "libz.so"
    assert not link.readlink().is_absolute()
    assert link.read_text() == "target"
    assert (root / "usr" / "lib" / "tri" / "libffi.so").readlink() == Path("libffi.so.8")


def test_build_skip_conditions_are_evaluated_per_platform_and_variant():
    """py-rattler-build's render leaves build.skip unevaluated: ci evaluates it, so numpy's
    source stand-in (linux-ppc64le only) and powerai's CUDA build on Power never build."""
    from ci.render import RecipeError, find_recipes, render_all, skip_reason

    assert skip_reason(["not ppc64le"], "linux-64", {}) == "not ppc64le"
    assert skip_reason(["not ppc64le"], "linux-ppc64le", {}) == ""
    cond = 'build_type == "cuda" and ppc64le'
    assert skip_reason([cond], "linux-ppc64le", {"build_type": "cuda"}) == cond
    assert skip_reason([cond], "linux-ppc64le", {"build_type": "cpu"}) == ""
    assert skip_reason([cond], "linux-aarch64", {"build_type": "cuda"}) == ""
    with pytest.raises(RecipeError, match="power9"):
        skip_reason(["power9"], "linux-64", {})
    root = Path(__file__).resolve().parents[2]
    # the MPI mutex (mpi) is noarch, one build per flavour but `external` (conda-forge has none)
    variants = {"python": ["3.11"], "mpi": ["openmpi", "mpich", "external"]}
    for platform, built in (("linux-64", {"python", "mpi"}),
                            ("linux-ppc64le", {"python", "numpy", "mpi4py", "mpi"})):
        skipped: list[str] = []
        nodes = render_all(find_recipes(root / "recipes", upstream=True), variants, [platform],
                           skipped)
        assert {n.name for n in nodes} == built
        assert sorted(n.build_string for n in nodes if n.name == "mpi") == ["mpich", "openmpi"]
        mutex = [x for x in skipped if x.startswith("mpi for")]
        assert len(mutex) == 1 and 'build.skip mpi == "external"' in mutex[0], skipped
        rest = [x for x in skipped if x not in mutex]
        assert len(rest) == 4 - len(built), skipped
        assert all("build.skip not ppc64le" in x for x in rest)


def test_pypi_source_urls_are_fetched_by_pip_and_checked(tmp_path, monkeypatch):
    """pypi://<project>/<file> sources come through pip (its own index settings: here a
    local folder) and are refused, naming the file and both hashes, when they differ."""
    import tarfile

    from ci.mirror import MirrorMiss, pypi_sdist

    assert pypi_sdist("pypi://numpy/numpy-2.4.6.tar.gz") == ("numpy", "2.4.6")
    assert pypi_sdist("https://example.invalid/x-1.tar.gz") is None
    with pytest.raises(MirrorMiss, match="pypi://<project>"):
        pypi_sdist("pypi://numpy/scipy-1.0.tar.gz")
    # a minimal sdist in a local "index" (pip --find-links), no build isolation needed
    src = tmp_path / "demo_pkg-1.0"
    src.mkdir()
    (src / "pyproject.toml").write_text(
        '[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'
        '[project]\nname = "demo_pkg"\nversion = "1.0"\n')
    (src / "PKG-INFO").write_text("Metadata-Version: 2.1\nName: demo_pkg\nVersion: 1.0\n")
    links = tmp_path / "links"
    links.mkdir()
    with tarfile.open(links / "demo_pkg-1.0.tar.gz", "w:gz") as tf:
        tf.add(src, arcname="demo_pkg-1.0")
    good = hashlib.sha256((links / "demo_pkg-1.0.tar.gz").read_bytes()).hexdigest()
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    monkeypatch.setenv("PIP_NO_BUILD_ISOLATION", "0")
    m = SourceMirror(tmp_path / "mirror")
    url = "pypi://demo-pkg/demo_pkg-1.0.tar.gz"
    with pytest.raises(ChecksumError) as e:
        m.fetch(url, "0" * 64)
    assert "demo_pkg-1.0.tar.gz" in str(e.value) and "0" * 64 in str(e.value)
    assert good in str(e.value)
    assert not list((tmp_path / "mirror").glob("demo*"))  # nothing half-kept
    assert m.fetch(url, good) == tmp_path / "mirror" / "demo_pkg-1.0.tar.gz"


def test_foreign_programs_run_through_host_scripts(tmp_path):
    """Without binfmt_misc a foreign program can only start foreign programs through host
    scripts: the sysroot's orted, and target-run / target-mpirun for an env's programs."""
    from ci.sysroot import prepare_for_qemu

    root = tmp_path / "sysroot-ppc64el"
    (root / "usr" / "bin").mkdir(parents=True)
    (root / "usr" / "bin" / "orted").write_bytes(b"\x7fELF-foreign")
    prepare_for_qemu(root, "ppc64el")
    prepare_for_qemu(root, "ppc64el")  # again: idempotent
    assert (root / "usr" / "bin" / "orted.ppc64el").read_bytes() == b"\x7fELF-foreign"
    orted = (root / "usr" / "bin" / "orted").read_text()
    assert orted.startswith("#!/bin/sh") and "qemu-ppc64le" in orted
    run = (root / "ddlce-bin" / "target-run").read_text()
    assert f"qemu-ppc64le -L {root}/ddlce-qemu" in run and "$PREFIX/lib" in run
    mpirun = (root / "ddlce-bin" / "target-mpirun").read_text()
    assert f"{root}/usr/bin/orterun" in mpirun and "--mca pml ob1" in mpirun
    # the scripts run: target-run hands its arguments to qemu (here: a stand-in qemu)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "qemu-ppc64le").write_text('#!/bin/sh\necho "qemu $*"\n')
    (fake / "qemu-ppc64le").chmod(0o755)
    out = subprocess.run([str(root / "ddlce-bin" / "target-run"), "prog", "arg"],
                         capture_output=True, text=True, check=True,
                         env={"PATH": f"{fake}:/usr/bin:/bin", "PREFIX": "/env"}).stdout
    assert out.startswith(f"qemu -L {root}/ddlce-qemu") and out.strip().endswith("prog arg")
    assert "LD_LIBRARY_PATH=/env/lib:" in out and f"OPAL_PREFIX={root}/usr" in out
    # an env with its own Open MPI (the openmpi builds) launches with that one's prterun,
    # and its programs find Open MPI's files there, not in the sysroot
    env = tmp_path / "env"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "prterun").write_text("")
    (env / "bin" / "prterun").chmod(0o755)
    out = subprocess.run([str(root / "ddlce-bin" / "target-mpirun"), "-n", "2", "prog"],
                         capture_output=True, text=True, check=True,
                         env={"PATH": f"{fake}:/usr/bin:/bin", "PREFIX": str(env),
                              "OMPI_ALLOW_RUN_AS_ROOT": "1"}).stdout
    assert f"OPAL_PREFIX={env} " in out and f"{env}/bin/prterun" in out, out
    assert out.strip().endswith("-n 2 prog") and "orterun" not in out


def test_emulated_arm64_cpu_is_described_from_what_qemu_reports(tmp_path):
    """qemu's -L prefix holds the cross libc and, on arm64, /proc/cpuinfo and MIDR_EL1 as
    the emulated CPU reports them (torch's CPU detection crashes on the host's x86 text):
    the probe's MIDR and HWCAPs, not a made-up CPU."""
    import shutil

    from ci.sysroot import emulated_root

    q = emulated_root(tmp_path / "sysroot-ppc64el", "ppc64el")
    assert not (q / "proc").exists()  # nothing to describe there
    if not (shutil.which("aarch64-linux-gnu-gcc") and shutil.which("qemu-aarch64")):
        pytest.skip("needs aarch64-linux-gnu-gcc and qemu-aarch64 (.ci/apt-packages.txt)")
    q = emulated_root(tmp_path / "sysroot-arm64", "arm64")
    assert (q / "lib").resolve() == Path("/usr/aarch64-linux-gnu/lib").resolve()
    probe = subprocess.run(["qemu-aarch64", "-L", str(q), str(q / "cpu-probe")],
                           capture_output=True, text=True, check=True).stdout.split()
    midr, hwcap = int(probe[0]), int(probe[1])
    info = (q / "proc" / "cpuinfo").read_text()
    assert info.count("processor\t:") >= 1
    assert f"CPU part\t: 0x{midr >> 4 & 0xfff:03x}" in info
    assert ("Features\t: fp asimd" in info) == bool(hwcap & 3 == 3)
    midr_file = q / "sys/devices/system/cpu/cpu0/regs/identification/midr_el1"
    assert int(midr_file.read_text(), 16) == midr
    # and a guest reading /proc/cpuinfo through that prefix sees it, not the host's
    src = tmp_path / "cat.c"
    src.write_text('#include <stdio.h>\nint main(void) { FILE *f = fopen("/proc/cpuinfo", "r");'
                   ' int c; if (!f) return 1; while ((c = fgetc(f)) != EOF) putchar(c); '
                   'return 0; }\n')
    subprocess.run(["aarch64-linux-gnu-gcc", "-o", str(tmp_path / "cat"), str(src)], check=True)
    seen = subprocess.run(["qemu-aarch64", "-L", str(q), str(tmp_path / "cat")],
                          capture_output=True, text=True, check=True).stdout
    assert seen == info


def test_wheel_spec_platform_requirements(tmp_path):
    """A platform may list its own wheel requirements ({key} pins filled like the rest)."""
    from ci.standins import load_wheel_spec

    (tmp_path / "upstream").mkdir()
    (tmp_path / "upstream" / "wheels.yaml").write_text(yaml.safe_dump({
        "python": "3.11", "requirements": ["numpy=={numpy}"],
        "platforms": {"linux-64": {"arch": "x86_64"},
                      "linux-ppc64le": {"arch": "ppc64le", "requirements": ["py-rattler=={r}"]}}}))
    spec = load_wheel_spec(tmp_path, {"numpy": "2.4.6", "r": "0.28.0"})
    assert spec["requirements"] == ["numpy==2.4.6"]
    assert spec["platforms"]["linux-ppc64le"]["requirements"] == ["py-rattler==0.28.0"]
    with pytest.raises(KeyError, match="linux-ppc64le requirement 'py-rattler=={r}' names 'r'"):
        load_wheel_spec(tmp_path, {"numpy": "2.4.6"})
    with pytest.raises(KeyError, match="a requirement 'numpy=={numpy}' names 'numpy'"):
        load_wheel_spec(tmp_path, {"r": "0.28.0"})

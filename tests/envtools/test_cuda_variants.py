"""CPU and CUDA builds of one package, as the channel has them for powerai and pytorch:
envtools installs the CUDA set where a driver is described (``--virtual __cuda=13.0``, as on
a login node without a GPU) and the CPU set where none is, validate checks the driver
against the env's CUDA and finds a second NCCL from a pip wheel, and module names the
CUDA env's module ``NAME/1.0-cuda`` beside ``NAME/1.0``.

The packages are built here with rattler-build from three small recipes (a fake libnccl
compiled by gcc, the CPU and the CUDA build of ``gpu-meta``), in their own channel, so the
shared fixture channel stays as it is."""

from __future__ import annotations

import asyncio
import json
import shutil
import textwrap
import warnings
from pathlib import Path

import pytest
from conftest import run_envtools

NCCL = """
package: {name: nccl, version: "2.29.7"}
build:
  number: 0
  script:
    - mkdir -p $PREFIX/lib
    - printf 'int ncclGetVersion(int *v){ *v = 22907; return 0; }\\n' > n.c
    - gcc -shared -fPIC -Wl,-soname,libnccl.so.2 -o $PREFIX/lib/libnccl.so.2 n.c
"""
META = """
package: {{name: gpu-meta, version: "1.0.0"}}
build:
  number: {number}
  string: {string}
  script:
    - mkdir -p $PREFIX/share/gpu-meta && printf '{string}\\n' > $PREFIX/share/gpu-meta/BUILD
requirements:
  run: {run}
"""


@pytest.fixture(scope="module")
def gpu_channel(tmp_path_factory) -> Path:
    if shutil.which("gcc") is None:
        pytest.skip("gcc is needed to build the fixture packages (apt-get install gcc)")
    import rattler
    import rattler_build

    base = tmp_path_factory.mktemp("gpuchan")
    recipes = {
        "nccl": NCCL,
        "gpu-meta-cpu": META.format(number=0, string="cpu_0", run="[]"),
        # as conda-forge: the CUDA build needs the driver and wins (higher build number)
        # wherever there is one
        "gpu-meta-cuda": META.format(number=100, string="cuda130_100",
                                     run='["__cuda >=13.0", "nccl >=2.29"]'),
    }
    paths = []
    for folder, text in recipes.items():
        p = base / "recipes" / folder / "recipe.yaml"
        p.parent.mkdir(parents=True)
        p.write_text(textwrap.dedent(text))
        paths.append(str(p))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        rattler_build.build_recipes(paths, output_dir=str(base / "out"), test="skip")
    ch = base / "channel"
    for sub in ("linux-64", "noarch"):
        (ch / sub).mkdir(parents=True)
        for pkg in (base / "out" / sub).glob("*.conda") if (base / "out" / sub).exists() else []:
            shutil.copy2(pkg, ch / sub / pkg.name)
    asyncio.run(rattler.index.index_fs(ch, write_zst=False, write_shards=False))
    return ch


@pytest.fixture(scope="module")
def envs(gpu_channel, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("gpusite")
    out = {"cuda": root / "envs" / "gpu-cuda", "cpu": root / "envs" / "gpu-cpu"}
    run_envtools("install", "--channel", gpu_channel, "--prefix", out["cuda"], "gpu-meta",
                 "--virtual", "__cuda=13.0")
    run_envtools("install", "--channel", gpu_channel, "--prefix", out["cpu"], "gpu-meta",
                 "--virtual", "__cuda=")
    return out


def _installed(prefix: Path) -> dict[str, str]:
    out = {}
    for f in (prefix / "conda-meta").glob("*.json"):
        d = json.loads(f.read_text())
        out[d["name"]] = d["build"]
    return out


def _validate(prefix: Path, *args: str) -> dict:
    p = run_envtools("validate", "--json", prefix, *args, check=False)
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


def _found(report: dict, check: str) -> list[dict]:
    return [f for f in report["findings"] if f["check"] == check]


def test_the_driver_picks_the_build(envs):
    cuda, cpu = _installed(envs["cuda"]), _installed(envs["cpu"])
    assert cuda["gpu-meta"] == "cuda130_100" and "nccl" in cuda
    assert cpu == {"gpu-meta": "cpu_0"}


def test_a_driver_too_old_for_the_cuda_build_cannot_install_it(gpu_channel, tmp_path):
    # a 12.x driver: the CUDA build is out of reach, so the solver falls back to the CPU one
    run_envtools("install", "--channel", gpu_channel, "--prefix", tmp_path / "e", "gpu-meta",
                 "--virtual", "__cuda=12.4")
    assert _installed(tmp_path / "e") == {"gpu-meta": "cpu_0"}
    # asking for the CUDA build there says why it cannot be had
    p = run_envtools("install", "--channel", gpu_channel, "--prefix", tmp_path / "f",
                     "gpu-meta=*=cuda*", "--virtual", "__cuda=12.4", check=False)
    assert p.returncode == 2 and "__cuda" in p.stderr, p.stderr


def test_validate_checks_the_driver_against_the_envs_cuda(envs):
    old = _validate(envs["cuda"], "--virtual", "__cuda=12.4")
    errors = [f for f in _found(old, "cuda-driver") if f["severity"] == "error"]
    assert len(errors) == 1, old["findings"]
    msg = errors[0]["message"]
    assert "supports CUDA 12.4" in msg and "built for CUDA 13.0" in msg and "gpu-meta" in msg
    assert "driver" in errors[0]["hint"] and "cpu" in errors[0]["hint"]
    assert not _found(old, "depends"), old["findings"]  # said once, by cuda-driver
    ok = _validate(envs["cuda"], "--virtual", "__cuda=13.2")
    assert ok["exit_status"] == 0 and not _found(ok, "cuda-driver"), ok["findings"]
    login = _validate(envs["cuda"], "--virtual", "__cuda=")
    assert [f["severity"] for f in _found(login, "cuda-driver")] == ["info"]
    assert login["exit_status"] == 0
    cpu = _validate(envs["cpu"], "--virtual", "__cuda=12.4")
    assert not _found(cpu, "cuda-driver") and cpu["exit_status"] == 0


def test_validate_finds_a_second_nccl_from_a_pip_wheel(envs, tmp_path):
    clone = tmp_path / "mine"
    run_envtools("clone", envs["cuda"], clone)
    assert not _found(_validate(clone, "--virtual", "__cuda=13.0"), "duplicate-library")
    # what `pip install nvidia-nccl-cu13` leaves: its own libnccl under site-packages,
    # with its dist-info (pip's files are not in conda-meta)
    site = clone / "lib" / "python3.11" / "site-packages"
    lib = site / "nvidia" / "nccl" / "lib"
    lib.mkdir(parents=True)
    shutil.copy2(clone / "lib" / "libnccl.so.2", lib / "libnccl.so.2")
    dist = site / "nvidia_nccl_cu13-2.29.7.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: nvidia-nccl-cu13\n"
                                   "Version: 2.29.7\n")
    (dist / "RECORD").write_text("nvidia/nccl/lib/libnccl.so.2,,\n")
    (dist / "INSTALLER").write_text("pip\n")
    rep = _validate(clone, "--virtual", "__cuda=13.0")
    dup = _found(rep, "duplicate-library")
    assert len(dup) == 1 and "2 copies of libnccl" in dup[0]["message"], rep["findings"]
    assert "lib/libnccl.so.2" in dup[0]["message"]
    assert "nvidia/nccl/lib/libnccl.so.2" in dup[0]["message"]
    assert "nccl" in dup[0]["packages"]


def test_module_names_the_cuda_build(envs, tmp_path):
    out = tmp_path / "modulefiles"
    for env in envs.values():
        run_envtools("module", env, "--out", out)
    assert (out / "gpu-meta" / "1.0-cuda.lua").exists() and (out / "gpu-meta" / "1.0").exists()
    assert (out / "gpu-meta" / "1.0.lua").exists() and (out / "gpu-meta" / "1.0-cuda").exists()
    lua = (out / "gpu-meta" / "1.0-cuda.lua").read_text()
    assert "CUDA 13.0 build: needs an NVIDIA driver for CUDA 13.0 or newer" in lua
    assert "CUDA" not in (out / "gpu-meta" / "1.0.lua").read_text()
    # a name given wins
    run_envtools("module", envs["cuda"], "--out", out, "--name", "site/gpu")
    assert (out / "site" / "gpu.lua").exists()

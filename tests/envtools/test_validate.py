"""envtools validate: a clean env passes; each way of breaking one is found, with a hint."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import run_envtools
from test_clone import pip_install


def validate(prefix: Path, *extra: str) -> dict:
    p = run_envtools("validate", prefix, "--json", *extra, check=False)
    assert p.returncode in (0, 1), p.stderr
    doc = json.loads(p.stdout)
    assert doc["exit_status"] == p.returncode
    return doc


def findings(doc: dict, check: str) -> list[dict]:
    return [f for f in doc["findings"] if f["check"] == check]


def only_error(doc: dict, check: str) -> dict:
    """The breakage gives an error of this kind (with packages and a hint), and no others."""
    errs = [f for f in doc["findings"] if f["severity"] == "error"]
    assert errs and all(f["check"] == check for f in errs), json.dumps(errs, indent=1)
    assert doc["exit_status"] == 1
    for f in errs:
        assert f["hint"] and f["packages"], f
    return errs[0]


@pytest.fixture
def broken(clone_env, tmp_path) -> Path:
    """A fresh writable copy of the clean clone, for one test to break."""
    dest = tmp_path / "env"
    run_envtools("clone", clone_env, dest)
    return dest


def test_clean_env_passes_and_json_schema(env):
    doc = validate(env)
    assert doc["schema"] == "envtools-validate/1"
    assert doc["exit_status"] == 0 and doc["summary"]["error"] == 0
    assert doc["checked"]["packages"] == 5 and doc["checked"]["elf_files"] >= 3
    assert doc["checked"]["hashed"] == 0  # the install-time stat cache vouches for every file
    assert any(v.startswith("__glibc=") for v in doc["virtual_packages"])
    for f in doc["findings"]:
        assert set(f) == {"check", "severity", "message", "packages", "paths", "hint"}
    full = validate(env, "--full")
    assert full["checked"]["hashed"] == full["checked"]["files"] - 4  # all but the symlinks


def test_text_output_and_exit_status(broken):
    (broken / "share" / "demo-meta" / "README").unlink()
    p = run_envtools("validate", broken, check=False)
    assert p.returncode == 1
    assert "missing-file" in p.stderr and "hint:" in p.stderr


def test_cannot_read_is_exit_2(tmp_path, broken):
    p = run_envtools("validate", tmp_path / "nope", check=False)
    assert p.returncode == 2 and "does not exist" in p.stderr
    (tmp_path / "notanenv").mkdir()
    p = run_envtools("validate", tmp_path / "notanenv", "--json", check=False)
    assert p.returncode == 2 and json.loads(p.stdout)["exit_status"] == 2
    rec = next((broken / "conda-meta").glob("libdemo-*.json"))
    rec.write_text("{ not json")
    p = run_envtools("validate", broken, check=False)
    assert p.returncode == 2 and "cannot read package record" in p.stderr


def test_missing_file(broken):
    (broken / "share" / "demo-meta" / "README").unlink()
    f = only_error(validate(broken), "missing-file")
    assert f["packages"] == ["demo-meta"] and f["paths"] == ["share/demo-meta/README"]


def test_altered_file(broken):
    h = broken / "include" / "demo.h"
    h.write_text(h.read_text() + "int oops;\n")
    f = only_error(validate(broken), "altered-file")
    assert f["packages"] == ["libdemo"] and f["paths"] == ["include/demo.h"]


def test_altered_file_same_size_found_by_hash(broken):
    h = broken / "include" / "demo.h"
    data = h.read_bytes()
    h.write_bytes(data[:-2] + b"X\n")
    assert only_error(validate(broken), "altered-file")["paths"] == ["include/demo.h"]


def test_unmet_dependency(broken):
    next((broken / "conda-meta").glob("libdemo-*.json")).unlink()
    doc = validate(broken)
    f = only_error(doc, "depends")
    assert "libdemo" in f["packages"] and "not installed" in f["message"]


def test_wrong_version_dependency(broken):
    rec = next((broken / "conda-meta").glob("libdemo-*.json"))
    data = json.loads(rec.read_text())
    data["version"] = "0.9"
    rec.write_text(json.dumps(data))
    f = only_error(validate(broken), "depends")
    assert "libdemo 0.9 is installed" in f["message"]


def test_cuda_driver_too_old(env):
    f = only_error(validate(env, "--virtual", "__cuda=12.4"), "cuda-driver")
    assert f["packages"] == ["cuda-version"] and "12.4" in f["message"]
    ok = validate(env, "--virtual", "__cuda=12.9")
    assert ok["exit_status"] == 0 and not findings(ok, "cuda-driver")
    none = validate(env, "--virtual", "__cuda=")
    assert [f["severity"] for f in findings(none, "cuda-driver")] == ["info"]


def test_clobbered_file(broken):
    src = next((broken / "conda-meta").glob("demo-meta-*.json"))
    data = json.loads(src.read_text())
    data.update(name="intruder", version="1.0", build="0")
    data["paths_data"]["paths"] = [{"_path": "share/demo/config.txt", "path_type": "hardlink",
                                    "sha256": "0" * 64, "size_in_bytes": 3}]
    data["files"] = ["share/demo/config.txt"]
    data["depends"] = []
    (broken / "conda-meta" / "intruder-1.0-0.json").write_text(json.dumps(data))
    doc = validate(broken)
    clob = findings(doc, "clobbered-file")
    assert clob and clob[0]["severity"] == "error"
    assert set(clob[0]["packages"]) == {"libdemo", "intruder"}


def test_pip_same_name_as_conda_package(broken, wheel_factory):
    pip_install(broken, wheel_factory("demo-py", "3.0", {"demo_py_extra.py": "x = 1\n"}))
    f = only_error(validate(broken), "pip-duplicate")
    assert "demo-py" in f["packages"] and "pip:demo-py" in f["packages"]


def test_pip_unmet_requires_dist(broken, wheel_factory):
    pip_install(broken, wheel_factory("needy", "1.0", {"needy.py": ""},
                                      requires=["not-there>=1", "demo-py>=3",
                                                "winonly; sys_platform == 'win32'"]))
    doc = validate(broken)
    only_error(doc, "pip-requires")
    msgs = " | ".join(f["message"] for f in findings(doc, "pip-requires"))
    assert "not-there" in msgs and "demo-py 2.0.0 is installed (from conda package demo-py)" in msgs
    assert "winonly" not in msgs
    satisfied = wheel_factory("happy", "1.0", {"happy.py": ""}, requires=["demo-py>=2,<3"])
    pip_install(broken, satisfied)
    assert len(findings(validate(broken), "pip-requires")) == 2


def test_pip_wrote_over_conda_files(broken, wheel_factory):
    pip_install(broken, wheel_factory("sneaky", "1.0", {"demo_py/__init__.py": "PREFIX = 0\n"}))
    f = only_error(validate(broken), "pip-overwrote")
    assert f["packages"] == ["pip:sneaky", "demo-py"]
    assert f["paths"][0].endswith("site-packages/demo_py/__init__.py")


def test_elf_for_wrong_architecture(broken):
    lib = broken / "lib" / "libforeign.so"
    data = bytearray((broken / "lib" / "libdemo.so.1").read_bytes())
    data[18:20] = (21).to_bytes(2, "little")  # e_machine = EM_PPC64
    lib.write_bytes(bytes(data))
    f = only_error(validate(broken), "elf-arch")
    assert f["paths"] == ["lib/libforeign.so"] and "ppc64" in f["message"]
    assert f["packages"] == ["(untracked)"]


def _gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True)


def test_unresolved_shared_library(broken, tmp_path):
    (tmp_path / "m.c").write_text("int missing_fn(void){return 1;}\n")
    _gcc("-shared", "-fPIC", "-o", str(tmp_path / "libmissingdep.so"), str(tmp_path / "m.c"))
    (tmp_path / "u.c").write_text("int missing_fn(void); int use(void){return missing_fn();}\n")
    _gcc("-shared", "-fPIC", "-o", str(broken / "lib" / "libuser.so"), str(tmp_path / "u.c"),
         f"-L{tmp_path}", "-lmissingdep")
    f = only_error(validate(broken), "elf-unresolved")
    assert "libmissingdep.so" in f["message"] and f["paths"] == ["lib/libuser.so"]


def test_two_copies_of_nccl(broken, tmp_path):
    (tmp_path / "n.c").write_text("int ncclGetVersion(int *v){*v=1;return 0;}\n")
    site = next(broken.glob("lib/python*/site-packages"))
    for d in (broken / "lib", site / "nvidia" / "nccl" / "lib"):
        d.mkdir(parents=True, exist_ok=True)
        _gcc("-shared", "-fPIC", "-Wl,-soname,libnccl.so.2", "-o", str(d / "libnccl.so.2"),
             str(tmp_path / "n.c"))
    f = only_error(validate(broken), "duplicate-library")
    assert "2 copies of libnccl" in f["message"]


def test_extension_for_other_python_abi(broken):
    site = next(broken.glob("lib/python*/site-packages"))
    ext = next((site / "demo_py").glob("_ext.cpython-*.so"))
    shutil.copy(ext, site / "demo_py" / "_old.cpython-39-x86_64-linux-gnu.so")
    f = only_error(validate(broken), "python-abi")
    assert "CPython 3.9" in f["message"]


def test_validate_after_clone_add(env, tmp_path):
    """Adding a package to a clone keeps it valid (the channel pipeline's final step too)."""
    dest = tmp_path / "plus"
    run_envtools("clone", env, dest, "--add", "demo-extra")
    assert validate(dest)["exit_status"] == 0

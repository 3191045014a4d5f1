"""Planted breaks validate must find (exit 1, naming the package to reinstall or remove),
beyond the ones in test_validate.py (missing/altered file, foreign arch, python ABI, pip
duplicate, unmet Requires-Dist); and bad input that must give exit 2 or a finding, never
a traceback. Each test breaks its own writable clone of the fixture env."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import envtools_as, run_envtools
from test_clone import pip_install
from test_validate import findings, validate

WHEELS = Path("/opt/pypi/files")


@pytest.fixture
def broken(clone_env, tmp_path) -> Path:
    dest = tmp_path / "env"
    run_envtools("clone", clone_env, dest)
    return dest


def site_of(env: Path) -> Path:
    return next(env.glob("lib/python*/site-packages"))


def errors(doc: dict, check: str) -> list[dict]:
    got = [f for f in doc["findings"] if f["check"] == check and f["severity"] == "error"]
    assert got and doc["exit_status"] == 1, json.dumps(doc["findings"], indent=1)
    for f in got:
        assert f["packages"] and f["hint"], f
    return got


def _gcc(*args: str) -> None:
    subprocess.run(["gcc", *args], check=True, capture_output=True)


def test_package_removed_behind_condas_back(broken):
    """rm -rf of a package's files and record while demo-py still depends on it."""
    rec = next((broken / "conda-meta").glob("libdemo-*.json"))
    for e in json.loads(rec.read_text())["paths_data"]["paths"]:
        (broken / e["_path"]).unlink(missing_ok=True)
    rec.unlink()
    doc = validate(broken)
    dep = errors(doc, "depends")
    assert any("libdemo" in f["packages"] and "not installed" in f["message"] for f in dep)
    assert any("libdemo" in f["hint"] for f in dep)


def test_truncated_shared_library(broken):
    lib = broken / "lib" / "libdemo.so.1"
    real = lib.resolve()
    data = real.read_bytes()
    real.unlink()
    real.write_bytes(data[: len(data) // 2])
    doc = validate(broken, "--no-imports")
    f = errors(doc, "elf-damaged")[0]
    assert "truncated" in f["message"] and f["packages"] == ["libdemo"]
    assert "reinstall libdemo" in f["hint"]


def _stub_mpi(d: Path, soname: str) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    (d / "m.c").write_text("int MPI_Init(int *c, char ***v){return 0;}\n")
    _gcc("-shared", "-fPIC", f"-Wl,-soname,{soname}", "-o", str(d / soname), str(d / "m.c"))
    return d / soname


def test_missing_and_stale_libmpi(broken, tmp_path):
    """A library built against libmpi.so.40 in an env whose libmpi is gone (missing) or
    is another MPI's (stale: libmpi.so.12): not an optional plugin, an error."""
    ompi = _stub_mpi(tmp_path / "ompi", "libmpi.so.40")
    (tmp_path / "u.c").write_text("int MPI_Init(int*, char***); int go(void){"
                                  "return MPI_Init(0, 0);}\n")
    _gcc("-shared", "-fPIC", "-Wl,--no-as-needed", "-o", str(broken / "lib" / "libusesmpi.so"),
         str(tmp_path / "u.c"), f"-L{ompi.parent}", "-l:libmpi.so.40",
         "-Wl,-rpath,$ORIGIN")
    f = errors(validate(broken, "--no-imports"), "elf-unresolved")[0]
    assert "libmpi.so.40" in f["message"] and f["paths"] == ["lib/libusesmpi.so"]
    _stub_mpi(broken / "lib", "libmpi.so.12")  # another MPI in the env: still stale
    f = errors(validate(broken, "--no-imports"), "elf-unresolved")[0]
    assert "libmpi.so.40" in f["message"]
    shutil.copy(ompi, broken / "lib" / "libmpi.so.40")
    assert not findings(validate(broken, "--no-imports"), "elf-unresolved")


def test_import_shadowed_by_pythonpath(broken, tmp_path):
    shadow = tmp_path / "shadow" / "demo_py"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("PREFIX = 'elsewhere'\n")
    p = run_envtools("validate", broken, "--json", check=False,
                     env={**os.environ, "PYTHONPATH": str(shadow.parent)})
    doc = json.loads(p.stdout)
    f = errors(doc, "import-shadowed")[0]
    assert p.returncode == 1 and "PYTHONPATH" in f["message"] and "demo-py" in f["packages"]
    assert "unset PYTHONPATH" in f["hint"]


def test_import_shadowed_by_pth(broken, tmp_path, wheel_factory):
    """A pip package whose .pth puts its own copy of demo_py first (as setuptools'
    distutils-precedence.pth does for distutils)."""
    shadow = tmp_path / "vendored"
    (shadow / "demo_py").mkdir(parents=True)
    (shadow / "demo_py" / "__init__.py").write_text("PREFIX = 'vendored'\n")
    pth = f"import sys; sys.path.insert(0, {str(shadow)!r})\n"
    pip_install(broken, wheel_factory("hijack", "1.0", {"hijack.pth": pth}))
    f = errors(validate(broken), "import-shadowed")[0]
    assert "hijack.pth" in f["message"] and "pip:hijack" in f["packages"]
    assert "remove" in f["hint"] and "hijack" in f["hint"]


def test_import_error_names_the_package(broken):
    init = site_of(broken) / "demo_py" / "__init__.py"
    init.write_text(init.read_text() + "raise ImportError('planted: cannot load _ext')\n")
    doc = validate(broken)
    f = errors(doc, "import-error")[0]
    assert "planted" in f["message"] and f["packages"] == ["demo-py"]
    assert "reinstall demo-py" in f["hint"]
    assert errors(doc, "altered-file")[0]["packages"] == ["demo-py"]


def test_import_crash_is_survived(broken, wheel_factory):
    """A module that kills the interpreter: reported, and the other modules still run."""
    pip_install(broken, wheel_factory("crasher", "1.0", {
        "crasher/__init__.py": "import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)\n"}))
    doc = validate(broken)
    f = errors(doc, "import-crash")[0]
    assert "SIGSEGV" in f["message"] and f["packages"] == ["pip:crasher"]
    assert doc["checked"]["imports"] == 2 and not findings(doc, "import-error")


@pytest.mark.skipif(not (WHEELS / "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64."
                         "manylinux2014_x86_64.whl").exists() or sys.version_info[:2] != (3, 11),
                    reason="needs the local numpy 1.26.4 and 2.x cp311 wheels")
def test_extension_built_against_another_numpy_abi(broken, tmp_path, wheel_factory):
    """A real extension compiled with numpy 1.26's headers, in an env with numpy 2."""
    old = WHEELS / "numpy-1.26.4-cp311-cp311-manylinux_2_17_x86_64.manylinux2014_x86_64.whl"
    new = next(WHEELS.glob("numpy-2.*-cp311-*.whl"))
    with zipfile.ZipFile(old) as z:
        z.extractall(tmp_path / "np1", [n for n in z.namelist()
                                        if n.startswith("numpy/core/include/")])
    pip_install(broken, new)
    (tmp_path / "e.c").write_text(
        "#define PY_SSIZE_T_CLEAN\n#include <Python.h>\n#include <numpy/arrayobject.h>\n"
        "static struct PyModuleDef m = {PyModuleDef_HEAD_INIT, \"npext\", 0, -1, 0};\n"
        "PyMODINIT_FUNC PyInit_npext(void){ import_array(); return PyModule_Create(&m); }\n")
    import sysconfig

    so = tmp_path / "npext.cpython-311-x86_64-linux-gnu.so"
    _gcc("-shared", "-fPIC", "-o", str(so), str(tmp_path / "e.c"),
         f"-I{sysconfig.get_paths()['include']}", f"-I{tmp_path}/np1/numpy/core/include")
    pip_install(broken, wheel_factory("npext", "1.0", {so.name: so.read_bytes()},
                                      requires=["numpy"]))
    f = errors(validate(broken), "numpy-abi")[0]
    assert "npext" in f["message"] and "pip:npext" in f["packages"]


# ---------------------------------------------------------------- bad input
def test_symlink_loops(broken, tmp_path):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    p = run_envtools("validate", loop, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr and "error:" in p.stderr
    # inside the env: a loop where a recorded file was, and an untracked one in lib/
    readme = broken / "share" / "demo-meta" / "README"
    readme.unlink()
    readme.symlink_to(readme)
    (broken / "lib" / "libloop.so").symlink_to(broken / "lib" / "libloop.so")
    p = run_envtools("validate", broken, "--json", check=False)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    f = errors(json.loads(p.stdout), "altered-file")[0]
    assert f["paths"] == ["share/demo-meta/README"] and "symbolic link" in f["message"]
    # a record that is a loop
    rec = next((broken / "conda-meta").glob("demo-meta-*.json"))
    rec.unlink()
    rec.symlink_to(rec)
    p = run_envtools("validate", broken, check=False)
    assert p.returncode == 2 and "Traceback" not in p.stderr and rec.name in p.stderr


def test_corrupt_record_names_the_file(broken):
    rec = next((broken / "conda-meta").glob("demo-py-*.json"))
    rec.write_text('{"name": "demo-py", "version": 2, "build": "0"}')
    p = run_envtools("validate", broken, check=False)
    assert p.returncode == 2 and rec.name in p.stderr and "Traceback" not in p.stderr


@pytest.mark.skipif(shutil.which("setpriv") is None or os.geteuid() != 0,
                    reason="needs setpriv and root (to become another user)")
def test_unreadable_prefix(broken):
    """As a user who cannot read the env (root reads everything, so drop to nobody)."""
    cmd = envtools_as(65534)
    os.chmod(broken / "conda-meta", 0o700)
    os.chmod(broken, 0o711)
    p = subprocess.run([*cmd, "validate", str(broken)],
                       capture_output=True, text=True, env={**os.environ, "HOME": "/tmp"})
    assert p.returncode == 2, p.stderr
    assert "cannot read" in p.stderr and "Traceback" not in p.stderr


def test_pyc_rewritten_by_python_is_a_warning_tampered_is_an_error(broken):
    """A package that ships a timestamp pyc which is stale at install: an import by a
    user who may write rewrites it with its source's own bytecode (a warning: the env
    still runs the recorded code); a pyc changed any other way is an error."""
    import hashlib
    import py_compile

    site = site_of(broken)
    src = site / "demo_py" / "__init__.py"
    pyc = Path(py_compile.compile(str(src), doraise=True))
    rec = next((broken / "conda-meta").glob("demo-py-*.json"))
    data = json.loads(rec.read_text())
    rel = str(pyc.relative_to(broken))
    data["paths_data"]["paths"].append({"_path": rel, "path_type": "hardlink",
                                        "sha256": hashlib.sha256(pyc.read_bytes()).hexdigest(),
                                        "size_in_bytes": pyc.stat().st_size})
    rec.write_text(json.dumps(data))
    assert validate(broken, "--no-imports")["exit_status"] == 0
    os.utime(src, (1_000_000_000, 1_000_000_000))  # the installer gave it another mtime
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    subprocess.run([str(broken / "bin" / "python"), "-c", "import demo_py"], check=True,
                   env=env)
    doc = validate(broken, "--no-imports")
    assert doc["exit_status"] == 0, doc["findings"]
    f = [f for f in findings(doc, "altered-file") if f["severity"] == "warning"]
    assert f and f[0]["paths"] == [rel] and "rewritten by Python" in f[0]["message"]
    body = bytearray(pyc.read_bytes())
    body[-3] ^= 0xFF
    pyc.write_bytes(bytes(body))
    assert errors(validate(broken, "--no-imports"), "altered-file")[0]["paths"] == [rel]


def test_python_that_cannot_run_is_one_finding(broken):
    py = broken / "bin" / next(p.name for p in (broken / "bin").iterdir()
                               if p.name.startswith("python3.") and p.is_symlink())
    py.unlink()
    py.symlink_to("/nonexistent/python")
    doc = validate(broken)
    f = errors(doc, "import-skipped")
    assert len(f) == 1 and "cannot run" in f[0]["message"] and f[0]["packages"] == ["python"]
    assert not findings(doc, "import-crash") and not findings(doc, "import-error")


def test_import_time_limit(broken, wheel_factory):
    """A module that hangs is stopped at --import-timeout; the others are still tried."""
    pip_install(broken, wheel_factory("hangs", "1.0", {
        "hangs/__init__.py": "import time\ntime.sleep(60)\n"}))
    p = run_envtools("validate", broken, "--json", "--import-timeout", "1", check=False,
                     timeout=30)
    doc = json.loads(p.stdout)
    f = findings(doc, "import-timeout")
    assert f and f[0]["packages"] == ["pip:hangs"] and f[0]["severity"] == "warning"
    assert doc["checked"]["imports"] == 2 and not findings(doc, "import-error")
    assert "--import-timeout" in f[0]["hint"]

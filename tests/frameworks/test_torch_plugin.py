"""The `torch.backends` entry point cannot break `import torch`.

Each case runs a fresh Python whose PYTHONPATH puts a copy of the installed ddl
distribution (ddl_core, the entry point's module, its dist-info) ahead of the venv's, and
breaks the copy for real: libddl's RUNPATH rewritten so libmpi is not found (ddl's
`external` build without the site MPI), libddl truncated, a module of ddl_core.torch that
raises on import, ddl-torch's module broken. The intact copy is the control: it registers
the real backend with no warning (so the copy really shadows the venv's ddl).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

#: what the child reports: warnings of `import torch` that mention ddl, the registered
#: creator's module, and how init_process_group("ddl") failed by three roads
PROBE = r"""
import json, os, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import torch
out = {"warnings": [str(w.message) for w in caught if "ddl" in str(w.message).lower()],
       "categories": [w.category.__name__ for w in caught if "ddl" in str(w.message).lower()]}
import torch.distributed as dist
out["creator"] = dist.Backend._plugins["DDL"].creator_fn.__module__
out["ddl_in_list"] = "ddl" in dist.Backend.backend_list
out["tensor"] = float(torch.ones(3).sum())  # torch itself works
for road in os.environ["PROBE_ROADS"].split(","):
    if road == "env":
        os.environ["OMPI_COMM_WORLD_SIZE"] = "1"  # as under mpirun, with no MASTER_ADDR
    try:
        if road == "store":
            dist.init_process_group("ddl", store=dist.HashStore(), rank=0, world_size=1)
        elif road == "ddl":
            dist.init_process_group("ddl", init_method="ddl://")
        else:
            dist.init_process_group("ddl")
    except Exception as exc:
        out[road] = [type(exc).__name__, str(exc), repr(exc.__cause__)]
    else:
        t = torch.ones(2)
        dist.all_reduce(t)
        out[road] = ["ok", float(t.sum()), dist.get_backend()]
        dist.destroy_process_group()
print("PROBE " + json.dumps(out))
"""


def _installed() -> tuple[Path, Path, Path]:
    """The venv's ddl_core package, the entry point's module and the dist-info."""
    core = Path(importlib.util.find_spec("ddl_core").origin).parent  # type: ignore[union-attr,arg-type]
    plugin = Path(importlib.util.find_spec("_ddl_core_torch_plugin").origin).parent  # type: ignore[union-attr,arg-type]
    infos = sorted(core.parent.glob("ddl_core-*.dist-info"))
    assert len(infos) == 1, infos
    return core, plugin, infos[0]


@pytest.fixture()
def shadow(tmp_path: Path) -> Path:
    """A copy of the installed ddl distribution, first on the child's sys.path."""
    site = tmp_path / "site"
    site.mkdir()
    for src in _installed():
        shutil.copytree(src, site / src.name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    return site


def _probe(site: Path, roads: str = "store,ddl,env") -> tuple[dict, str]:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                        "TORCH_DEVICE_BACKEND_AUTOLOAD", "DDL_TORCH_CPP")
           and not k.startswith(("OMPI_COMM_WORLD", "PMIX_", "PMI_"))}
    env.update({"PYTHONPATH": str(site), "PROBE_ROADS": roads, "OMP_NUM_THREADS": "1",
                "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"})
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, f"import torch failed:\n{proc.stdout}\n{proc.stderr}"
    line = [x for x in proc.stdout.splitlines() if x.startswith("PROBE ")]
    assert line, proc.stdout + proc.stderr
    return json.loads(line[-1][len("PROBE "):]), proc.stderr


def _so_files(site: Path) -> list[Path]:
    found = [p for p in (site / "ddl_core").iterdir()
             if p.name.startswith(("libddl.so", "_ddl.")) and p.is_file()
             and not p.is_symlink()]
    assert any(p.name.startswith("libddl.so") for p in found), found
    return found


def _no_libmpi(site: Path) -> None:
    """libddl and the extension look only beside themselves: libmpi.so is not found, as
    with ddl's `external` build and no site MPI loaded."""
    if shutil.which("patchelf") is None:
        pytest.skip("patchelf is not installed (it is in .ci/apt-packages.txt)")
    for so in _so_files(site):
        subprocess.run(["patchelf", "--set-rpath", "$ORIGIN", str(so)], check=True)


def _broken_libddl(site: Path) -> None:
    for so in _so_files(site):
        if so.name.startswith("libddl.so"):
            so.write_bytes(b"\x7fELF truncated")


def _raising_module(site: Path) -> None:
    """Not even an Exception: the hook must survive anything a module can raise."""
    backend = site / "ddl_core" / "torch" / "backend.py"
    backend.write_text(backend.read_text()
                       + '\nraise SystemExit("planted failure in ddl_core.torch.backend")\n')


BROKEN = {
    "no-libmpi": (_no_libmpi, "ImportError", "libmpi.so.40: cannot open shared object file"),
    "broken-libddl": (_broken_libddl, "ImportError", "libddl.so"),
    "raising-module": (_raising_module, "SystemExit",
                       "planted failure in ddl_core.torch.backend"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_broken_ddl_leaves_torch_working(shadow: Path, case: str) -> None:
    """`import torch` succeeds with exactly one warning naming the cause and its fix;
    init_process_group("ddl") raises that cause (chained) by the store, ddl:// and env://
    roads, instead of "Invalid backend" or "MASTER_ADDR expected"."""
    breaker, cause_type, cause = BROKEN[case]
    breaker(shadow)
    out, stderr = _probe(shadow)
    assert len(out["warnings"]) == 1, out["warnings"]
    warning = out["warnings"][0]
    assert out["categories"] == ["RuntimeWarning"]
    assert cause in warning and cause_type in warning, warning
    assert "Fix:" in warning and "init_process_group('ddl') raises this error" in warning
    if case == "no-libmpi":
        assert "MPI" in warning.split("Fix:")[1], warning
    assert out["tensor"] == 3.0
    assert out["ddl_in_list"] and out["creator"] == "_ddl_core_torch_plugin"
    for road in ("store", "ddl", "env"):
        kind, message, chained = out[road]
        assert kind == "RuntimeError", (road, out[road])
        assert cause in message and "Fix:" in message, (road, message)
        assert chained.startswith(cause_type), (road, chained)
    assert "MASTER_ADDR" in out["env"][1]  # says the way around DDL's rendezvous too


def test_intact_copy_registers_the_real_backend(shadow: Path) -> None:
    """The control: the same copy, unbroken, loads from the shadow (so the broken cases
    test the copy, not the venv's ddl), warns nothing and serves a 1-rank group."""
    out, _ = _probe(shadow, roads="store")
    assert out["warnings"] == []
    assert out["creator"] == "ddl_core.torch.backend"
    assert out["store"][0] == "ok" and out["store"][1] == 2.0, out["store"]


def test_broken_ddl_torch_warns_once_and_python_backend_serves(shadow: Path) -> None:
    """ddl-torch present but unloadable (its _C built for another torch, say): one warning
    naming it, and the ddl backend still works on the Python ProcessGroup."""
    pkg = shadow / "ddl_torch"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(
        'raise ImportError("_C.so: undefined symbol: planted_c10d_symbol")\n')
    out, _ = _probe(shadow, roads="store")
    assert len(out["warnings"]) == 1, out["warnings"]
    assert "ddl-torch" in out["warnings"][0] and "planted_c10d_symbol" in out["warnings"][0]
    assert out["creator"] == "ddl_core.torch.backend"
    assert out["store"][0] == "ok" and out["store"][1] == 2.0, out["store"]


def test_real_backend_replaces_the_placeholders() -> None:
    """A ddl that loads after the entry point left its placeholders (same process) takes
    over the backend, ddl:// and env:// from them."""
    code = r"""
import torch.distributed as dist, importlib, _ddl_core_torch_plugin as plugin
plugin._register_unavailable(RuntimeError("planted"))
rdzv = importlib.import_module("torch.distributed.rendezvous")
h = rdzv._rendezvous_handlers
assert dist.Backend._plugins["DDL"].creator_fn._ddl_unavailable and h["env"]._ddl_unavailable
import ddl_core.torch
assert dist.Backend._plugins["DDL"].creator_fn.__module__ == "ddl_core.torch.backend"
assert not getattr(h["ddl"], "_ddl_unavailable", False), h["ddl"]
assert h["env"]._ddl_wrapped and not getattr(h["env"], "_ddl_unavailable", False)
print("OK replaced")
"""
    env = {**os.environ, "TORCH_DEVICE_BACKEND_AUTOLOAD": "0"}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0 and "OK replaced" in proc.stdout, proc.stdout + proc.stderr

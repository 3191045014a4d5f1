"""The seeds' commands with the real conda against the channel and the site env.

A user types `conda create powerai`, `conda install mpich`, `conda create --clone`: each
test here runs that command with conda itself (classic solver, offline, local channels
only) and checks what the user then has.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from condahelp import MODULEFILES, ROOT, final_names, mpirun_allreduce, plain_channel_args

IMPORTS = "import ddl_core, torch, tensorflow, horovod.torch; print(torch.__version__)"


def _python(prefix, code: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CONDA_")}
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(prefix / "bin" / "python"), "-c", code], capture_output=True,
                          text=True, env=env, timeout=600, cwd="/")


def _mpi_packages(names) -> set[str]:
    return {n for n in names if n in ("openmpi", "mpich")}


@pytest.mark.parametrize("which", ["default_env", "cuda_env"])
def test_plain_create_gives_openmpi_env_that_imports_and_runs(conda, which, request):
    """The issue's "done when": `conda create -p E --offline -c ./channel -c
    ./channel-upstream powerai`, nothing else named, with and without a CUDA driver
    described (CONDA_OVERRIDE_CUDA=13.0, on this GPU-less machine): the openmpi build
    (the CUDA one with the driver), whose frameworks import (the ddl torch plugin
    quietly: it loads on every `import torch`) and whose mpirun runs a 2-rank allreduce."""
    prefix = request.getfixturevalue(which)
    have = conda.installed(prefix)
    assert have["powerai"]["build_string"].startswith("openmpi_"), have["powerai"]
    assert have["mpi"]["build_string"] == "openmpi", have.get("mpi")
    assert _mpi_packages(have) == {"openmpi"}
    want_cuda = which == "cuda_env"
    assert ("_cuda_" in have["powerai"]["build_string"]) == want_cuda, have["powerai"]
    p = _python(prefix, IMPORTS)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "ddl" not in p.stderr.lower(), p.stderr[-3000:]  # (no plugin warning)
    if want_cuda:
        assert "+cpu" not in p.stdout and have["pytorch"]["build_string"].startswith("cuda")
    r = mpirun_allreduce(prefix)
    assert r.returncode == 0 and r.stdout.count("allreduce ok") == 2, r.stdout + r.stderr[-3000:]


#: conda's solver plugins; a conda made from source has classic (conda-libmamba-solver and
#: libmambapy are not on PyPI; conda-rattler-solver is, and pip-installs into its venv)
SOLVERS = ["classic", "rattler", "libmamba"]
_HAS: dict[str, set[str]] = {}


def _solvers(conda) -> set[str]:
    """The solvers this conda offers (the choices of `conda create --solver`)."""
    if conda.exe not in _HAS:
        m = re.search(r"--solver \{([\w,-]+)\}", conda.run("create", "--help").stdout)
        _HAS[conda.exe] = set(m.group(1).split(",")) if m else set()
    return _HAS[conda.exe]


@pytest.mark.parametrize("solver", SOLVERS)
@pytest.mark.parametrize("priority,cuda", [("strict", ""), ("flexible", ""),
                                           ("strict", "13.0"), ("flexible", "13.0")])
def test_default_solve_in_every_solver(conda, tmp_path, solver, priority, cuda):
    """The plain command's solve in each solver this conda has and either channel
    priority (conda's default is flexible): the openmpi build and its mutex, the CUDA
    build exactly when a driver is described, no second MPI."""
    if solver not in _solvers(conda):
        how = {"rattler": "pip install conda-rattler-solver into conda's environment",
               "libmamba": "conda-libmamba-solver and libmambapy are not on PyPI: a conda "
                           "from conda-forge (Miniforge) has them"}[solver]
        pytest.skip(f"{conda.exe} has no {solver} solver (it offers "
                    f"{', '.join(sorted(_solvers(conda))) or 'none'}; {how})")
    env = {"CONDA_SOLVER": solver, "CONDA_CHANNEL_PRIORITY": priority}
    if cuda:
        env["CONDA_OVERRIDE_CUDA"] = cuda
    out = conda.json("create", "--dry-run", "-p", str(tmp_path / "e"), "--offline",
                     *plain_channel_args(), "powerai", extra_env=env, cwd=ROOT)
    link = {r["name"]: r for r in out["actions"]["LINK"]}
    kind = "cuda" if cuda else "cpu"
    assert link["powerai"]["build_string"].startswith(f"openmpi_{kind}_"), link["powerai"]
    assert link["mpi"]["build_string"] == "openmpi" and _mpi_packages(link) == {"openmpi"}
    assert link["ddl"]["build_string"].split("_")[1] == "openmpi", link["ddl"]


def test_external_build_when_asked(conda, tmp_path):
    """`powerai=*=*external*` still gives the external build, with no MPI package."""
    out = conda.json("create", "--dry-run", "-p", str(tmp_path / "e"), "--offline",
                     *conda.channel_args, "powerai=*=*external*")
    link = {r["name"]: r for r in out["actions"]["LINK"]}
    assert link["powerai"]["build_string"].startswith("external_"), link["powerai"]
    assert not _mpi_packages(link) and "mpi" not in link, sorted(link)


@pytest.mark.parametrize("flavour", ["mpich", "external"])
def test_each_flavour_named_is_what_the_solver_gives(conda, tmp_path, flavour):
    out = conda.json("create", "--dry-run", "-p", str(tmp_path / "e"), "--offline",
                     *conda.channel_args, f"powerai=*=*{flavour}*")
    link = {r["name"]: r for r in out["actions"]["LINK"]}
    assert link["powerai"]["build_string"].startswith(f"{flavour}_")
    assert link["ddl"]["build_string"].split("_")[1] == flavour, link["ddl"]


def test_mpich_into_openmpi_env_switches_or_is_refused(conda, default_env):
    """The mpi mutex: mpich joins an openmpi env only by replacing openmpi (and the
    openmpi builds of what needs an MPI), or the solver refuses; never both MPIs."""
    have = conda.installed(default_env)
    out = conda.json("install", "--dry-run", "-p", str(default_env), "--offline",
                     *conda.channel_args, "mpich", check=False)
    if out.get("success") and "actions" in out:
        final = final_names(have, out["actions"])
        assert _mpi_packages(final) == {"mpich"}, sorted(_mpi_packages(final))
        link = {r["name"]: r for r in out["actions"]["LINK"]}
        assert link["mpi"]["build_string"] == "mpich", link.get("mpi")
    else:
        refused = ("UnsatisfiableError", "SpecsConfigurationConflictError")
        assert out.get("exception_name") in refused, out


def test_channel_records_describe_their_files(channels):
    """What conda reads of channel/ and channel-upstream/ is what their files are: each
    record's size is its file's, each has a timestamp, and the MPI packages depend on the
    mpi mutex in both channels (channel-upstream/ once kept the records of stand-ins
    converted again under the same name: no mutex, old sizes and sha256s)."""
    import json

    bad, mpis = [], {}
    for ch in channels:
        for rd in sorted(ch.glob("*/repodata.json")):
            data = json.loads(rd.read_text())
            for name, rec in {**data.get("packages", {}), **data.get("packages.conda", {})}.items():
                key = f"{ch.name}/{rd.parent.name}/{name}"
                f = rd.parent / name
                if not f.is_file() or f.stat().st_size != rec.get("size"):
                    bad.append(f"{key}: size {rec.get('size')}, file "
                               f"{f.stat().st_size if f.is_file() else 'missing'}")
                if not rec.get("timestamp"):
                    bad.append(f"{key}: no timestamp")
                if rec["name"] in ("openmpi", "mpich"):
                    mpis[key] = rec.get("depends") or []
    assert not bad, f"{len(bad)} stale records (make channel indexes them again): {bad[:10]}"
    assert any(k.startswith(f"{channels[1].name}/") for k in mpis), sorted(mpis)
    for key, deps in mpis.items():
        flavour = key.rsplit("/", 1)[1].split("-")[0]
        assert f"mpi 1.0.* {flavour}" in deps, (key, deps)


def test_search_shows_the_six_powerai_builds_without_warnings(conda):
    p = conda.run("search", "--offline", *conda.channel_args, "powerai", "--json")
    assert "warn" not in p.stderr.lower(), p.stderr
    import json

    recs = json.loads(p.stdout)["powerai"]
    here = {(r["build"].split("_")[0], r["build"].split("_")[1]) for r in recs
            if r["subdir"] != "noarch"}
    assert here == {(m, t) for m in ("openmpi", "mpich", "external") for t in ("cpu", "cuda")}


def test_cuda_virtual_package_picks_the_cuda_build(conda, tmp_path):
    for override, kind in (("", "cpu"), ("13.0", "cuda")):
        out = conda.json("create", "--dry-run", "-p", str(tmp_path / "e"), "--offline",
                         *conda.channel_args, "powerai",
                         extra_env={"CONDA_OVERRIDE_CUDA": override} if override else None)
        link = {r["name"]: r for r in out["actions"]["LINK"]}
        assert link["powerai"]["build_string"].startswith(f"openmpi_{kind}_"), link["powerai"]


def _small_package(conda, prefix) -> str:
    """A package of the upstream channel the env does not hold and that needs little."""
    have = conda.installed(prefix)
    for name in ("cmake", "ninja", "wheel", "cython"):
        if name not in have:
            return name
    pytest.skip("every candidate package is already in the env")


def test_clone_as_root_then_install_and_remove(conda, site_env, tmp_path):
    clone = tmp_path / "clone"
    conda.run("create", "-y", "-p", str(clone), "--clone", str(site_env), "--offline",
              *conda.channel_args)
    assert set(conda.installed(clone)) == set(conda.installed(site_env))
    pkg = _small_package(conda, clone)
    conda.run("install", "-y", "-p", str(clone), "--offline", *conda.channel_args, pkg)
    assert pkg in conda.installed(clone)
    conda.run("remove", "-y", "-p", str(clone), "--offline", pkg)
    assert pkg not in conda.installed(clone)
    assert _python(clone, "import ddl_core").returncode == 0


@pytest.fixture
def open_home(tmp_path_factory):
    """A home directory for another uid, in a temp dir every uid can reach (pytest's own
    basetemp is 0700 to root, so a uid could not even stat a path under it)."""
    top = Path(tempfile.mkdtemp(prefix="ddlce-conda-uid-"))
    top.chmod(0o755)
    yield top / "home"
    shutil.rmtree(top, ignore_errors=True)


def test_clone_as_another_uid_then_install(conda, site_env, open_home):
    """A user without write access to the site env or to root's package cache: `conda
    create --clone` into their home (conda's default pkgs dir there), then install and
    remove in the clone."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run conda as another uid")
    uid = 47311
    home = open_home
    home.mkdir()
    os.chown(home, uid, uid)
    probe = subprocess.run(["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups",
                            "--", conda.exe, "--version"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"uid {uid} cannot run {conda.exe}: {probe.stderr.strip()[-300:]}")
    user = {"CONDA_PKGS_DIRS": str(home / ".conda" / "pkgs")}
    clone = home / "clone"
    conda.run("create", "-y", "-p", str(clone), "--clone", str(site_env), "--offline",
              *conda.channel_args, uid=uid, home=home, extra_env=user)
    assert clone.stat().st_uid == uid
    assert set(conda.installed(clone)) == set(conda.installed(site_env))
    pkg = _small_package(conda, clone)
    conda.run("install", "-y", "-p", str(clone), "--offline", *conda.channel_args, pkg,
              uid=uid, home=home, extra_env=user)
    assert pkg in conda.installed(clone)
    conda.run("remove", "-y", "-p", str(clone), "--offline", pkg, uid=uid, home=home,
              extra_env=user)
    assert pkg not in conda.installed(clone)
    assert _python(clone, "import ddl_core").returncode == 0


def test_activate_sets_nothing_the_modulefile_lacks(conda, site_env):
    """Every variable `conda activate` sets for the site env is in its modulefile, so
    `module load powerai` gives what conda users get."""
    p = conda.run("shell.posix", "activate", str(site_env))
    names = set(re.findall(r"^export (\w+)=", p.stdout, re.M))
    # conda's own bookkeeping (where conda itself lives), not the env's
    names -= {"CONDA_EXE", "_CONDA_EXE", "CONDA_PYTHON_EXE", "_CONDA_ROOT", "_CE_M", "_CE_CONDA"}
    files = [f for f in (MODULEFILES / "powerai").iterdir() if f.is_file()]
    if not files:
        pytest.skip("needs modulefiles/powerai from `make channel`")
    assert {"PATH", "CONDA_PREFIX", "CONDA_SHLVL"} <= names, p.stdout
    sets = re.compile(r"^\s*(?:setenv|pushenv|prepend[-_]path|append[-_]path)"
                      r"\s*\(?\s*\"?(\w+)", re.M)
    for f in files:
        missing = sorted(names - set(sets.findall(f.read_text())))
        assert not missing, (f.name, missing, p.stdout)


@pytest.mark.parametrize("name", ["spec-file.txt", "explicit.txt"])
def test_list_explicit_recreates_the_env(conda, site_env, tmp_path, name):
    """conda's documented round trip: `conda list --explicit > spec-file.txt` then `conda
    create --file spec-file.txt` (the user guide's name; `explicit.txt` is create's --help
    example). conda 26 picks a file's format by name first and reads `spec.txt` or
    `requirements.txt` as a plain list of specs, refusing an explicit one, so those names
    are not used for an explicit file."""
    spec = tmp_path / name
    spec.write_text(conda.run("list", "--explicit", "--md5", "-p", str(site_env)).stdout)
    assert "@EXPLICIT" in spec.read_text().splitlines()
    again = tmp_path / "again"
    conda.run("create", "-y", "-p", str(again), "--offline", "--file", str(spec))
    a, b = conda.installed(site_env), conda.installed(again)
    assert {(n, r["version"], r["build_string"]) for n, r in a.items()} == \
           {(n, r["version"], r["build_string"]) for n, r in b.items()}
    assert _python(again, "import ddl_core").returncode == 0


def test_env_export_and_create(conda, site_env, tmp_path):
    yml = tmp_path / "env.yml"
    yml.write_text(conda.run("env", "export", "-p", str(site_env)).stdout)
    again = tmp_path / "again"
    conda.run("env", "create", "-y", "-p", str(again), "-f", str(yml))
    a, b = conda.installed(site_env), conda.installed(again)
    assert {(n, r["version"]) for n, r in a.items()} == {(n, r["version"]) for n, r in b.items()}

"""CI matrix: one variant file per CI job (as conda-smithy's ``.ci_support/``) and a
GitHub Actions workflow that runs each with ``python -m ci build --config <file>``.

A variant file is one (platform, mpi, python) combination. linux-64 runs on a hosted
x86_64 runner. linux-ppc64le and linux-aarch64 each get a *cross* job (x86_64 with
Debian's cross gcc, the target sysroot and qemu-user for the tests) and, for sites with
such machines, a *native* job beside it on a runner of that architecture: a self-hosted
``[self-hosted, linux, ppc64le]`` for Power, GitHub's hosted ``ubuntu-24.04-arm`` for Arm.
A native job builds everything (python, numpy and the frameworks included), which cross
builds cannot offline. ``--ppc64le cross`` / ``--aarch64 cross`` leave the native jobs out.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import yaml

from ci.config import Settings
from ci.errors import CiError

JOB_KEYS = ("mpi", "python")

#: foreign platform -> (native runner, Debian packages a cross job installs)
FOREIGN = {
    "linux-ppc64le": (["self-hosted", "linux", "ppc64le"],
                      "gcc-powerpc64le-linux-gnu g++-powerpc64le-linux-gnu qemu-user"),
    "linux-aarch64": ("ubuntu-24.04-arm", "gcc-aarch64-linux-gnu g++-aarch64-linux-gnu qemu-user"),
}
X86_RUNNER = "ubuntu-24.04"
MODES = ("native", "cross")


def jobs(settings: Settings) -> list[dict]:
    """Every (platform, mpi, python) combination with its single-valued variant config."""
    out = []
    values = {k: settings.variants.get(k) or [None] for k in JOB_KEYS}
    for platform in settings.target_platforms:
        for combo in itertools.product(*(values[k] for k in JOB_KEYS)):
            cfg = {k: v for k, v in settings.variants.items() if k not in JOB_KEYS}
            for k, v in zip(JOB_KEYS, combo, strict=True):
                if v is not None:
                    cfg[k] = [v]
            cfg["target_platforms"] = [platform]
            cfg["upstream_channels"] = settings.upstream_channels
            name = platform.replace("-", "_") + "".join(
                f"_{k}{v}" for k, v in zip(JOB_KEYS, combo, strict=True) if v is not None
            )
            out.append({"name": name, "platform": platform, "config": cfg})
    return out


def runs(job: dict, native: dict[str, bool]) -> list[dict]:
    """The workflow entries of one variant file: one on x86_64 for linux-64; for a foreign
    platform a cross entry, plus a native one when ``native[platform]``."""
    base = {"config": job["config_path"], "platform": job["platform"]}
    if job["platform"] not in FOREIGN:
        return [{"job": job["name"], **base, "runner": X86_RUNNER, "cross": False,
                 "apt": ""}]
    runner, apt = FOREIGN[job["platform"]]
    out = [{"job": f"{job['name']}_cross", **base, "runner": X86_RUNNER, "cross": True,
            "apt": apt}]
    if native.get(job["platform"], True):
        out.append({"job": f"{job['name']}_native", **base, "runner": runner, "cross": False,
                    "apt": ""})
    return out


def workflow(
    job_list: list[dict], support_dir: str, ppc64le: str = "native", aarch64: str = "native"
) -> dict:
    """A GitHub Actions workflow with one matrix entry per job file and runner kind."""
    native = {"linux-ppc64le": ppc64le == "native", "linux-aarch64": aarch64 == "native"}
    include = [
        run
        for j in job_list
        for run in runs({**j, "config_path": f"{support_dir}/{j['name']}.yaml"}, native)
    ]
    steps = [
        {"uses": "actions/checkout@v4"},
        {"name": "System packages", "run": "sudo make .venv/.stamps/apt || make .venv/.stamps/apt"},
        {
            "name": "Cross toolchain and emulator",
            "if": "${{ matrix.cross }}",
            "run": "sudo apt-get install -y ${{ matrix.apt }}",
        },
        {"name": "Python tools", "run": "make .venv/.stamps/venv .venv/.stamps/ci"},
        {
            "name": "Build, test and index",
            "run": ".venv/bin/python -m ci build --config ${{ matrix.config }} "
            "--platform ${{ matrix.platform }}",
        },
        {
            "uses": "actions/upload-artifact@v4",
            "with": {"name": "channel-${{ matrix.job }}", "path": "channel/"},
        },
    ]
    return {
        "name": "ddl-ce channel",
        "on": {"push": {"branches": ["main"]}, "pull_request": None, "workflow_dispatch": None},
        "jobs": {
            "build": {
                "name": "${{ matrix.job }}",
                "runs-on": "${{ matrix.runner }}",
                "timeout-minutes": 120,
                "strategy": {"fail-fast": False, "matrix": {"include": include}},
                "steps": steps,
            }
        },
    }


def write_matrix(
    settings: Settings, out: Path, ppc64le: str = "native", *, aarch64: str = "native"
) -> list[Path]:
    """Write ``out/.ci_support/*.yaml`` and ``out/.github/workflows/ddlce-channel.yml``."""
    for flag, value in (("--ppc64le", ppc64le), ("--aarch64", aarch64)):
        if value not in MODES:
            raise CiError(
                f"{flag} {value!r} is not a runner kind",
                f"{flag} native (native runner jobs beside the cross ones) or {flag} cross",
            )
    support = out / ".ci_support"
    support.mkdir(parents=True, exist_ok=True)
    for old in support.glob("*.yaml"):
        old.unlink()
    job_list = jobs(settings)
    written = []
    for j in job_list:
        p = support / f"{j['name']}.yaml"
        p.write_text(
            f"# CI job {j['name']}: generated by `python -m ci matrix`; do not edit.\n"
            + yaml.safe_dump(j["config"], sort_keys=True)
        )
        written.append(p)
    wf = out / ".github" / "workflows" / "ddlce-channel.yml"
    wf.parent.mkdir(parents=True, exist_ok=True)
    wf.write_text(
        "# Generated by `python -m ci matrix`; regenerate instead of editing.\n"
        + yaml.safe_dump(workflow(job_list, ".ci_support", ppc64le, aarch64), sort_keys=False,
                       width=120)
    )
    written.append(wf)
    return written

"""Cross-building for linux-ppc64le and linux-aarch64 and testing under qemu-user.

Cross-built here against a Debian sysroot of the target: libddl (the site's MPI,
`external`), and, offline, the python stand-in; for linux-ppc64le also numpy and mpi4py
from their sdists (recipes/upstream); then ddl and powerai, and where the upstream has
pytorch for the target (linux-aarch64: PyPI's wheels) ddl-torch. Each is tested by its
recipe's ``cross_test.sh`` in an env for the target installed from the channels, the
target's programs run under qemu-user (sysroot.prepare_for_qemu's launchers). Power's
pytorch and tensorflow are left to a native build (the report says so; nothing is faked).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from ci.build import Outcome
from ci.sysroot import ensure_sysroot, prepare_for_qemu

CROSS_PLATFORMS = {
    "linux-ppc64le": ("ppc64el", "powerpc64le-linux-gnu", "qemu-ppc64le"),
    "linux-aarch64": ("arm64", "aarch64-linux-gnu", "qemu-aarch64"),
}


def missing_tools(platform: str) -> list[str]:
    """Host tools a cross build + emulated test for ``platform`` needs but lacks."""
    _, tri, qemu = CROSS_PLATFORMS[platform]
    need = [f"{tri}-gcc", f"{tri}-g++", qemu, "dpkg", "file"]
    return [t for t in need if shutil.which(t) is None]


def prepare(cache: Path, platform: str) -> Path:
    """Fetch/unpack the sysroot, make it runnable under qemu, export DDLCE_SYSROOT."""
    arch = CROSS_PLATFORMS[platform][0]
    root = ensure_sysroot(cache, arch)
    prepare_for_qemu(root, arch)
    os.environ["DDLCE_SYSROOT"] = str(root)
    return root


def install_for_target(channels: list[str], specs: list[str], platform: str,
                       prefix: Path, cuda: str | None = None) -> None:
    """Solve ``specs`` for ``platform`` and install them into ``prefix`` (nothing runs:
    the packages are only linked), as a user of that platform would get them; ``cuda``:
    on a node whose driver supports that CUDA (see install.solve)."""
    import asyncio

    import rattler

    from ci.install import solve

    records, _ = solve(channels, specs, platform, cuda=cuda)
    asyncio.run(rattler.install(records, target_prefix=prefix, show_progress=False))


#: an emulated test past this is hung (powerai's, the longest, takes about 90 s on 2 cores)
TEST_TIMEOUT_S = 900


def emulated_test(o: Outcome, channels: list[str], *, cuda: str | None = None) -> tuple[str, str]:
    """Run the recipe's ``cross_test.sh`` (or say none) in an environment for the target
    holding the package and its run dependencies from ``channels``, as a user of that
    platform would install it; the script runs the target's binaries under qemu-user.
    ``cuda``: the env is solved as on a GPU node with a driver for that CUDA, which the
    CUDA builds need (linux-aarch64's pytorch is one); nothing here runs on a GPU."""
    script = o.node.recipe_path.parent / "cross_test.sh"
    if not script.exists():
        return "none", "no cross_test.sh in the recipe"
    with tempfile.TemporaryDirectory(prefix="ci-cross-test-") as tmp:
        prefix = Path(tmp) / "prefix"
        spec = f"{o.node.name} =={o.node.version} {o.node.build_string}"
        try:
            install_for_target(channels, [spec], o.node.subdir, prefix, cuda=cuda)
        except Exception as exc:  # noqa: BLE001 - an uninstallable package fails its test
            return "failed", f"{spec} does not install for {o.node.subdir}: {exc}"
        launchers = Path(os.environ["DDLCE_SYSROOT"]) / "ddlce-bin"
        env = {
            **os.environ,
            "PREFIX": str(prefix),
            "RECIPE_DIR": str(script.parent),
            "target_platform": o.node.subdir,
            # the target's GNU triplet and emulator, so the scripts need no table of them
            "CROSS_TRIPLE": CROSS_PLATFORMS[o.node.subdir][1],
            "CROSS_QEMU": CROSS_PLATFORMS[o.node.subdir][2],
            # target-run PROGRAM / target-mpirun -n N target-run PROGRAM (sysroot.py)
            "CROSS_RUN": str(launchers / "target-run"),
            "CROSS_MPIRUN": str(launchers / "target-mpirun"),
            "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
        }
        try:
            p = subprocess.run(["bash", str(script)], cwd=tmp, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               timeout=TEST_TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout or ""
            out = out.decode(errors="replace") if isinstance(out, bytes) else out
            return "failed", f"{out}\ncross_test.sh ran past {TEST_TIMEOUT_S} s and was killed"
    return ("passed" if p.returncode == 0 else "failed"), p.stdout

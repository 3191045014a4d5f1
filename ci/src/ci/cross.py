"""Cross-building for linux-ppc64le and testing under qemu-user.

Cross-built here, for linux-ppc64le and linux-aarch64: libddl (C) against the site's MPI
(`external`), taken from a Debian sysroot of the target architecture, and, offline, the
python stand-in (recipes/upstream/python) against the sysroot's libraries. numpy, mpi4py,
ddl, pytorch and tensorflow are not cross-built yet: they need a native build (the report
says so; nothing is faked).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import zipfile
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
    need = [f"{tri}-gcc", qemu, "dpkg", "file"]
    return [t for t in need if shutil.which(t) is None]


def prepare(cache: Path, platform: str) -> Path:
    """Fetch/unpack the sysroot, make it runnable under qemu, export DDLCE_SYSROOT."""
    arch = CROSS_PLATFORMS[platform][0]
    root = ensure_sysroot(cache, arch)
    prepare_for_qemu(root, arch)
    os.environ["DDLCE_SYSROOT"] = str(root)
    return root


def unpack_conda(path: Path, dest: Path) -> None:
    """Extract a .conda's payload (pkg-*.tar.zst) into ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path) as z:
        member = next(n for n in z.namelist() if n.startswith("pkg-"))
        z.extract(member, dest)
    subprocess.run(["tar", "--zstd", "-xf", str(dest / member), "-C", str(dest)], check=True)
    (dest / member).unlink()


def emulated_test(o: Outcome) -> tuple[str, str]:
    """Run the recipe's ``cross_test.sh`` against the unpacked package (or say none)."""
    script = o.node.recipe_path.parent / "cross_test.sh"
    if not script.exists():
        return "none", "no cross_test.sh in the recipe"
    with tempfile.TemporaryDirectory(prefix="ci-cross-test-") as tmp:
        prefix = Path(tmp) / "prefix"
        unpack_conda(Path(o.path), prefix)
        env = {
            **os.environ,
            "PREFIX": str(prefix),
            "RECIPE_DIR": str(script.parent),
            "target_platform": o.node.subdir,
        }
        p = subprocess.run(
            ["bash", str(script)], cwd=tmp, env=env, capture_output=True, text=True, timeout=600
        )
    return ("passed" if p.returncode == 0 else "failed"), (p.stdout + p.stderr)[-4000:]

"""Seal figures (issue 39): how long ``envtools seal`` of an env takes, the image's size
against the env's, and whether a second seal of the unchanged env gives the same sha256.

``seal_benchmark(prefix, workdir)`` returns the figures as a dict and
``format_seal_rows(result)`` the lines to print; ``python -m envtools.bench --startup``
includes them, and ``python -m envtools.image.bench PREFIX`` prints them alone. The load
average before each seal is printed with it: the figure is for the cores the machine
had free, and a shared machine's other work slows mksquashfs down in proportion.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path

#: the issue's targets
TARGET_SEAL_S = 90.0
TARGET_RATIO = 0.45


def seal_benchmark(prefix: str | os.PathLike[str], workdir: str | os.PathLike[str] | None = None,
                   keep: Path | None = None) -> dict:
    """Seal ``prefix`` twice into ``workdir`` (a temporary directory if None); returns
    the figures. ``keep``: move the first image (and its sidecars) there for later use,
    e.g. the startup benchmark's ``ddlrun --env``."""
    from envtools.image import seal as seal_mod

    work = Path(tempfile.mkdtemp(prefix="envtools-seal-bench-", dir=workdir))
    try:
        rows = []
        for n in (1, 2):
            out = work / f"seal{n}.sqfs"
            load = os.getloadavg()[0]
            t0 = time.monotonic()
            m = seal_mod.seal(prefix, out)
            rows.append({"seconds": time.monotonic() - t0, "load_before": load,
                         "sha256": m.image_sha256})
        first = work / "seal1.sqfs"
        if keep is not None:
            for suffix in ("", ".sha256", ".json"):
                shutil.move(f"{first}{suffix}", f"{keep}{suffix}")
        return {
            "prefix": str(prefix), "packages": m.packages, "files": m.files,
            "env_bytes": m.env_bytes, "image_bytes": m.image_bytes,
            "ratio": m.image_bytes / max(m.env_bytes, 1),
            "seal_s": rows[0]["seconds"], "second_seal_s": rows[1]["seconds"],
            "load_before": rows[0]["load_before"], "cores": os.cpu_count(),
            "zstd_level": seal_mod.ZSTD_LEVEL, "block": seal_mod.BLOCK_SIZE,
            "same_sha256": rows[0]["sha256"] == rows[1]["sha256"],
            "sha256": rows[0]["sha256"],
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)


def format_seal_rows(r: dict) -> list[str]:
    """The figures as printed lines, each with its target."""
    ok = lambda good: "ok" if good else "MISSED"  # noqa: E731
    return [
        f"envtools seal {r['prefix']}: {r['packages']} packages, {r['files']} entries, "
        f"{r['env_bytes'] / 2**20:.0f} MiB (zstd level {r['zstd_level']}, {r['block']} blocks)",
        f"  seal time        {r['seal_s']:7.1f} s   (second {r['second_seal_s']:.1f} s; "
        f"{r['cores']} cores, load average {r['load_before']:.1f} before)  target <= "
        f"{TARGET_SEAL_S:.0f} s: {ok(r['seal_s'] <= TARGET_SEAL_S)}",
        f"  image size       {r['image_bytes'] / 2**20:7.0f} MiB = {100 * r['ratio']:.1f}% of "
        f"the env  target <= {100 * TARGET_RATIO:.0f}%: {ok(r['ratio'] <= TARGET_RATIO)}",
        f"  second seal      same sha256: {r['same_sha256']} ({r['sha256'][:16]}...)  "
        f"{ok(r['same_sha256'])}",
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m envtools.image.bench",
                                 description="Seal an env twice and print the seal figures.")
    ap.add_argument("prefix", type=Path)
    ap.add_argument("--workdir", type=Path, help="where the images go [default: TMPDIR]")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args(argv)
    r = seal_benchmark(a.prefix, a.workdir)
    print("\n".join(format_seal_rows(r)))
    if a.json:
        a.json.write_text(json.dumps(r, indent=2) + "\n")
    return 0 if r["same_sha256"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""What staging an image costs one node, against a plain copy of it, in one run.

    python -m ddl_core.bench stage IMAGE [--stage-dir DIR] [--reps 5] [--json F]

IMAGE is an image `envtools seal` wrote (IMAGE.sha256 and IMAGE.json beside it). Each
repetition runs, in turn and in the same order: `cp IMAGE DIR/`, the baseline staging is
judged by (target: staging <= 2x it); `ddlrun -v --env IMAGE -n 1 true`, taking ddlrun's
own figure for its staging to this node (the keeper process, the image streamed to it
and written to DIR, every chunk checked against IMAGE.json's chunk sha256s on every
core, until the keeper says READY); the same staging of the same bytes as an image
sealed before chunk digests (IMAGE.json without them: one sha256 of the whole stream, on
one thread); and the check `envtools run` makes of an image before mounting it, both
ways (envtools.image.chunks.first_bad against sha256 of the whole file), from page
cache. Medians of the repetitions, and each one's ratio to `cp`; the load average before
and after, since a busy machine slows the checks more than the copy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from envtools.image.chunks import first_bad
from envtools.image.manifest import Manifest, parse
from envtools.prefix.hashing import sha256_fileobj


def _timed(fn) -> float:
    """The seconds ``fn`` took, or the figure it returns (a time it measured itself)."""
    t0 = time.perf_counter()
    own = fn()
    return own if isinstance(own, float) else time.perf_counter() - t0


def _unchunked(image: Path, work: Path) -> Path:
    """The same image under another name, with an IMAGE.json as one sealed before chunk
    digests reads (a symbolic link: the bytes staged are the same file's)."""
    link = work / "unchunked.sqsh"
    link.symlink_to(image)
    shutil.copyfile(f"{image}.sha256", f"{link}.sha256")
    doc = json.loads(Path(f"{image}.json").read_text())
    doc.pop("chunk_bytes", None)
    doc.pop("chunk_sha256", None)
    Path(f"{link}.json").write_text(json.dumps(doc))
    return link


_STAGED = re.compile(r"^# --env .*: staged .* in ([0-9.]+) s", re.M)


def _stage(image: Path, root: Path) -> float:
    """One real job, `ddlrun -v --env IMAGE -n 1 true`, run as a user runs it (the
    benchmarks sit beside ddlrun, not above it, so it is a process here); ddlrun's own
    figure for its staging: from opening the image to every keeper's READY."""
    ddlrun = str(Path(sys.executable).with_name("ddlrun"))
    p = subprocess.run([ddlrun, "-v", "--env", str(image), "--stage-dir", str(root),
                        "-n", "1", "true"], capture_output=True, text=True, timeout=300)
    m = _STAGED.search(p.stderr)
    if p.returncode != 0 or not m:
        raise SystemExit(f"ddlrun --env {image} failed (exit {p.returncode}):\n"
                         + p.stderr[-2000:])
    return float(m.group(1))


def _cp(image: Path, root: Path) -> None:
    dest = root / "plain-copy"
    subprocess.run(["cp", str(image), str(dest)], check=True)
    dest.unlink()


def _verify(image: Path, m: Manifest, chunked: bool) -> None:
    with open(image, "rb") as fh:
        if chunked:
            ok = first_bad(fh.fileno(), m.image_bytes, m.chunk_bytes, m.chunk_sha256) is None
        else:
            ok = sha256_fileobj(fh) == m.image_sha256
    if not ok:
        raise SystemExit(f"{image} does not match its IMAGE.json")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m ddl_core.bench stage", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("image", type=Path)
    ap.add_argument("--stage-dir", type=Path, default=Path(tempfile.gettempdir()),
                    help="node-local directory staged to [the temp dir]")
    ap.add_argument("--reps", type=int, default=5, help="repetitions (median) [5]")
    ap.add_argument("--json", type=Path, help="write the figures here")
    a = ap.parse_args(argv)
    image = a.image.resolve()
    if not Path(f"{image}.json").is_file():
        ap.error(f"{image}.json is missing: give an image envtools seal wrote")
    m = parse(Path(f"{image}.json").read_bytes(), f"{image}.json", beside=True)
    if not m.chunk_sha256:
        ap.error(f"{image}.json lists no chunk sha256s: seal the env again with this envtools")
    size = image.stat().st_size
    with tempfile.TemporaryDirectory(dir=a.stage_dir, prefix="bench-stage-") as tmp:
        work = Path(tmp)
        old = _unchunked(image, work)
        rows = {
            "cp": lambda: _cp(image, work),
            "stage (chunk sha256s, all cores)": lambda: _stage(image, work),
            "stage (whole sha256, one thread)": lambda: _stage(old, work),
            "check before mount (chunks)": lambda: _verify(image, m, True),
            "check before mount (whole)": lambda: _verify(image, m, False),
        }
        load0 = os.getloadavg()
        print(f"image {image.name}: {size / 2**20:.0f} MiB, {len(m.chunk_sha256)} chunks "
              f"of {m.chunk_bytes >> 20} MiB; stage dir {a.stage_dir}; "
              f"{len(os.sched_getaffinity(0))} cores; load {load0[0]:.2f} {load0[1]:.2f} "
              f"{load0[2]:.2f}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
              flush=True)
        _cp(image, work)  # (the image in page cache for every row alike)
        times: dict[str, list[float]] = {k: [] for k in rows}
        for rep in range(a.reps):
            for name, fn in rows.items():
                times[name].append(_timed(fn))
            print(f"  rep {rep + 1}/{a.reps}: " + ", ".join(
                f"{v[-1]:.2f}" for v in times.values()), flush=True)
    load1 = os.getloadavg()
    base = statistics.median(times["cp"])
    print(f"{'what':36} {'median s':>9} {'vs cp':>7}   each")
    for name, v in times.items():
        med = statistics.median(v)
        print(f"{name:36} {med:9.3f} {med / base:6.2f}x   "
              + " ".join(f"{x:.2f}" for x in v))
    print(f"load at the end {load1[0]:.2f} {load1[1]:.2f} {load1[2]:.2f}")
    if a.json:
        a.json.write_text(json.dumps({"image_bytes": size, "reps": a.reps, "load_start": load0,
                                      "load_end": load1, "seconds": times}, indent=1))
    return 0

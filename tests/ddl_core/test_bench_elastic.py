"""`python -m ddl_core.bench elastic` on one host, a few trials: every killed job ends, the
survivors agree on the newest commit and finish bit-identical (the benchmark's own checks,
read back from its JSON; its timings are figures, not asserted here)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import ddl_core

pytestmark = pytest.mark.timeout(600)


def test_bench_elastic_trials_end_identical_with_no_lost_step(tmp_path: Path) -> None:
    if not hasattr(ddl_core, "shrink_world"):
        pytest.skip("this ddl_core has no fault tolerance (libddl without ULFM)")
    out = tmp_path / "elastic.json"
    proc = subprocess.run([sys.executable, "-m", "ddl_core.bench", "elastic", "--hosts", "1",
                           "--ranks", "4", "--trials", "4", "--healthy-reps", "1",
                           "--steps", "8", "--kill-step", "4", "--json", str(out)],
                          capture_output=True, text=True, timeout=580, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    cfg = json.loads(out.read_text())["configs"][0]
    assert [t["victim"] for t in cfg["trials"]] == [0, 1, 2, 3]  # rank 0 included
    for t in cfg["trials"]:
        assert t["finished"] and t["no_lost_step"] and t["identical"], t
        assert t["size"] == 3 and t["recovered_s"] is not None, t
    assert len(cfg["healthy_step_s"]["plain"]) == 1 == len(cfg["healthy_step_s"]["elastic"])

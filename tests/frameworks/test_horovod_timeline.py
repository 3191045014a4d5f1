"""The timeline (HOROVOD_TIMELINE / DDL_TIMELINE, start_timeline/stop_timeline): a
Chrome-trace JSON file that covers every collective of a small real run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import WORKERS, mpirun, need, ok_lines

pytestmark = pytest.mark.timeout(600)


def _rows(events: list[dict]) -> dict[str, set[str]]:
    """{tensor row: the phases on it}."""
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e["name"] == "process_name"}
    rows: dict[str, set[str]] = {}
    for e in events:
        if e.get("ph") in ("X", "B") and e["pid"] in names:
            rows.setdefault(names[e["pid"]], set()).add(e["name"])
    return rows


def test_horovod_timeline_covers_every_collective(tmp_path: Path) -> None:
    need("torch")
    first, second = tmp_path / "tl.json", tmp_path / "tl2.json"
    proc = mpirun(2, WORKERS / "hvd_timeline.py", str(second),
                  env={"HOROVOD_TIMELINE": str(first)})
    assert ok_lines(proc, "hvd_timeline") == 2, proc.stdout
    events = json.loads(first.read_text())      # valid JSON: a complete array
    rows = _rows(events)
    want = {
        "allreduce.t.allreduce": {"NEGOTIATE_ALLREDUCE", "ALLREDUCE", "QUEUE",
                                  "DDL_ALLREDUCE"},
        "allreduce.t.allreduce_async": {"ALLREDUCE", "DDL_ALLREDUCE"},
        "grouped_allreduce.t.grouped.0": {"ALLREDUCE"},
        "grouped_allreduce.t.grouped.1": {"ALLREDUCE"},
        "allgather.t.allgather": {"NEGOTIATE_ALLGATHER", "ALLGATHER", "DDL_ALLGATHER"},
        "broadcast.t.broadcast": {"BROADCAST", "DDL_BROADCAST"},
        "alltoall.t.alltoall": {"ALLGATHER"},
        "reducescatter.t.reducescatter": {"ALLREDUCE"},
        "t.broadcast_object": {"BROADCAST_OBJECT"},
        "t.allgather_object": {"ALLGATHER_OBJECT"},
        "barrier": {"BARRIER"},
        "allreduce.t.set_allreduce": {"NEGOTIATE_ALLREDUCE", "ALLREDUCE"},
        "join": {"JOIN"},
    }
    for row, phases in want.items():
        assert row in rows, (row, sorted(rows))
        assert phases <= rows[row], (row, rows[row])
    ddl = [e for e in events if e.get("name") == "DDL_ALLREDUCE"
           and e["pid"] in {p for p, nm in {e2["pid"]: e2["args"]["name"] for e2 in events
                                            if e2.get("name") == "process_name"}.items()
                            if nm == "allreduce.t.allreduce"}]
    assert ddl and ddl[0]["args"]["fused_bytes"] >= 4000 and ddl[0]["args"]["levels"], ddl
    assert ddl[0]["dur"] >= 0
    assert "t.second" not in str(sorted(rows))
    later = _rows(json.loads(second.read_text()))
    assert set(later) == {"allreduce.t.second"}, later


def test_ddl_timeline_for_ddl_core_users(tmp_path: Path) -> None:
    path = tmp_path / "ddl-{rank}.json"
    script = ("import numpy as np, ddl_core as d; d.init(); "
              "d.allreduce_async(np.ones(64), name='grad.w').wait(); "
              "d.allgatherv_async(np.ones(d.rank() + 1), name='rows').wait(); "
              "print('OK ddl_timeline')")
    proc = mpirun(2, "-c", script, env={"DDL_TIMELINE": str(path)})
    assert ok_lines(proc, "ddl_timeline") == 2, proc.stdout
    for rank in (0, 1):                           # "{rank}": one file per rank
        rows = _rows(json.loads((tmp_path / f"ddl-{rank}.json").read_text()))
        assert {"NEGOTIATE_ALLREDUCE", "DDL_ALLREDUCE"} <= rows["grad.w"], rows
        assert "DDL_ALLGATHER" in rows["rows"], rows

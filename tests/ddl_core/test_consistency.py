"""Replicas never diverge: the property test of workers/consistency.py on 2-5 ranks.

Random inputs full of NaN (any payload, either sign), +-inf, -0.0, subnormals and
overflowing values; every dtype and op; counts around the 64 KiB small-message limit and
the DDL_SEGMENT / DDL_PIECE boundaries; every algorithm (set per case, the same on every
rank); fusion on and off; blocking, in place, asynchronous and fused batches. The results
are gathered (with mpi4py) and compared bit for bit, and min/max and integer results
against numpy under DDL's NaN and signed-zero rule.

DDL_CONSISTENCY_CASES sets the total number of cases over the five jobs (default 1500, a
CI-sized run of about a minute on 2 cores); the figure in the README comes from
    DDL_CONSISTENCY_CASES=12000 .venv/bin/python -m pytest -q -s tests/ddl_core/test_consistency.py
"""

from __future__ import annotations

import os
import re

import pytest
from conftest import ok_lines, run_mpi

JOBS = [
    (2, {}),
    (3, {"DDL_SEGMENT": "4096"}),
    # two "nodes" of two: the node-leader pipeline in 4 KiB segments, 1000-byte pieces
    (4, {"DDL_TOPOLOGY": "2x2", "DDL_SEGMENT": "4096", "DDL_PIECE": "1000"}),
    (4, {"DDL_TOPOLOGY": "2x2", "DDL_NODE_LEADER": "0", "DDL_PIECE": "1000"}),
    (5, {}),
]
TOTAL = int(os.environ.get("DDL_CONSISTENCY_CASES", "1500"))
SEED = int(os.environ.get("DDL_CONSISTENCY_SEED", "1"))


@pytest.mark.parametrize("ranks,env", JOBS, ids=[f"{n}ranks-{'-'.join(e) or 'default'}"
                                                   for n, e in JOBS])
def test_every_rank_gets_the_same_bits(ranks: int, env: dict[str, str]) -> None:
    cases = max(1, TOTAL // len(JOBS))
    seed = SEED * 1000 + JOBS.index((ranks, env))
    proc = run_mpi(ranks, "consistency.py", str(cases), str(seed),
                   env={"DDL_TIMEOUT": "60", **env}, timeout=max(300, cases), check=False)
    m = re.search(r"CONSISTENCY ranks=(\d+) cases=(\d+) divergent=(\d+) wrong=(\d+) "
                  r"noncanonical=(\d+)", proc.stdout)
    assert m, proc.stdout[-4000:] + proc.stderr[-4000:]
    print(m.group(0), env)
    assert int(m.group(2)) >= cases
    assert (m.group(3), m.group(4), m.group(5)) == ("0", "0", "0"), proc.stdout[-4000:]
    assert ok_lines(proc, "consistency") == ranks and proc.returncode == 0, proc.stderr[-4000:]

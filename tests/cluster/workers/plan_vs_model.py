"""Rank worker: libddl's cost model (csrc/model.c, via ddl.plan) and its Python port
(ddl_core.model.hierarchical) must predict the same time for every size."""

import os
import sys

import ddl_core as ddl
from ddl_core import model

ddl.init()
fab = model.Fabric.from_tune_file(os.environ["DDL_TUNE_FILE"])
dims = list(ddl.topology())
for nbytes in (8, 1000, 1 << 16, 1 << 20, 1 << 24, 3 << 26):
    algos, c_time = ddl.plan(nbytes)
    py_time, py_algos = model.hierarchical(fab, dims, nbytes)
    if abs(c_time - py_time) > 1e-9 + 1e-9 * c_time:
        sys.exit(f"size {nbytes}: libddl predicts {c_time}, ddl_core.model {py_time}")
    flat = py_algos[0].endswith("(flat)")
    if (not flat and list(algos) != py_algos) or (flat and set(algos) != {"recdoubling"}):
        sys.exit(f"size {nbytes}: libddl plans {algos}, ddl_core.model {py_algos}")
print("OK plan_vs_model", flush=True)

"""Configuration errors at init: clear, the same on every rank, bounded by DDL_TIMEOUT.

Usage: config.py MODE
  hostile   every numeric DDL_* variable set to each hostile value, on every rank in
            turn: ddl.init() raises InvalidArgumentError naming it on every rank; then a
            clean init works (a failed init leaves nothing behind)
  differs   each setting that must agree set differently on one rank: every rank raises
            InvalidArgumentError naming the variable, both values and the ranks, well
            within DDL_TIMEOUT; then a clean init works
  one_bad   one rank alone has a bad value: every rank reports it with that rank
  missing   rank MISSING (env) never calls ddl.init(): the others raise DDLTimeoutError
            naming it within about DDL_TIMEOUT
  late      rank LATE calls ddl.init() after the others gave up: it times out naming rank 0
  setters   ddl.set_algorithm / set_fusion on one rank only: the next collective raises
            MismatchError on every rank, at once; the same settings again work
Each rank prints "OK MODE ..." when its checks pass.
"""

from __future__ import annotations

import os
import sys
import time

from mpi4py import MPI  # MPI starts here, so a rank that skips ddl.init() is still in the job

import ddl_core as ddl

mode = sys.argv[1]
comm = MPI.COMM_WORLD
r, n = comm.rank, comm.size
timeout = float(os.environ["DDL_TIMEOUT"])

NUMERIC = ["DDL_TIMEOUT", "DDL_SPIN_US", "DDL_CYCLE_TIME_MS", "DDL_WINDOW", "DDL_LOG",
           "DDL_NODE_LEADER", "DDL_SEGMENT", "DDL_PIECE", "DDL_FUSION_THRESHOLD"]
HOSTILE = ["nan", "inf", "-inf", "-1", "1e400", "12abc", "", " 5", "0x10", "1" + "0" * 30]
# (variable, value on rank 0, value on the odd one out)
DIFFERS = [("DDL_TOPOLOGY", "2x2", "4"), ("DDL_ALGO", "ring", "mpi"),
           ("DDL_FUSION_THRESHOLD", "1048576", "65536"), ("DDL_NODE_LEADER", "1", "0"),
           ("DDL_SEGMENT", "4096", "8192"), ("DDL_PIECE", "1000", "0"),
           ("DDL_NCCL", "auto", "0"), ("DDL_NCCL_OUTER", "nccl", "mpi")]


def init_error(expect: type[BaseException]) -> tuple[str, float]:
    t0 = time.monotonic()
    try:
        ddl.init()
    except expect as e:
        return str(e), time.monotonic() - t0
    ddl_vars = {k: v for k, v in os.environ.items() if k.startswith("DDL_")}
    raise AssertionError(f"rank {r}: ddl.init() did not raise {expect.__name__} ({ddl_vars})")


def clean_init_works() -> None:
    import numpy as np

    ddl.init()
    assert (ddl.allreduce(np.ones(4, np.float32)) == n).all()
    ddl.finalize()


def same_everywhere(msg: str) -> None:
    msgs = comm.allgather(msg)
    assert all(m == msgs[0] for m in msgs), msgs


if mode == "hostile":
    checked = 0
    for var in NUMERIC:
        before = os.environ.get(var)
        for value in HOSTILE:
            if var == "DDL_SPIN_US" and value == "-1":
                value = "-2"  # -1 is allowed there: always spin
            os.environ[var] = value
            msg, took = init_error(ddl.InvalidArgumentError)
            shown = f"{var}={value}" if value else f"{var} is set but empty"
            assert shown in msg and "[" in msg and "default" in msg, (var, value, msg)
            assert "on every rank" in msg, msg
            same_everywhere(msg)
            assert took < timeout, took
            checked += 1
        if before is None:
            del os.environ[var]
        else:
            os.environ[var] = before
    clean_init_works()
    print(f"OK hostile {checked} values", flush=True)

elif mode == "differs":
    odd = n - 1
    for var, common, other in DIFFERS:
        os.environ[var] = other if r == odd else common
        msg, took = init_error(ddl.InvalidArgumentError)
        assert f"{var} differs between ranks" in msg, msg
        assert f"'{common}'" in msg and f"'{other}'" in msg and f"rank {odd} has" in msg, msg
        assert took < timeout, took
        same_everywhere(msg)
        del os.environ[var]
    clean_init_works()
    print("OK differs", flush=True)

elif mode == "one_bad":
    if r == 1:
        os.environ["DDL_SEGMENT"] = "12abc"
    msg, took = init_error(ddl.InvalidArgumentError)
    assert "DDL_SEGMENT=12abc is not an integer" in msg and "(on rank 1)" in msg, msg
    same_everywhere(msg)
    os.environ.pop("DDL_SEGMENT", None)
    clean_init_works()
    print("OK one_bad", flush=True)

elif mode == "setters":
    import numpy as np

    ddl.init()
    small, large = np.ones(2, np.float32), np.ones(1 << 18, np.float32)
    changes = [(lambda: ddl.set_algorithm("ring"), lambda: ddl.set_algorithm("auto")),
               (lambda: ddl.set_fusion(1024, 1.0), lambda: ddl.set_fusion(64 << 20, 1.0))]
    for change, undo in changes:
        if r == 1:
            change()  # on one rank only
        for x in (small, large):
            t0 = time.monotonic()
            try:
                ddl.allreduce(x)
                raise AssertionError(f"rank {r}: no MismatchError")
            except ddl.MismatchError as e:
                assert "ddl_set_algorithm / ddl_set_fusion" in str(e), e
            assert time.monotonic() - t0 < timeout
        if r == 1:
            undo()
        assert (ddl.allreduce(large) == n).all()  # the same settings again: it works
    print("OK setters", flush=True)

elif mode == "missing":
    missing = int(os.environ["MISSING"])
    if r == missing:
        time.sleep(timeout + 2)  # never calls ddl.init()
        print("OK missing (the missing rank)", flush=True)
    else:
        msg, took = init_error(ddl.DDLTimeoutError)
        assert f"rank {missing} did not call ddl_init()" in msg, msg
        assert timeout * 0.9 <= took <= timeout + 6, took
        print(f"OK missing after {took:.1f}s: {msg}", flush=True)

elif mode == "late":
    late = int(os.environ["LATE"])
    if r == late:
        time.sleep(timeout + 3)
        msg, took = init_error(ddl.DDLTimeoutError)
        assert "no answer from rank 0" in msg, msg
        print(f"OK late after {took:.1f}s", flush=True)
    else:
        msg, took = init_error(ddl.DDLTimeoutError)
        assert f"rank {late} did not call ddl_init()" in msg, msg
        print(f"OK late after {took:.1f}s", flush=True)

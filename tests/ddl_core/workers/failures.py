"""Failure behaviour: mismatches raise on every rank, misuse raises (dead or hung peers:
ddl_core.bench.faults, run by test_faults.py).

Usage: failures.py MODE
"""

from __future__ import annotations

import sys

import numpy as np

import ddl_core as ddl

mode = sys.argv[1]


def raises(exc: type[BaseException], fn, *args, **kw) -> str:  # noqa: ANN001
    try:
        fn(*args, **kw)
    except exc as e:
        return str(e)
    raise AssertionError(f"{fn.__name__} did not raise {exc.__name__}")


if mode == "misuse":
    msg = raises(ddl.NotInitializedError, ddl.allreduce, np.ones(3, np.float32))
    assert "not initialized" in msg and "init()" in msg, msg
    raises(ddl.NotInitializedError, ddl.rank)
    ddl.init()
    ddl.init()  # harmless twice
    r = ddl.rank()
    x = np.ones(6, np.float32)
    # Bad op / dtype / layout raise before any communication: only rank 0 makes the
    # mistake, so a call that communicated would hang the others.
    if r == 0:
        assert "unknown op 'bogus'" in raises(ValueError, ddl.allreduce, x, op="bogus")
        assert "complex128" in raises(TypeError, ddl.allreduce, np.ones(3, np.complex128))
        assert "C-contiguous" in raises(ValueError, ddl.allreduce, np.ones((4, 4))[:, 1])
        assert "elements" in raises(ValueError, ddl.allreduce, x, out=np.ones(5, np.float32))
        raises(ValueError, ddl.broadcast, x, root=ddl.size())
        raises(ValueError, ddl.set_algorithm, "bogus")
    ddl.barrier()
    assert (ddl.allreduce(x) == ddl.size()).all()
    ddl.finalize()
    assert "finalize" in raises(ddl.NotInitializedError, ddl.allreduce, x)
    raises(ddl.NotInitializedError, ddl.barrier)
    print("OK misuse", flush=True)

elif mode == "mismatch":
    ddl.init()
    r, n = ddl.rank(), ddl.size()
    cases = [
        ("small count", lambda: ddl.allreduce(np.ones(10 + (r == 1), np.float32))),
        ("large count", lambda: ddl.allreduce(np.ones(100000 + (r == n - 1), np.float32))),
        ("small vs large count", lambda: ddl.allreduce(np.ones(3 if r == 0 else 50000,
                                                               np.float32))),
        ("dtype", lambda: ddl.allreduce(np.ones(8, np.float32 if r else np.int32))),
        ("op", lambda: ddl.allreduce(np.ones(8, np.float32), op="max" if r else "sum")),
        ("broadcast root", lambda: ddl.broadcast(np.ones(8, np.float32), root=r % 2)),
        ("allgather count", lambda: ddl.allgather(np.ones(4 + r, np.float32))),
        ("collective kind", lambda: ddl.allreduce(np.ones(8, np.float32)) if r
         else ddl.broadcast(np.ones(8, np.float32))),
        ("async count", lambda: ddl.allreduce_async(np.ones(64 + r, np.float32)).wait()),
    ]
    for name, fn in cases:
        msg = raises(ddl.MismatchError, fn)
        assert f"rank {r}" in msg, msg
        if "count" in name and "async" not in name:
            assert "different counts" in msg, msg
        # nothing is left half-done: the next collective works
        assert (ddl.allreduce(np.full(5, 2.0, np.float32)) == 2.0 * n).all(), name
    print("OK mismatch", flush=True)

else:
    raise SystemExit(f"unknown mode {mode}")

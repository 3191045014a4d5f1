"""Worker for test_ulfm.py: a rank SIGKILLs itself mid-loop under `mpirun --with-ft ulfm`;
the survivors must see ProcessFailedError naming it, shrink, and compute right after.

    ulfm.py CASE [VICTIMS] [KILL_AT]

CASE: loop (blocking allreduces on the world), comm (on a split communicator), async (a
named asynchronous batch in flight), two (two victims at once), during_shrink (a second
victim dies inside the shrink), rank0 (the liveness hub dies), midway (the victim dies
inside a large allreduce, while the others' pre-posted receives and streamed pieces are in
flight: run with DDL_LIVENESS=0 and DDL_TOPOLOGY=2x2, so that MPI's own error, not the
watcher, reports it). Each survivor prints one
JSON line: {"rank", "ranks" (what the error named, as world ranks), "detect_s",
"shrink_s", "new_size", "ok"}; the victims print nothing after KILL.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import threading
import time

import numpy as np

import ddl_core as ddl

case = sys.argv[1]
victims = [int(v) for v in (sys.argv[2] if len(sys.argv) > 2 else "2").split(",")]
kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else 5
ddl.init()
assert ddl.fault_tolerant(), "launched without --with-ft ulfm"
me, n = ddl.rank(), ddl.size()
world = ddl.comm_world()
comm = world.split(0, key=n - me) if case == "comm" else world  # reversed order
# The victims' kill times go to the test's own directory (ULFM_STAMP_DIR).
stamp = os.path.join(os.environ.get("ULFM_STAMP_DIR", tempfile.gettempdir()),
                     f"ulfm-kill-{os.environ.get('ULFM_TAG', 'x')}")


def die() -> None:
    # The moment of the kill, for the survivors' figures (same host, same clock).
    with open(f"{stamp}-{me}", "w") as f:
        f.write(repr(time.time()))
    os.kill(os.getpid(), signal.SIGKILL)


def kill_time() -> float:
    times = []
    for v in victims:
        try:
            with open(f"{stamp}-{v}") as f:
                times.append(float(f.read()))
        except OSError:
            pass
    return min(times) if times else float("nan")


x = np.arange(1000 if case != "midway" else 1 << 21, dtype=np.float64)  # midway: 16 MiB
err = None
t_err = 0.0
try:
    for i in range(100000):
        if i == kill_at and me in victims and case == "midway":
            # The allreduce below holds no GIL while it moves data: the timer fires in it.
            threading.Timer(float(os.environ.get("ULFM_MIDWAY_DELAY", "0.01")), die).start()
        elif i == kill_at and me in victims and case != "during_shrink":
            die()
        if i == kill_at and case == "during_shrink" and me == victims[0]:
            die()
        if case == "async":
            hs = [comm.allreduce_async(x + j, name=f"g{j}") for j in range(8)]
            for j, h in enumerate(hs):
                y = h.wait()
                assert np.array_equal(y, (x + j) * comm.size), (j, y[:3])
        else:
            y = comm.allreduce(x)
            assert np.array_equal(y, x * comm.size)
except ddl.ProcessFailedError as e:
    t_err = time.time()
    err = e
if err is None:
    raise SystemExit("the loop ended without a failure")
ranks = list(err.ranks)
# The next call on the failed communicator fails at once too.
try:
    comm.allreduce(x)
    raise SystemExit("a call on the failed communicator succeeded")
except ddl.ProcessFailedError:
    pass
if case == "during_shrink" and me == victims[1]:
    # Dies inside its shrink: the others are in theirs (it takes tens of ms).
    threading.Timer(float(os.environ.get("ULFM_SHRINK_DELAY", "0.005")), die).start()
t0 = time.time()
if comm is world:
    new = ddl.shrink_world()
else:
    new = comm.shrink()
t_shrunk = time.time()
y = new.allreduce(np.full(4, 1.0))
ok = bool(np.all(y == new.size))
if comm is world:
    # The module-level calls are the new world's now.
    ok &= ddl.size() == new.size and ddl.rank() == new.rank
    z = ddl.allreduce(np.array([ddl.rank()], dtype=np.int64))
    ok &= int(z[0]) == sum(range(ddl.size()))
    h = ddl.allreduce_async(np.ones(3), name="after")
    ok &= bool(np.all(h.wait() == ddl.size()))
# .ranks are ranks of the failed communicator; as world ranks, for the test to compare.
print(json.dumps({"rank": me, "ranks": [comm.members[r] for r in ranks],
                  "failed_ranks": [comm.members[r] for r in comm.failed_ranks],
                  "comm_ranks": ranks,
                  "detect_s": t_err - kill_time(), "shrink_s": t_shrunk - kill_time(),
                  "shrink_only_s": t_shrunk - t0, "new_size": new.size, "ok": ok,
                  "msg": str(err)[:300]}), flush=True)

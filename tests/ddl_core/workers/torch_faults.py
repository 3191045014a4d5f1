"""torch.distributed on the ddl backend when collectives fail: errors, never crashes.

Usage: torch_faults.py MODE [STAMP]  (STAMP: a file for ddp_dead's time of death)
  ddp_mismatch  rank 1's model is float64: DDP's gradient allreduce mismatches; backward
                raises RuntimeError on every rank (it segfaulted in Reducer::finalize_backward
                when a failed future carried the exception as its value).
  ddp_dead      rank 1 is killed just before backward; the others' backward raises RuntimeError
                naming the lost rank within 2 s.
  pg_timeout    timeout= of init_process_group (3 s) and new_group (2 s) is each group's
                deadline (DDL_TIMEOUT is 60 s): rank 1 does not call; Work.wait() raises the
                ddl error, Work.exception() returns it, the default group times out, and
                monitored_barrier(timeout) names rank 1.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import ddl_core

mode = sys.argv[1]
dist.init_process_group("ddl", timeout=timedelta(seconds=3) if mode == "pg_timeout" else None)
rank = dist.get_rank()


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(10, 50), nn.ReLU(), nn.Linear(50, 2))


if mode in ("ddp_mismatch", "ddp_dead"):
    m, x = model(), torch.randn(4, 10)
    if mode == "ddp_mismatch" and rank == 1:
        m, x = m.double(), x.double()
    ddp = DDP(m, init_sync=False)  # the first collective is the gradient allreduce
    stamp = Path(sys.argv[2]) if len(sys.argv) > 2 else None
    if mode == "ddp_dead" and rank == 1:
        time.sleep(0.3)  # the others are in backward by now
        assert stamp is not None
        stamp.write_text(f"{time.monotonic():.6f}")  # one host: a shared monotonic clock
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        ddp(x).sum().backward()
    except RuntimeError as e:
        want = "MismatchError" if mode == "ddp_mismatch" else "PeerLostError"
        assert want in str(e), e
        if mode == "ddp_dead" and stamp is not None:
            took = time.monotonic() - float(stamp.read_text())
            assert "rank 1 exited or died" in str(e) and took <= 2.0, (took, e)
        print(f"OK {mode} {rank}", flush=True)
        os._exit(0)
    raise AssertionError("backward did not raise")

elif mode == "pg_timeout":
    group = dist.new_group(backend="ddl", timeout=timedelta(seconds=2))
    t = torch.ones(8)
    dist.all_reduce(t, group=group)  # both ranks are here
    if rank == 1:
        time.sleep(10)
        os._exit(0)
    t0 = time.monotonic()
    work = dist.all_reduce(t, group=group, async_op=True)
    try:
        work.wait()
    except ddl_core.DDLTimeoutError as e:
        took = time.monotonic() - t0
        assert 1.9 <= took <= 4.5, took
        assert "the timeout set for this call" in str(e) and "rank 1" in str(e), e
        # through torch's C++ Work (ddl-torch) the error comes back as a RuntimeError
        # carrying the ddl_core error's text, as gloo's does
        ex = work.exception()
        assert isinstance(ex, RuntimeError) and str(e) in str(ex), ex
        assert not work.is_success() and work.is_completed()
        print(f"OK new_group timeout {took:.1f}s", flush=True)
    else:
        raise AssertionError("wait() did not raise")
    t0 = time.monotonic()
    try:
        dist.all_reduce(t)
    except RuntimeError as e:
        took = time.monotonic() - t0
        assert 2.9 <= took <= 5.5, took
        assert isinstance(e, ddl_core.DDLTimeoutError), e  # the ddl error, unwrapped
        print(f"OK init_process_group timeout {took:.1f}s", flush=True)
    else:
        raise AssertionError("all_reduce did not raise")
    t0 = time.monotonic()
    try:  # as gloo's: fails after its own timeout, naming the rank that did not arrive
        dist.distributed_c10d._get_default_group().monitored_barrier(timedelta(seconds=1))
    except ddl_core.DDLTimeoutError as e:
        took = time.monotonic() - t0
        assert 0.9 <= took <= 3.0 and "rank 1 has not reached it" in str(e), (took, e)
        print(f"OK monitored_barrier timeout {took:.1f}s", flush=True)
        os._exit(0)
    raise AssertionError("monitored_barrier did not raise")
else:
    raise SystemExit(f"unknown mode {mode}")

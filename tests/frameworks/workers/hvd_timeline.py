"""A small horovod-ddl run with HOROVOD_TIMELINE set (the test reads the file): every
collective once, named after itself, on the world and on a process set; then
start_timeline/stop_timeline write a second file at run time."""

from __future__ import annotations

import sys

import horovod.torch as hvd
import torch

half = hvd.ProcessSet([0])
hvd.init(process_sets=[half])
r, n = hvd.rank(), hvd.size()

hvd.allreduce(torch.ones(1000), name="t.allreduce")
hvd.synchronize(hvd.allreduce_async(torch.ones(10), name="t.allreduce_async"))
hvd.grouped_allreduce([torch.ones(3), torch.ones(4)], name="t.grouped")
hvd.allgather(torch.ones(r + 1, 2), name="t.allgather")
hvd.broadcast(torch.ones(5), root_rank=0, name="t.broadcast")
hvd.alltoall(torch.arange(2 * n, dtype=torch.float32), name="t.alltoall")
hvd.reducescatter(torch.ones(2 * n), name="t.reducescatter")
hvd.broadcast_object({"a": 1}, root_rank=0, name="t.broadcast_object")
hvd.allgather_object(r, name="t.allgather_object")
hvd.barrier()
if r == 0:
    hvd.allreduce(torch.ones(7), name="t.set_allreduce", process_set=half)
hvd.join()
hvd.stop_timeline()

hvd.start_timeline(sys.argv[1])
hvd.allreduce(torch.ones(3), name="t.second")
hvd.stop_timeline()
print("OK hvd_timeline", flush=True)

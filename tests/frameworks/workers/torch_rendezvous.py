"""The ddl backend's rendezvous under an MPI launcher.

  initdestroy  init_process_group("ddl") then destroy at once: rank 0 must not take its
               store away while a rank is still connecting to it;
  masteraddr   MASTER_ADDR and MASTER_PORT exported but no RANK or WORLD_SIZE (what
               torch's env:// demands): rank and size come from MPI, the store is at
               MASTER_ADDR:MASTER_PORT;
  torchrun     started by torchrun, not MPI, with ddl_core.init() before init: each
               process is then a job of one, and init must say so and what to do
               (tests/frameworks/test_torchrun.py).
"""

import os
import sys

import torch
import torch.distributed as dist

mode = sys.argv[1]
if mode == "masteraddr":
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = sys.argv[2]
    assert "RANK" not in os.environ and "WORLD_SIZE" not in os.environ
if mode == "torchrun":
    import ddl_core

    ddl_core.init()
dist.init_process_group("ddl")
if mode == "masteraddr":
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    n = dist.get_world_size()
    assert torch.all(t == n * (n + 1) / 2), t
dist.destroy_process_group()
print(f"OK {mode}", flush=True)

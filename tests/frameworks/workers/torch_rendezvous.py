"""The ddl backend's rendezvous under an MPI launcher.

  initdestroy  init_process_group("ddl") then destroy at once: rank 0 must not take its
               store away while a rank is still connecting to it;
  masteraddr   MASTER_ADDR and MASTER_PORT exported but no RANK or WORLD_SIZE (what
               torch's env:// demands): rank and size come from MPI, the store is at
               MASTER_ADDR:MASTER_PORT;
  torchrun     started by torchrun, not MPI: init must fail with an error naming the
               launchers that work.
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
dist.init_process_group("ddl")
if mode == "masteraddr":
    t = torch.full((4,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    n = dist.get_world_size()
    assert torch.all(t == n * (n + 1) / 2), t
dist.destroy_process_group()
print(f"OK {mode}", flush=True)

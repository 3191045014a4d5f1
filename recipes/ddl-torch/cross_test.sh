#!/bin/bash
# Run by ci for a cross-built ddl-torch (linux-aarch64): $PREFIX is an env for the target
# holding it, pytorch (PyPI's aarch64 torch, the CUDA build: the env is one of a GPU node)
# and ddl; the sysroot's Open MPI plays the site's. Under qemu-user ($CROSS_RUN,
# $CROSS_MPIRUN: ci/src/ci/sysroot.py): ddl_torch._C loads against that torch, and 2 ranks
# under the target's mpirun all-reduce through the C++ Backend on a named group.
set -euo pipefail
py=$PREFIX/bin/python3.11
cat > fc.py <<'PY'
import platform
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc
import ddl_torch  # noqa: F401  (the C++ Backend)
dist.init_process_group("ddl")
assert dist.group.WORLD.group_name, "no named group: not the C++ Backend"
n = dist.get_world_size()
t = fc.all_reduce(torch.full((4,), dist.get_rank() + 1.0), "sum", dist.group.WORLD).wait()
assert t.tolist() == [n * (n + 1) / 2] * 4, t
print(f"ddl-torch {dist.get_rank()}/{n} {platform.machine()} ok")
dist.destroy_process_group()
PY
out=$("$CROSS_MPIRUN" -n 2 "$CROSS_RUN" "$py" "$PWD/fc.py" 2>&1) || { echo "$out"; exit 1; }
echo "$out"
# (two ranks' lines can arrive joined: count the matches, not the lines)
test "$(echo "$out" | grep -Eo "[01]/2 [a-z0-9_]+ ok" | sort -u | wc -l)" = 2

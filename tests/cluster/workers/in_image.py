"""A rank run by `ddlrun --env`: where it runs from, which mount it sees, and an allreduce.

Prints one `IMAGE {json}` line per rank: its rank and host, sys.prefix and ddl_core's
directory (both must be the image's), the id of its mount namespace (ranks of one node
share one), whether the prefix is a mount in that namespace (squashfs or squashfuse),
and the allreduce of rank+1 over the job (size*(size+1)/2). With `sleep` as argv[1] it
then prints UP and sleeps (for the kill tests).
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time

import numpy as np

import ddl_core as ddl

ddl.init()
x = ddl.allreduce(np.full(4, ddl.rank() + 1.0))
mounts = [line.split() for line in open("/proc/self/mountinfo")]
prefix_mount = [m[m.index("-") + 1] for m in mounts if m[4] == sys.prefix]
print("IMAGE " + json.dumps({
    "rank": ddl.rank(), "size": ddl.size(), "host": socket.gethostname(),
    "prefix": sys.prefix, "ddl": os.path.dirname(ddl.__file__),
    "mntns": os.stat("/proc/self/ns/mnt").st_ino, "fstype": prefix_mount,
    "sum": float(x[0]), "conda_prefix": os.environ.get("CONDA_PREFIX"),
}), flush=True)
if sys.argv[1:] == ["sleep"]:
    print("UP", flush=True)
    time.sleep(300)

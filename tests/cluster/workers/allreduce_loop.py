"""Rank worker that runs until stopped: announces itself, then allreduces in a loop.
For the Slurm tests that cancel a job or kill a node under it."""

import json
import os
import socket
import sys
import time

import numpy as np

import ddl_core as ddl

ddl.init()
print("READY " + json.dumps({"rank": ddl.rank(), "host": socket.gethostname(),
                             "pid": os.getpid(), "marker": sys.argv[1:]}), flush=True)
x = np.ones(1024, np.float32)
while True:
    ddl.allreduce(x)
    time.sleep(0.05)

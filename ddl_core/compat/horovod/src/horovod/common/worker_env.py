"""The HOROVOD_* variables Horovod's launcher gives every worker (HOROVOD_HOSTNAME,
HOROVOD_RANK, HOROVOD_SIZE, HOROVOD_LOCAL_RANK, HOROVOD_LOCAL_SIZE, and once hvd.init()
has learnt the layout HOROVOD_CROSS_RANK / HOROVOD_CROSS_SIZE), made from what mpirun
tells the rank, for scripts that read them (Horovod's elastic tests log HOROVOD_RANK as
the rank a worker started with). A value already set (by the user or a launcher that
knows better, e.g. for a rank started later) is kept."""

from __future__ import annotations

import os
import socket
from collections.abc import MutableMapping

#: HOROVOD_* name -> the launcher's variable it comes from (Open MPI, else Slurm's srun)
_FROM = {
    "HOROVOD_RANK": ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"),
    "HOROVOD_SIZE": ("OMPI_COMM_WORLD_SIZE", "SLURM_NTASKS"),
    "HOROVOD_LOCAL_RANK": ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"),
    "HOROVOD_LOCAL_SIZE": ("OMPI_COMM_WORLD_LOCAL_SIZE",),
}


def export_launch_env(environ: MutableMapping[str, str] = os.environ) -> None:
    """Set the variables a launched rank can know before MPI starts; nothing outside a
    launched job (no launcher variables: a plain `python train.py`)."""
    launched = False
    for name, sources in _FROM.items():
        for src in sources:
            if environ.get(src, "").isdigit():
                environ.setdefault(name, environ[src])
                launched = True
                break
    if launched:
        environ.setdefault("HOROVOD_HOSTNAME", socket.gethostname())


def export_layout(rank: int, size: int, local_rank: int, local_size: int, cross_rank: int,
                  cross_size: int, environ: MutableMapping[str, str] = os.environ) -> None:
    """After hvd.init(): the values it found, where the launcher gave none."""
    for name, value in (("HOROVOD_RANK", rank), ("HOROVOD_SIZE", size),
                        ("HOROVOD_LOCAL_RANK", local_rank), ("HOROVOD_LOCAL_SIZE", local_size),
                        ("HOROVOD_CROSS_RANK", cross_rank), ("HOROVOD_CROSS_SIZE", cross_size)):
        environ.setdefault(name, str(value))
    environ.setdefault("HOROVOD_HOSTNAME", socket.gethostname())

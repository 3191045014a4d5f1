"""`hvd.elastic` on horovod-ddl: elastic Horovod (workers joining and leaving a running
job) is not supported, because a DDL job has a fixed set of MPI ranks. Every name
raises NotImplementedError saying so and what to use instead, rather than an
AttributeError that looks like a broken install."""

from __future__ import annotations

from typing import Any

MESSAGE = ("horovod-ddl does not support elastic Horovod (hvd.elastic.{name}): a DDL job "
           "has a fixed set of MPI ranks. Use a fixed-size job (horovodrun -np N or "
           "ddlrun -n N), save checkpoints (hvd.rank() == 0) and restart the job from the "
           "last one after a failure or to change its size")


def __getattr__(name: str) -> Any:
    if name.startswith("__"):
        raise AttributeError(name)
    raise NotImplementedError(MESSAGE.format(name=name))

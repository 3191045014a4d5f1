"""Horovod's API on DDL (the horovod-ddl package; not upstream Horovod).

`import horovod.torch as hvd` / `horovod.tensorflow` / `horovod.tensorflow.keras` /
`horovod.keras` give Horovod's documented functions, implemented with ddl_core's
collectives, so Horovod scripts run unchanged under `ddlrun` (or `horovodrun`).
"""

__version__ = "0.28.1"

from horovod.common.worker_env import export_launch_env as _export_launch_env

_export_launch_env()

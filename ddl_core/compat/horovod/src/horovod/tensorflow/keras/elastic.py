"""hvd.elastic: not supported by horovod-ddl (see horovod.common.elastic)."""

from horovod.common.elastic import __getattr__  # noqa: F401

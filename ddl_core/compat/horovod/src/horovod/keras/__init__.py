"""`import horovod.keras as hvd`: Keras 3 is tf.keras here, so this is
horovod.tensorflow.keras."""

from horovod.tensorflow.keras import *  # noqa: F403
from horovod.tensorflow.keras import (  # noqa: F401
    DistributedOptimizer,
    allgather,
    allreduce,
    broadcast,
    load_model,
)

from . import callbacks, elastic  # noqa: F401

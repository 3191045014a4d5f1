"""horovod.keras.callbacks = horovod.tensorflow.keras.callbacks."""

from horovod.tensorflow.keras.callbacks import *  # noqa: F403
from horovod.tensorflow.keras.callbacks import (  # noqa: F401
    BroadcastGlobalVariablesCallback,
    LearningRateScheduleCallback,
    LearningRateWarmupCallback,
    MetricAverageCallback,
)

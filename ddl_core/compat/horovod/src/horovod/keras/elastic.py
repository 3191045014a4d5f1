"""`horovod.keras`'s hvd.elastic: Keras 3 is tf.keras here (horovod.tensorflow.keras)."""

from horovod.tensorflow.keras.elastic import *  # noqa: F403
from horovod.tensorflow.keras.elastic import __all__  # noqa: F401

"""`horovod.tensorflow.util` on horovod-ddl: the helper scripts and Horovod's own tests
import from it (`_executing_eagerly`)."""

from __future__ import annotations

import tensorflow as tf


def _executing_eagerly() -> bool:
    """Whether TensorFlow runs eagerly here (False inside a tf.function or a TF1 graph)."""
    return bool(tf.executing_eagerly())

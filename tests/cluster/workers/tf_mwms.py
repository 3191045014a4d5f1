"""A native tf.distribute.MultiWorkerMirroredStrategy keras fit, with nothing from DDL:
it runs across ranks only if the launcher gave each a TF_CONFIG. Each worker seeds and
draws its data from its own index, so the workers end with the same weights only when
the strategy really averaged their gradients. Prints one `TFW {json}` line."""

import json
import os
import socket

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

strategy = tf.distribute.MultiWorkerMirroredStrategy()
index = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {}).get("index", 0)
replicas = strategy.num_replicas_in_sync
tf.random.set_seed(1000 + index)
rng = np.random.default_rng(index)
x = rng.normal(size=(64, 4)).astype("float32")
y = x @ np.array([[1.0], [2.0], [3.0], [4.0]], "float32")
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(16 * replicas).with_options(options)
model.fit(ds, epochs=2, verbose=0)
weights = np.concatenate([v.numpy().ravel() for v in model.weights]).tolist()
print("TFW " + json.dumps({"index": index, "replicas": replicas, "host": socket.gethostname(),
                           "weights": weights}), flush=True)

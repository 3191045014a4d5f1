"""A Horovod Keras training script, unchanged from what runs on upstream Horovod.

    horovodrun -np 4 python horovod_keras.py      (or: ddlrun -n 4 python horovod_keras.py)
"""

import argparse
import time

import horovod.tensorflow.keras as hvd
import keras
import numpy as np

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--data", help="an .npz with x_train (N,28,28) and y_train (N,)")
ap.add_argument("--batch-size", type=int, default=64)
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--samples", type=int, default=2048)
ap.add_argument("--lr", type=float, default=0.001)
args = ap.parse_args()

hvd.init()

if args.data:
    with np.load(args.data) as f:
        x, y = f["x_train"], f["y_train"]
else:
    rng = np.random.default_rng(hvd.rank())  # a different synthetic shard per worker
    x = rng.integers(0, 255, (args.samples // hvd.size(), 28, 28)).astype(np.uint8)
    y = rng.integers(0, 10, args.samples // hvd.size())
x = (x / 255.0).astype(np.float32)[..., None]

model = keras.Sequential([
    keras.Input((28, 28, 1)),
    keras.layers.Conv2D(32, 3, activation="relu"),
    keras.layers.MaxPooling2D(),
    keras.layers.Flatten(),
    keras.layers.Dense(64, activation="relu"),
    keras.layers.Dense(10, activation="softmax"),
])
opt = keras.optimizers.Adam(args.lr * hvd.size())
opt = hvd.DistributedOptimizer(opt)
model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, metrics=["accuracy"])

callbacks = [
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),
    hvd.callbacks.MetricAverageCallback(),
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=args.lr * hvd.size(), warmup_epochs=1,
                                             verbose=1),
]
t0 = time.perf_counter()
model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, callbacks=callbacks,
          verbose=1 if hvd.rank() == 0 else 0)
rate = hvd.allreduce(np.array([len(x) * args.epochs / (time.perf_counter() - t0)]), op=hvd.Sum)
if hvd.rank() == 0:
    print("-" * 64)
    print(f"total images/sec: {rate[0]:.2f}")
    print("-" * 64)

"""The seeds' tf.keras MNIST CNN distributed with DDL in four steps.

    ddlrun -H host1,host2 python keras_mnist_ddl.py              # synthetic MNIST-shaped data
    ddlrun -n 4 python keras_mnist_ddl.py --data mnist.npz       # x_train, y_train, x_test, y_test

The single-GPU script (keras' examples/mnist_cnn.py) plus the four marked steps.
"""

import argparse
import time

import ddl  # Step 1: import the ddl library (starts DDL; model.fit averages gradients)
import keras
import numpy as np

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--data", help="an .npz with x_train, y_train, x_test, y_test (MNIST layout)")
ap.add_argument("--batch-size", type=int, default=128)
ap.add_argument("--epochs", type=int, default=2)
ap.add_argument("--samples", type=int, default=6000, help="synthetic training samples")
ap.add_argument("--lr", type=float, default=1.0, help="single-learner Adadelta learning rate")
args = ap.parse_args()

num_classes, img_rows, img_cols = 10, 28, 28
if args.data:
    with np.load(args.data) as f:
        x_train, y_train, x_test, y_test = f["x_train"], f["y_train"], f["x_test"], f["y_test"]
else:  # synthetic: nothing is downloaded
    rng = np.random.default_rng(0)
    x_train = rng.integers(0, 255, (args.samples, img_rows, img_cols), dtype=np.uint8)
    y_train = rng.integers(0, num_classes, args.samples)
    x_test = rng.integers(0, 255, (args.samples // 6, img_rows, img_cols), dtype=np.uint8)
    y_test = rng.integers(0, num_classes, args.samples // 6)

# Step 2: split the training data: every learner trains on its own section
x_train = ddl.shard(x_train)
y_train = ddl.shard(y_train)

x_train = x_train.reshape(-1, img_rows, img_cols, 1).astype("float32") / 255
x_test = x_test.reshape(-1, img_rows, img_cols, 1).astype("float32") / 255
y_train = keras.utils.to_categorical(y_train, num_classes)
y_test = keras.utils.to_categorical(y_test, num_classes)

model = keras.Sequential([
    keras.Input((img_rows, img_cols, 1)),
    keras.layers.Conv2D(32, (3, 3), activation="relu"),
    keras.layers.Conv2D(64, (3, 3), activation="relu"),
    keras.layers.MaxPooling2D((2, 2)),
    keras.layers.Dropout(0.25),
    keras.layers.Flatten(),
    keras.layers.Dense(128, activation="relu"),
    keras.layers.Dropout(0.5),
    keras.layers.Dense(num_classes, activation="softmax"),
])

# Step 3: modify hyperparameters: scale the learning rate by the number of learners
model.compile(loss="categorical_crossentropy",
              optimizer=keras.optimizers.Adadelta(learning_rate=args.lr * ddl.size()),
              metrics=["accuracy"])


class Throughput(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.t0 = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.rate = len(x_train) * ddl.size() / (time.perf_counter() - self.t0)


speed = Throughput()
# Step 4: add callbacks: DDLCallback first, DDLGlobalVariablesCallback last
model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
          verbose=1 if ddl.rank() == 0 else 0, validation_data=(x_test, y_test),
          callbacks=[ddl.DDLCallback(), speed, ddl.DDLGlobalVariablesCallback()])
score = model.evaluate(x_test, y_test, verbose=0)
if ddl.rank() == 0:
    print("Test loss:", score[0])
    print("Test accuracy:", score[1])
    print("-" * 64)
    print(f"total images/sec: {speed.rate:.2f}")
    print("-" * 64)

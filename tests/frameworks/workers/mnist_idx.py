"""MNIST-shaped data made here, in MNIST's own files, so torchvision's `datasets.MNIST(dir,
download=True)` finds them and downloads nothing (this machine reaches no dataset host).

    python mnist_idx.py DIR [--train 2000] [--test 500]

Writes DIR/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte (the idx format:
big-endian magic 0x0803 / 0x0801, the counts, then bytes). Each image is its digit's
fixed 28x28 pattern plus noise, so a model can learn it and the loss falls as on MNIST.
"""

from __future__ import annotations

import argparse
import struct
from pathlib import Path

import numpy as np


def write(raw: Path, prefix: str, n: int, patterns: np.ndarray, rng: np.random.Generator
          ) -> None:
    labels = rng.integers(0, 10, n).astype(np.uint8)
    noise = rng.integers(0, 96, (n, 28, 28))
    images = np.clip(patterns[labels].astype(np.int64) + noise, 0, 255).astype(np.uint8)
    (raw / f"{prefix}-images-idx3-ubyte").write_bytes(
        struct.pack(">IIII", 0x0803, n, 28, 28) + images.tobytes())
    (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(
        struct.pack(">II", 0x0801, n) + labels.tobytes())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dir", type=Path)
    ap.add_argument("--train", type=int, default=2000)
    ap.add_argument("--test", type=int, default=500)
    a = ap.parse_args()
    raw = a.dir / "MNIST" / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    patterns = (rng.random((10, 28, 28)) > 0.7) * 160
    write(raw, "train", a.train, patterns, rng)
    write(raw, "t10k", a.test, patterns, rng)


if __name__ == "__main__":
    main()

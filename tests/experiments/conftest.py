"""Fixtures shared by the experiment tests."""
from pathlib import Path

import numpy as np


def write_tiny_mnist(folder: Path, n_train: int, n_val: int, n_test: int) -> Path:
    """Noisy 28x28 'digits' (a bar whose position is the label) saved as ``folder/mnist.npz``, the
    layout the MNIST loader reads from ``--data-dir``; returns the file."""
    rng = np.random.default_rng(0)

    def split(n):
        labels = rng.integers(0, 10, n)
        images = rng.integers(0, 40, (n, 28, 28)).astype(np.uint8)
        for i, d in enumerate(labels):
            images[i, 2 + 2 * d:4 + 2 * d, 4:24] = 255
        return images, labels

    (xtr, ytr), (xva, yva), (xte, yte) = split(n_train), split(n_val), split(n_test)
    path = Path(folder) / "mnist.npz"
    np.savez(path, x_train=xtr, y_train=ytr, x_val=xva, y_val=yva, x_test=xte, y_test=yte)
    return path

"""Small float networks for 28x28-class images: the reference SGD's models (`insitu train --algo
sgd --model mlp|cnn`), also the float baselines of the LRT transfer experiment."""

from __future__ import annotations

import numpy as np

from .layers import Conv2d, Dense, Flatten, MaxPool2d, ReLU
from .model import Sequential


def mlp(sample_shape, classes, seed):
    n_in = int(np.prod(sample_shape))
    return Sequential(Flatten(), Dense(n_in, 128, seed=seed, dtype=np.float32), ReLU(),
                      Dense(128, classes, seed=seed + 1, dtype=np.float32))


def cnn(sample_shape, classes, seed, hidden: int | None = None):
    """Two conv + pool stages and a classifier (with a hidden dense layer when ``hidden``)."""
    h, w = sample_shape
    flat = 16 * (h // 4) * (w // 4)
    head = ([Dense(flat, hidden, seed=seed + 2, dtype=np.float32), ReLU(),
             Dense(hidden, classes, seed=seed + 3, dtype=np.float32)] if hidden
            else [Dense(flat, classes, seed=seed + 2, dtype=np.float32)])
    return Sequential(
        Conv2d(1, 8, 3, padding=1, seed=seed, dtype=np.float32), ReLU(), MaxPool2d(2),
        Conv2d(8, 16, 3, padding=1, seed=seed + 1, dtype=np.float32), ReLU(), MaxPool2d(2),
        Flatten(), *head)


#: The networks by name (the first is the default).
NETWORKS = {"mlp": mlp, "cnn": cnn}

"""Small float networks (the reference SGD's models, `insitu train --algo sgd --model mlp|cnn`, also
the float baselines of the LRT transfer experiment), and what a network needs of a dataset.

What a network takes of any :class:`~insitu.data.Dataset` (``--dataset`` of any kind):

* a *dense* network (``mlp``) flattens any sample: grey or RGB images, or feature vectors;
* a *grey CNN* (``cnn``; LRT's paper CNN) takes images only (:meth:`Dataset.require_images`), brings
  RGB to grey by the data layer's rule (``fit_images(channels=1)``), and takes them at their own
  size when its pools leave at least one pixel (:func:`image_input`): smaller images are refused,
  naming the size and the limit, not enlarged;
"""

from __future__ import annotations

import numpy as np

from insitu.errors import UsageError

from .layers import Conv2d, Dense, Flatten, MaxPool2d, ReLU
from .model import Sequential

__all__ = ["mlp", "cnn", "NETWORKS", "CNN_MIN_SIZE", "image_input"]

#: The smallest image side :func:`cnn` takes: its two 2x2 max pools leave 1 pixel of 4.
CNN_MIN_SIZE = 4


def mlp(sample_shape, classes, seed, hidden: int = 128):
    n_in = int(np.prod(sample_shape))
    return Sequential(Flatten(), Dense(n_in, hidden, seed=seed, dtype=np.float32), ReLU(),
                      Dense(hidden, classes, seed=seed + 1, dtype=np.float32))


def cnn(sample_shape, classes, seed, hidden: int | None = None):
    """Two conv + pool stages and a classifier (with a hidden dense layer when ``hidden``); grey
    images ``(H, W)`` of sides >= :data:`CNN_MIN_SIZE` (odd sides: the pools drop the last row)."""
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


def image_input(ds, who: str, min_size: int, channels: int | None = 1, why: str = ""):
    """``ds`` as a CNN of ``channels`` input channels (1: grey; None: the dataset's) takes it, at
    the dataset's own size; ``who`` names the network in the errors (``--model cnn``).

    UsageError (exit 2, before any work) for feature vectors, and for images with a side under
    ``min_size`` (``why``: what sets the limit, e.g. "three 2x2 pools")."""
    ds.require_images(who)
    h, w = ds.image_size
    if min(h, w) < min_size:
        raise UsageError(f"{who} takes images of at least {min_size}x{min_size}"
                         f"{f' ({why})' if why else ''}, and --dataset {ds.name} has {h}x{w}: "
                         f"resample the images to {min_size}x{min_size} or more, or use a model that "
                         "takes any size (e.g. --model mlp)")
    return ds.fit_images(channels=channels)

"""The datasets of the MCU experiment, as uint8 images at a model's input size.

===================  =========================================================================
task                 what it is
===================  =========================================================================
``fashion-mnist``    the pretraining task (:func:`pretrain_task`): FashionMNIST train/test
                     (60k/10k), resampled to the input size.
``digits``           adaptation: scikit-learn's 8x8 digits (its 80/20 split from
                     ``load_dataset('digits')``, 1438/359), upsampled to the input size —
                     new classes, new image statistics (thick low-resolution strokes).
``fashion-shift``    adaptation: the FashionMNIST *test* images (never seen in pretraining)
                     rotated by 90 degrees counter-clockwise (``np.rot90``), same 10 classes,
                     split 8000/2000 by a fixed seeded permutation. A rotation keeps the
                     low-level statistics (edges, background, contrast) that the early layers
                     learned, so a sparse update of the last layers can adapt, while the
                     pretrained classifier is largely wrong on it (the shapes' orientation
                     carries the class: trousers, dresses, sleeves).
===================  =========================================================================

Resampling (:func:`resize`) is the data's one rule (:mod:`insitu.data.images`): separable and
linear, area averaging when shrinking, bilinear interpolation on pixel centres when enlarging,
then rounding to uint8. Equal sizes pass through untouched.

:func:`load_task` returns ``(x_train, y_train, x_test, y_test, num_classes)`` with uint8 images
``(N, size, size)`` and int64 labels; feed them to the int8 graph through
:func:`insitu.sparse.graph.input_codes`, to the float model through :func:`float_inputs`.
"""

from __future__ import annotations

import functools

import numpy as np

from insitu.data import load_dataset
from insitu.data.images import resize_images
from insitu.errors import UsageError
from insitu.sparse.graph import channels_first

__all__ = ["TASKS", "ADAPTATION_TASKS", "PRETRAIN_TASK", "check_task", "load_task", "pretrain_task", "resize",
           "float_inputs", "task_key", "FASHION_SHIFT_TRAIN", "FASHION_SHIFT_SEED"]

PRETRAIN_TASK = "fashion-mnist"
ADAPTATION_TASKS = ("digits", "fashion-shift")
TASKS = (PRETRAIN_TASK, *ADAPTATION_TASKS)
#: fashion-shift: how many of the 10000 rotated test images form its train split, and the seed.
FASHION_SHIFT_TRAIN = 8000
FASHION_SHIFT_SEED = 0


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """uint8 ``(N, H, W)`` -> uint8 ``(N, size, size)`` by the data's one resampling rule
    (:func:`insitu.data.images.resize_images`)."""
    images = np.asarray(images)
    if images.dtype != np.uint8 or images.ndim != 3:
        raise ValueError(f"resize expects uint8 (N, H, W) images, got {images.dtype}{images.shape}")
    return resize_images(images, (size, size))


def float_inputs(images: np.ndarray, dtype: type = np.float32) -> np.ndarray:
    """uint8 ``(N, H, W)`` -> the float model's input ``(N, 1, H, W)`` (channel-last ``(N, H, W, C)``
    -> ``(N, C, H, W)``): ``(pixel - 128) / 128``, the real value of the int8 graph's input codes."""
    return (channels_first(images).astype(dtype) - 128) / 128


def pretrain_task(input_size: int, channels: int = 1, samples: int | None = None, test_samples: int | None = None):
    """FashionMNIST resampled to ``input_size``: ``(x_train, y_train, x_test, y_test, 10)``; with
    ``samples`` / ``test_samples``, only the first that many images of each split (resampled
    alone: 60,000 RGB images at 128x128 would take 2.9 GB), ``channels=3`` as RGB."""
    if samples is None and test_samples is None:
        return load_task(PRETRAIN_TASK, input_size, channels)
    from insitu.data.images import to_channels

    ds = load_dataset("fashion-mnist")
    n, m = len(ds.y_train) if samples is None else samples, len(ds.y_test) if test_samples is None else test_samples
    x_train, x_test = resize(ds.x_train[:n], input_size), resize(ds.x_test[:m], input_size)
    if channels == 3:
        x_train, x_test = to_channels(x_train, 3), to_channels(x_test, 3)
    return x_train, ds.y_train[:n].copy(), x_test, ds.y_test[:m].copy(), ds.num_classes


def check_task(name: str, option: str = "--dataset") -> None:
    """The cheap check of a task name (before any slow work): one of :data:`TASKS`, or the user's
    image files (``folder:DIR``, ``npz:FILE``) that exist. Raises UsageError."""
    from insitu.data import check_dataset
    from insitu.data.files import is_file_spec, parse_spec

    if name in TASKS:
        return
    if not is_file_spec(name, TASKS):
        raise UsageError(f"{option}: unknown task {name!r}; known tasks: {', '.join(TASKS)}, or your "
                         "images: folder:DIR, npz:FILE")
    if parse_spec(name).kind == "csv":
        raise UsageError(f"{option} {name}: the MCU models take images, and a CSV table holds "
                         "feature vectors; give a folder:DIR or an npz:FILE of images")
    check_dataset(name)


def task_key(name: str) -> str:
    """How caches name a task's data: a built-in task's name, the user's files by
    :attr:`insitu.data.Dataset.key` (their spec and a hash of the arrays)."""
    from insitu.data.files import is_file_spec

    return load_dataset(name).key if is_file_spec(name, TASKS) else name


def load_task(name: str, input_size: int, channels: int = 1):
    """``(x_train, y_train, x_test, y_test, num_classes)`` of a task at ``input_size`` (uint8
    ``(N, input_size, input_size)`` images, or ``(N, size, size, 3)`` for ``channels=3``; int64
    labels). A task is one of :data:`TASKS` or the user's files (``folder:DIR``, ``npz:FILE``),
    brought to the input by the data's one rule (:meth:`insitu.data.Dataset.fit_images`).
    Unknown names raise UsageError."""
    from insitu.data.files import is_file_spec

    check_task(name, "task")
    if not isinstance(input_size, (int, np.integer)) or input_size < 4:
        raise UsageError(f"input size must be an integer >= 4, got {input_size!r}")
    if channels not in (1, 3):
        raise UsageError(f"the model's input has {channels} channels; images have 1 (grey) or 3 (RGB)")
    if is_file_spec(name, TASKS):
        ds = load_dataset(name)
        ds.require_images(f"the MCU models (input {channels}x{input_size}x{input_size})")
        ds = ds.fit_images((int(input_size), int(input_size)), channels)
        return ds.x_train, ds.y_train, ds.x_test, ds.y_test, ds.num_classes
    x_train, y_train, x_test, y_test, classes = _load(name, int(input_size))
    if channels == 3:               # a built-in grey task for an RGB model: the rule's grey -> RGB
        from insitu.data.images import to_channels

        x_train, x_test = to_channels(x_train, 3), to_channels(x_test, 3)
    return x_train, y_train, x_test, y_test, classes


@functools.lru_cache(maxsize=8)
def _load(name: str, size: int):
    if name == "digits":
        ds = load_dataset("digits")
        arrays = (resize(ds.x_train, size), ds.y_train.copy(), resize(ds.x_test, size), ds.y_test.copy())
        num_classes = ds.num_classes
    else:
        ds = load_dataset("fashion-mnist")
        num_classes = ds.num_classes
        if name == PRETRAIN_TASK:
            arrays = (resize(ds.x_train, size), ds.y_train.copy(), resize(ds.x_test, size), ds.y_test.copy())
        else:
            rotated = np.ascontiguousarray(np.rot90(ds.x_test, k=1, axes=(1, 2)))
            order = np.random.RandomState(FASHION_SHIFT_SEED).permutation(len(rotated))
            train, test = np.sort(order[:FASHION_SHIFT_TRAIN]), np.sort(order[FASHION_SHIFT_TRAIN:])
            images = resize(rotated, size)
            arrays = (images[train], ds.y_test[train].copy(), images[test], ds.y_test[test].copy())
    for a in arrays:            # cached and shared between callers: read-only
        a.flags.writeable = False
    return (*arrays, num_classes)

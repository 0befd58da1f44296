"""The one rule that brings images to a model's input: channels first, then size.

Every method that takes images (``--dataset`` of any kind, any model) applies :func:`fit_images`
to the dataset's uint8 images before its own preprocessing:

1. **Channels.** RGB to grey is the ITU-R BT.601 luma ``0.299 R + 0.587 G + 0.114 B``, rounded;
   grey to RGB repeats the grey value in the three channels.
2. **Size.** Each axis is resampled on its own (separable, linear): area averaging when
   shrinking (every source pixel counts in proportion to its overlap, so nothing aliases) and
   bilinear interpolation between pixel centres when enlarging (edges clamped); the result is
   rounded to uint8. The aspect ratio is not kept: a 40x30 image becomes a square input by
   stretching, not by cropping. Equal sizes pass through untouched.

Images are uint8 ``(N, H, W)`` (grey) or ``(N, H, W, 3)`` (RGB, channel last, as Pillow and most
image files store them).
"""

from __future__ import annotations

import numpy as np

__all__ = ["LUMA", "fit_images", "resize_images", "to_channels", "image_channels"]

#: ITU-R BT.601 luma weights of R, G, B (what Pillow's ``convert("L")`` uses too).
LUMA = (0.299, 0.587, 0.114)


def image_channels(images: np.ndarray) -> int:
    """1 for grey ``(N, H, W)``, 3 for RGB ``(N, H, W, 3)``."""
    if images.ndim == 3:
        return 1
    if images.ndim == 4 and images.shape[3] == 3:
        return 3
    raise ValueError(f"images must be uint8 (N, H, W) or (N, H, W, 3), got shape {images.shape}")


def _check(images) -> np.ndarray:
    images = np.asarray(images)
    if images.dtype != np.uint8:
        raise ValueError(f"images must be uint8, got {images.dtype}")
    image_channels(images)
    return images


def _resample_matrix(n_in: int, n_out: int) -> np.ndarray:
    """``(n_out, n_in)`` rows of weights summing to 1: area averaging (shrink) or bilinear on
    pixel centres with edge clamping (enlarge)."""
    m = np.zeros((n_out, n_in))
    if n_out <= n_in:
        r = n_in / n_out
        for i in range(n_out):
            lo, hi = i * r, (i + 1) * r
            for j in range(int(np.floor(lo)), min(n_in, int(np.ceil(hi)))):
                m[i, j] = min(hi, j + 1) - max(lo, j)
        return m / r
    if n_in == 1:                                 # one row or column: nothing to interpolate
        return np.ones((n_out, 1))
    for i in range(n_out):
        c = min(max((i + 0.5) * n_in / n_out - 0.5, 0.0), n_in - 1.0)
        j = min(int(np.floor(c)), n_in - 2)
        f = c - j
        m[i, j] += 1 - f
        m[i, j + 1] += f
    return m


def resize_images(images, size: tuple[int, int]) -> np.ndarray:
    """uint8 ``(N, H, W[, 3])`` -> uint8 ``(N, size[0], size[1][, 3])`` (rule 2 of the module)."""
    images = _check(images)
    h, w = images.shape[1:3]
    out_h, out_w = (int(s) for s in size)
    if (h, w) == (out_h, out_w):
        return images.copy()
    rows = _resample_matrix(h, out_h).astype(np.float32)
    cols = _resample_matrix(w, out_w).astype(np.float32)
    if images.ndim == 3:
        out = np.matmul(np.matmul(rows, images.astype(np.float32)), cols.T)
    else:       # RGB: resample each channel as a grey image
        planes = np.moveaxis(images, 3, 1).astype(np.float32)           # (N, 3, H, W)
        out = np.moveaxis(np.matmul(np.matmul(rows, planes), cols.T), 1, 3)
    return np.clip(np.rint(out), 0, 255).astype(np.uint8)


def to_channels(images, channels: int) -> np.ndarray:
    """uint8 images with ``channels`` (1: grey ``(N, H, W)``, 3: RGB ``(N, H, W, 3)``), by rule 1
    of the module; images that already have them are returned as they are (not copied)."""
    images = _check(images)
    have = image_channels(images)
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 (grey) or 3 (RGB), got {channels!r}")
    if have == channels:
        return images
    if channels == 3:
        return np.repeat(images[..., None], 3, axis=3)
    luma = images.astype(np.float32) @ np.asarray(LUMA, np.float32)
    return np.clip(np.rint(luma), 0, 255).astype(np.uint8)


def fit_images(images, size: tuple[int, int] | None = None, channels: int | None = None) -> np.ndarray:
    """``images`` brought to a model's input: ``channels`` (1 or 3; None keeps them), then
    ``size`` ``(H, W)`` (None keeps it). Returns a new array unless nothing changes."""
    images = _check(images)
    if channels is not None:
        images = to_channels(images, channels)
    if size is not None and tuple(images.shape[1:3]) != tuple(size):
        images = resize_images(images, size)
    return images

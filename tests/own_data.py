"""Users' own datasets written by tests from the built-in ``digits``: an image folder (grey PNGs
plus RGB PNGs of another size), an ``.npz`` and a CSV table (``--dataset folder:|npz:|csv:``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from insitu.data import load_dataset


def digits(n: int):
    ds = load_dataset("digits")
    return ds.x_train[:n], ds.y_train[:n], ds.x_test[:max(n // 4, 20)], ds.y_test[:max(n // 4, 20)]


def write_image_folder(root: Path, n: int = 300, rgb_every: int = 3, rgb_size: int = 12,
                       split: bool = False) -> Path:
    """``root/<class>/<i>.png`` from the first ``n`` digits (8x8 grey); every ``rgb_every``-th
    image is written as RGB at ``rgb_size`` x ``rgb_size`` instead (a tint on the red channel, so
    it is really colour). ``split``: ``root/train/...`` and ``root/test/...``."""
    from PIL import Image

    x_train, y_train, x_test, y_test = digits(n)
    parts = [("train", x_train, y_train), ("test", x_test, y_test)] if split else [("", x_train, y_train)]
    for part, images, labels in parts:
        for i, (image, label) in enumerate(zip(images, labels)):
            folder = root / part / f"digit-{label}"
            folder.mkdir(parents=True, exist_ok=True)
            picture = Image.fromarray(image)
            if rgb_every and i % rgb_every == 0:
                rgb = np.repeat(np.asarray(picture.resize((rgb_size, rgb_size)))[..., None], 3, axis=2)
                rgb[..., 0] = np.maximum(rgb[..., 0], 40)
                picture = Image.fromarray(rgb)
            picture.save(folder / f"{i}.png")
    return root


def write_npz(path: Path, n: int = 300, split: bool = True) -> Path:
    x_train, y_train, x_test, y_test = digits(n)
    if split:
        np.savez(path, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
    else:
        np.savez(path, x=np.concatenate([x_train, x_test]), y=np.concatenate([y_train, y_test]))
    return path


def write_csv(path: Path, n: int = 300, features: int = 16, names: bool = False) -> Path:
    """A table of ``features`` pixel columns (the centre rows of the digits) and a label column
    (class names ``digit-K`` when ``names``)."""
    x_train, y_train, _, _ = digits(n)
    x = x_train.reshape(len(x_train), -1)[:, 24:24 + features]
    lines = [",".join([*(f"p{j}" for j in range(features)), "label"])]
    for row, label in zip(x, y_train):
        lines.append(",".join([*map(str, row.tolist()), f"digit-{label}" if names else str(label)]))
    path.write_text("\n".join(lines) + "\n")
    return path

"""The user's own data as a :class:`~insitu.data.datasets.Dataset`: image folders, arrays, tables.

``--dataset`` takes, besides the built-in names, one of these (options after commas)::

    folder:DIR[,test=0.2][,seed=0][,size=HxW]
                                        one sub-folder per class of PNG/JPEG/BMP images;
                                        DIR/train/ and DIR/test/ (or val/, validation/) if
                                        the split is given; size= resamples every image
    npz:FILE[,test=0.2][,seed=0]        x_train, y_train, x_test, y_test -- or x, y
    csv:FILE[,label=COLUMN][,test=0.2][,seed=0]
                                        a table with a header row; one row per sample

A bare path works too when its kind is plain (a directory, ``*.npz``, ``*.csv``).

What each becomes:

- **Images** are uint8 ``(N, H, W)`` (grey) or ``(N, H, W, 3)`` (RGB). A folder is RGB if any of
  its images is in colour (its three channels differ somewhere), else grey; images of another size than the folder's most common one
  are resampled to it (:mod:`insitu.data.images`), and ``data info`` says how many; ``size=HxW``
  resamples every image to that size instead (photos of many sizes; a folder whose decoded
  images would take more than :data:`MAX_FOLDER_BYTES` is refused with that hint). Hidden files
  and folders (names starting with ``.``) are skipped. Arrays may be
  uint8, or floats in [0, 1] (scaled by 255 and rounded), channel-last ``(N, H, W, C)`` or
  channel-first ``(N, C, H, W)`` with C = 1 or 3.
- **Features** (a table, or 2-D arrays ``(N, F)``) are float32, each column scaled to [0, 1] by the
  train split's minimum and maximum (test values outside are clipped; a constant column is 0),
  the inputs' range that the fixed-point methods assume for images too.
- **Labels** are integers 0..K-1, every class present in the train split. A table's labels may
  be names instead (any non-integer text): they are sorted and numbered 0..K-1. A folder's classes
  are its sub-folders, in sorted order.
- **Split.** Without a given split, a seeded stratified split holds ``test`` (default 0.2) of
  each class out, with the same rule as the built-in ``digits`` (the same everywhere).

A decoded image folder is cached (:func:`insitu.resources.cache_dir` ``datasets/``), keyed by
every file's path, size and modification time, so a second run reads one ``.npz``; the first run
says where it writes it. Every error names the file and what is wrong, and is a
:class:`DataFileError` (exit 2): it happens before any training.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
import os
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from insitu.errors import DataFileError, UsageError
from insitu.resources import cache_dir

__all__ = ["FileSpec", "parse_spec", "is_file_spec", "load_file_dataset", "write_folder", "write_npz", "IMAGE_SUFFIXES",
           "DEFAULT_TEST_FRACTION", "DEFAULT_SPLIT_SEED", "LABEL_COLUMNS"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
DEFAULT_TEST_FRACTION = 0.2
DEFAULT_SPLIT_SEED = 0
#: Column names a table's labels are looked for under (case-insensitive), before the last column.
LABEL_COLUMNS = ("label", "class", "target")
#: The folders a split image folder may call its test split.
TEST_FOLDERS = ("test", "val", "validation")
#: A folder whose decoded images take more than this is refused (pass size=HxW).
MAX_FOLDER_BYTES = 4 << 30
KINDS = ("folder", "npz", "csv")


@dataclass(frozen=True)
class FileSpec:
    """A parsed ``--dataset`` of the user's files."""

    kind: str                      # folder | npz | csv
    path: Path
    test: float = DEFAULT_TEST_FRACTION
    seed: int = DEFAULT_SPLIT_SEED
    label: str | None = None       # csv: the label column
    size: tuple[int, int] | None = None     # folder: every image resampled to (H, W)

    @property
    def text(self) -> str:
        return f"{self.kind}:{self.path}"


def is_file_spec(name: str, builtins: tuple[str, ...] = ()) -> bool:
    """Whether ``--dataset name`` names the user's files rather than a built-in dataset (or one of
    ``builtins``, e.g. the MCU's tasks): a built-in name wins over a folder of the same name."""
    from insitu.data.datasets import dataset_names

    if name in dataset_names() or name in builtins:
        return False
    kind = name.split(":", 1)[0]
    return (kind in KINDS and ":" in name) or os.sep in name or Path(name).suffix.lower() in (".npz", ".csv") \
        or Path(name).is_dir()


def parse_spec(name: str) -> FileSpec:
    """``folder:DIR,test=0.3`` and the like (see the module docstring) as a :class:`FileSpec`."""
    kind, sep, rest = name.partition(":")
    if not sep or kind not in KINDS:
        kind, rest = "", name
    path_text, *options = rest.split(",")
    if not path_text:
        raise UsageError(f"--dataset {name!r}: no path; give e.g. folder:DIR, npz:FILE or csv:FILE")
    path = Path(path_text).expanduser()
    if not kind:
        kind = ("folder" if path.is_dir() else "npz" if path.suffix.lower() == ".npz"
                else "csv" if path.suffix.lower() == ".csv" else "")
        if not kind:
            raise UsageError(f"--dataset {name!r}: not a built-in dataset, a directory, a .npz or "
                             "a .csv; say which with folder:, npz: or csv:")
    fields: dict = {}
    for option in options:
        key, eq, value = option.partition("=")
        allowed = {"csv": ("test", "seed", "label"), "folder": ("test", "seed", "size")}.get(kind, ("test", "seed"))
        if not eq or key not in allowed:
            raise UsageError(f"--dataset {name!r}: unknown option {option!r}; {kind}: takes "
                             + ", ".join(f"{k}=..." for k in allowed))
        fields[key] = value
    try:
        test = float(fields.get("test", DEFAULT_TEST_FRACTION))
        seed = int(fields.get("seed", DEFAULT_SPLIT_SEED))
    except ValueError:
        raise UsageError(f"--dataset {name!r}: test= takes a fraction and seed= an integer") from None
    if not 0 < test < 1:
        raise UsageError(f"--dataset {name!r}: test={test} must be a fraction between 0 and 1")
    size = None
    if "size" in fields:
        try:
            h, w = (int(v) for v in fields["size"].lower().split("x"))
        except ValueError:
            raise UsageError(f"--dataset {name!r}: size= takes HxW, e.g. size=64x64") from None
        if min(h, w) < 1:
            raise UsageError(f"--dataset {name!r}: size={h}x{w} must be at least 1x1")
        size = (h, w)
    return FileSpec(kind, path, test, seed, fields.get("label"), size)


def load_file_dataset(spec: FileSpec):
    """Load and check the user's files; the :class:`Dataset` they become."""
    loaders = {"folder": _load_folder, "npz": _load_npz, "csv": _load_csv}
    if spec.kind == "folder" and not spec.path.is_dir():
        raise DataFileError(f"{spec.path}: no such directory (--dataset folder:DIR takes a folder "
                            "with one sub-folder of images per class)")
    if spec.kind != "folder" and not spec.path.is_file():
        raise DataFileError(f"{spec.path}: no such file (--dataset {spec.kind}:FILE)")
    return loaders[spec.kind](spec)


# ------------------------------------------------------------------------------------- checks

def check_labels(labels, where: str, num_classes: int | None = None) -> np.ndarray:
    """int64 labels; integers 0..K-1, else a :class:`DataFileError` that names ``where``."""
    labels = np.asarray(labels)
    if labels.ndim != 1:
        raise DataFileError(f"{where}: labels must be one integer per sample (shape (N,)), got "
                            f"shape {labels.shape}")
    if labels.dtype.kind == "f":
        if not np.all(np.isfinite(labels)) or np.any(labels != np.round(labels)):
            bad = labels[~(np.isfinite(labels) & (labels == np.round(labels)))][0]
            raise DataFileError(f"{where}: labels must be integers 0..K-1, found {bad!r}")
    elif labels.dtype.kind not in "iub":
        raise DataFileError(f"{where}: labels must be integers 0..K-1, got {labels.dtype} values")
    labels = labels.astype(np.int64)
    if len(labels) and labels.min() < 0:
        raise DataFileError(f"{where}: labels must be integers 0..K-1, found {labels.min()}")
    if num_classes is not None and len(labels) and labels.max() >= num_classes:
        raise DataFileError(f"{where}: label {labels.max()} is not one of the {num_classes} "
                            f"classes 0..{num_classes - 1} of the train split")
    return labels


def _class_count(y_train: np.ndarray, where: str) -> int:
    """K, the class count, from the train labels: every class 0..K-1 must have a sample."""
    if len(y_train) == 0:
        raise DataFileError(f"{where}: the train split is empty")
    k = int(y_train.max()) + 1
    missing = sorted(set(range(k)) - set(np.unique(y_train).tolist()))
    if missing:
        raise DataFileError(f"{where}: labels must be 0..K-1 with every class in the train split; "
                            f"class(es) {', '.join(map(str, missing[:10]))} of 0..{k - 1} have no "
                            "train sample")
    if k < 2:
        raise DataFileError(f"{where}: one class only (label 0); training needs at least two")
    return k


def stratified_split(labels: np.ndarray, test_fraction: float, seed: int):
    """Indices ``(train, test)`` holding ``test_fraction`` of each class out, in original order.

    Uses the legacy ``RandomState``, whose stream NumPy keeps stable across versions (unlike
    ``default_rng`` or scikit-learn's splitters), so the split is the same everywhere.
    """
    rng = np.random.RandomState(seed)
    test = []
    for cls in np.unique(labels):
        members = np.flatnonzero(labels == cls)
        n_test = int(round(len(members) * test_fraction))
        test.append(rng.permutation(members)[:n_test])
    test = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
    train = np.setdiff1d(np.arange(len(labels)), test)
    return train, test


def _split_note(spec: FileSpec) -> str:
    return (f"stratified {1 - spec.test:.0%}/{spec.test:.0%} split, seed {spec.seed}")


def _scaled_features(x_train: np.ndarray, x_test: np.ndarray):
    """Each column scaled to [0, 1] by the train split's range (see the module docstring)."""
    lo, hi = x_train.min(axis=0), x_train.max(axis=0)
    span = np.where(hi > lo, hi - lo, 1.0)
    scale = lambda x: np.clip((x - lo) / span, 0.0, 1.0).astype(np.float32)  # noqa: E731
    return scale(x_train), scale(x_test)


def _dataset(spec: FileSpec, x_train, y_train, x_test, y_test, class_names=None, note: str = "",
             details: dict | None = None):
    from insitu.data.datasets import Dataset, frozen

    where = str(spec.path)
    num_classes = _class_count(y_train, where)
    if len(y_test) == 0:
        raise DataFileError(f"{where}: the test split is empty; give test samples (or a larger test= "
                            "fraction), every method reports its accuracy on them")
    check_labels(y_test, f"{where} (test split)", num_classes)
    if class_names is None or len(class_names) != num_classes:
        class_names = [str(k) for k in range(num_classes)]
    if x_train.ndim == 2:
        x_train, x_test = _scaled_features(x_train.astype(np.float64), x_test.astype(np.float64))
        note += "; features scaled to [0, 1] per column by the train split's min and max"
    return frozen(Dataset(spec.text, np.ascontiguousarray(x_train), y_train,
                          np.ascontiguousarray(x_test), y_test, num_classes,
                          source=f"{spec.path.resolve()}{note}", class_names=tuple(class_names),
                          details=dict(details or {})))


# ------------------------------------------------------------------------------------- arrays

def _as_samples(x, where: str) -> np.ndarray:
    """Arrays as images (uint8 ``(N, H, W[, 3])``) or features (float ``(N, F)``)."""
    x = np.asarray(x)
    if x.dtype.kind not in "uif" or x.ndim not in (2, 3, 4):
        raise DataFileError(f"{where}: expected numbers of shape (N, F) features, (N, H, W) or "
                            f"(N, H, W, C) / (N, C, H, W) images, got {x.dtype} of shape {x.shape}")
    if x.dtype.kind == "f" and not np.all(np.isfinite(x)):
        index = np.argwhere(~np.isfinite(x))[0]
        raise DataFileError(f"{where}: NaN or infinite value at index {tuple(index.tolist())}; "
                            "remove or impute it first")
    if x.ndim == 2:
        return x.astype(np.float64)
    if x.ndim == 4:
        if x.shape[3] in (1, 3):
            pass
        elif x.shape[1] in (1, 3):
            x = np.moveaxis(x, 1, 3)
        else:
            raise DataFileError(f"{where}: 4-D images need 1 or 3 channels, first (N, C, H, W) or "
                                f"last (N, H, W, C); got shape {x.shape}")
        x = x[..., 0] if x.shape[3] == 1 else x
    if x.dtype == np.uint8:
        return np.ascontiguousarray(x)
    lo, hi = float(x.min(initial=0)), float(x.max(initial=0))
    if x.dtype.kind == "f" and lo >= 0 and hi <= 1:
        return np.rint(x * 255).astype(np.uint8)
    if lo >= 0 and hi <= 255 and np.all(x == np.round(x)):
        return x.astype(np.uint8)
    raise DataFileError(f"{where}: image values range {lo:g}..{hi:g}; give uint8 pixels 0..255 "
                        "or floats in [0, 1] (or 2-D (N, F) arrays for features)")


def _load_npz(spec: FileSpec):
    where = str(spec.path)
    try:
        with np.load(spec.path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in f.files}
    except Exception as exc:        # zipfile, pickle and format errors alike: not a readable .npz
        raise DataFileError(f"{where}: not a readable .npz file ({exc})") from None
    names = [n.decode() if isinstance(n, bytes) else str(n)
             for n in np.atleast_1d(arrays.pop("class_names", np.zeros(0))).tolist()]
    if {"x_train", "y_train", "x_test", "y_test"} <= set(arrays):
        x_train = _as_samples(arrays["x_train"], f"{where}: x_train")
        x_test = _as_samples(arrays["x_test"], f"{where}: x_test")
        y_train = check_labels(arrays["y_train"], f"{where}: y_train")
        y_test = check_labels(arrays["y_test"], f"{where}: y_test")
        note = "; its own train/test split"
    elif {"x", "y"} <= set(arrays):
        x = _as_samples(arrays["x"], f"{where}: x")
        y = check_labels(arrays["y"], f"{where}: y")
        _same_length(where, x, y, "x", "y")
        train, test = stratified_split(y, spec.test, spec.seed)
        x_train, y_train, x_test, y_test = x[train], y[train], x[test], y[test]
        note = "; " + _split_note(spec)
    else:
        raise DataFileError(f"{where}: holds {', '.join(sorted(arrays)) or 'no arrays'}; a dataset "
                            ".npz holds x_train, y_train, x_test, y_test (or x, y and is split "
                            "here), and optionally class_names")
    _same_length(where, x_train, y_train, "x_train", "y_train")
    _same_length(where, x_test, y_test, "x_test", "y_test")
    if x_train.shape[1:] != x_test.shape[1:]:
        raise DataFileError(f"{where}: x_test's samples have shape {x_test.shape[1:]}, x_train's "
                            f"{x_train.shape[1:]}; they must be the same")
    return _dataset(spec, x_train, y_train, x_test, y_test, names or None, note)


def _same_length(where, x, y, x_name, y_name) -> None:
    if len(x) != len(y):
        raise DataFileError(f"{where}: {x_name} holds {len(x)} samples but {y_name} {len(y)} labels")


# ------------------------------------------------------------------------------------- tables

def _load_csv(spec: FileSpec):
    where = str(spec.path)
    try:
        with open(spec.path, newline="", encoding="utf-8-sig") as f:
            rows = [row for row in csv.reader(f) if any(cell.strip() for cell in row)]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:
        raise DataFileError(f"{where}: not a readable CSV file ({exc})") from None
    if len(rows) < 2:
        raise DataFileError(f"{where}: needs a header row and at least one sample row")
    header = [h.strip() for h in rows[0]]
    if all(_is_number(h) for h in header):
        raise DataFileError(f"{where}: the first row is numbers; a table needs a header row that "
                            "names its columns (one of them the label)")
    label_at = _label_column(spec, header)
    split_at = next((i for i, h in enumerate(header) if h.lower() == "split"), None)
    features = [i for i in range(len(header)) if i not in (label_at, split_at)]
    if not features:
        raise DataFileError(f"{where}: no feature columns besides the label {header[label_at]!r}")
    x = np.empty((len(rows) - 1, len(features)))
    labels, splits = [], []
    for r, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DataFileError(f"{where}, line {r}: {len(row)} fields, the header has {len(header)}")
        for c, i in enumerate(features):
            value = _number(row[i])
            if value is None or not math.isfinite(value):
                raise DataFileError(f"{where}, line {r}, column {header[i]!r}: {row[i]!r} is not a "
                                    "finite number (NaN and empty cells are refused: impute or drop "
                                    "them first)")
            x[r - 2, c] = value
        labels.append(row[label_at].strip())
        splits.append(row[split_at].strip().lower() if split_at is not None else "")
    y, names = _table_labels(labels, f"{where}, column {header[label_at]!r}")
    if split_at is not None:
        bad = sorted(set(splits) - {"train", "test"})
        if bad:
            raise DataFileError(f"{where}, column {header[split_at]!r}: {bad[0]!r}; its values are "
                                "train or test")
        train, test = (np.flatnonzero(np.asarray(splits) == s) for s in ("train", "test"))
        note = f"; its split column {header[split_at]!r}"
    else:
        train, test = stratified_split(y, spec.test, spec.seed)
        note = "; " + _split_note(spec)
    note += f"; label column {header[label_at]!r}, {len(features)} features"
    return _dataset(spec, x[train], y[train], x[test], y[test], names, note,
                    {"feature_columns": [header[i] for i in features]})


def _is_number(text: str) -> bool:
    return _number(text) is not None


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _label_column(spec: FileSpec, header: list[str]) -> int:
    lowered = [h.lower() for h in header]
    if spec.label is not None:
        if spec.label.lower() not in lowered:
            raise DataFileError(f"{spec.path}: no column {spec.label!r} (label=); its columns: "
                                f"{', '.join(header)}")
        return lowered.index(spec.label.lower())
    for name in LABEL_COLUMNS:
        if name in lowered:
            return lowered.index(name)
    # else the last column that is not the split column
    return max(i for i, h in enumerate(lowered) if h != "split") if len(header) > 1 else 0


def _table_labels(labels: list[str], where: str):
    """int64 labels and class names: integers must be 0..K-1; text is numbered in sorted order."""
    if all(_is_number(v) for v in labels):
        values = np.asarray([float(v) for v in labels])
        return check_labels(values, where), None
    if any(not v for v in labels):
        raise DataFileError(f"{where}: a row has no label")
    names = sorted(set(labels))
    index = {name: k for k, name in enumerate(names)}
    return np.asarray([index[v] for v in labels], np.int64), names


# ------------------------------------------------------------------------------------- folders

def _visible(directory: Path) -> list[Path]:
    """The entries of ``directory`` that are not hidden (``.DS_Store``, macOS ``._x.png``)."""
    return sorted(p for p in directory.iterdir() if not p.name.startswith("."))


def _image_files(folder: Path) -> list[Path]:
    """The images of a class folder; one that holds folders instead is refused."""
    entries = _visible(folder)
    nested = [p for p in entries if p.is_dir()]
    if nested:
        raise DataFileError(f"{nested[0]}: a folder inside the class folder {folder.name!r}; an image "
                            "folder is DIR/<class>/<image> (or DIR/train/<class>/<image> and "
                            "DIR/test/<class>/<image>)")
    return [p for p in entries if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES]


def _class_folders(directory: Path) -> list[Path]:
    folders = [p for p in _visible(directory) if p.is_dir()]
    if not folders:
        raise DataFileError(f"{directory}: no class folders; an image folder holds one sub-folder of "
                            "images per class (DIR/cat/1.png, DIR/dog/2.png), or train/ and test/ "
                            "folders that do")
    for folder in folders:
        if not _image_files(folder):
            raise DataFileError(f"{folder}: class folder holds no images ({', '.join(IMAGE_SUFFIXES)})")
    return folders


def _split_folders(root: Path) -> tuple[Path, Path] | None:
    """``(train, test)`` folders of a split image folder, None for an unsplit one."""
    tests = [root / name for name in TEST_FOLDERS if (root / name).is_dir()]
    if not (root / "train").is_dir():
        if tests:
            raise DataFileError(f"{tests[0]}: a {tests[0].name}/ folder without train/ beside it; give "
                                "both, or one sub-folder per class")
        return None
    if len(tests) != 1:
        raise DataFileError(f"{root / 'train'}: a split image folder has train/ and one test folder "
                            f"({', '.join(t + '/' for t in TEST_FOLDERS)}), found "
                            f"{len(tests) or 'no'} test folders; or pass --dataset folder:{root / 'train'} "
                            "to split train/ here")
    return root / "train", tests[0]


def _load_folder(spec: FileSpec):
    root = spec.path
    split = _split_folders(root)
    if split:
        train_dir, test_dir = split
        classes = [f.name for f in _class_folders(train_dir)]
        test_classes = [f.name for f in _class_folders(test_dir)]
        unknown = sorted(set(test_classes) - set(classes))
        if unknown:
            raise DataFileError(f"{test_dir / unknown[0]}: class folder {unknown[0]!r} is not in {train_dir}")
        parts = {part: [(f, classes.index(c)) for c in names for f in _image_files(directory / c)]
                 for part, directory, names in (("train", train_dir, classes), ("test", test_dir, test_classes))}
        files, n_train = parts["train"] + parts["test"], len(parts["train"])
    else:
        classes = [f.name for f in _class_folders(root)]
        files = [(f, k) for k, c in enumerate(classes) for f in _image_files(root / c)]
        n_train = 0                 # split below
    if len(classes) < 2:            # before decoding anything
        raise DataFileError(f"{root}: one class folder ({classes[0]!r}); training needs at least two")
    images, details = _decoded(root, [f for f, _ in files], spec.size)
    labels = np.asarray([k for _, k in files], np.int64)
    if split:
        train, test = np.arange(n_train), np.arange(n_train, len(files))
        note = f"; its {split[0].name}/ and {split[1].name}/ folders"
    else:
        train, test = stratified_split(labels, spec.test, spec.seed)
        note = "; " + _split_note(spec)
    note += f"; {details['mode']} images {details['size'][0]}x{details['size'][1]}"
    if details["resized"]:
        note += f" ({details['resized']} of other sizes resampled to it)"
    return _dataset(spec, images[train], labels[train], images[test], labels[test], classes, note,
                    details)


def _decoded(root: Path, files: list[Path], size: tuple[int, int] | None):
    """uint8 images of ``files`` (one size and mode, see the module docstring), cached."""
    from insitu.io import atomic_write

    key = hashlib.sha256(f"size {size}\n".encode())
    for f in files:
        st = f.stat()
        key.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    cached = cache_dir("datasets") / f"folder-{key.hexdigest()[:24]}.npz"
    if cached.is_file():
        try:
            with np.load(cached, allow_pickle=False) as f:
                return f["images"], json.loads(str(f["details"]))
        except Exception:           # a damaged cache file is decoded again and replaced
            pass
    images, details = _decode_all(root, files, size)
    buffer = io.BytesIO()
    np.savez(buffer, images=images, details=np.asarray(json.dumps(details)))
    try:
        atomic_write(cached, buffer.getvalue())
        print(f"decoded {len(files)} images of {root}; cached in {cached} ({cached.stat().st_size:,} "
              "bytes; delete it to free the space)", file=sys.stderr)
    except OSError as exc:
        print(f"decoded {len(files)} images of {root}; not cached ({exc})", file=sys.stderr)
    return images, details


def _decode_all(root: Path, files: list[Path], size: tuple[int, int] | None):
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise UsageError("image folders need Pillow: pip install pillow (it is in insitu[host]); "
                         "or pass the images as a .npz") from None
    from insitu.data.images import resize_images

    decoded = []
    for path in files:
        try:
            with Image.open(path) as image:
                image.load()
                decoded.append(_pixels(image))
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise DataFileError(f"{path}: unreadable image ({exc})") from None
    decoded = [_grey_if_equal(a) for a in decoded]
    colour = any(a.ndim == 3 for a in decoded)
    if size is None:
        sizes = Counter((a.shape[0], a.shape[1]) for a in decoded)
        size = max(sizes, key=lambda s: (sizes[s], s[0] * s[1]))      # the most common, then largest
    need = len(decoded) * size[0] * size[1] * (3 if colour else 1)
    if need > MAX_FOLDER_BYTES:
        raise DataFileError(f"{root}: {len(decoded)} images at {size[0]}x{size[1]} would take "
                            f"{need / 2**30:.1f} GiB; resample them as they load with "
                            f"--dataset folder:{root},size=HxW (e.g. size=128x128)")
    out = np.empty((len(decoded), *size, *((3,) if colour else ())), np.uint8)
    resized = 0
    for i, a in enumerate(decoded):
        if colour and a.ndim == 2:
            a = np.repeat(a[..., None], 3, axis=2)
        if a.shape[:2] != size:
            a, resized = resize_images(a[None], size)[0], resized + 1
        out[i] = a
    return out, {"mode": "RGB" if colour else "grey", "size": list(size), "resized": resized,
                 "files": len(files)}


def _pixels(image) -> np.ndarray:
    """uint8 ``(H, W)`` for a grey image, ``(H, W, 3)`` for a colour one (alpha dropped)."""
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):          # 16-bit and float grey
        a = np.asarray(image, dtype=np.float64)
        peak = 65535.0 if a.max(initial=0) > 255 else 255.0
        return np.clip(np.rint(a * (255.0 / peak)), 0, 255).astype(np.uint8)
    if image.mode in ("1", "L", "LA"):
        return np.asarray(image.convert("L"), dtype=np.uint8)
    return np.asarray(image.convert("RGB"), dtype=np.uint8)


def _grey_if_equal(a: np.ndarray) -> np.ndarray:
    """An RGB image whose three channels are equal everywhere is grey (grey JPEGs saved as RGB)."""
    if a.ndim == 3 and np.array_equal(a[..., 0], a[..., 1]) and np.array_equal(a[..., 1], a[..., 2]):
        return np.ascontiguousarray(a[..., 0])
    return a


# ------------------------------------------------------------------------------------- writing

def _head(ds, samples: int | None):
    """``(split, images, labels)`` of ``ds``: all of it, or the first ``samples`` train samples
    and a quarter as many test samples."""
    n_test = None if samples is None else max(1, samples // 4)
    return [("train", ds.x_train[:samples], ds.y_train[:samples]),
            ("test", ds.x_test[:n_test], ds.y_test[:n_test])]


def write_folder(ds, root: Path, samples: int | None = None) -> int:
    """``ds``'s images as ``root/train/<class>/<i>.png`` and ``root/test/...``; the count written."""
    from PIL import Image

    if ds.kind != "images":
        raise UsageError(f"{ds.name} holds feature vectors; write it as a .npz")
    folders = [name.replace("/", "-") for name in ds.class_names]
    if sorted(folders) != folders:      # a folder's classes are numbered in sorted order
        folders = [f"{k:0{len(str(len(folders) - 1))}d}-{name}" for k, name in enumerate(folders)]
    count = 0
    for split, images, labels in _head(ds, samples):
        for i, (image, label) in enumerate(zip(images, labels)):
            (root / split / folders[label]).mkdir(parents=True, exist_ok=True)
            # zero-padded, so that the files sort (and read back) in the dataset's order
            Image.fromarray(image).save(root / split / folders[label] / f"{i:0{len(str(len(labels)))}d}.png")
            count += 1
    return count


def write_npz(ds, path: Path, samples: int | None = None) -> int:
    """``ds`` as the arrays a dataset ``.npz`` holds (atomically); the count written."""
    from insitu.io import atomic_write

    (_, x_train, y_train), (_, x_test, y_test) = _head(ds, samples)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
                        class_names=np.asarray(ds.class_names))
    atomic_write(path, buffer.getvalue())
    return len(y_train) + len(y_test)

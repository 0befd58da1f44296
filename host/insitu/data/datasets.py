"""The datasets insitu trains on, loaded into one small in-memory form (:class:`Dataset`).

=================  =====================================================================  =======
name               where it comes from                                                    samples
=================  =====================================================================  =======
``fashion-mnist``  IDX files; default ``/usr/share/datasets/fashion-mnist`` (Debian         60k/10k
                   package ``dataset-fashion-mnist``), ``data_dir`` overrides
``mnist``          IDX files in ``data_dir`` (not packaged: the caller downloads them)    60k/10k
``digits``         scikit-learn's bundled ``load_digits`` (always available), split 80/20  1438/359
=================  =====================================================================  =======

Besides these names, ``--dataset`` takes the user's own files: ``folder:DIR`` (one sub-folder of
images per class), ``npz:FILE`` (arrays) and ``csv:FILE`` (a table); :mod:`insitu.data.files` says
what each becomes, and :mod:`insitu.data.images` the one rule that brings images to a model's
input (:meth:`Dataset.fit_images`).

The built-in datasets' images are ``uint8`` of shape ``(N, H, W)``; the user's may be RGB
``(N, H, W, 3)`` too, or float32 features ``(N, F)`` in [0, 1]. Labels are ``int64``. The arrays
of a loaded dataset are read-only because loads are cached per process and shared between callers
(``x = ds.x_train.copy()`` to get arrays you may modify, or :meth:`Dataset.float_images`).
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from insitu.data.files import stratified_split
from insitu.data.idx import read_idx
from insitu.errors import DatasetError, UsageError

if TYPE_CHECKING:
    from sklearn.utils import Bunch

__all__ = ["Dataset", "load_dataset", "check_dataset", "frozen", "dataset_info", "list_datasets", "dataset_names",
           "FASHION_MNIST_DIR", "DIGITS_TEST_FRACTION", "DIGITS_SPLIT_SEED"]

#: Where the Debian package ``dataset-fashion-mnist`` installs the files.
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
#: The digits split: fraction of each class held out for test, and the seed of the shuffle.
DIGITS_TEST_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0


# eq=False: identity hashing, so that fitted copies can be cached per dataset.
@dataclass(frozen=True, eq=False)
class Dataset:
    """A dataset split into train and test: uint8 images ``(N, H, W)`` or ``(N, H, W, 3)``, or
    float32 features ``(N, F)`` in [0, 1]; int64 labels 0..K-1."""

    name: str
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    source: str
    class_names: tuple[str, ...] = field(default=())
    #: What loading found and did (a folder's image mode, size, resampled count...), for `data info`.
    details: dict = field(default_factory=dict, compare=False)

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample, e.g. ``(28, 28)``, ``(32, 32, 3)`` or ``(12,)`` features."""
        return tuple(self.x_train.shape[1:])

    @functools.cached_property
    def key(self) -> str:
        """How a cache of trained networks names this data: a built-in dataset's name (its files
        are the published ones), and for the user's files (``folder:``, ``npz:``, ``csv:``) their
        spec with a hash of the loaded arrays, so that a changed file, or another split of it, is
        never served a network trained on the old data."""
        if self.name in _registry():
            return self.name
        digest = hashlib.sha256(str(self.num_classes).encode())
        for array in (self.x_train, self.y_train, self.x_test, self.y_test):
            digest.update(f"{array.dtype}{array.shape}".encode())
            digest.update(np.ascontiguousarray(array).tobytes())
        return f"{self.name}#{digest.hexdigest()[:16]}"

    @property
    def kind(self) -> str:
        """``"images"`` (uint8) or ``"features"`` (float vectors)."""
        return "features" if self.x_train.ndim == 2 else "images"

    @property
    def channels(self) -> int | None:
        """1 (grey) or 3 (RGB) for images, None for features."""
        return None if self.kind == "features" else (3 if self.x_train.ndim == 4 else 1)

    @property
    def image_size(self) -> tuple[int, int] | None:
        """``(H, W)`` of the images, None for features."""
        if self.kind == "features":
            return None
        h, w = self.x_train.shape[1:3]
        return int(h), int(w)

    def require_images(self, who: str) -> None:
        """Raise a UsageError naming ``who`` (e.g. ``--model cnn``) when these are features."""
        if self.kind != "images":
            raise UsageError(f"{who} takes images, and --dataset {self.name} holds feature vectors "
                             f"{self.sample_shape}; use a model that takes vectors (e.g. --model mlp)")

    def fit_images(self, size: tuple[int, int] | None = None, channels: int | None = None) -> "Dataset":
        """This dataset with its images brought to a model's input by the one rule of
        :mod:`insitu.data.images` (channels, then size); ``self`` when nothing changes."""
        self.require_images("resizing")
        if channels in (None, self.channels) and size in (None, self.image_size):
            return self
        return _fitted(self, None if size is None else tuple(size), channels)

    @property
    def splits(self) -> dict[str, int]:
        """The number of samples in each split: ``{"train": ..., "test": ...}``."""
        return {"train": len(self.y_train), "test": len(self.y_test)}

    def split(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        """``(images, labels)`` of ``"train"`` or ``"test"``."""
        if split == "train":
            return self.x_train, self.y_train
        if split == "test":
            return self.x_test, self.y_test
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")

    def float_images(self, split: str = "train", dtype: type = np.float32, rows=None) -> np.ndarray:
        """The samples of ``split`` (only its ``rows``, an index array or a slice, if given) as a
        new float array in [0, 1]: pixel / 255 for images, the (already scaled) features as they
        are."""
        images, _ = self.split(split)
        out = (images if rows is None else images[rows]).astype(dtype)
        if self.kind == "images":
            out /= 255
        return out


@functools.lru_cache(maxsize=8)
def _fitted(ds: Dataset, size, channels) -> Dataset:
    from insitu.data.images import fit_images

    return frozen(Dataset(ds.name, fit_images(ds.x_train, size, channels), ds.y_train,
                          fit_images(ds.x_test, size, channels), ds.y_test, ds.num_classes,
                          ds.source, ds.class_names, ds.details))


# --- the registry -------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Spec:
    name: str
    description: str
    num_classes: int
    class_names: tuple[str, ...]
    #: "idx": four MNIST-layout IDX files in a directory; "sklearn": bundled with scikit-learn.
    kind: str
    #: Where the IDX files are when no data_dir is given; None: the caller must give one.
    default_dir: Path | None = None


_FASHION_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                    "Sneaker", "Bag", "Ankle boot")
_DIGIT_CLASSES = tuple(str(d) for d in range(10))


def _registry() -> dict[str, _Spec]:
    # Built on each call (it is tiny) so that FASHION_MNIST_DIR can be patched in tests.
    specs = [
        _Spec("fashion-mnist", "Zalando FashionMNIST: 28x28 grey clothing images, 10 classes",
              10, _FASHION_CLASSES, "idx", default_dir=FASHION_MNIST_DIR),
        _Spec("mnist", "MNIST handwritten digits: 28x28 grey images, 10 classes",
              10, _DIGIT_CLASSES, "idx"),
        _Spec("digits", "scikit-learn digits: 8x8 images scaled to 0..255, 10 classes, 80/20 split",
              10, _DIGIT_CLASSES, "sklearn"),
    ]
    return {spec.name: spec for spec in specs}


def dataset_names() -> list[str]:
    """The names :func:`load_dataset` accepts."""
    return list(_registry())


def _spec(name: str) -> _Spec:
    registry = _registry()
    if name not in registry:
        raise UsageError(f"unknown dataset {name!r}; known datasets: {', '.join(registry)}; or your "
                     "files: folder:DIR, npz:FILE, csv:FILE (docs/own-data.md)")
    return registry[name]


def check_dataset(name: str, data_dir: str | Path | None = None) -> None:
    """The cheap checks of ``--dataset name`` (before any slow work): a known name, or the user's
    files whose spec parses and whose path exists. Loading checks the contents."""
    from insitu.data import files

    if name in _registry():
        return
    if not files.is_file_spec(name):
        _spec(name)                                      # the unknown-name error
    spec = files.parse_spec(name)
    if data_dir is not None:
        raise UsageError(f"--dataset {name} names its files itself; leave out --data-dir")
    if not spec.path.exists():
        raise UsageError(f"--dataset {name}: {spec.path} does not exist")


def load_dataset(name: str, data_dir: str | Path | None = None) -> Dataset:
    """Load a dataset by name (see the module docstring for the names), or the user's files
    (``folder:DIR``, ``npz:FILE``, ``csv:FILE``: :mod:`insitu.data.files`).

    ``data_dir`` is a directory with the four IDX files (fashion-mnist, mnist); it overrides the
    default location. Raises :class:`UsageError` for an unknown name and :class:`DatasetError`
    when files are missing or corrupt. Loads are cached per process; the returned arrays are
    read-only.
    """
    from insitu.data import files

    if name not in _registry() and files.is_file_spec(name):
        check_dataset(name, data_dir)
        return _load_files(files.parse_spec(name))
    spec = _spec(name)
    if spec.kind == "sklearn":
        if data_dir is not None:
            raise UsageError(f"dataset {name!r} comes with scikit-learn and takes no data "
                             "directory; leave out --data-dir")
        return _load_digits()
    return _load_idx_dataset(spec, Path(data_dir) if data_dir is not None else None)


def _load_files(spec) -> Dataset:
    from insitu.data.files import load_file_dataset

    path = spec.path.resolve()
    stat = path.stat() if path.exists() else None
    # A folder's files are keyed (and cached on disk) by the loader itself; a file by its identity.
    key = (str(path), stat.st_mtime_ns, stat.st_size) if stat and path.is_file() else None
    return _load_files_cached(spec, key) if key else load_file_dataset(spec)


@functools.lru_cache(maxsize=4)
def _load_files_cached(spec, key) -> Dataset:
    from insitu.data.files import load_file_dataset

    return load_file_dataset(spec)


def dataset_info(name: str, data_dir: str | Path | None = None) -> dict:
    """A JSON-ready summary of a dataset; loads (and so fully checks) it."""
    ds = load_dataset(name, data_dir)
    registry = _registry()
    description = (registry[name].description if name in registry
                   else f"your {ds.kind} ({name.split(':', 1)[0] if ':' in name else 'files'})")
    return {
        "name": ds.name,
        "description": description,
        "kind": ds.kind,
        "channels": ds.channels,
        "splits": ds.splits,
        "sample_shape": list(ds.sample_shape),
        "num_classes": ds.num_classes,
        "class_names": list(ds.class_names),
        "train_per_class": np.bincount(ds.y_train, minlength=ds.num_classes).tolist(),
        "dtype": str(ds.x_train.dtype),
        "label_dtype": str(ds.y_train.dtype),
        "source": ds.source,
        "details": ds.details,
    }


def list_datasets() -> list[dict]:
    """Every known dataset: ``name``, ``description``, ``available`` (loadable here without a
    ``data_dir``), ``source`` (where it is read from) and ``hint`` (what to do when it is not
    available, else None).

    Availability is judged from file presence only (cheap); :func:`dataset_info` does the full
    check.
    """
    rows = []
    for spec in _registry().values():
        if spec.kind == "idx" and spec.default_dir is None:
            available, source = False, None
            hint = "not packaged: download the four IDX files and pass --data-dir DIR"
        elif spec.kind == "idx" and spec.default_dir is not None:    # always set here (see above)
            available, source = not _missing_idx_files(spec.default_dir), str(spec.default_dir)
            hint = None if available else (f"apt-get install dataset-{spec.name}, "
                                           "or pass --data-dir DIR")
        else:
            available, source, hint = True, "scikit-learn (bundled)", None
        rows.append({"name": spec.name, "description": spec.description,
                     "available": available, "source": source, "hint": hint})
    return rows


# --- IDX datasets (MNIST layout) ----------------------------------------------------------------

#: The four files of an MNIST-layout dataset: (split, kind, file name prefix, IDX dims).
_IDX_FILES = (
    ("train", "images", "train", 3),
    ("train", "labels", "train", 1),
    ("test", "images", "t10k", 3),
    ("test", "labels", "t10k", 1),
)


def _idx_candidates(prefix: str, kind: str, dims: int) -> list[str]:
    """File names to look for, the canonical one first."""
    # The original site names them train-images-idx3-ubyte; several mirrors (and Kaggle) use
    # train-images.idx3-ubyte. Either may be gzip-compressed.
    stems = [f"{prefix}-{kind}-idx{dims}-ubyte", f"{prefix}-{kind}.idx{dims}-ubyte"]
    return [stem + suffix for stem in stems for suffix in (".gz", "")]


def _find_idx_file(directory: Path, prefix: str, kind: str, dims: int) -> Path | None:
    for candidate in _idx_candidates(prefix, kind, dims):
        if (directory / candidate).is_file():
            return directory / candidate
    return None


def _missing_idx_files(directory: Path) -> list[Path]:
    """The canonical paths of the files that are not in ``directory``."""
    return [directory / _idx_candidates(prefix, kind, dims)[0]
            for _, kind, prefix, dims in _IDX_FILES
            if _find_idx_file(directory, prefix, kind, dims) is None]


def _load_idx_dataset(spec: _Spec, data_dir: Path | None) -> Dataset:
    name = spec.name
    if data_dir is None:
        if spec.default_dir is None:
            names = ", ".join(_idx_candidates(p, k, d)[0] for _, k, p, d in _IDX_FILES)
            raise DatasetError(f"{name} is not packaged for this system: download its four IDX "
                               f"files ({names}) into a directory and pass --data-dir DIR "
                               "(data_dir= in Python)")
        directory = spec.default_dir
        hint = f"install them with `apt-get install dataset-{name}`, or pass --data-dir DIR"
    else:
        directory = data_dir
        hint = "pass --data-dir with a directory holding the four IDX files"

    if not directory.is_dir():
        raise DatasetError(f"{directory}: no such directory (looking for {name}); {hint}")
    paths = []
    for split, kind, prefix, dims in _IDX_FILES:
        found = _find_idx_file(directory, prefix, kind, dims)
        if found is None:
            names = " or ".join(_idx_candidates(prefix, kind, dims))
            raise DatasetError(f"{directory / _idx_candidates(prefix, kind, dims)[0]}: missing "
                               f"({name} {split} {kind}; looked for {names}); {hint}")
        paths.append(found.resolve())

    # Key the cache on each file's identity too, so that a replaced file is read again.
    key = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for p in paths)
    return _load_idx_cached(name, str(directory.resolve()), key)


@functools.lru_cache(maxsize=8)
def _load_idx_cached(name: str, directory: str, files: tuple) -> Dataset:
    spec = _spec(name)
    paths = {(split, kind): Path(f[0]) for (split, kind, _, _), f in zip(_IDX_FILES, files)}
    arrays = {}
    for split in ("train", "test"):
        images_path, labels_path = paths[split, "images"], paths[split, "labels"]
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.ndim != 3 or images.dtype != np.uint8:
            raise DatasetError(f"{images_path}: expected uint8 images of shape (N, H, W), got "
                               f"{images.dtype} of shape {images.shape}")
        if labels.ndim != 1 or labels.dtype != np.uint8:
            raise DatasetError(f"{labels_path}: expected uint8 labels of shape (N,), got "
                               f"{labels.dtype} of shape {labels.shape}")
        labels = labels.astype(np.int64)
        _check_split(name, split, images, labels, spec.num_classes, images_path, labels_path)
        arrays[split] = images, labels
    train_shape, test_shape = arrays["train"][0].shape[1:], arrays["test"][0].shape[1:]
    if train_shape != test_shape:
        raise DatasetError(f"{paths['test', 'images']}: image shape {test_shape} differs from "
                           f"the train images' {train_shape}; the files do not belong together")
    return frozen(Dataset(name, *arrays["train"], *arrays["test"], num_classes=spec.num_classes,
                           source=directory, class_names=spec.class_names))


def _check_split(name, split, images, labels, num_classes, images_path, labels_path) -> None:
    if len(images) != len(labels):
        raise DatasetError(f"{name} {split}: {images_path} holds {len(images)} images but "
                           f"{labels_path} holds {len(labels)} labels; the files do not belong "
                           "together, download them again")
    if len(labels) and (labels.min() < 0 or labels.max() >= num_classes):
        raise DatasetError(f"{labels_path}: labels range {labels.min()}..{labels.max()}, "
                           f"expected 0..{num_classes - 1} for {name}")


# --- digits (scikit-learn) ----------------------------------------------------------------------

def _sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits, ``(images (1797, 8, 8) of counts 0..16, labels)``: its bundled
    ``datasets/data/digits.csv.gz`` read as ``load_digits`` reads it, without importing sklearn
    (~1 s, every command run on digits); ``load_digits`` itself where the file is not found."""
    spec = importlib.util.find_spec("sklearn")       # a top-level package: found, not imported
    folder = Path(spec.origin).parent if spec is not None and spec.origin else None
    if folder is not None and (folder / "datasets" / "data" / "digits.csv.gz").is_file():
        with gzip.open(folder / "datasets" / "data" / "digits.csv.gz", "rt", encoding="utf-8") as fh:
            data = np.loadtxt(fh, delimiter=",")
        return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(int)
    from sklearn.datasets import load_digits

    bunch = cast("Bunch", load_digits())        # (a (data, target) tuple only with return_X_y)
    return bunch.images, bunch.target


@functools.lru_cache(maxsize=1)
def _load_digits() -> Dataset:
    images, target = _sklearn_digits()
    # Pixels are counts 0..16 (4x4 blocks of a 32x32 bitmap); scale to the 0..255 of the other
    # datasets so that every pipeline sees uint8 images: round(v * 255 / 16), so 16 -> 255.
    images = np.rint(images * (255 / 16)).astype(np.uint8)
    labels = target.astype(np.int64)
    train, test = stratified_split(labels, DIGITS_TEST_FRACTION, DIGITS_SPLIT_SEED)
    spec = _spec("digits")
    return frozen(Dataset("digits", images[train], labels[train], images[test], labels[test],
                           num_classes=spec.num_classes, class_names=spec.class_names,
                           source=f"sklearn.datasets.load_digits (scikit-learn); stratified "
                                  f"{1 - DIGITS_TEST_FRACTION:.0%}/{DIGITS_TEST_FRACTION:.0%} "
                                  f"split, seed {DIGITS_SPLIT_SEED}"))


def frozen(ds: Dataset) -> Dataset:
    # The Dataset is cached and shared: read-only arrays make an in-place edit by one caller an
    # error instead of a silent change to everyone else's data.
    for array in (ds.x_train, ds.y_train, ds.x_test, ds.y_test):
        array.flags.writeable = False
    return ds

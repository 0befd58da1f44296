"""The dataset registry: loading, checks across files, caching, digits, and the real FashionMNIST."""

from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from insitu.data import (FASHION_MNIST_DIR, Dataset, dataset_info, dataset_names, list_datasets,
                         load_dataset, write_idx)
from insitu.data.files import stratified_split as _stratified_split
from insitu.errors import DatasetError, UsageError

pytestmark = pytest.mark.unit

NAMES = ["fashion-mnist", "mnist", "digits"]
FASHION_PRESENT = (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file()
needs_fashion = pytest.mark.skipif(
    not FASHION_PRESENT,
    reason=f"FashionMNIST not installed in {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)")


def make_idx_dataset(directory, n_train=6, n_test=4, shape=(5, 5), naming="dash", compress=True,
                     seed=0):
    """Write a small MNIST-layout dataset; returns the arrays written."""
    rng = np.random.default_rng(seed)
    arrays = {
        "train-images": rng.integers(0, 256, (n_train, *shape), dtype=np.uint8),
        "train-labels": rng.integers(0, 10, n_train, dtype=np.uint8),
        "t10k-images": rng.integers(0, 256, (n_test, *shape), dtype=np.uint8),
        "t10k-labels": rng.integers(0, 10, n_test, dtype=np.uint8),
    }
    directory.mkdir(parents=True, exist_ok=True)
    for stem, array in arrays.items():
        write_idx(directory / idx_name(stem, naming, compress), array, gzip=compress)
    return arrays


def idx_name(stem, naming="dash", compress=True):
    dims = 3 if stem.endswith("images") else 1
    sep = "-" if naming == "dash" else "."
    return f"{stem}{sep}idx{dims}-ubyte" + (".gz" if compress else "")


# --- IDX datasets from a directory --------------------------------------------------------------

@pytest.mark.parametrize("naming", ["dash", "dot"])
@pytest.mark.parametrize("compress", [True, False], ids=["gz", "raw"])
def test_load_from_data_dir(tmp_path, naming, compress):
    arrays = make_idx_dataset(tmp_path, naming=naming, compress=compress)
    ds = load_dataset("mnist", tmp_path)
    assert isinstance(ds, Dataset)
    assert ds.name == "mnist" and ds.num_classes == 10
    assert ds.splits == {"train": 6, "test": 4}
    assert ds.sample_shape == (5, 5)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64
    np.testing.assert_array_equal(ds.x_train, arrays["train-images"])
    np.testing.assert_array_equal(ds.y_test, arrays["t10k-labels"])
    assert ds.source == str(tmp_path.resolve())


def test_data_dir_overrides_default_for_fashion_mnist(tmp_path):
    make_idx_dataset(tmp_path)
    ds = load_dataset("fashion-mnist", data_dir=str(tmp_path))
    assert ds.splits == {"train": 6, "test": 4}
    assert ds.class_names[0] == "T-shirt/top"


def test_arrays_are_read_only_and_cached(tmp_path):
    make_idx_dataset(tmp_path)
    ds = load_dataset("mnist", tmp_path)
    assert load_dataset("mnist", tmp_path) is ds
    for array in (ds.x_train, ds.y_train, ds.x_test, ds.y_test):
        with pytest.raises(ValueError, match="read-only"):
            array[0] = 1
    with pytest.raises(AttributeError):
        ds.x_train = None  # frozen dataclass


def test_replaced_file_is_read_again(tmp_path):
    make_idx_dataset(tmp_path)
    first = load_dataset("mnist", tmp_path)
    make_idx_dataset(tmp_path, n_train=8)
    assert load_dataset("mnist", tmp_path).splits["train"] == 8
    assert first.splits["train"] == 6  # the old object is untouched


def test_float_images(tmp_path):
    make_idx_dataset(tmp_path)
    ds = load_dataset("mnist", tmp_path)
    x = ds.float_images("test")
    assert x.dtype == np.float32 and x.shape == ds.x_test.shape
    np.testing.assert_allclose(x * 255, ds.x_test, atol=1e-4)
    x[...] = 0  # a fresh array, not a view of the cache
    assert ds.x_test.any()
    assert ds.float_images("train", dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError):
        ds.float_images("validation")


def test_mnist_needs_data_dir():
    with pytest.raises(DatasetError, match="--data-dir") as info:
        load_dataset("mnist")
    assert "train-images-idx3-ubyte.gz" in str(info.value)


def test_missing_directory(tmp_path):
    with pytest.raises(DatasetError, match="no such directory") as info:
        load_dataset("mnist", tmp_path / "nope")
    assert str(tmp_path / "nope") in str(info.value)


@pytest.mark.parametrize("stem", ["train-images", "train-labels", "t10k-images", "t10k-labels"])
def test_missing_file_in_dataset_dir(tmp_path, stem):
    make_idx_dataset(tmp_path)
    (tmp_path / idx_name(stem)).unlink()
    with pytest.raises(DatasetError, match="missing") as info:
        load_dataset("mnist", tmp_path)
    assert str(tmp_path / idx_name(stem)) in str(info.value)


def test_image_label_count_mismatch(tmp_path):
    make_idx_dataset(tmp_path)
    write_idx(tmp_path / idx_name("train-labels"), np.zeros(5, np.uint8), gzip=True)  # 6 images
    with pytest.raises(DatasetError, match="6 images but .* 5 labels") as info:
        load_dataset("mnist", tmp_path)
    assert str(tmp_path / idx_name("train-labels")) in str(info.value)
    assert str(tmp_path / idx_name("train-images")) in str(info.value)


def test_labels_out_of_range(tmp_path):
    make_idx_dataset(tmp_path)
    write_idx(tmp_path / idx_name("t10k-labels"), np.array([0, 1, 10, 2], np.uint8), gzip=True)
    with pytest.raises(DatasetError, match="0..9") as info:
        load_dataset("mnist", tmp_path)
    assert str(tmp_path / idx_name("t10k-labels")) in str(info.value)


def test_images_of_wrong_rank_or_dtype(tmp_path):
    make_idx_dataset(tmp_path)
    write_idx(tmp_path / idx_name("train-images"), np.zeros((6, 25), np.uint8), gzip=True)
    with pytest.raises(DatasetError, match=r"\(N, H, W\)") as info:
        load_dataset("mnist", tmp_path)
    assert str(tmp_path / idx_name("train-images")) in str(info.value)
    write_idx(tmp_path / idx_name("train-images"), np.zeros((6, 5, 5), np.float32), gzip=True)
    with pytest.raises(DatasetError, match="uint8"):
        load_dataset("mnist", tmp_path)


def test_train_and_test_shapes_differ(tmp_path):
    make_idx_dataset(tmp_path)
    write_idx(tmp_path / idx_name("t10k-images"), np.zeros((4, 6, 6), np.uint8), gzip=True)
    with pytest.raises(DatasetError, match="differs") as info:
        load_dataset("mnist", tmp_path)
    assert str(tmp_path / idx_name("t10k-images")) in str(info.value)


def test_corrupt_file_in_dataset_dir_is_named(tmp_path):
    make_idx_dataset(tmp_path)
    path = tmp_path / idx_name("t10k-images")
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(DatasetError) as info:
        load_dataset("mnist", tmp_path)
    assert str(path) in str(info.value)


# --- names --------------------------------------------------------------------------------------

def test_known_names():
    assert dataset_names() == NAMES
    assert [row["name"] for row in list_datasets()] == NAMES


@pytest.mark.parametrize("call", [load_dataset, dataset_info])
def test_unknown_name_lists_known_names(call):
    with pytest.raises(UsageError) as info:
        call("nope")
    assert info.value.exit_code == 2
    assert "nope" in str(info.value)
    for name in NAMES:
        assert name in str(info.value)


def test_list_datasets():
    rows = {row["name"]: row for row in list_datasets()}
    assert rows["digits"]["available"] is True
    assert rows["digits"]["hint"] is None
    assert rows["mnist"]["available"] is False and "--data-dir" in rows["mnist"]["hint"]
    assert rows["fashion-mnist"]["available"] is FASHION_PRESENT
    assert rows["fashion-mnist"]["source"] == str(FASHION_MNIST_DIR)
    assert (rows["fashion-mnist"]["hint"] is None) is FASHION_PRESENT


# --- digits -------------------------------------------------------------------------------------

def test_digits_shapes_and_scaling():
    ds = load_dataset("digits")
    assert ds.splits == {"train": 1438, "test": 359}
    assert ds.sample_shape == (8, 8)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64
    assert ds.x_train.max() == 255 and ds.x_train.min() == 0  # 16 -> 255
    assert set(np.unique(ds.y_train)) == set(range(10))
    # Stratified: each class is about 20% of its samples in test.
    test_share = np.bincount(ds.y_test, minlength=10) / (
        np.bincount(ds.y_test, minlength=10) + np.bincount(ds.y_train, minlength=10))
    assert np.all(np.abs(test_share - 0.2) < 0.01)


def test_digits_scaling_matches_sklearn():
    from sklearn.datasets import load_digits

    def rows_sorted(images):
        flat = images.reshape(len(images), -1)
        return flat[np.lexsort(flat.T[::-1])]

    expected = np.rint(load_digits().images * 255 / 16).astype(np.uint8)
    ds = load_dataset("digits")
    # The split reorders samples; as a multiset they are sklearn's images, scaled by 255/16.
    np.testing.assert_array_equal(rows_sorted(np.concatenate([ds.x_train, ds.x_test])),
                                  rows_sorted(expected))


def test_digits_split_is_pinned():
    # The split must be the same on every machine and version: pin it.
    ds = load_dataset("digits")
    digest = hashlib.sha256(ds.y_test.astype("<i8").tobytes() + ds.x_test.tobytes()).hexdigest()
    assert digest[:16] == "e5edd73ac65a24ca"


def test_stratified_split_is_deterministic_and_disjoint():
    labels = np.repeat(np.arange(3), [10, 20, 30])
    train, test = _stratified_split(labels, 0.2, seed=0)
    again = _stratified_split(labels, 0.2, seed=0)
    np.testing.assert_array_equal(train, again[0])
    np.testing.assert_array_equal(test, again[1])
    assert np.intersect1d(train, test).size == 0
    assert np.union1d(train, test).tolist() == list(range(60))
    assert np.bincount(labels[test]).tolist() == [2, 4, 6]
    assert not np.array_equal(test, _stratified_split(labels, 0.2, seed=1)[1])


def test_digits_takes_no_data_dir(tmp_path):
    with pytest.raises(UsageError, match="data-dir"):
        load_dataset("digits", tmp_path)


def test_dataset_info_digits():
    info = dataset_info("digits")
    assert info["name"] == "digits"
    assert info["splits"] == {"train": 1438, "test": 359}
    assert info["sample_shape"] == [8, 8]
    assert info["num_classes"] == 10
    assert info["dtype"] == "uint8"
    assert "load_digits" in info["source"]


# --- the real FashionMNIST ----------------------------------------------------------------------

@needs_fashion
def test_fashion_mnist():
    ds = load_dataset("fashion-mnist")
    assert ds.x_train.shape == (60000, 28, 28) and ds.x_test.shape == (10000, 28, 28)
    assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int64
    assert np.bincount(ds.y_train).tolist() == [6000] * 10
    assert np.bincount(ds.y_test).tolist() == [1000] * 10
    assert ds.source == os.path.realpath(FASHION_MNIST_DIR)
    assert ds.x_train.max() == 255


@needs_fashion
def test_fashion_mnist_info():
    info = dataset_info("fashion-mnist")
    assert info["splits"] == {"train": 60000, "test": 10000}
    assert info["sample_shape"] == [28, 28]
    assert info["num_classes"] == 10 and info["dtype"] == "uint8"
    assert len(info["class_names"]) == 10


def test_fashion_mnist_not_installed_says_how_to_get_it(tmp_path, monkeypatch):
    monkeypatch.setattr("insitu.data.datasets.FASHION_MNIST_DIR", tmp_path / "fashion-mnist")
    with pytest.raises(DatasetError) as info:
        load_dataset("fashion-mnist")
    message = str(info.value)
    assert str(tmp_path / "fashion-mnist") in message
    assert "apt-get install dataset-fashion-mnist" in message and "--data-dir" in message
    (row,) = [r for r in list_datasets() if r["name"] == "fashion-mnist"]
    assert row["available"] is False and "apt-get install dataset-fashion-mnist" in row["hint"]

"""Datasets: the IDX reader/writer and the named datasets insitu trains on.

    >>> from insitu.data import load_dataset
    >>> ds = load_dataset("digits")
    >>> ds.x_train.shape, ds.sample_shape, ds.num_classes
    ((1437, 8, 8), (8, 8), 10)
"""

from insitu.data.datasets import (
    DIGITS_SPLIT_SEED,
    DIGITS_TEST_FRACTION,
    FASHION_MNIST_DIR,
    Dataset,
    check_dataset,
    dataset_info,
    dataset_names,
    list_datasets,
    load_dataset,
)
from insitu.data.idx import read_idx, write_idx

__all__ = ["Dataset", "load_dataset", "check_dataset", "dataset_info", "dataset_names", "list_datasets",
           "read_idx", "write_idx", "FASHION_MNIST_DIR", "DIGITS_TEST_FRACTION",
           "DIGITS_SPLIT_SEED"]

"""Benchmark (prints figures, asserts nothing about speed): the NumPy core training on FashionMNIST.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks
"""

import json

import pytest

from insitu.data import dataset_info
from insitu.training import TrainConfig, train

pytestmark = pytest.mark.benchmark


@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_one_epoch_of_fashion_mnist(model):
    try:
        dataset_info("fashion-mnist")
    except Exception as exc:  # the dataset is a Debian package; say so rather than fail obscurely
        pytest.skip(f"FashionMNIST not available: {exc}")
    result = train(TrainConfig(board="ultra96v2-sim", model=model, samples=60_000, batch_size=32, lr=0.05))
    print(json.dumps({k: result[k] for k in ("model", "samples", "accuracy", "parameters", "seconds",
                                              "samples_per_second")}))
    assert result["samples"] == 60_000

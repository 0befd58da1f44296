"""`insitu data` through the installed console script: exit codes, JSON, and error messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from insitu.data import write_idx

pytestmark = pytest.mark.system

FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")
NAMES = ["fashion-mnist", "mnist", "digits"]
needs_fashion = pytest.mark.skipif(
    not (FASHION_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason=f"FashionMNIST not installed in {FASHION_DIR} (apt-get install dataset-fashion-mnist)")


def _write_small_dataset(directory: Path) -> None:
    rng = np.random.default_rng(0)
    for prefix, n in (("train", 6), ("t10k", 4)):
        write_idx(directory / f"{prefix}-images-idx3-ubyte.gz",
                  rng.integers(0, 256, (n, 4, 4), dtype=np.uint8), gzip=True)
        write_idx(directory / f"{prefix}-labels-idx1-ubyte.gz",
                  rng.integers(0, 10, n, dtype=np.uint8), gzip=True)


@needs_fashion
def test_info_fashion_mnist_json(run_cli):
    run = run_cli("data", "info", "fashion-mnist", "--json")
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)  # stdout holds nothing but the JSON document
    assert info["splits"] == {"train": 60000, "test": 10000}
    assert info["sample_shape"] == [28, 28]
    assert info["num_classes"] == 10 and info["dtype"] == "uint8"


@needs_fashion
def test_info_fashion_mnist_table(run_cli):
    run = run_cli("data", "info", "fashion-mnist")
    assert run.returncode == 0, run.stderr
    assert "60000" in run.stdout and "10000" in run.stdout and "28x28" in run.stdout


def test_info_digits_json(run_cli):
    run = run_cli("data", "info", "digits", "--json")
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)
    assert info["splits"] == {"train": 1438, "test": 359} and info["sample_shape"] == [8, 8]


def test_info_data_dir(run_cli, tmp_path):
    _write_small_dataset(tmp_path)
    run = run_cli("data", "info", "mnist", "--data-dir", tmp_path, "--json")
    assert run.returncode == 0, run.stderr
    info = json.loads(run.stdout)
    assert info["splits"] == {"train": 6, "test": 4} and info["sample_shape"] == [4, 4]
    assert info["source"] == str(tmp_path.resolve())


def test_unknown_name_exits_2_and_lists_names(run_cli):
    run = run_cli("data", "info", "nope")
    assert run.returncode == 2
    assert run.stdout == ""
    assert "nope" in run.stderr
    for name in NAMES:
        assert name in run.stderr
    assert "Traceback" not in run.stderr


def test_corrupt_data_dir_exits_1_naming_the_file(run_cli, tmp_path):
    _write_small_dataset(tmp_path)
    broken = tmp_path / "t10k-images-idx3-ubyte.gz"
    broken.write_bytes(broken.read_bytes()[:-12])  # cut into the gzip trailer
    run = run_cli("data", "info", "mnist", "--data-dir", tmp_path, "--json")
    assert run.returncode == 1
    assert run.stdout == ""
    assert str(broken) in run.stderr
    assert "Traceback" not in run.stderr


def test_missing_file_in_data_dir_names_it(run_cli, tmp_path):
    _write_small_dataset(tmp_path)
    (tmp_path / "train-labels-idx1-ubyte.gz").unlink()
    run = run_cli("data", "info", "fashion-mnist", "--data-dir", tmp_path)
    assert run.returncode == 1
    assert str(tmp_path / "train-labels-idx1-ubyte.gz") in run.stderr


def test_mnist_without_data_dir_says_what_to_do(run_cli):
    run = run_cli("data", "info", "mnist")
    assert run.returncode == 1
    assert "--data-dir" in run.stderr


def test_list_json(run_cli):
    run = run_cli("data", "list", "--json")
    assert run.returncode == 0, run.stderr
    rows = {row["name"]: row for row in json.loads(run.stdout)}
    assert list(rows) == NAMES
    assert rows["digits"]["available"] is True
    assert rows["mnist"]["available"] is False


def test_help_names_every_dataset(run_cli):
    for args in (("data", "--help"), ("data", "info", "--help")):
        run = run_cli(*args)
        assert run.returncode == 0, run.stderr
        for name in NAMES:
            assert name in run.stdout, f"`insitu {' '.join(args)}` does not mention {name}"

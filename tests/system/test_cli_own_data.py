"""Users' own datasets through the installed CLI: `data info` shows what a file became; the
reference SGD trains on each kind; a bad file exits 2 with the file named, before training."""

from __future__ import annotations

import json

import numpy as np
import pytest
from own_data import write_csv, write_image_folder, write_npz

from conftest import cache_env

pytestmark = pytest.mark.system


@pytest.fixture
def own(tmp_path):
    return {"folder": f"folder:{write_image_folder(tmp_path / 'imgs', n=200)}",
            "npz": f"npz:{write_npz(tmp_path / 'd.npz', n=200)}",
            "csv": f"csv:{write_csv(tmp_path / 't.csv', n=200, names=True)}"}


@pytest.fixture
def env(insitu_cache):
    """The test's own cache: for the commands, and for the files this process loads back."""
    return cache_env(insitu_cache)


def test_data_info_shows_what_each_file_became(run_cli, own, env):
    shapes = {}
    for kind, spec in own.items():
        run = run_cli("data", "info", spec, "--json", env=env)
        assert run.returncode == 0, run.stderr
        info = json.loads(run.stdout)
        shapes[kind] = (info["kind"], info["channels"], tuple(info["sample_shape"]), info["num_classes"])
    assert shapes == {"folder": ("images", 3, (8, 8, 3), 10), "npz": ("images", 1, (8, 8), 10),
                      "csv": ("features", None, (16,), 10)}
    table = run_cli("data", "info", own["folder"], env=env)
    assert table.returncode == 0 and "RGB images" in table.stdout and "resampled" in table.stdout


@pytest.mark.parametrize("kind,model", [("folder", "mlp"), ("folder", "cnn"), ("npz", "cnn"), ("csv", "mlp")])
def test_sgd_trains_on_each_kind(run_cli, own, env, kind, model):
    # 3000 samples: measured 0.79-0.95 on the ~40 test images, far from chance (0.1) and the bar
    run = run_cli("train", "--dataset", own[kind], "--model", model, "--samples", "3000", "--json", env=env)
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["dataset"] == own[kind]
    assert result["accuracy"] > 0.4


def test_cnn_on_a_table_and_a_broken_image_exit_2_naming_them(run_cli, own, env, tmp_path):
    run = run_cli("train", "--dataset", own["csv"], "--model", "cnn", "--samples", "100", env=env)
    assert run.returncode == 2 and "takes images" in run.stderr and "t.csv" in run.stderr
    broken = tmp_path / "imgs" / "digit-4" / "zz.png"
    broken.write_bytes(b"not an image")
    for args in (("train", "--dataset", own["folder"], "--samples", "100"), ("data", "info", own["folder"])):
        run = run_cli(*args, env=env)
        assert run.returncode == 2, run.stderr
        assert str(broken) in run.stderr and "unreadable image" in run.stderr
        assert "Traceback" not in run.stderr
    run = run_cli("train", "--dataset", f"folder:{tmp_path / 'nothing'}", "--data-dir", "x", env=env)
    assert run.returncode == 2


def test_data_export_writes_what_dataset_reads_back(run_cli, env, tmp_path):
    from insitu.data import load_dataset

    digits = load_dataset("digits")
    for out in (tmp_path / "my-images", tmp_path / "d.npz"):
        run = run_cli("data", "export", "digits", out, "--samples", "60", env=env)
        assert run.returncode == 0, run.stderr
        back = load_dataset(f"{'npz' if out.suffix else 'folder'}:{out}")
        order = np.argsort(back.y_train, kind="stable") if not out.suffix else np.arange(60)
        expected = np.argsort(digits.y_train[:60], kind="stable") if not out.suffix else np.arange(60)
        assert np.array_equal(back.x_train[order], digits.x_train[:60][expected])
        assert np.array_equal(back.y_train[order], digits.y_train[:60][expected])
        assert back.splits == {"train": 60, "test": 15}
    assert run_cli("data", "export", "digits", tmp_path / "d.npz", env=env).returncode == 2   # exists
    run = run_cli("data", "export", "digits", tmp_path / "big", "--size", "32", "--samples", "40", env=env)
    assert run.returncode == 0, run.stderr
    assert load_dataset(f"folder:{tmp_path / 'big'}").sample_shape == (32, 32)


@pytest.mark.parametrize("kind, twin", [("folder", "qemu"), ("npz", "unix")], ids=["folder", "npz"])
def test_sparse_update_on_the_twins_trains_on_each_kind(run_cli, own, insitu_cache, kind, twin):
    """The RGB folder (12x12 and 8x8 images) and the grey npz brought to mbv2-tiny's grey input.
    What a kind changes is the host's (the images decoded and brought to the model's input); the
    folder trains on the Cortex-M7 twin, the npz on the unix-port twin (the same firmware and link
    without the emulated UART's seconds of flashing)."""
    # The decoded files in the test's own cache; the pretraining and the firmware, slow, shared.
    env = cache_env(insitu_cache, share=("mcu", "mcu-twin", "mcu-native"))
    run = run_cli("train", "--board", "stm32f746-disco-sim", "--algo", "sparse", "--model", "mbv2-tiny",
                  "--dataset", own[kind], "--twin", twin, "--samples", "6", "--test-samples", "10", "--json",
                  env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert (result["dataset"], result["twin"], result["samples"]) == (own[kind], twin, 6)
    assert result["host_sim_agreement"] == 1.0                # the device computes the host's bits
    assert result["peak_heap_bytes"] <= result["heap_bytes"]

"""TT training on the user's own files through the installed CLI: `insitu tt train` (host) and
`insitu train --algo tt` on the FPGA twins, on a folder of PNGs (grey 8x8 and RGB 12x12, which the
folder loader brings to 8x8 RGB), an .npz and a CSV table; the network's modes follow each dataset;
images too large for the PEs are refused naming the limit, and trained once --input-size brings
them down; --tt-modes is a run's option; the RTL twin trains another shape as the fast one
(marked rtl). About 40 s of CPU, the RTL test included once its twin and Verilog are cached."""

from __future__ import annotations

import json

import numpy as np
import pytest
from own_data import digits, write_csv, write_image_folder, write_npz

from conftest import cache_env

pytestmark = pytest.mark.system

# Short runs that learn the digits (one epoch of the 300 on the host, 480 samples on the twins:
# the accuracies reach 0.6 to 0.9): no prior on the host, a weak one on the twins (the default
# weight, 5 g/N, is tuned for 60,000 samples and prunes a 300-sample set's ranks away in 3 epochs).
HOST = ("--variant", "fixed", "--epochs", "1", "--batch-size", "32", "--lr", "0.006",
        "--lr-schedule", "constant", "--json")
BOARD = ("--algo", "tt", "--samples", "480", "--batch-size", "32", "--lr", "0.006",
         "--prior-weight", "0.5", "--json")
FIRST_MODES = {"folder": [4, 2, 2, 16], "npz": [2, 2, 2, 16], "csv": [1, 1, 1, 16]}
INPUTS = {"folder": "8x8 RGB images (256 values: rows of 24 padded to 32)",
          "npz": "8x8 grey images (128 values: rows of 8 padded to 16)",
          "csv": "16 features (16 values)"}


@pytest.fixture(scope="module")
def own(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    x_train, y_train, x_test, y_test = digits(300)
    # 40x40 RGB: too large for the PEs at rank 16 (each digit pixel a 5x5 block, tinted).
    big = {name: np.repeat(np.kron(x, np.ones((5, 5), np.uint8))[..., None], 3, axis=3)
           for name, x in (("x_train", x_train), ("x_test", x_test))}
    np.savez(root / "big.npz", y_train=y_train, y_test=y_test, **big)
    return {"folder": f"folder:{write_image_folder(root / 'imgs', n=300)}",
            "npz": f"npz:{write_npz(root / 'd.npz', n=300)}",
            "csv": f"csv:{write_csv(root / 't.csv', n=300, names=True)}",
            "big": f"npz:{root / 'big.npz'}",
            # the RTL twin and its Verilog (generated in seconds only when cached) are the suite's
            "env": cache_env(root / "cache", share=("rtl-twin",))}


def _json(run):
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


@pytest.mark.parametrize("kind", ["folder", "npz", "csv"])
def test_tt_train_on_each_kind(run_cli, own, kind):
    result = _json(run_cli("tt", "train", "--dataset", own[kind], *HOST, env=own["env"]))
    network = result["network"]
    assert network["layers"][0] == [FIRST_MODES[kind], [4, 4, 2, 16]]
    assert network["layers"][1] == [[32, 16], [1, 16]] and network["classes"] == 10
    assert network["input"] == INPUTS[kind] and network["modes_from"] == "rule"
    assert result["test_accuracy"] > 0.3, result["history"]            # 10 classes: chance 0.1


@pytest.mark.parametrize("kind,board", [("folder", "ultra96v2-sim"), ("npz", "zedboard-sim"),
                                        ("csv", "ultra96v2-sim")])
def test_train_algo_tt_on_each_kind_on_a_twin(run_cli, own, kind, board):
    result = _json(run_cli("train", "--board", board, "--dataset", own[kind], *BOARD, env=own["env"]))
    assert result["board"] == board and result["executor"] == "twin-fast"
    assert result["network"]["layers"][0][0] == FIRST_MODES[kind]
    assert result["pl_cycles"] > 0 and set(result["ops"]) == {"PE1", "PE2", "PE3"}
    assert result["accuracy"] > 0.3


def test_images_too_large_are_refused_naming_the_limit_then_fitted_when_asked(run_cli, own, tmp_path):
    for args in (("tt", "train", "--dataset", own["big"], "--epochs", "1"),
                 ("train", "--algo", "tt", "--dataset", own["big"], "--samples", "64")):
        run = run_cli(*args, env=own["env"])
        assert run.returncode == 2, (run.stdout, run.stderr)
        for needle in ("40x40 RGB images (5120 values", "no modes fit", "factor_words",
                       "--input-size 40x40x1", "--input-size 25x25", "--tt-modes"):
            assert needle in run.stderr, (needle, run.stderr)
        assert "Traceback" not in run.stderr and run.stdout == ""
    host = _json(run_cli("tt", "train", "--dataset", own["big"], "--input-size", "20x20", *HOST,
                         env=own["env"]))
    assert host["network"]["sample_shape"] == [20, 20, 3] and host["test_accuracy"] > 0.3
    board = _json(run_cli("train", "--dataset", own["big"], "--input-size", "16x16x1", *BOARD,
                          "--board", "zedboard-sim", env=own["env"]))
    assert board["network"]["sample_shape"] == [16, 16] and board["accuracy"] > 0.3


@pytest.mark.parametrize("args,message", [
    (("train", "--algo", "sgd", "--input-size", "8x8"), "--input-size does not apply to --algo sgd"),
    (("train", "--algo", "lrt", "--tt-modes", "4,4,16"), "--tt-modes does not apply to --algo lrt"),
    (("train", "--prior-weight", "1"), "--prior-weight does not apply to --algo sgd"),
    (("train", "--algo", "tt", "--tt-modes", "4,x"), "--tt-modes takes comma-separated integers"),
    (("tt", "train", "--input-size", "8x8x2"), "--input-size takes HxW or HxWxC"),
    (("tt", "train", "--dataset", "csv", "--input-size", "8x8"), "--input-size resizes images"),
    (("tt", "train", "--dataset", "npz", "--tt-modes", "4,4,16"), "--tt-modes takes 4 modes"),
    (("train", "--algo", "tt", "--dataset", "npz", "--batch-size", "512", "--samples", "64"),
     "pe3_b_max = 256"),
])
def test_bad_shape_options_exit_2(run_cli, own, args, message):
    args = tuple(own.get(a, a) if a in ("csv", "npz") else a for a in args)
    run = run_cli(*args, env=own["env"])
    assert run.returncode == 2, (run.stdout, run.stderr)
    assert message in run.stderr and "Traceback" not in run.stderr


def test_tt_modes_are_part_of_a_run(run_cli, own, tmp_path):
    folder = tmp_path / "run"
    args = ("train", "--algo", "tt", "--dataset", own["npz"], "--samples", "64", "--batch-size", "32",
            "--run-dir", folder)
    result = _json(run_cli(*args, "--tt-modes", "4,2,1,16", "--json", env=own["env"]))
    assert result["network"]["layers"][0][0] == [4, 2, 1, 16]
    assert result["network"]["modes_from"] == "--tt-modes"
    assert 'tt-modes = "4,2,1,16"' in (folder / "config.toml").read_text()
    other = run_cli(*args, "--tt-modes", "2,2,2,16", env=own["env"])
    assert other.returncode == 2 and "tt-modes '4,2,1,16' there" in other.stderr, other.stderr
    # The run's checkpoint resumes with the same modes; with other modes it is another run.
    resumed = _json(run_cli(*args[:-2], "--tt-modes", "4,2,1,16", "--samples", "96", "--checkpoint",
                            folder / "checkpoint.npz", "--json", env=own["env"]))
    assert resumed["samples"] == 96
    other = run_cli(*args[:-2], "--tt-modes", "2,2,2,16", "--checkpoint", folder / "checkpoint.npz",
                    env=own["env"])
    assert other.returncode != 0 and "belongs to another run" in other.stderr, other.stderr


def test_a_checkpoint_never_resumes_on_a_changed_file(run_cli, own, tmp_path):
    data = tmp_path / "d.npz"
    runs = {"tt": ("tt", "train", "--variant", "float", "--epochs", "1"),
            "board": ("train", "--algo", "tt", "--samples", "64")}
    for name, args in runs.items():
        write_npz(data, n=200)
        args = (*args, "--dataset", f"npz:{data}", "--checkpoint", tmp_path / f"{name}.npz")
        _json(run_cli(*args, "--json", env=own["env"]))
        write_npz(data, n=240)                           # the same spec, other arrays
        run = run_cli(*args, env=own["env"])
        assert run.returncode != 0 and "belongs to another run" in run.stderr, (name, run.stderr)


@pytest.mark.rtl
def test_the_rtl_twin_trains_another_shape_as_the_fast_one(run_cli, own, tmp_path):
    """The PEs' sizes are run-time registers: the tiny network's modes for 8x8 RGB images run on
    the RTL (compiled with Verilator) with the fast twin's loss, accuracy and weights."""
    from insitu.checkpoint import load_checkpoint

    step = ("--algo", "tt", "--model", "tiny", "--dataset", own["folder"], "--samples", "8",
            "--batch-size", "4", "--test-samples", "8", "--json")
    runs = {mode: _json(run_cli("train", *step, "--mode", mode, "--checkpoint", tmp_path / f"{mode}.npz",
                                env=own["env"], timeout=400)) for mode in ("fast", "rtl")}
    assert runs["rtl"]["network"]["layers"][0][0] == [2, 2, 16] == runs["fast"]["network"]["layers"][0][0]
    assert runs["rtl"]["final_loss"] == runs["fast"]["final_loss"]
    assert runs["rtl"]["accuracy"] == runs["fast"]["accuracy"] and runs["rtl"]["pl_cycles"] > 0
    rtl, _ = load_checkpoint(tmp_path / "rtl.npz")
    fast, _ = load_checkpoint(tmp_path / "fast.npz")
    assert sorted(rtl) == sorted(fast)
    for key in rtl:
        np.testing.assert_array_equal(rtl[key], fast[key], err_msg=key)

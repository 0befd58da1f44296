"""`insitu lrt adapt`, `insitu train --algo lrt` (on the FPGA twins) and `insitu e2train run` on the
user's own files: an RGB image folder of another size than digits', a grey .npz and a CSV table;
and what they refuse (exit 2, before any work). Small settings: each run takes seconds, except the
first board run, which pre-trains the MLP (20,000 samples x 20 epochs, ~15 s) once: the runs name
their files by relative paths, in the files' folder, so the data's cache key is the same in every
session and the pre-trained networks live in the suite's shared cache (the key holds a hash of
the data as well). The refusals run in this process (tests/in_process.py), on a cache of their
own that they leave empty."""

import json

import numpy as np
import pytest

from conftest import cache_env, insitu_cli
from in_process import insitu_in_process
from insitu.data import load_dataset
from own_data import write_csv, write_image_folder, write_npz

pytestmark = pytest.mark.system

#: lrt adapt with a tiny pre-training.
ADAPT = ("lrt", "adapt", "--offline-samples", "200", "--samples", "200", "--segment", "50",
         "--dense-batch", "20", "--json")
E2_TINY = ("e2train", "run", "--epochs", "6", "--width", "4", "--blocks-per-stage", "1",
           "--batch-size", "32", "--json")


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    root = tmp_path_factory.mktemp("own")
    cache = root / "cache"
    ds = load_dataset("digits")
    few = ds.y_train < 3
    np.savez(root / "three.npz", x=ds.x_train[few], y=ds.y_train[few])
    np.savez(root / "six.npz", x=ds.x_train[:200, :6, :6], y=ds.y_train[:200])
    (root / "many.csv").write_text("f,label\n" + "".join(f"{k + r / 10},{k}\n" for k in range(130)
                                                          for r in range(3)))
    write_image_folder(root / "rgb", n=300, rgb_every=1)       # 12x12 RGB
    write_npz(root / "grey.npz", n=400)                         # 8x8 grey
    write_csv(root / "table.csv", n=600)                        # 16 features
    return {
        "rgb": "folder:rgb", "npz": "npz:grey.npz", "csv": "csv:table.csv",
        "three": "npz:three.npz", "six": "npz:six.npz", "many": "csv:many.csv",
        "root": root, "vars": cache_env(cache, share=("lrt",)),
    }


def _run(env, *args):
    return insitu_cli(*args, env=env["vars"], timeout=120, cwd=env["root"])


def _json(env, *args) -> dict:
    run = _run(env, *args)
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout)


def _refused(env, tmp_path, *args) -> str:
    cache = tmp_path / "cache"
    run = insitu_in_process(*args, env=cache_env(cache), cwd=env["root"])
    assert run.returncode == 2, (run.returncode, run.stderr[-3000:])
    assert "Traceback" not in run.stderr and run.stdout.strip() == ""
    assert not cache.exists() or not any(cache.rglob("*.npz"))      # nothing pre-trained or converted
    return run.stderr


# ------------------------------------------------------------------------------ lrt adapt

@pytest.mark.parametrize("kind,args", [
    ("rgb", ("--env", "shift", "--model", "cnn")),
    ("npz", ("--env", "control", "--model", "cnn")),
    ("csv", ("--env", "shift", "--model", "mlp")),
])
def test_lrt_adapt_on_own_files(env, kind, args):
    result = _json(env, *ADAPT, *args, "--dataset", env[kind])
    assert result["dataset"] == env[kind] and result["samples"] == 200
    # Well above chance (0.1) after a 200-sample pre-training, on 10 classes:
    assert result["pretrained_validation_accuracy"] > 0.3 and result["online_accuracy"] > 0.3
    assert result["layers"]["fc2"]["cells"] == 10 * (64 if "cnn" in args else 128)   # 10 classes
    if kind == "csv":                 # vectors are shifted by clustering and noise only
        assert {a for s in result["segments"] for a in s["augmentations"]} == {"CD", "WN"}


@pytest.mark.parametrize("kind,args,messages", [
    ("csv", ("--model", "cnn"), ["--model cnn", "--dataset {} holds feature vectors (16,)", "--model mlp"]),
    ("six", ("--model", "cnn"), ["at least 8x8", "--dataset {} has 6x6", "resample"]),
    ("three", ("--model", "mlp"), ["--rank 4 is too large for layer fc2 (3 x 128)",
                                   "3 outputs are the dataset's classes"]),
], ids=["cnn-on-features", "cnn-on-6x6", "rank-vs-3-classes"])
def test_lrt_adapt_refuses_what_the_network_cannot_take(env, tmp_path, kind, args, messages):
    stderr = _refused(env, tmp_path, *ADAPT, "--env", "control", *args, "--dataset", env[kind])
    for message in messages:
        assert message.format(env[kind]) in stderr, (message, stderr)


# ------------------------------------------------------------------------------ train --algo lrt

@pytest.mark.parametrize("board", ["ultra96v2-sim", "zedboard-sim"])
def test_train_lrt_on_the_twins_on_a_table(env, board):
    result = _json(env, "train", "--algo", "lrt", "--board", board, "--model", "mlp", "--dataset",
                   env["csv"], "--samples", "300", "--test-samples", "100", "--lr", "0.1",
                   "--batch-size", "50", "--json")
    assert result["dataset"] == env["csv"] and result["layer_shape"] == [10, 128]
    assert result["accuracy"] > 0.3 and result["max_writes_per_cell"] > 0     # measured 0.59; chance 0.1
    assert result["executor"] == "twin-fast" and result["pl_cycles"] > 0


@pytest.mark.parametrize("kind,args,messages", [
    ("csv", ("--model", "cnn"), ["--model cnn", "--dataset {} holds feature vectors"]),
    ("many", ("--model", "mlp"), ["130 classes x 128", "at most 128 classes"]),
    ("three", ("--model", "mlp"), ["rank 4 is too large for the 3 classes", "--rank 2 or lower"]),
], ids=["cnn-on-features", "130-classes", "rank-vs-3-classes"])
def test_train_lrt_refuses_what_the_pe_cannot_take_before_pretraining(env, tmp_path, kind, args, messages):
    stderr = _refused(env, tmp_path, "train", "--algo", "lrt", *args, "--dataset", env[kind], "--samples", "8",
                      "--test-samples", "8", "--json")
    assert "pre-training" not in stderr
    for message in messages:
        assert message.format(env[kind]) in stderr, (message, stderr)


# ------------------------------------------------------------------------------ e2train

def test_e2train_on_rgb_images_as_three_channels(env):
    result = _json(env, *E2_TINY, "--dataset", env["rgb"], "--train-size", "200",
                   "--test-samples", "50", "--downsample", "1", "--techniques", "smd,slu,psg")
    assert result["config"]["dataset"] == env["rgb"] and result["config"]["downsample"] == 1
    assert result["baseline_accuracy"] > 0.5 and 0 < result["energy_saving"] < 1
    assert {r["row"] for r in result["rows"]} == {"sgd32", "smd+slu+psg"}


def test_e2train_on_a_grey_npz(env):
    result = _json(env, *E2_TINY, "--dataset", env["npz"], "--train-size", "400",
                   "--test-samples", "100", "--downsample", "1", "--techniques", "psg")
    assert result["baseline_accuracy"] > 0.5 and result["row"] == "psg"


def test_e2train_refuses_features(env, tmp_path):
    stderr = _refused(env, tmp_path, *E2_TINY, "--dataset", env["csv"])
    assert f"ResNet takes images, and --dataset {env['csv']} holds feature vectors" in stderr

"""The TT training experiment: config validation, short runs of two variants, the report and figure."""

import functools
import math

import numpy as np
import pytest
from own_data import write_npz

from insitu.data.datasets import FASHION_MNIST_DIR
from insitu.errors import InsituError
from insitu.tt.report import PAPER_TABLE1, format_table, plot_history
from insitu.tt.experiment import (VARIANTS, TTTrainConfig, dense_memory_bits, learning_rate,
                             run_tt_training)

pytestmark = pytest.mark.unit

needs_fashion = pytest.mark.skipif(
    not (FASHION_MNIST_DIR / "train-images-idx3-ubyte.gz").is_file(),
    reason=f"FashionMNIST not installed in {FASHION_MNIST_DIR} (apt-get install dataset-fashion-mnist)")


@pytest.mark.parametrize("changes,option", [
    ({"variant": "sparse"}, "--variant"),
    ({"epochs": 0}, "--epochs"),
    ({"epochs": 1.5}, "--epochs"),
    ({"batch_size": 0}, "--batch-size"),
    ({"rank": True}, "--rank"),
    ({"train_samples": 0}, "--train-size"),
    ({"eval_train_samples": -1}, "eval_train_samples"),      # no option sets it
    ({"lr": 0.0}, "--lr"),
    ({"lr": -1e-3}, "--lr"),
    ({"lr": math.nan}, "--lr"),
    ({"prune_threshold": 1.0}, "--prune-threshold"),
    ({"prune_threshold": -0.01}, "--prune-threshold"),
    ({"prior_weight": -1.0}, "--prior-weight"),
    ({"prior_weight": math.inf}, "--prior-weight"),
    ({"lr_schedule": "step"}, "--lr-schedule"),
])
def test_validate_names_the_bad_option(changes, option):
    config = TTTrainConfig(**changes)
    with pytest.raises(ValueError, match=option):
        config.validate()


def test_validate_accepts_the_defaults_and_every_variant():
    for variant in VARIANTS:
        TTTrainConfig(variant=variant).validate()
    TTTrainConfig(prune_threshold=0.0, prior_weight=0.0, train_samples=1).validate()
    assert set(VARIANTS) == set(PAPER_TABLE1)


def test_unknown_variant_message_lists_the_choices():
    with pytest.raises(ValueError, match="unknown --variant 'sparse'; choose one of dense, float"):
        TTTrainConfig(variant="sparse").validate()


def test_cosine_schedule_anneals_from_lr_to_zero():
    config = TTTrainConfig(lr=0.002, epochs=4)
    assert learning_rate(config, 0) == 0.002
    assert learning_rate(config, 2) == pytest.approx(0.001)
    assert learning_rate(config, 4) == pytest.approx(0.0, abs=1e-15)
    constant = TTTrainConfig(lr=0.002, epochs=4, lr_schedule="constant")
    assert learning_rate(constant, 0) == learning_rate(constant, 3.5) == 0.002


def test_run_validates_before_loading_data():
    with pytest.raises(ValueError, match="epochs"):
        run_tt_training(TTTrainConfig(epochs=0, dataset="no-such-dataset"))


def test_dense_memory_is_the_vanilla_network_in_32_bit_floats():
    # 896 x 512 + 512 and 512 x 16 + 16 weights and biases.
    assert dense_memory_bits() == 467472 * 32 == (896 * 512 + 512 + 512 * 16 + 16) * 32


# Each run trains on 256 samples for one epoch and evaluates 200 training and 500 test samples
# (the network is FashionMNIST's: its --data-dir holds the first 2,000 training and 500 test
# samples; the inference passes, on the golden-model PEs for fixed-prior, are most of a run's
# time). A constant learning rate: cosine annealing would spend half of the only epoch at a
# small rate.
_RUN = {"train_samples": 256, "epochs": 1, "eval_train_samples": 200, "lr_schedule": "constant",
        "lr": 0.003}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    from insitu.data import load_dataset
    from insitu.data.idx import write_idx

    full, folder = load_dataset("fashion-mnist"), tmp_path_factory.mktemp("fashion-subset")
    for prefix, images, labels in (("train", full.x_train[:2000], full.y_train[:2000]),
                                   ("t10k", full.x_test[:500], full.y_test[:500])):
        write_idx(folder / f"{prefix}-images-idx3-ubyte", images)
        write_idx(folder / f"{prefix}-labels-idx1-ubyte", labels.astype(np.uint8))
    return {v: run_tt_training(TTTrainConfig(variant=v, data_dir=str(folder), **_RUN))
            for v in ("float", "fixed-prior")}


@needs_fashion
@pytest.mark.parametrize("variant", ["float", "fixed-prior"])
def test_short_run_returns_the_documented_record(results, variant):
    r = results[variant]
    for key in ("test_accuracy", "train_accuracy", "parameters", "memory_bits", "memory_reduction",
                "ranks", "history", "variant", "config", "best_test_accuracy", "best_epoch",
                "dense_memory_bits", "epochs", "train_samples", "seconds"):
        assert key in r, key
    assert r["variant"] == variant and r["epochs"] == 1 and r["train_samples"] == 256
    assert r["config"]["variant"] == variant and r["config"]["eval_train_samples"] == 200
    assert r["test_accuracy"] > 0.2 and r["train_accuracy"] > 0.2          # chance is 0.1
    assert 0 <= r["test_accuracy"] <= 1 and 0 <= r["train_accuracy"] <= 1
    assert r["dense_memory_bits"] == dense_memory_bits()
    assert r["memory_reduction"] == pytest.approx(dense_memory_bits() / r["memory_bits"])
    assert len(r["ranks"]) == 2 and r["ranks"][0][0] == r["ranks"][0][-1] == 1
    (record,) = r["history"]
    assert record["epoch"] == 1 and math.isfinite(record["loss"])
    assert record["test_accuracy"] == r["test_accuracy"] and record["ranks"] == r["ranks"]
    assert r["best_epoch"] == 1 and r["best_test_accuracy"] == r["test_accuracy"]


@needs_fashion
def test_short_runs_have_the_variants_sizes(results):
    float_run, fixed_run = results["float"], results["fixed-prior"]
    assert float_run["ranks"] == [[1, 16, 16, 16, 1], [1, 16, 1]]
    assert float_run["parameters"] == 14800 and float_run["memory_bits"] == 14800 * 32
    assert float_run["memory_reduction"] == pytest.approx(31.59, abs=0.01)   # paper: 31.4x
    assert "prior" not in float_run["history"][0]
    # fixed-prior: 4-bit factors, and what pruning did after the epoch is in the record.
    record = fixed_run["history"][0]
    assert fixed_run["memory_bits"] < fixed_run["parameters"] * 8
    assert fixed_run["memory_reduction"] >= 243.9                          # paper: 243x unpruned
    assert math.isfinite(record["prior"]) and record["pruned_ranks"] >= 0
    removed = sum(16 - r for layer in (fixed_run["ranks"][0][1:-1], fixed_run["ranks"][1][1:-1])
                  for r in layer)
    assert removed == record["pruned_ranks"]
    assert [[len(c) for c in layer] for layer in record["lambda_ratios"]] == \
        [list(layer[1:-1]) for layer in fixed_run["ranks"]]
    for layer in record["lambda_ratios"]:
        for core in layer:
            assert max(core) == 1.0 and min(core) >= 0.01 - 1e-5


@needs_fashion
def test_format_table_and_plot_history_take_the_results(results, tmp_path):
    rows = [results["float"], results["fixed-prior"]]
    table = format_table(rows).splitlines()
    assert table[0].split()[:3] == ["variant", "train", "acc"]
    assert len(table) == 4 and set(table[1]) == {"-"}
    assert table[2].startswith("float ") and table[3].startswith("fixed-prior ")
    assert f"{results['float']['test_accuracy']:.4f}" in table[2]
    assert "0.8803" in table[2] and "31.4x" in table[2]                  # the paper's figures
    assert "0.8486" in table[3] and "292.0x" in table[3]
    png = plot_history(rows, tmp_path / "sub" / "tt.png")
    assert png == tmp_path / "sub" / "tt.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_history_needs_results(tmp_path):
    with pytest.raises(ValueError, match="no results"):
        plot_history([], tmp_path / "tt.png")
    assert not (tmp_path / "tt.png").exists()


def test_format_table_of_the_dense_variant_shows_no_paper_reduction():
    row = {"variant": "dense", "train_accuracy": 0.9, "test_accuracy": 0.89, "parameters": 467472,
           "memory_bits": 467472 * 32, "memory_reduction": 1.0, "epochs": 10, "seconds": 12.0}
    line = format_table([row]).splitlines()[2]
    assert "n/a" in line and "0.8927" in line and "467472" in line


class _Interrupted(Exception):
    pass


def _interrupt_after_epoch(n):
    def on_epoch(record):
        if record["epoch"] == n:
            raise _Interrupted
    return on_epoch


@pytest.mark.parametrize("variant", ["fixed-prior", "dense"])
def test_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path, variant):
    """Interrupted after epoch 1 and resumed: the same history (pruning included) as 3 in a row.

    On 128 digits (32 test samples: the evaluations and the curve's probes, on the golden-model
    PEs for fixed-prior, would otherwise be most of the time), three steps an epoch."""
    data = write_npz(tmp_path / "digits.npz", n=128)
    config = TTTrainConfig(variant=variant, epochs=3, train_samples=96, eval_train_samples=48,
                           batch_size=32, prune_threshold=0.5, prior_weight=50.0,
                           dataset=f"npz:{data}")
    straight = run_tt_training(config)
    if variant == "fixed-prior":                  # the prior prunes, so the resume carries it
        assert straight["history"][0]["pruned_ranks"] > 0, straight["history"]
    ck = tmp_path / "run.npz"
    with pytest.raises(_Interrupted):
        run_tt_training(config, checkpoint=ck, on_epoch=_interrupt_after_epoch(1))
    resumed = run_tt_training(config, checkpoint=ck)

    def strip(history):
        return [{k: v for k, v in r.items() if k != "seconds"} for r in history]

    assert strip(resumed["history"]) == strip(straight["history"])
    assert resumed["ranks"] == straight["ranks"]
    # Asking a finished checkpoint for fewer epochs is refused; with a constant learning rate the
    # epoch budget may grow (a cosine schedule depends on it, so there it is part of the run).
    with pytest.raises(InsituError, match="belongs to another run"):
        run_tt_training(TTTrainConfig(**{**config.__dict__, "epochs": 4}), checkpoint=ck)


def test_constant_rate_run_continues_for_more_epochs(tmp_path):
    config = functools.partial(TTTrainConfig, variant="float", train_samples=64, eval_train_samples=64,
                               lr_schedule="constant", dataset="digits")
    ck = tmp_path / "run.npz"
    run_tt_training(config(epochs=2), checkpoint=ck)
    longer = run_tt_training(config(epochs=3), checkpoint=ck)
    assert [r["epoch"] for r in longer["history"]] == [1, 2, 3]
    with pytest.raises(InsituError, match="already 3 epochs in"):
        run_tt_training(config(epochs=2), checkpoint=ck)


def test_checkpoint_of_another_run_is_refused(tmp_path):
    ck = tmp_path / "run.npz"
    config = functools.partial(TTTrainConfig, variant="float", train_samples=64, eval_train_samples=64, epochs=1,
                               dataset="digits")
    run_tt_training(config(), checkpoint=ck)
    with pytest.raises(InsituError, match="belongs to another run"):
        run_tt_training(config(lr=0.01), checkpoint=ck)


@needs_fashion
def test_more_train_samples_than_the_dataset_is_an_error():
    with pytest.raises(ValueError, match="exceeds the 60000 training samples"):
        run_tt_training(TTTrainConfig(variant="float", train_samples=70_000))


# ------------------------------------------------------------------ the network's inputs

def _shapes():
    """digits (8x8 grey) for the paper network and the tiny one (which pools 2x2), and brought to
    12x12 RGB (rows padded): every step of the conversion."""
    from insitu.data import load_dataset
    from insitu.tt.network import fit_input, tt_shape

    digits = load_dataset("digits")
    for model, data in (("paper", digits), ("tiny", digits), ("paper", fit_input(digits, (12, 12, 3)))):
        yield data, tt_shape(data.sample_shape, data.num_classes, model=model, rank=16, batch=32)


def test_network_inputs_convert_the_rows_asked_for_as_the_whole_split_would():
    from insitu.tt.experiment import network_inputs

    rng = np.random.default_rng(1)
    for data, shape in _shapes():
        x_train, y_train, x_test, y_test = network_inputs(data, shape)
        assert np.array_equal(y_train, data.y_train) and np.array_equal(y_test, data.y_test)
        for split, lazy in (("train", x_train), ("test", x_test)):
            whole = shape.vectors(data.float_images(split, np.float64))
            assert len(lazy) == len(whole) and np.array_equal(lazy[:], whole)
            for index in (slice(0, 250), slice(250, 500), slice(len(whole) - 1, None), np.array([3]),
                          rng.permutation(len(whole))[:64]):
                got = lazy[index]
                assert got.dtype == np.float64 and np.array_equal(got, whole[index]), (split, index)
            pick = rng.permutation(len(whole))[:100]
            subset = lazy.subset(pick)
            assert len(subset) == 100 and np.array_equal(subset[10:60], whole[pick][10:60])
            assert np.array_equal(subset.subset(slice(5))[[4, 0]], whole[pick[[4, 0]]])


def test_a_run_on_network_inputs_is_the_run_on_the_converted_split():
    """The loop, its evaluation and the curve's probe take the inputs as they took the converted
    arrays: the same losses, curve, history and weights (fixed-prior: pruning included)."""
    from insitu.harness import RunPlan, run_training
    from insitu.tt.experiment import Model, TTLearner, accuracy, curve_probe, network_inputs

    data, shape = next(_shapes())
    config = TTTrainConfig(variant="fixed-prior", batch_size=32, lr=3e-3, lr_schedule="constant",
                           prune_threshold=0.5, prior_weight=50.0)
    lazy_train, y_train, lazy_test, y_test = network_inputs(data, shape)
    pick = np.random.default_rng(0).permutation(len(y_train))[:64]
    eager_train = shape.vectors(data.float_images("train", np.float64))[pick]
    eager_test = shape.vectors(data.float_images("test", np.float64))

    def run(x, x_test):
        model = Model(config, len(x), shape.layers, classes=shape.classes)
        learner = TTLearner(model, x, y_train[pick], config.seed)
        plan = RunPlan("test", {}, 2 * len(x), config.batch_size, epoch_size=len(x),
                       evaluate_every_epoch=True)
        outcome = run_training(plan, learner, end_of_epoch=learner.end_of_epoch,
                               evaluate=lambda: {"test_accuracy": accuracy(model, x_test, y_test)},
                               probe=curve_probe(model, x_test, y_test))
        return outcome, learner.state()

    (lazy, (lazy_arrays, lazy_meta)), (eager, (eager_arrays, eager_meta)) = \
        run(lazy_train.subset(pick), lazy_test), run(eager_train, eager_test)
    assert lazy.losses == eager.losses and lazy.curve == eager.curve and lazy_meta == eager_meta
    strip = [{k: v for k, v in r.items() if k != "seconds"} for r in lazy.history]
    assert strip == [{k: v for k, v in r.items() if k != "seconds"} for r in eager.history]
    assert lazy.history[0]["pruned_ranks"] > 0
    assert lazy_arrays.keys() == eager_arrays.keys()
    for key, value in lazy_arrays.items():
        np.testing.assert_array_equal(value, eager_arrays[key], err_msg=key)

"""E²-Train rows on the run harness: a row interrupted by Ctrl-C and resumed from its checkpoint
ends exactly where an uninterrupted row does (history, counted energy, accuracy), SMD's drops
follow the batch index, and an experiment resumes its row in progress from ``--out``."""

import os
import signal

import numpy as np
import pytest

from insitu import nn
from insitu.e2train import experiment
from insitu.e2train.experiment import Data, E2Config, smd_drops, train_row
from insitu.harness import Interrupted

pytestmark = pytest.mark.unit

CONFIG = E2Config(epochs=2, batch_size=32, train_samples=200, test_samples=64, width=4,
                  blocks_per_stage=1)


def tiny_data(config: E2Config = CONFIG) -> Data:
    """Random 14x14 images whose class is the quadrant of their brightest pixel (learnable)."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((config.train_samples + config.test_samples, 1, 14, 14)).astype(np.float32)
    brightest = x.reshape(len(x), -1).argmax(axis=1)
    y = (2 * (brightest // 14 >= 7) + (brightest % 14 >= 7)).astype(np.int64)
    n = config.train_samples
    return Data(x[:n], y[:n], x[n:], y[n:], num_classes=4)


def interrupt_after(monkeypatch, position: int, techniques: tuple[str, ...]) -> None:
    """Ctrl-C from inside the training step of row ``techniques`` that starts at ``position``."""
    train = experiment.E2Learner.train

    def train_then_interrupt(self, start, count):
        loss = train(self, start, count)
        if start == position and self.techniques == techniques:
            os.kill(os.getpid(), signal.SIGINT)
        return loss

    monkeypatch.setattr(experiment.E2Learner, "train", train_then_interrupt)


def without_timings(result: dict) -> dict:
    return {k: v for k, v in result.items() if k not in ("train_seconds", "resumed_from")} | {
        "history": [{k: v for k, v in h.items() if k != "seconds"} for h in result["history"]]}


@pytest.mark.parametrize("techniques", [(), ("smd", "slu", "psg")], ids=["sgd32", "all-three"])
def test_an_interrupted_row_resumes_to_the_uninterrupted_result(tmp_path, monkeypatch, techniques):
    data = tiny_data()
    whole = train_row(CONFIG, techniques, data)
    checkpoint = tmp_path / "row.ckpt.npz"
    interrupt_after(monkeypatch, 232, techniques)   # the second epoch's second mini-batch
    with pytest.raises(Interrupted, match="after 264 of"):
        train_row(CONFIG, techniques, data, checkpoint=checkpoint)
    monkeypatch.undo()
    said = []
    resumed = train_row(CONFIG, techniques, data, checkpoint=checkpoint, say=said.append)
    assert said == [f"resumed from {checkpoint} at 264 samples"] and resumed["resumed_from"] == 264
    assert without_timings(resumed) == without_timings(whole)
    assert [h["epoch"] for h in whole["history"]] == list(range(1, whole["epochs"] + 1))
    assert whole["counted"]["energy_j"] == whole["history"][-1]["energy_j"] > 0


def test_every_point_of_the_curve_has_the_loss_and_both_accuracies():
    data = tiny_data()
    row = train_row(CONFIG, ("slu", "psg"), data)
    curve = row["curve"]
    assert len(curve) == 14 and curve[-1]["samples"] == 400     # a point a step (7 an epoch)
    for point in curve:
        assert point["loss"] > 0 and 0 <= point["train_accuracy"] <= 1 and 0 <= point["test_accuracy"] <= 1
        assert point["energy_j"] > 0
    ends = {h["samples"]: h["test_accuracy"] for h in row["history"]}
    assert [p["test_accuracy"] for p in curve if p["samples"] in ends] == list(ends.values())
    # SMD: a point whose mini-batches were all dropped trained nothing: no loss, no training
    # accuracy; the others have both, over the samples of the batches trained.
    smd = train_row(CONFIG, ("smd",), data)
    trained = [p for p in smd["curve"] if p["loss"] is not None]
    assert 0 < len(trained) < len(smd["curve"])
    assert all(0 <= p["train_accuracy"] <= 1 for p in trained)
    assert all("train_accuracy" not in p for p in smd["curve"] if p["loss"] is None)
    assert all(0 <= p["test_accuracy"] <= 1 for p in smd["curve"])


def test_smd_drops_follow_the_batch_index_and_count_in_the_schedule():
    config = E2Config(smd_p=0.5, seed=3)
    drops = [smd_drops(config, b) for b in range(400)]
    assert drops == [smd_drops(config, b) for b in range(400)]
    assert 150 < sum(drops) < 250
    assert drops != [smd_drops(E2Config(smd_p=0.5, seed=4), b) for b in range(400)]
    row = train_row(CONFIG, ("smd",), tiny_data())
    batches_per_epoch = -(-CONFIG.train_samples // CONFIG.batch_size)
    assert row["batches"] == row["epochs"] * batches_per_epoch
    assert row["dropped_batches"] == sum(smd_drops(CONFIG, b) for b in range(row["batches"]))
    assert row["steps"] == row["batches"] - row["dropped_batches"]


def test_an_experiment_resumes_its_row_in_progress(tmp_path, monkeypatch):
    monkeypatch.setattr(experiment, "load_data", lambda config: tiny_data(config))
    rows = [("psg",)]
    whole = experiment.run_experiment(CONFIG, rows, tmp_path / "whole")
    out = tmp_path / "stopped"
    interrupt_after(monkeypatch, 264, ("psg",))     # in the PSG row, after the baseline
    with pytest.raises(Interrupted):
        experiment.run_experiment(CONFIG, rows, out)
    (checkpoint,) = (out / "rows").glob("psg-*.ckpt.npz")
    monkeypatch.undo()
    monkeypatch.setattr(experiment, "load_data", lambda config: tiny_data(config))
    said = []
    resumed = experiment.run_experiment(CONFIG, rows, out, log=said.append)
    assert said == ["sgd32: reusing " + str(next((out / "rows").glob("sgd32-*.json"))),
                    f"psg: resumed from {checkpoint} at 296 samples"]
    assert not checkpoint.exists() and len(list((out / "rows").glob("*.json"))) == 2
    for name in ("sgd32", "psg"):
        assert without_timings(resumed["runs"][name]) == without_timings(whole["runs"][name])

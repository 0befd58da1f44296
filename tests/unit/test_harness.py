"""The run harness: resume, refusals, interrupts, divergence, phases and what `seconds` counts."""

from __future__ import annotations

import json
import os
import signal
import warnings

import numpy as np
import pytest

from insitu.checkpoint import load_checkpoint, save_checkpoint
from insitu.errors import InsituError
from insitu.harness import Diverged, Interrupted, RunPlan, run_training, sample_order
from insitu.measure.phases import PHASE_ENV, read_markers

pytestmark = pytest.mark.unit


class Counter:
    """A learner whose state is the positions it trained on; its loss is 1 / (1 + position)."""

    def __init__(self, on_step=None, loss=None):
        self.seen: list[int] = []
        self.on_step, self.loss = on_step, loss

    def train(self, start, count):
        self.seen.extend(range(start, start + count))
        if self.on_step:
            self.on_step(start)
        return self.loss(start) if self.loss else 1.0 / (1 + start)

    def state(self):
        return {"seen": np.array(self.seen, np.int64)}, {"n": len(self.seen)}

    def load_state(self, arrays, meta):
        assert meta["n"] == len(arrays["seen"])
        self.seen = arrays["seen"].tolist()


def plan(tmp_path=None, **kw):
    args = dict(command="test", identity={"seed": 0, "lr": 0.1}, samples=100, step=8,
                checkpoint=tmp_path / "c.npz" if tmp_path else None, checkpoint_every=24)
    return RunPlan(**{**args, **kw})


def test_a_resumed_run_ends_where_an_uninterrupted_one_does(tmp_path):
    straight = Counter()
    whole = run_training(plan(), straight)
    first = Counter()
    run_training(plan(tmp_path, samples=40), first)
    said = []
    again = Counter()
    out = run_training(plan(tmp_path), again, say=said.append)
    assert again.seen == straight.seen == list(range(100))
    assert (out.samples, out.resumed_from, whole.resumed_from) == (100, 40, None)
    assert out.losses == whole.losses and said == [f"resumed from {tmp_path / 'c.npz'} at 40 samples"]


def test_a_checkpoint_of_another_run_names_the_fields_that_differ(tmp_path):
    run_training(plan(tmp_path, samples=16), Counter())
    with pytest.raises(InsituError, match=r"belongs to another run \(lr 0.1 there, 0.2 here\)"):
        run_training(plan(tmp_path, identity={"seed": 0, "lr": 0.2}), Counter())


def test_a_budget_below_the_checkpoint_is_refused_not_reprinted(tmp_path):
    run_training(plan(tmp_path, samples=48), Counter())
    with pytest.raises(InsituError, match="already 48 samples in: ask for --samples 48 or more"):
        run_training(plan(tmp_path, samples=40), Counter())
    with pytest.raises(InsituError, match="already 3 epochs in: ask for --epochs 3 or more"):
        run_training(plan(tmp_path, samples=32, epoch_size=16, samples_option="--epochs"), Counter())


def test_a_file_that_is_not_a_run_checkpoint_is_named_as_such(tmp_path):
    save_checkpoint(tmp_path / "c.npz", {"w": np.zeros(2)}, {"something": "else"})
    with pytest.raises(InsituError, match="is not a checkpoint of test"):
        run_training(plan(tmp_path), Counter())


def test_sigint_writes_the_checkpoint_and_exits_130(tmp_path):
    # What the run found (Python's default handler, or SIG_IGN where a shell started the tests in
    # the background) is what it leaves.
    before = signal.getsignal(signal.SIGINT)
    learner = Counter(on_step=lambda start: start == 32 and os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(Interrupted, match="SIGINT after 40 of 100 samples; checkpoint") as info:
        run_training(plan(tmp_path, checkpoint_every=1000), learner)
    assert info.value.exit_code == 130
    _, meta = load_checkpoint(tmp_path / "c.npz")
    assert meta["run"]["samples_done"] == 40 and meta["learner"]["n"] == 40
    assert signal.getsignal(signal.SIGINT) is before                          # restored


def test_sigterm_without_a_checkpoint_says_the_work_is_lost_and_exits_143():
    learner = Counter(on_step=lambda start: start == 8 and os.kill(os.getpid(), signal.SIGTERM))
    with pytest.raises(Interrupted, match="SIGTERM after 16 of 100 samples; no --checkpoint") as info:
        run_training(plan(), learner)
    assert info.value.exit_code == 143          # 128 + 15, as a shell reports a SIGTERM


def test_a_nan_loss_stops_the_run():
    with pytest.raises(Diverged, match="the loss is nan after 24 samples"):
        run_training(plan(), Counter(loss=lambda start: np.nan if start == 16 else 1.0))


def test_epochs_end_on_their_boundary_and_are_evaluated(tmp_path):
    ends = []
    out = run_training(plan(tmp_path, samples=50, step=16, epoch_size=20, evaluate_every_epoch=True),
                       learner := Counter(), end_of_epoch=lambda e: ends.append(e) or {"pruned": e},
                       evaluate=lambda: {"accuracy": 0.5})
    assert ends == [1, 2] and learner.seen == list(range(50))
    assert [(h["epoch"], h["samples"], h["pruned"], h["accuracy"]) for h in out.history] == \
        [(1, 20, 1, 0.5), (2, 40, 2, 0.5)]
    assert out.evaluation == {"accuracy": 0.5}


def test_phases_mark_training_and_testing_only(tmp_path, monkeypatch):
    markers = tmp_path / "phases.jsonl"
    monkeypatch.setenv(PHASE_ENV, str(markers))
    run_training(plan(samples=20), Counter(), evaluate=lambda: {})
    got = read_markers(markers)
    names = [(m["phase"], m["event"]) for m in got]
    assert names[:2] == [("train", "start"), ("train", "stop")] and names[-2:] == [("test", "start"), ("test", "stop")]
    assert sum(m["samples"] for m in got if m["phase"] == "train" and m["event"] == "stop") == 20
    assert json.dumps(got)                                       # plain JSON records


def test_the_sample_stream_regenerates_any_position():
    whole = sample_order(50, 3, 0, 130)
    assert np.array_equal(np.concatenate([sample_order(50, 3, 0, 77), sample_order(50, 3, 77, 53)]), whole)
    assert sorted(whole[:50]) == list(range(50)) and not np.array_equal(whole[:50], whole[50:100])


def test_a_learner_that_keeps_its_own_state_resumes_where_it_stands():
    said = []
    learner = Counter(on_step=lambda start: start == 40 and os.kill(os.getpid(), signal.SIGINT))
    with pytest.raises(Interrupted, match="the device's flash keeps the state"):
        run_training(plan(kept_by="the device's flash", resume_at=32), learner, say=said.append)
    assert learner.seen == list(range(32, 48)) and said == ["resumed from the device's flash at 32 samples"]
    with pytest.raises(InsituError, match="the device's flash is already 120 samples in"):
        run_training(plan(kept_by="the device's flash", resume_at=120), Counter())


def test_a_resumed_epoch_keeps_its_losses_and_the_last_epoch_is_evaluated_once(tmp_path):
    calls = []

    def evaluate():
        calls.append(1)
        return {"accuracy": len(calls)}

    epochs = dict(samples=40, step=8, epoch_size=20, evaluate_every_epoch=True)
    whole = run_training(plan(**epochs), Counter(), evaluate=evaluate)
    assert len(calls) == 2 and whole.evaluation == {"accuracy": 2}
    run_training(plan(tmp_path, **{**epochs, "samples": 28}), Counter(), evaluate=evaluate)
    resumed = run_training(plan(tmp_path, **epochs), Counter(), evaluate=evaluate)
    assert [h["loss"] for h in resumed.history] == [h["loss"] for h in whole.history]


def test_consecutive_steps_are_one_training_phase_between_evaluations(tmp_path, monkeypatch):
    markers = tmp_path / "phases.jsonl"
    monkeypatch.setenv(PHASE_ENV, str(markers))
    run_training(plan(samples=40, step=4, epoch_size=20, evaluate_every_epoch=True), Counter(),
                 evaluate=lambda: {})
    got = [(m["phase"], m["event"], m["samples"]) for m in read_markers(markers)]
    assert got == [("train", "start", None), ("train", "stop", 20), ("test", "start", None),
                   ("test", "stop", None)] * 2


class Scoring(Counter):
    """A Counter that counts a right prediction at every even position (its training accuracy 0.5)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.correct = 0

    def train(self, start, count):
        self.correct += sum(1 for p in range(start, start + count) if p % 2 == 0)
        return super().train(start, count)


def test_the_curve_has_regular_points_with_losses_accuracies_and_probes():
    probes = []
    out = run_training(plan(curve_every=16), Scoring(),
                       probe=lambda: probes.append(1) or {"test_accuracy": 0.25})
    assert [p["samples"] for p in out.curve] == [16, 32, 48, 64, 80, 96, 100] and len(probes) == 7
    assert out.curve[0]["loss"] == pytest.approx(np.mean([1.0, 1.0 / 9]))   # the steps at 0 and 8
    assert all(p["train_accuracy"] == 0.5 and p["test_accuracy"] == 0.25 for p in out.curve)
    assert out.record()["curve"] == out.curve
    default = run_training(plan(samples=1000), Counter())      # about CURVE_POINTS points
    assert 15 <= len(default.curve) <= 21 and default.curve[-1]["samples"] == 1000


def test_a_resumed_run_has_the_whole_curve_of_an_uninterrupted_one(tmp_path):
    whole = run_training(plan(curve_every=24), Scoring())
    run_training(plan(tmp_path, samples=40, curve_every=24), Scoring())
    again = run_training(plan(tmp_path, curve_every=24), Scoring())
    assert again.curve == whole.curve and again.resumed_from == 40


def test_a_finished_run_run_again_keeps_its_last_point(tmp_path):
    first = run_training(plan(tmp_path, samples=50, curve_every=21), Scoring())
    assert len(first.curve) >= 2 and first.curve[-1]["samples"] == 50
    for _ in range(2):                   # nothing left to run, twice: the checkpoint keeps it too
        again = run_training(plan(tmp_path, samples=50, curve_every=21), Scoring())
        assert again.curve == first.curve and again.resumed_from == 50


def test_epoch_evaluations_are_points_of_the_curve(tmp_path):
    out = run_training(plan(epoch_size=32, evaluate_every_epoch=True, curve_every=1000), Counter(),
                       evaluate=lambda: {"accuracy": 0.75})
    assert [p["samples"] for p in out.curve] == [32, 64, 96, 100]
    assert all(p["test_accuracy"] == 0.75 for p in out.curve)


def test_progress_shows_the_live_loss_and_the_test_stage():
    notes = []

    def advance(n):
        pass
    advance.note = lambda **figures: notes.append(figures)
    run_training(plan(samples=16), Counter(), advance=advance, evaluate=lambda: {})
    assert notes[0] == {"loss": 1.0} and {"stage": "test"} in notes and notes[-1] == {"stage": "train"}


def test_an_evaluation_of_diverged_weights_prints_no_numpy_warning():
    """Weights a step left infinite make the probe overflow; the run reports the divergence once,
    at the next step's loss, without NumPy's RuntimeWarning (and its source path) before it."""
    losses = iter([1.0, np.inf])

    def probe():
        weights = np.array([np.inf, 1e308])
        return {"accuracy": float(np.mean(np.exp(weights) * 10 - weights))}

    with warnings.catch_warnings():
        warnings.simplefilter("error")                 # a RuntimeWarning would fail the test
        with pytest.raises(Diverged, match="the loss is inf after 16 samples"):
            run_training(plan(curve_every=8), Counter(loss=lambda start: next(losses)), probe=probe)


def test_a_complete_checkpoint_run_again_says_so_and_keeps_its_rate(tmp_path):
    first = run_training(plan(tmp_path, samples=48), Counter())
    said = []
    again = run_training(plan(tmp_path, samples=48), Counter(), say=said.append)
    assert said == [f"checkpoint {tmp_path / 'c.npz'} is already complete at 48 samples: nothing is "
                    "trained again (ask for more --samples to go on)"]
    assert again.samples_per_second == pytest.approx(48 / first.seconds)
    assert again.losses == first.losses and again.curve == first.curve


class Skipping(Counter):
    """Trains (and predicts every sample right) at every other step, skips the rest (SMD)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.correct = self.scored = 0

    def train(self, start, count):
        if start // 8 % 2:
            return None                      # a skipped step: nothing predicted, no loss
        self.correct += count
        self.scored += count
        return super().train(start, count)


def test_the_training_accuracy_is_over_the_samples_predicted_and_evaluations_keep_it():
    out = run_training(plan(curve_every=16), Skipping(), probe=lambda: {"test_accuracy": 0.25})
    assert all(p["train_accuracy"] == 1.0 for p in out.curve)      # not 0.5: half were skipped
    # An epoch's evaluation adds its test figures; the training loss and accuracy stay the
    # learner's (the evaluation's own training accuracy, say, is in the history).
    out = run_training(plan(epoch_size=32, evaluate_every_epoch=True, curve_every=16), Scoring(),
                       evaluate=lambda: {"accuracy": 0.75, "train_accuracy": 0.1, "loss": 9.0})
    ends = [p for p in out.curve if p["samples"] % 32 == 0]
    assert ends and all(p["test_accuracy"] == 0.75 and p["train_accuracy"] == 0.5 and p["loss"] < 1
                        for p in ends)
    assert out.history[0]["train_accuracy"] == 0.1

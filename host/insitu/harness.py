"""One run harness for every training command: the sample stream, checkpoints, interrupts, phases.

Every training command (``insitu train --algo sgd|tt|lrt|sparse``, ``insitu tt train``,
``insitu lrt adapt``, ``insitu e2train run``) is a :class:`Learner` driven by :func:`run_training`.
The learner supplies its training work, its state and its evaluation; the harness owns the rest,
so that every command behaves the same way:

* **the sample stream**: positions ``0 .. samples`` of an endless stream; the learner maps a
  position to a sample (:func:`sample_order` for a dataset: a fresh permutation per epoch, which any
  position regenerates, so a resumed run sees exactly the samples an uninterrupted one would);
* **checkpoints**: the learner's state plus the harness's (position, recent losses, history,
  the run's identity), written atomically every ``checkpoint_every`` positions, at epoch ends
  and at the end; a rerun with the same identity resumes from it and says so; a checkpoint of
  another run is refused naming the fields that differ;
* **interrupts**: SIGINT (Ctrl-C) or SIGTERM stops the run after the step in progress, writes the
  checkpoint when there is one, and exits 130 or 143 (:class:`Interrupted`);
* **phases**: ``train`` spans the training steps only and ``test`` the evaluations (the markers a
  power recorder aligns with its trace, :mod:`insitu.measure.phases`), and ``seconds`` counts the
  training steps only;
* **a curve**: at regular points (``curve_every`` positions, about :data:`CURVE_POINTS` over the
  budget) the mean training loss since the last point, the training accuracy when the learner
  counts its right predictions (``learner.correct``, over ``learner.scored`` samples where it
  predicts fewer than it trains: SMD's dropped batches) and a cheap test probe (``probe()``, a fixed
  subset of the test set), with the sample count; kept in checkpoints, so a resumed run's curve is
  whole;
* **progress**: ``advance(n)`` as positions are consumed (a resume advances to where it stands),
  and ``advance.note(loss=...)`` / ``advance.note(stage="test")`` where the progress shows figures
  (the live loss, what is being done);
* **a divergence** (a NaN or infinite loss) stops the run with a clear error.
"""

from __future__ import annotations

import json
import logging
import math
import signal
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, ContextManager, Protocol

import numpy as np

from insitu.checkpoint import load_checkpoint, save_checkpoint
from insitu.checks import check_int
from insitu.errors import InsituError
from insitu.io import check_writable, to_jsonable
from insitu.measure import phases
from insitu.runs import differences

#: Losses kept for the result's ``final_loss`` (their mean) and in checkpoints.
LOSS_WINDOW = 20
#: Points of a run's curve when the plan does not say how often.
CURVE_POINTS = 20
#: The checkpoint's format, in its metadata: a checkpoint without it was not written here.
FORMAT = "insitu-run/1"

log = logging.getLogger(__name__)


class Interrupted(InsituError):
    """The run was stopped by SIGINT or SIGTERM (after its checkpoint was written, if any); the
    exit status is the shell's for that signal: 128 + its number (130 SIGINT, 143 SIGTERM)."""

    exit_code = 128 + signal.SIGINT

    def __init__(self, message: str, signal_name: str = "SIGINT"):
        super().__init__(message)
        self.exit_code = 128 + signal.Signals[signal_name].value


class Diverged(InsituError):
    """The loss became NaN or infinite: the run cannot go on (a smaller learning rate may help)."""


class Learner(Protocol):
    """What a training method supplies to the harness."""

    def train(self, start: int, count: int) -> float | None:
        """Train on stream positions ``start .. start + count`` (one step); return its loss."""
        ...

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """``(arrays, meta)``: everything needed to go on from here (JSON-ready meta)."""
        ...

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Go on from a :meth:`state` of a learner built the same way."""
        ...


@dataclass
class RunPlan:
    """How to run a learner: the budget, the step, the checkpoint, the epochs and evaluations."""

    #: The command, for messages (``insitu train --algo tt``).
    command: str
    #: What makes two runs the same run: a checkpoint of one resumes the other. Not the budget,
    #: nor where files go or how often they are written.
    identity: dict
    #: Stream positions to train on (the sample budget).
    samples: int
    #: Positions per training step (the last step of the budget may be shorter).
    step: int
    checkpoint: str | Path | None = None
    #: Positions between checkpoints (also written at every epoch end and at the end).
    checkpoint_every: int = 10_000
    #: Positions per epoch: ``end_of_epoch`` runs when the stream crosses a multiple of it.
    epoch_size: int | None = None
    #: Evaluate (``evaluate``) at every epoch end, recording the history, not only at the end.
    evaluate_every_epoch: bool = False
    #: Name of the option that sets ``samples`` (for the "already N samples in" message).
    samples_option: str = "--samples"
    #: Where the learner keeps its own state instead of a checkpoint file (a device's flash), and
    #: the position that state is at: the run goes on from there.
    kept_by: str | None = None
    resume_at: int = 0
    #: Positions between the curve's points (None: about CURVE_POINTS over the budget, whole steps).
    curve_every: int | None = None

    def curve_interval(self) -> int:
        if self.curve_every is not None:
            return max(1, self.curve_every)
        steps = max(1, -(-self.samples // self.step))
        return max(1, -(-steps // CURVE_POINTS)) * self.step


@dataclass
class RunOutcome:
    """What the harness measured; the command adds its learner's figures to make the result."""

    samples: int
    resumed_from: int | None
    #: Seconds of training steps (this session plus those before a resume), no evaluation.
    seconds: float
    #: Positions trained per second of training in this session; a run with nothing left to
    #: train (complete already): the run's own rate; None when unknown.
    samples_per_second: float | None
    losses: list[float]
    #: One record per epoch end when evaluating every epoch: ``{"epoch", "samples", "loss", ...}``.
    history: list[dict] = field(default_factory=list)
    #: The final evaluation (``evaluate()`` after the last step), {} without one.
    evaluation: dict = field(default_factory=dict)
    #: ``{"samples", "loss", "train_accuracy", ...probe figures}`` at regular points of the run.
    curve: list[dict] = field(default_factory=list)

    @property
    def final_loss(self) -> float | None:
        return float(np.mean(self.losses[-LOSS_WINDOW:])) if self.losses else None

    def record(self) -> dict:
        """The harness's part of a result record."""
        return {"samples": self.samples, "resumed_from": self.resumed_from,
                "final_loss": self.final_loss, "seconds": self.seconds,
                "samples_per_second": self.samples_per_second, "curve": self.curve}


def sample_order(n_train: int, seed: int, start: int, count: int) -> np.ndarray:
    """Indices of training samples ``start .. start+count`` of the stream for ``seed``.

    The stream is a sequence of epochs, each a permutation drawn from ``(seed, epoch)``, so any
    position of it can be regenerated after a resume without replaying what came before.
    """
    out = []
    pos = start
    while pos < start + count:
        epoch, offset = divmod(pos, n_train)
        perm = np.random.default_rng([seed, epoch]).permutation(n_train)
        take = min(n_train - offset, start + count - pos)
        out.append(perm[offset:offset + take])
        pos += take
    return np.concatenate(out) if out else np.zeros(0, dtype=np.int64)


def run_identity(config, drop=()) -> dict:
    """What makes two runs of a command the same run (a checkpoint of one resumes the other), from
    its config dataclass: not the sample budget, nor where files go or how often they are written,
    nor the fields in ``drop``."""
    skip = {"samples", "checkpoint", "checkpoint_every", "data_dir", *drop}
    return {k: v for k, v in asdict(config).items() if k not in skip}


def say(text: str) -> None:
    """Tell the user about the run (a resume...): on stderr, never in --json output."""
    log.warning("%s", text)


def _jsonable(value):
    """``value`` as it reads back from a checkpoint's JSON metadata (tuples become lists...)."""
    return json.loads(json.dumps(value, default=to_jsonable))


def _as_test_figures(evaluation: dict) -> dict:
    """An evaluation's figures as a curve point's: its ``accuracy`` is the ``test_accuracy``."""
    return {("test_accuracy" if k == "accuracy" else k): v for k, v in evaluation.items()
            if isinstance(v, (int, float)) or v is None}


def _rate(done: int, first: int, trained_seconds: float, seconds_before: float) -> float | None:
    """Positions trained per second: this session's, or, when it trained nothing (a complete run
    run again), the run's own over the sessions before."""
    if trained_seconds > 0:
        return (done - first) / trained_seconds
    return done / seconds_before if done == first and seconds_before > 0 else None


def _budget(plan: RunPlan, done: int) -> str:
    """'N samples in: ask for --samples N or more', in epochs where the budget is given in epochs."""
    if plan.samples_option == "--epochs" and plan.epoch_size:
        epochs = -(-done // plan.epoch_size)
        return f"{epochs} epochs in: ask for --epochs {epochs} or more"
    return f"{done} samples in: ask for {plan.samples_option} {done} or more"


class _TrainingPhase:
    """One ``train`` phase over consecutive training steps (not one per step), closed before each
    evaluation and at the end of the run (also when it raises)."""

    def __init__(self, phase: Callable[[str], ContextManager]):
        self.phase = phase
        self.open: ContextManager | None = None
        self.handle: Any = None                  # what the phase yields (its ``samples`` counted)

    def training(self, samples: int) -> None:
        if self.open is None:
            self.open = self.phase("train")
            self.handle = self.open.__enter__()
            self.handle.samples = 0
        self.handle.samples += samples

    def close(self) -> None:
        if self.open is not None:
            opened, self.open = self.open, None
            opened.__exit__(None, None, None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


class _StopSignals:
    """SIGINT/SIGTERM set a flag the loop checks after each step (a second SIGINT stops at once)."""

    def __init__(self):
        self.received: str | None = None
        self._previous = {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum, frame):
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.received = signal.Signals(signum).name

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def check_resumable(plan: RunPlan) -> tuple[dict, dict] | None:
    """The plan's checkpoint ``(arrays, meta)`` if it exists and is this run's, None if there is
    none yet; an error if it cannot be written, is not a run checkpoint, belongs to another run or
    is past the budget. Cheap: call it before slow work (pre-training) as well; :func:`run_training`
    calls it again."""
    if not plan.checkpoint:
        return None
    checkpoint = check_writable(plan.checkpoint, "checkpoint")
    if not checkpoint.exists():
        return None
    arrays, meta = load_checkpoint(checkpoint)
    run = meta.get("run")
    if meta.get("format") != FORMAT or not isinstance(run, dict):
        raise InsituError(f"{checkpoint} is not a checkpoint of {plan.command} (it has no "
                          "run record): choose another --checkpoint path, or move it away")
    identity = _jsonable(plan.identity)
    if run["identity"] != identity:
        raise InsituError(f"checkpoint {checkpoint} belongs to another run "
                          f"({differences(run['identity'], identity)}): choose another "
                          "--checkpoint path, or delete it to start over")
    if run["samples_done"] > plan.samples:
        raise InsituError(f"checkpoint {checkpoint} is already {_budget(plan, run['samples_done'])}")
    return arrays, meta


def run_training(plan: RunPlan, learner: Learner, *,
                 evaluate: Callable[[], dict] | None = None,
                 end_of_epoch: Callable[[int], dict | None] | None = None,
                 advance: Callable[[int], None] = lambda n: None,
                 say: Callable[[str], None] = lambda text: None,
                 phase: Callable[[str], ContextManager] = phases.phase,
                 on_history: Callable[[dict], None] = lambda record: None,
                 probe: Callable[[], dict] | None = None) -> RunOutcome:
    """Run ``learner`` as ``plan`` says and return what the harness measured.

    ``end_of_epoch(epoch)`` runs after the last step of every epoch (1-based; training work such as
    pruning, timed as training) and may return figures for that epoch's history record;
    ``evaluate()`` returns evaluation figures (timed as test, never as training); ``say`` reports
    a resume; ``phase(name)`` marks the training and test phases; ``on_history(record)`` gets each
    epoch's history record once its checkpoint is written; ``probe()`` returns cheap test figures
    for each point of the curve (timed as test).
    """
    check_int(plan.samples_option, plan.samples)
    identity = _jsonable(plan.identity)
    checkpoint = Path(plan.checkpoint) if plan.checkpoint else None
    done, losses, history, seconds_before, resumed_from = 0, [], [], 0.0, None
    window: list[float] = []               # the losses of the epoch in progress
    curve: list[dict] = []
    point_losses: list[float] = []         # the losses since the curve's last point
    ends_at_budget = False
    saved = check_resumable(plan)
    if saved is not None:
        arrays, meta = saved
        run = meta["run"]
        learner.load_state(arrays, meta["learner"])
        done = resumed_from = run["samples_done"]
        losses, history, seconds_before = run["losses"], run["history"], run["seconds"]
        window = run["epoch_losses"]
        curve, point_losses = run.get("curve", []), run.get("point_losses", [])
        if run.get("curve_ends_at_budget") and curve:
            if done < plan.samples:
                curve.pop()        # that run's last point; this run goes on past it
            else:
                ends_at_budget = True      # nothing left to run: the curve stays whole
        if done < plan.samples:
            say(f"resumed from {checkpoint} at {done} samples")
        else:
            say(f"checkpoint {checkpoint} is already complete at {done} samples: nothing is "
                f"trained again (ask for more {plan.samples_option} to go on)")
        advance(done)

    if plan.kept_by is not None and plan.resume_at:
        if plan.resume_at > plan.samples:
            raise InsituError(f"{plan.kept_by} is already {_budget(plan, plan.resume_at)}")
        done = resumed_from = plan.resume_at
        say(f"resumed from {plan.kept_by} at {done} samples")
        advance(done)

    trained_seconds = 0.0

    def save() -> None:
        assert checkpoint is not None
        arrays, meta = learner.state()
        save_checkpoint(checkpoint, arrays, {
            "format": FORMAT, "learner": meta,
            "run": {"command": plan.command, "identity": identity, "samples_done": done,
                    "losses": losses[-LOSS_WINDOW:], "epoch_losses": window, "history": history,
                    "curve": curve, "point_losses": point_losses, "curve_ends_at_budget": at_budget,
                    "seconds": seconds_before + trained_seconds}})

    marks = _TrainingPhase(phase)
    note = getattr(advance, "note", lambda **figures: None)

    def run_evaluation(evaluation: Callable[[], dict] | None = evaluate) -> dict:
        marks.close()
        if evaluation is None:
            return {}
        note(stage="test")
        try:
            # Weights a diverging step left infinite must not print NumPy warnings: the next
            # step's loss stops the run with a clear error.
            with phase("test"), np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                return evaluation()
        finally:
            note(stage="train")

    every = plan.curve_interval()
    correct_then = getattr(learner, "correct", None)
    # The samples ``correct`` counts over: the learner's ``scored`` where it skips some (SMD drops
    # batches), else every position trained.
    trained_then = getattr(learner, "scored", done)
    at_budget = ends_at_budget       # the last point marks the budget's end, not a regular point

    def add_point(evaluated: dict | None = None, regular: bool = True) -> None:
        """A point of the curve here: with ``evaluated`` (an evaluation just made), else a probe.
        A point that is not ``regular`` (the budget's end) leaves the interval open: a resumed
        run drops it and goes on with the interval's losses."""
        nonlocal correct_then, trained_then, point_losses, at_budget
        point: dict = {"samples": done,
                       "loss": float(np.mean(point_losses)) if point_losses else None}
        correct_now = getattr(learner, "correct", None)
        trained_now = getattr(learner, "scored", done)
        if correct_now is not None and correct_then is not None and trained_now > trained_then:
            point["train_accuracy"] = (correct_now - correct_then) / (trained_now - trained_then)
        if evaluated is None and probe is not None:
            evaluated = run_evaluation(probe)
        for key, value in _as_test_figures(evaluated or {}).items():
            point.setdefault(key, value)     # the training loss and accuracy stay the learner's
        curve.append(point)
        at_budget = not regular
        if regular:
            correct_then, trained_then, point_losses = correct_now, trained_now, []

    first = done
    next_save = (done // plan.checkpoint_every + 1) * plan.checkpoint_every
    evaluated_at, evaluation = None, {}
    with _StopSignals() as stop, marks:
        while done < plan.samples:
            epoch = None                                    # the epoch this step ends, if any
            count = min(plan.step, plan.samples - done)
            if plan.epoch_size:
                epoch_end = (done // plan.epoch_size + 1) * plan.epoch_size
                count = min(count, epoch_end - done)        # a step never spans two epochs
                if done + count == epoch_end:
                    epoch = epoch_end // plan.epoch_size
            marks.training(count)
            started = time.perf_counter()
            with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
                loss = learner.train(done, count)    # a divergence is reported below, once
            ended_epoch = epoch is not None
            epoch_figures = end_of_epoch(epoch) if epoch is not None and end_of_epoch is not None else None
            trained_seconds += time.perf_counter() - started
            done += count
            advance(count)
            if loss is not None:
                if not math.isfinite(loss):
                    raise Diverged(f"the loss is {loss} after {done} samples: training diverged "
                                   "(try a smaller --lr)")
                losses.append(float(loss))
                window.append(float(loss))
                point_losses.append(float(loss))
                note(loss=float(np.mean(losses[-LOSS_WINDOW:])))
            regular_point = done // every > (done - count) // every
            if ended_epoch and plan.evaluate_every_epoch:
                evaluation, evaluated_at = run_evaluation(), done
                history.append({"epoch": epoch, "samples": done,
                                "loss": float(np.mean(window)) if window else None,
                                "seconds": seconds_before + trained_seconds,
                                **(epoch_figures or {}), **evaluation})
                window = []
                add_point(evaluation)
            elif regular_point or done == plan.samples:
                add_point(regular=regular_point)
            stopping = stop.received is not None and done < plan.samples
            if checkpoint is not None and (done >= next_save or ended_epoch or done == plan.samples
                                           or stopping):
                save()
                next_save = (done // plan.checkpoint_every + 1) * plan.checkpoint_every
            if history and ended_epoch and plan.evaluate_every_epoch:
                on_history(history[-1])
            if stopping:
                if checkpoint is not None:
                    where = f"checkpoint {checkpoint} is written: run the same command again to resume"
                elif plan.kept_by is not None:
                    where = f"{plan.kept_by} keeps the state: run the same command again to resume"
                else:
                    where = "no --checkpoint was given, so the work is lost (give one to keep it)"
                raise Interrupted(f"{stop.received} after {done} of {plan.samples} samples; {where}",
                                  stop.received or "SIGINT")
    if checkpoint is not None and done == first:
        save()                     # a resumed run with nothing left still leaves its checkpoint
    if evaluated_at != done:               # not just evaluated at the last epoch's end
        evaluation = run_evaluation()      # Ctrl-C here stops at once: the checkpoint is written
        if curve and curve[-1]["samples"] == done and probe is None:
            curve[-1].update(_as_test_figures(evaluation))
    return RunOutcome(samples=done, resumed_from=resumed_from,
                      seconds=seconds_before + trained_seconds,
                      samples_per_second=_rate(done, first, trained_seconds, seconds_before),
                      losses=losses[-LOSS_WINDOW:], history=history, evaluation=evaluation,
                      curve=curve)

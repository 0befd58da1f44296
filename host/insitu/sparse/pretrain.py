"""Pre-training of the built-in MCU models: the float training of a named model on FashionMNIST
(:func:`insitu.sparse.tasks.pretrain_task`) before it is quantized, and the cache on disk of the
resulting int8 graph.

:func:`pretrained` is the one entry: the graph of a model name (``mbv2-28``, ``mbv2-tiny``, the
paper's 128x128 networks), loaded from ``<cache>/<model>-<hash>.npz`` (:func:`pretrained_path`)
when there, else

* trained in float with BatchNorm (:func:`insitu.sparse.models.train_float`, the settings of
  :data:`PRETRAIN_DEFAULTS`), announced on stderr before it starts (about how long:
  :func:`estimate_seconds`; where it is cached) with a line per epoch;
* resumable: the training state is checkpointed atomically next to the final file
  (:func:`checkpoint_path`) and an interrupted run goes on from there;
* locked: a second process waits for the first (a lock file beside it) instead of training the
  same model twice;
* quantized by :func:`insitu.sparse.quantize.quantize_model` (calibrated on
  :data:`~insitu.sparse.quantize.CALIBRATION_SAMPLES` training images), evaluated float and int8,
  and cached.

The cache key (the hash in the file name) covers the model configuration, the training settings,
the quantization settings and :data:`FORMAT_VERSION`. Quantization itself (the int8 graph, its
forward, a new head) is :mod:`insitu.sparse.quantize`; this module only trains, caches and calls it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from insitu import resources
from insitu.errors import InsituError, UsageError
from insitu.sparse import graph as g
from insitu.sparse.models import build_model, float_accuracy, model_config, train_float
from insitu.sparse.quantize import CALIBRATION_PERCENTILE, CALIBRATION_SAMPLES, int8_accuracy, quantize_model

__all__ = ["pretrained", "pretrained_path", "checkpoint_path", "estimate_seconds", "PRETRAIN_DEFAULTS",
           "PRETRAIN_SECONDS", "SECONDS_PER_MAC_SAMPLE", "CHECKPOINT_EVERY_S", "FORMAT_VERSION"]

#: Bump when quantization or training changes in a way the configuration does not show, so
#: cached pretrained graphs are rebuilt.
FORMAT_VERSION = 1


#: Pretraining defaults per model: training samples (of FashionMNIST's 60000), epochs, peak lr.
#: Measured on an idle 2-core machine: mbv2-28 227 s of training + 20 s of evaluation and
#: quantization, FashionMNIST test accuracy 90.27 % float / 90.22 % int8; mbv2-tiny 6.8 s + 0.6 s,
#: 82.75 % / 82.76 %.
PRETRAIN_DEFAULTS = {
    "mbv2-28": {"samples": 60000, "epochs": 2, "lr": 0.1, "batch_size": 64},
    "mbv2-tiny": {"samples": 20000, "epochs": 3, "lr": 0.1, "batch_size": 64},
    # The paper's 128x128 RGB networks (its backbones are ImageNet-pretrained; there is no
    # ImageNet here): FashionMNIST as RGB at 128x128, a few thousand images, evaluated on the
    # first test_samples test images (a NumPy forward of 17-23 M MACs is ~40 ms a sample).
    **{name: {"samples": 3000, "epochs": 2, "lr": 0.1, "batch_size": 32, "test_samples": 1000}
       for name in ("mbv2-w0.35", "proxyless-w0.3", "mcunet-5fps")},
}
_FALLBACK_DEFAULTS = {"samples": 60000, "epochs": 2, "lr": 0.1, "batch_size": 64}


def _settings(model_name: str, samples, epochs, seed) -> dict:
    config = model_config(model_name)
    d = {**_FALLBACK_DEFAULTS, **PRETRAIN_DEFAULTS.get(model_name, {})}
    if samples is not None:
        d["samples"] = samples
    if epochs is not None:
        d["epochs"] = epochs
    if not isinstance(d["samples"], (int, np.integer)) or d["samples"] < 1:
        raise UsageError(f"pretrained: samples must be a positive integer, got {d['samples']!r}")
    if not isinstance(d["epochs"], (int, np.integer)) or d["epochs"] < 1:
        raise UsageError(f"pretrained: epochs must be a positive integer, got {d['epochs']!r}")
    settings = {"config": config.as_dict(), "samples": int(d["samples"]), "epochs": int(d["epochs"]),
                "lr": d["lr"], "batch_size": d["batch_size"], "seed": int(seed),
                "calibration": {"samples": CALIBRATION_SAMPLES, "percentile": CALIBRATION_PERCENTILE},
                "version": FORMAT_VERSION}
    if "test_samples" in d:                   # (only where set: the other models' cache keys stay)
        settings["test_samples"] = int(d["test_samples"])
    return settings


def pretrained_path(model_name: str, cache_dir=None, samples=None, epochs=None, seed: int = 0) -> Path:
    """Where :func:`pretrained` keeps this configuration's graph: ``<cache_dir>/<model>-<hash>.npz``
    with ``cache_dir`` defaulting to ``resources.cache_dir("mcu")``; the hash covers the model
    configuration, the training settings and the quantization settings."""
    settings = _settings(model_name, samples, epochs, seed)
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:12]
    folder = Path(cache_dir) if cache_dir is not None else resources.cache_dir("mcu")
    return folder / f"{model_name}-{digest}.npz"


def checkpoint_path(model_name: str, cache_dir=None, samples=None, epochs=None, seed: int = 0) -> Path:
    """Where an unfinished :func:`pretrained` keeps its training state, next to the final file:
    ``<model>-<hash>.partial.npz`` (removed once the graph is cached)."""
    path = pretrained_path(model_name, cache_dir, samples, epochs, seed)
    return path.with_name(f"{path.stem}.partial.npz")


#: Measured pretraining time at :data:`PRETRAIN_DEFAULTS` on an idle 2-core machine (training,
#: evaluation and quantization; see the comment there), for the announcement's estimate.
PRETRAIN_SECONDS = {"mbv2-28": 250.0, "mbv2-tiny": 7.5,
                    # the paper's networks, measured on a 2-core machine busy with other runs:
                    # 503 / 428 / 412 s of training, the rest the evaluation of 1000 images at 128x128
                    "mbv2-w0.35": 730.0, "proxyless-w0.3": 665.0, "mcunet-5fps": 565.0}
#: Else: seconds per training MAC-sample (mbv2-28's 227 s for 2.19 M MACs x 120,000 samples).
SECONDS_PER_MAC_SAMPLE = 227.0 / (2_194_944 * 120_000)
#: Within an epoch, the training state is saved at most this often (and at every epoch's end).
CHECKPOINT_EVERY_S = 60.0


def estimate_seconds(model_name: str, samples: int, epochs: int) -> float:
    """About how long :func:`pretrained` trains ``model_name`` (an idle 2-core machine)."""
    if model_name in PRETRAIN_SECONDS:
        d = {**_FALLBACK_DEFAULTS, **PRETRAIN_DEFAULTS.get(model_name, {})}
        return PRETRAIN_SECONDS[model_name] * samples * epochs / (d["samples"] * d["epochs"])
    from insitu.sparse.models import model_summary

    return SECONDS_PER_MAC_SAMPLE * model_summary(model_name)["macs"] * samples * epochs


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(1, round(seconds))} s"
    return f"{seconds / 60:.0f} min"


def _load_partial(path: Path, settings: dict, say):
    """``(state, seconds spent)``: the :class:`FloatTrainState` saved at ``path`` for these
    settings, or None (a missing file; one that is unreadable or of other settings is said and
    ignored)."""
    from insitu.checkpoint import load_checkpoint
    from insitu.sparse.models import FloatTrainState

    if not path.is_file():
        return None
    try:
        arrays, meta = load_checkpoint(path)
        if meta.get("settings") != json.loads(json.dumps(settings)):
            raise InsituError("it is of other pretraining settings")
        state = FloatTrainState(int(meta["step"]), list(meta["losses"]), float(meta["total"]), arrays)
        return state, float(meta.get("seconds", 0.0))
    except (InsituError, KeyError, TypeError, ValueError) as exc:
        say(f"not resuming from {path} ({exc}); starting over", always=True)
        return None


def pretrained(model_name: str, cache_dir=None, samples: int | None = None, epochs: int | None = None,
               seed: int = 0, verbose: bool | None = None, progress=None) -> g.Graph:
    """The int8 graph of ``model_name`` pretrained on FashionMNIST (:func:`tasks.pretrain_task`):
    loaded from the cache when there, else trained (float, BN), quantized and cached.

    ``samples`` / ``epochs`` override :data:`PRETRAIN_DEFAULTS` (first ``samples`` training
    images). ``graph.meta["pretrain"]`` holds the float and int8 test accuracies and the time.

    Training happens once per configuration and says so on stderr before it starts (about how
    long, where it is cached), then prints a line per epoch (loss, time elapsed), and step lines
    when it is slow (``verbose=None``: for runs expected to take more than ~15 s; ``verbose=False``
    prints nothing). ``progress(epoch, epochs, loss, elapsed_s)`` is called after each epoch.

    Resumable: the training state is saved atomically next to the final file
    (:func:`checkpoint_path`) after every epoch and every :data:`CHECKPOINT_EVERY_S` within one;
    an interrupted pretraining (Ctrl-C, a crash, an exception from ``progress``) goes on from
    there when called again, and ends with the same weights as an uninterrupted one.
    """
    import fcntl

    path = pretrained_path(model_name, cache_dir, samples, epochs, seed)
    cached = _load_cached(path)
    if cached is not None:
        return cached
    settings = _settings(model_name, samples, epochs, seed)
    config = model_config(model_name)
    n_wanted = settings["samples"]
    estimate = estimate_seconds(model_name, min(n_wanted, 60000), settings["epochs"])
    slow = estimate > 15 if verbose is None else bool(verbose)

    def say(msg, always=False):
        if verbose is not False and (always or slow):
            print(f"[insitu] pretrain {model_name}: {msg}", file=sys.stderr, flush=True)

    partial = checkpoint_path(model_name, cache_dir, samples, epochs, seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f"{path.stem}.lock"), "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"another process is pretraining it into {path}; waiting for it", always=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        cached = _load_cached(path)            # the other process may have finished it
        if cached is not None:
            return cached
        return _pretrain(model_name, config, settings, seed, path, partial, estimate, say, slow, progress)


def _load_cached(path: Path) -> g.Graph | None:
    if path.is_file():
        try:
            return g.Graph.load(path)
        except InsituError:
            pass                                  # unreadable: rebuilt by the caller
    return None


def _pretrain(model_name, config, settings, seed, path, partial, estimate, say, slow, progress) -> g.Graph:
    from insitu.checkpoint import save_checkpoint
    from insitu.sparse.tasks import pretrain_task

    epochs = settings["epochs"]
    loaded = _load_partial(partial, settings, say)
    resume, spent = loaded if loaded is not None else (None, 0.0)
    if resume is None:
        say(f"pretraining once on FashionMNIST ({min(settings['samples'], 60000):,} images, {epochs} "
            f"epoch(s)), about {_duration(estimate)} on an idle 2-core machine (longer on a busy one); "
            f"cached in {path} for every later run; if interrupted, it resumes from its last "
            f"checkpoint ({partial.name})", always=True)
    if "test_samples" in settings:             # the large inputs: only the images used are resampled
        x_train, y_train, x_test, y_test, classes = pretrain_task(config.input_size, config.in_channels,
                                                                   settings["samples"], settings["test_samples"])
    else:
        x_train, y_train, x_test, y_test, classes = pretrain_task(config.input_size, config.in_channels)
    n = min(settings["samples"], len(x_train))
    # The classifier of the pretraining task's classes (the paper's networks are ImageNet's, 1000).
    model = build_model(dataclasses.replace(config, num_classes=classes), seed=seed)
    if resume is not None:
        per_epoch = -(-n // settings["batch_size"])
        say(f"resuming the interrupted pretraining at epoch {resume.step // per_epoch + 1}/{epochs} "
            f"(step {resume.step}/{per_epoch * epochs}) from {partial}; about "
            f"{_duration(estimate * (1 - resume.step / (per_epoch * epochs)))} left; cached in {path} "
            "once done", always=True)
    start = time.perf_counter()

    def elapsed() -> float:
        return spent + time.perf_counter() - start

    def save(state) -> None:
        save_checkpoint(partial, state.arrays, {"settings": settings, "step": state.step,
                                                "losses": state.losses, "total": state.total,
                                                "seconds": elapsed()})

    def on_epoch(epoch, total_epochs, loss) -> None:
        say(f"epoch {epoch}/{total_epochs}: loss {loss:.4f}, {elapsed():.0f} s elapsed", always=True)
        if progress is not None:
            progress(epoch, total_epochs, loss, elapsed())

    try:
        losses = train_float(model, x_train[:n], y_train[:n], epochs=epochs,
                             batch_size=settings["batch_size"], lr=settings["lr"], seed=seed,
                             log=(lambda s, t, loss: say(f"step {s}/{t} loss {loss:.3f} "
                                                         f"({elapsed():.0f} s)")) if slow else None,
                             resume=resume, save=save, save_every_s=CHECKPOINT_EVERY_S, on_epoch=on_epoch)
    except KeyboardInterrupt:
        if partial.is_file():
            say(f"interrupted; the next run resumes from {partial}", always=True)
        raise
    train_s = elapsed()
    float_acc = float_accuracy(model, x_test, y_test)
    calib = np.random.default_rng(seed + 1).permutation(n)[:CALIBRATION_SAMPLES]
    graph = quantize_model(model, x_train[calib])
    int8_acc = int8_accuracy(graph, x_test, y_test)
    graph.meta["pretrain"] = {**settings, "task": "fashion-mnist", "train_samples": n,
                              "epoch_losses": [round(v, 4) for v in losses],
                              "float_test_accuracy": float_acc, "int8_test_accuracy": int8_acc,
                              "train_seconds": round(train_s, 1),
                              "total_seconds": round(elapsed(), 1)}
    graph.save(path)
    partial.unlink(missing_ok=True)
    say(f"float test accuracy {float_acc:.4f}, int8 {int8_acc:.4f} ({elapsed():.0f} s); cached in {path}",
        always=True)
    return graph

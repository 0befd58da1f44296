"""The online adaptation experiment (the LRT paper's figure 2).

A model is pre-trained offline (quantization-aware), programmed into NVM, and then deployed: it
predicts each online sample, is told the label, and learns from it with one of the schemes of
:mod:`insitu.lrt.schemes`, in one of four environments:

* ``control`` — the online stream has the offline statistics, the weights do not drift;
* ``shift``   — the input distribution changes every 10k samples (augmentations of
  :mod:`insitu.lrt.online`);
* ``analog``  — Gaussian drift of every weight cell (σ₀ = 10 over 1M steps, every 10 steps);
* ``digital`` — random bit flips of the weight cells (p₀ = 10 over 1M steps, every 10 steps).

Reported: the online accuracy as an exponential moving average (0.999, bias-corrected), the
maximum and total writes per NVM cell, and the curves of both over the run.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import time
from collections.abc import Set as AbstractSet
from pathlib import Path

import numpy as np

from insitu.checkpoint import load_checkpoint, save_checkpoint
from insitu.checks import check_int
from insitu.errors import InsituError
from insitu.harness import CURVE_POINTS, RunPlan, check_resumable, run_training, say
from insitu.io import atomic_write, exclusive
from insitu.lrt.nvm import NVMModel, make_drift
from insitu.lrt.online import ENVS, OnlineData
from insitu.lrt.qnet import ARCHITECTURES, PAPER_CNN_MIN_SIZE
from insitu.nn.networks import image_input
from insitu.lrt.schemes import SCHEMES, LRTConfig, OnlineTrainer, check_rank, evaluate, pretrain
from insitu.resources import cache_dir
from insitu.io import save_figure

__all__ = ["ENVS", "SCHEMES", "AdaptLearner", "build_network", "check_adapt", "pretrained_model",
           "run_adapt", "plot_adapt", "default_cache_dir"]

EMA_DECAY = 0.999
_PRETRAIN_VERSION = 3          # bump when the network or pre-training changes


def default_cache_dir() -> Path:
    return cache_dir("lrt")


def build_network(arch: str, data: OnlineData, seed: int, config: LRTConfig):
    """The untrained network for ``data`` (its size and classes); its streaming batch norms use the
    pseudo-batches. The CNN takes images of sides >= 8 only (UsageError otherwise: exit 2, before
    any work); the MLP flattens any sample, images or feature vectors."""
    if arch not in ARCHITECTURES:
        raise ValueError(f"unknown architecture {arch!r}; known: {', '.join(ARCHITECTURES)}")
    shape = data.sample_shape
    if arch == "cnn":
        shape = image_input(data.dataset, "--model cnn (the LRT paper's CNN)", PAPER_CNN_MIN_SIZE,
                            why="three 2x2 pools").image_size
    return ARCHITECTURES[arch](sample_shape=shape, classes=data.num_classes,
                               seed=seed, conv_batch=config.conv_batch, dense_batch=config.dense_batch)


#: The pre-training recipe (:func:`insitu.lrt.schemes.pretrain`); part of the cache key.
PRETRAIN_RECIPE = dict(lr=0.1, batch=32, momentum=0.9, warmup=1.0, schedule="cosine", clip=2.0,
                       centred_bn=True)
PRETRAIN_EPOCHS = 20
OFFLINE_SAMPLES = 20_000


def pretrained_model(arch: str = "cnn", dataset: str = "fashion-mnist", data_dir=None, seed: int = 0,
                     offline_samples: int = OFFLINE_SAMPLES, epochs: int = PRETRAIN_EPOCHS,
                     cache_dir=None, config: LRTConfig | None = None, advance=lambda n: None,
                     say=say, recipe: dict | None = None):
    """The offline-trained network for ``seed`` (cached on disk: every scheme starts from it);
    with ``offline_samples`` 0, the network as initialized (trained from scratch online).

    Each epoch trains on ``offline_samples`` fresh samples of the elastic-augmented offline
    stream (epoch ``e`` on samples ``e·n .. (e+1)·n - 1``: new augmentations of the same 15 %
    offline split, never the online images). ``recipe``: :data:`PRETRAIN_RECIPE` by default.
    Returns ``(net, info)`` with ``info`` holding the validation accuracy, the per-epoch losses
    and where it came from. A pre-training (once per key) is announced with ``say``, and so are
    its epochs and its end; it is resumable per epoch (a ``.partial.npz`` checkpoint next to the
    cache file, removed once the model is cached).
    """
    config = config or LRTConfig()
    recipe = {**PRETRAIN_RECIPE, **(recipe or {})}
    data = OnlineData(dataset, data_dir, seed=seed)
    net = build_network(arch, data, seed, config)
    if offline_samples == 0:       # from scratch: the network as initialized (the paper's figure 6)
        xv, yv = data.validation()
        return net, {"validation_accuracy": evaluate(net, xv.astype(np.float64), yv),
                     "offline_samples": 0, "epochs": 0, "from_scratch": True}
    key = dict(arch=arch, dataset=data.dataset.key, seed=seed, offline_samples=offline_samples,
               epochs=epochs, conv_batch=config.conv_batch, dense_batch=config.dense_batch,
               recipe=recipe, elastic=[data.alpha, data.sigma], version=_PRETRAIN_VERSION)
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    path = cache / f"pretrained-{arch}-{digest}.npz"
    info = _load_pretrained(path, key, net)
    if info is not None:
        return net, info
    try:
        cache.mkdir(parents=True, exist_ok=True)
        writable = os.access(cache, os.W_OK)
    except OSError:
        writable = False         # a read-only cache: no resuming, and no caching either
    # One pre-training per key at a time (parallel runs, sweep points): a process that waited
    # finds the network the first one cached.
    with exclusive(path.with_suffix(".lock")) if writable else contextlib.nullcontext():
        info = _load_pretrained(path, key, net)
        if info is not None:
            return net, info
        return net, _pretrain_and_cache(net, data, path, key, arch, offline_samples, epochs, seed,
                                        recipe, writable, advance, say)


def _load_pretrained(path: Path, key: dict, net) -> dict | None:
    """The cached network's ``info`` (its weights loaded into ``net``), or None if not cached."""
    if path.exists():
        arrays, meta = load_checkpoint(path)
        if meta.get("key") == key:
            net.load_state_dict(arrays)
            return meta["info"]
    return None


def _pretrain_and_cache(net, data, path: Path, key: dict, arch: str, offline_samples: int,
                        epochs: int, seed: int, recipe: dict, writable: bool, advance, say) -> dict:
    partial = path.with_name(path.name.replace(".npz", ".partial.npz"))
    say(f"pre-training the {arch} offline on {offline_samples} samples x {epochs} epochs, once "
        f"(cached in {path}; the next runs with these settings start at once"
        + ("; resuming from its last epoch)" if partial.exists() else ")"))
    xv, yv = data.validation()
    xv = xv.astype(np.float64)

    def epoch_data(epoch):
        return data.offline_train(offline_samples, start=epoch * offline_samples)

    def on_epoch(epoch, record):
        record["validation_accuracy"] = evaluate(net, xv[:2000], yv[:2000])
        say(f"  pre-training epoch {epoch}/{epochs}: loss {record['loss']:.4f}, validation "
            f"accuracy (2000 samples) {record['validation_accuracy']:.4f}, {record['seconds']:.0f} s")

    start = time.perf_counter()
    checkpoint = partial if writable else None
    history = pretrain(net, epoch_data, epochs=epochs, seed=seed, advance=advance,
                       checkpoint=checkpoint, checkpoint_key=key, on_epoch=on_epoch, **recipe)
    info = {"validation_accuracy": evaluate(net, xv, yv),
            "offline_samples": offline_samples, "epochs": epochs, "recipe": recipe,
            "epoch_log": history,
            "pretrain_seconds": round(sum(r["seconds"] for r in history), 1),
            "seconds_this_run": round(time.perf_counter() - start, 1)}
    say(f"pre-trained in {info['pretrain_seconds']:.0f} s: validation accuracy "
        f"{info['validation_accuracy']:.4f}")
    try:
        save_checkpoint(path, net.state_dict(), {"key": key, "info": info})
        partial.unlink(missing_ok=True)
    except (OSError, InsituError):
        pass                     # a read-only cache only costs the next run a pre-training
    return info


def check_adapt(arch: str, data: OnlineData, config: LRTConfig,
                names: dict[str, str] | None = None) -> None:
    """Everything about a run that can be wrong, checked before minutes of pre-training.

    ``names``: how the errors name LRTConfig's fields (``{"bias_lr": "--bias-lr"}``: the options
    of a command); without it, the fields' own names."""
    try:
        config.validate()
        check_rank(build_network(arch, data, 0, config), config.rank)
    except ValueError as exc:
        field = str(exc).split(" ", 1)[0]
        if not names or field not in names:
            raise
        raise type(exc)(names[field] + str(exc)[len(field):]) from None


def curve_positions(samples: int, points: int) -> set[int]:
    """The samples after which the curve records a point: ``points`` spread evenly to the last."""
    return set(np.unique(np.linspace(1, samples, min(points, samples)).astype(int)).tolist())


class AdaptLearner:
    """Online adaptation on the stream of an environment, for the run harness.

    ``trainer`` predicts each sample, is told its label and learns from it: an
    :class:`~insitu.lrt.schemes.OnlineTrainer` (every scheme, on the host) or an
    :class:`insitu.fpga.lrt_board.LRTBoardTrainer` (the vector work on the LRT PE); both have
    ``train(x, y, after_each)``, ``state()``, ``load_state()`` and ``max_writes_per_cell()``. This
    class keeps what the experiment measures of either: the online accuracy (EMA and mean), the
    curve, and the drift of the weight cells (``drift``: an :func:`insitu.lrt.nvm.make_drift`).
    """

    def __init__(self, trainer, data: OnlineData, env: str, drift=None,
                 curve_at: AbstractSet[int] = frozenset()):
        self.trainer, self.data, self.env, self.drift = trainer, data, env, drift
        self.cells = list(trainer.arrays.values()) if drift is not None else []
        self.curve_at = curve_at
        self.curve = {"sample": [], "ema_accuracy": [], "max_writes_per_cell": []}
        self.ema_sum = self.ema_weight = 0.0
        self.correct = 0

    def train(self, start: int, count: int) -> float | None:
        """Samples ``start .. start + count`` of the stream; returns their mean loss (the
        trainer's ``last_losses``: each sample's before it was learnt)."""
        x, y = self.data.online(self.env, count, start=start)
        self.trainer.train(x.astype(np.float64), y,
                           after_each=lambda i, correct: self._after(start + i, correct))
        losses = getattr(self.trainer, "last_losses", ())
        return float(np.mean(losses)) if len(losses) else None

    def _after(self, step: int, correct: bool) -> None:
        if self.drift is not None:
            self.drift.step(self.cells, step)
        self.correct += correct
        self.ema_sum = EMA_DECAY * self.ema_sum + (1 - EMA_DECAY) * correct
        self.ema_weight = EMA_DECAY * self.ema_weight + (1 - EMA_DECAY)
        if step + 1 in self.curve_at:
            self.curve["sample"].append(step + 1)
            self.curve["ema_accuracy"].append(round(self.ema_sum / self.ema_weight, 5))
            self.curve["max_writes_per_cell"].append(self.trainer.max_writes_per_cell())

    def online_accuracy(self, samples: int) -> dict:
        """The EMA (0.999, bias-corrected) and the mean of the online predictions."""
        return {"online_accuracy": round(self.ema_sum / self.ema_weight, 5) if self.ema_weight else None,
                "online_accuracy_mean": round(self.correct / samples, 5) if samples else None}

    def state(self) -> tuple[dict, dict]:
        arrays, meta = self.trainer.state()
        rng = getattr(self.drift, "rng", None)
        return arrays, {"trainer": meta, "drift_rng": rng.bit_generator.state if rng else None,
                        "ema_sum": self.ema_sum, "ema_weight": self.ema_weight,
                        "correct": self.correct, "curve": self.curve}

    def load_state(self, arrays: dict, meta: dict) -> None:
        self.trainer.load_state(arrays, meta["trainer"])
        rng = getattr(self.drift, "rng", None)
        if rng is not None:
            rng.bit_generator.state = meta["drift_rng"]
        self.ema_sum, self.ema_weight = meta["ema_sum"], meta["ema_weight"]
        self.correct, self.curve = meta["correct"], meta["curve"]


def run_adapt(env: str, scheme: str, samples: int, seed: int = 0, arch: str = "cnn",
              dataset: str = "fashion-mnist", data_dir=None, config: LRTConfig | None = None,
              offline_samples: int = OFFLINE_SAMPLES, pretrain_epochs: int = PRETRAIN_EPOCHS,
              segment: int = 10_000, curve_points: int = 200, cache_dir=None, counts_out=None, checkpoint=None,
              checkpoint_every: int = 1000, advance=lambda n: None, test_samples: int = 200) -> dict:
    """Deploy the pre-trained model in ``env`` and train it online with ``scheme``.

    ``counts_out`` (a path ending in .npz) receives the per-cell write counts of every layer.
    ``checkpoint`` (a .npz path) is rewritten atomically every ``checkpoint_every`` samples (and
    on SIGINT/SIGTERM) and resumed from when it exists (:mod:`insitu.harness`).
    """
    if env not in ENVS:
        raise ValueError(f"unknown environment {env!r}; environments: {', '.join(ENVS)}")
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; schemes: {', '.join(SCHEMES)}")
    check_int("samples", samples)
    check_int("checkpoint_every", checkpoint_every)
    config = config or LRTConfig()
    data = OnlineData(dataset, data_dir, seed=seed, segment=segment)
    check_adapt(arch, data, config)
    # What makes a checkpoint this run's: everything but the sample budget and file places.
    identity = {"env": env, "scheme": scheme, "seed": seed, "arch": arch,
                "dataset": data.dataset.key,
                "config": vars(config), "offline_samples": offline_samples,
                "pretrain_epochs": pretrain_epochs, "segment": segment}
    # A curve point comes at a step's end: a step of at most 1/CURVE_POINTS of the budget (the
    # samples are learnt one at a time: the step changes no result).
    step = max(1, min(1000, checkpoint_every, -(-samples // CURVE_POINTS)))
    plan = RunPlan("insitu lrt adapt", identity, samples, step, checkpoint, checkpoint_every)
    check_resumable(plan)                  # a checkpoint of another run: refused before pre-training
    net, pre = pretrained_model(arch, dataset, data_dir, seed, offline_samples, pretrain_epochs,
                                cache_dir, config)
    nvm = NVMModel()
    trainer = OnlineTrainer(net, scheme, config, nvm=nvm, seed=seed)
    learner = AdaptLearner(trainer, data, env, make_drift(env, seed=seed + 7919),
                           curve_positions(samples, curve_points))
    x_test, y_test = data.test(test_samples)
    x_test = x_test.astype(np.float64)
    # The curve's test accuracy: the first test samples, on the weights as they are (inference:
    # no statistic, no NVM read or write counted).
    outcome = run_training(plan, learner, advance=advance, say=say,
                           probe=lambda: {"test_accuracy": evaluate(net, x_test, y_test)})
    report = nvm.report(samples)
    if counts_out:
        buf = io.BytesIO()
        np.savez_compressed(buf, **nvm.write_counts())
        atomic_write(Path(counts_out), buf.getvalue())
    result = {
        "env": env, "scheme": scheme, "samples": samples, "seed": seed, "arch": arch,
        "dataset": data.name,
        **learner.online_accuracy(samples),
        "pretrained_validation_accuracy": pre["validation_accuracy"],
        "max_writes_per_cell": trainer.max_writes_per_cell(),
        "total_writes": trainer.total_writes(),
        "max_update_ops_per_cell": trainer.max_update_ops_per_cell(),
        "layers": {name: {k: entry[k] for k in ("cells", "max_writes_per_cell", "total_writes",
                                                 "update_operations",
                                                 "mean_writes_per_cell", "write_histogram")}
                   for name, entry in report["arrays"].items()},
        "nvm": report["total"],
        "nvm_parameters": report["parameters"],
        "config": {k: v for k, v in vars(config).items()},
        "resumed_from": outcome.resumed_from,
        "seconds": round(outcome.seconds, 2),
        "online_curve": learner.curve,
        "curve": outcome.curve,
    }
    if trainer.lrt:
        result["lrt"] = trainer.lrt_summary()
    if env == "shift":
        result["segments"] = data.segments(samples)
    return result


def plot_adapt(results: list[dict], path) -> Path:
    """One PNG in the style of the paper's figure 2: EMA accuracy (top), max writes (bottom)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    if not results:
        raise ValueError("plot_adapt: no results to plot")
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    for r in results:
        c = r["online_curve"]
        top.plot(c["sample"], c["ema_accuracy"], label=r["scheme"])
        writes = np.maximum(np.asarray(c["max_writes_per_cell"], dtype=float), 0.8)
        bottom.plot(c["sample"], writes, label=r["scheme"])
    for seg in results[0].get("segments", []):
        top.axvline(seg["start"], color="0.8", lw=0.8)
        top.text(seg["start"], 0.02, "+".join(a.upper() for a in seg["augmentations"]) or "none",
                 fontsize=7, transform=top.get_xaxis_transform())
    env = results[0]["env"]
    top.set_title(f"online adaptation, environment: {env}")
    top.set_ylabel("online accuracy (EMA 0.999)")
    top.legend(fontsize=8, loc="lower right")
    bottom.set_yscale("log")
    bottom.set_ylabel("max writes per cell")
    bottom.set_xlabel("online samples")
    fig.tight_layout()
    try:
        return save_figure(fig, path)
    finally:
        plt.close(fig)

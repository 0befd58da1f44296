"""E²-Train runs: a small ResNet on FashionMNIST (or any image dataset) with any of SMD, SLU and
PSG, and 32-bit SGD.

One row (a configuration) is an :class:`E2Learner` driven by the run harness
(:func:`insitu.harness.run_training`: the sample stream, per-epoch evaluation, checkpoints,
Ctrl-C), and counts what it computed (:class:`~insitu.e2train.energy.EnergyCounter`);
:func:`run_experiment` trains the 32-bit SGD baseline and the requested rows, and reports accuracy
and savings against the baseline (the paper's Tables 2-3). With an ``OUT`` folder a row in
progress keeps its checkpoint in ``OUT/rows/<row>-<key>.ckpt.npz`` (a rerun resumes it where it
stopped), and each finished row is written atomically to ``OUT/rows/<row>-<key>.json`` (its
trained weights to ``.npz`` beside it), the key a hash of everything the row depends on, so
experiments sharing a folder share their rows (the baseline is trained once for any E2-Train
settings; processes that run at once, such as sweep points, take turns on a row through its
``.lock`` file beside it, so the later ones reuse what the first one trained).

The paper's protocol, scaled to a 2-core CPU (section 4.1 and appendix B):

* SGD baseline: momentum 0.9, weight decay 1e-4, He initialisation; learning rate decayed by 10x
  at 50 % and 75 % of the iterations (the paper: 32k and 48k of 64k).
* PSG: SignSGD with its own, smaller learning rate (the paper: 0.03) and weight decay 5e-4, the
  same step decay.
* SMD: each mini-batch is skipped with probability ``smd_p`` (0.5), drawn from (seed, batch
  index) so that a resumed row drops the batches an uninterrupted one does; the learning-rate
  schedule still counts the skipped iterations ("all other training protocols remain
  unchanged"). As in the paper's experiments after section 4.2 ("we adopt SMD under this energy
  ratio of 0.67 in all the remaining experiments"), an SMD row runs
  ``smd_energy_ratio / (1 - smd_p)`` times the baseline's epochs, so that it trains on about ``smd_energy_ratio`` of the baseline's batches
  (0.67: 8 epochs for the baseline's 6 at p = 0.5); ``smd_energy_ratio = 1 - smd_p`` keeps the
  baseline's epochs.
* The images are 2x2 average pooled to 14x14 (a 4x cheaper ResNet on this CPU) and standardised.

Any ``--dataset`` of images runs (:func:`insitu.data.load_dataset`: the built-ins, or the user's
``folder:``, ``npz:``): the ResNet takes the dataset's channels (grey as 1, RGB as 3 input
channels, ``in_channels``) and its size after the ``downsample`` pooling (any size: its global
average pool makes the head size-free; ``--downsample 1`` keeps small images whole), and has one
output per class. Feature vectors (``csv:``, 2-D arrays) are refused (exit 2) before any work: a
ResNet convolves pixels. A row's key names the user's files by a hash of their arrays
(:attr:`insitu.data.Dataset.key`), so a changed file is trained again, never served from
``OUT/rows``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from insitu import nn
from insitu.checkpoint import save_checkpoint
from insitu.errors import UsageError
from insitu.harness import RunPlan, run_training, sample_order
from insitu.io import atomic_write_json, exclusive
from insitu.measure.phases import phase

from . import energy
from .psg import PSGLayer, PSGStats, SignSGD, psg_wrapper
from .resnet import ResNet

TECHNIQUES = ("smd", "slu", "psg")
#: Bumped whenever the training loop changes what a row computes (its key changes with it, so
#: rows cached by an older loop are trained again): 2 is the run harness's sample stream.
TRAINING_LOOP = 2
#: The rows of the ablation table (the paper's Fig. 4 / Tables 2-3): each technique alone and all.
ABLATION_ROWS = (("smd",), ("slu",), ("psg",), ("smd", "slu", "psg"))


#: How the errors name each field of :class:`E2Config`: the option of `insitu e2train run` that
#: sets it (fields without one keep their name).
OPTIONS = {"epochs": "--epochs", "batch_size": "--batch-size", "train_samples": "--train-size",
           "test_samples": "--test-samples", "lr": "--lr", "psg_lr": "--psg-lr", "smd_p": "--smd-p",
           "smd_energy_ratio": "--smd-energy-ratio", "beta": "--beta", "slu_alpha": "--slu-alpha",
           "slu_target": "--slu-target", "width": "--width", "blocks_per_stage": "--blocks-per-stage",
           "downsample": "--downsample", "dataset": "--dataset", "data_dir": "--data-dir",
           "seed": "--seed"}


@dataclass(frozen=True)
class E2Config:
    """Everything a run's result depends on (its key for resuming)."""

    epochs: int = 6
    batch_size: int = 64
    train_samples: int = 10000
    test_samples: int = 2000
    lr: float = 0.1                     # SGD
    psg_lr: float = 0.01                # SignSGD (PSG)
    weight_decay: float = 1e-4
    psg_weight_decay: float = 5e-4
    smd_p: float = 0.5
    smd_energy_ratio: float = 2 / 3     # SMD's budget in baseline epochs (the paper's protocol)
    beta: float = 0.05
    slu_alpha: float = 2.0
    slu_target: float = 0.4             # fraction of gated-block MACs SLU aims to skip
    width: int = 8                      # channels of the first stage (then 2x, 4x)
    blocks_per_stage: int = 2           # ResNet-(6n+2): 2 -> ResNet-14
    downsample: int = 2                 # average-pool the images by this factor
    dataset: str = "fashion-mnist"
    seed: int = 0
    data_dir: str | None = None         # where a built-in's files are (not part of a row's key)

    def __post_init__(self):
        opt = OPTIONS
        if not 0.0 <= self.smd_p <= 1.0:
            raise ValueError(f"{opt['smd_p']} (SMD's drop probability) must be in [0, 1], got {self.smd_p}")
        if not 0.0 < self.smd_energy_ratio <= 1.0:
            raise ValueError(f"{opt['smd_energy_ratio']} must be in (0, 1], got {self.smd_energy_ratio}")
        if not 0.0 <= self.slu_target <= 1.0:
            raise ValueError(f"{opt['slu_target']} (SLU's skip ratio) must be in [0, 1], got {self.slu_target}")
        if not 0.0 < self.beta < 1.0:
            raise ValueError(f"{opt['beta']} must be in (0, 1) (the paper uses 0.05), got {self.beta}")
        for name in ("epochs", "batch_size", "train_samples", "test_samples", "width", "downsample"):
            if getattr(self, name) < 1:
                raise ValueError(f"{opt.get(name, name)} must be >= 1, got {getattr(self, name)}")
        if self.blocks_per_stage < 0:
            raise ValueError(f"{opt['blocks_per_stage']} must be >= 0, got {self.blocks_per_stage}")
        for name in ("lr", "psg_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{opt[name]} must be > 0, got {getattr(self, name)}")
        if self.slu_alpha < 0:
            raise ValueError(f"{opt['slu_alpha']} must be >= 0, got {self.slu_alpha}")
        if self.weight_decay < 0 or self.psg_weight_decay < 0:
            raise ValueError("the weight decays must be >= 0")

    def key(self, techniques: tuple[str, ...] = TECHNIQUES, data_key: str | None = None) -> str:
        """A hash of :meth:`row_fields`: a cached row is reused only when its key matches, so
        rows are shared across runs."""
        blob = json.dumps(self.row_fields(techniques, data_key), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def row_fields(self, techniques: tuple[str, ...], data_key: str | None = None) -> dict:
        """What a row's result depends on: the config less the settings of techniques the row
        does not use (the baseline ignores beta, SMD's p...), the energy model's version and the
        training loop's; the dataset as ``data_key`` names it (:attr:`Data.key`: a built-in's
        name, the user's files with a hash of their arrays), not where its files are."""
        fields = asdict(self)
        fields.pop("data_dir")
        fields["dataset"] = data_key or self.dataset
        for technique, names in _TECHNIQUE_FIELDS.items():
            if technique not in techniques:
                for name in names:
                    fields.pop(name)
        if "psg" in techniques:
            fields.pop("lr")                # PSG rows train with psg_lr
            fields.pop("weight_decay")
        return {**fields, "energy_model": energy.VERSION, "training_loop": TRAINING_LOOP}


#: The config fields only a technique's rows depend on.
_TECHNIQUE_FIELDS = {"smd": ("smd_p", "smd_energy_ratio"), "slu": ("slu_alpha", "slu_target"),
                     "psg": ("psg_lr", "psg_weight_decay", "beta")}


def parse_techniques(text: str | tuple | list) -> tuple[str, ...]:
    """``"smd,slu"`` -> ``("smd", "slu")`` in canonical order; unknown names are an error."""
    names = [t.strip().lower() for t in (text.split(",") if isinstance(text, str) else text) if t.strip()]
    unknown = sorted(set(names) - set(TECHNIQUES))
    if unknown:
        raise ValueError(f"unknown E2-Train technique(s) {', '.join(unknown)}; choose from "
                         f"{', '.join(TECHNIQUES)} (comma separated), or 'none' for the baseline")
    return tuple(t for t in TECHNIQUES if t in names)


def row_name(techniques: tuple[str, ...]) -> str:
    return "+".join(techniques) if techniques else "sgd32"


# ------------------------------------------------------------------------------------------ data

@dataclass
class Data:
    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    num_classes: int
    #: The dataset as rows' keys name it (None: the config's dataset name).
    key: str | None = None


def load_data(config: E2Config) -> Data:
    """A class-balanced-by-chance subset of the dataset, pooled and standardised (float32 NCHW,
    one channel per image channel). Feature vectors, too few samples, or images smaller than the
    pooling are refused (UsageError or ValueError, before any training)."""
    from insitu.data import load_dataset
    
    ds = load_dataset(config.dataset, config.data_dir)
    size = ds.image_size
    if size is None:                    # feature vectors
        raise UsageError(f"E2-Train's ResNet takes images, and --dataset {ds.name} holds feature "
                         f"vectors {ds.sample_shape}: give it images (folder:DIR, or npz:FILE of "
                         "(N, H, W[, 3]) arrays); vectors train with --model mlp of "
                         "`insitu train` or `insitu lrt adapt`")
    if config.train_samples > len(ds.x_train) or config.test_samples > len(ds.x_test):
        raise ValueError(f"{config.dataset} has {len(ds.x_train)} training and {len(ds.x_test)} test "
                         f"images; asked for {OPTIONS['train_samples']} {config.train_samples} and "
                         f"{OPTIONS['test_samples']} {config.test_samples}: give "
                         f"{OPTIONS['train_samples']} {len(ds.x_train)} and "
                         f"{OPTIONS['test_samples']} {len(ds.x_test)} or less")
    k = config.downsample
    if min(size) < k:
        h, w = size
        raise ValueError(f"{OPTIONS['downsample']} {k} average-pools {k}x{k} pixels into one, and "
                         f"--dataset {ds.name} has {h}x{w} images: use {OPTIONS['downsample']} "
                         f"{min(h, w)} or less (1 keeps them whole)")
    rng = np.random.default_rng(config.seed)
    tr = rng.permutation(len(ds.x_train))[:config.train_samples]
    te = rng.permutation(len(ds.x_test))[:config.test_samples]

    def prep(images):
        x = images.astype(np.float32) / 255.0
        x = x[:, None] if x.ndim == 3 else np.moveaxis(x, 3, 1)      # NCHW: RGB is 3 channels
        if k > 1:
            n, c, h, w = x.shape
            x = x[..., :h // k * k, :w // k * k]
            x = x.reshape(n, c, h // k, k, w // k, k).mean(axis=(3, 5))
        return np.ascontiguousarray(x)

    x_train, x_test = prep(ds.x_train[tr]), prep(ds.x_test[te])
    mean, std = x_train.mean(), x_train.std()
    return Data((x_train - mean) / std, ds.y_train[tr].astype(np.int64),
                (x_test - mean) / std, ds.y_test[te].astype(np.int64), ds.num_classes,
                key=ds.key)


# ------------------------------------------------------------------------------------------ one run

def build_model(config: E2Config, techniques: tuple[str, ...], data: Data,
                psg_stats: PSGStats | None = None) -> ResNet:
    wrapper = psg_wrapper(config.beta, psg_stats) if "psg" in techniques else None
    h, w = data.x_train.shape[2:]
    return ResNet(in_channels=data.x_train.shape[1], num_classes=data.num_classes, w0=config.width,
                  blocks_per_stage=config.blocks_per_stage, gated="slu" in techniques,
                  slu_alpha=config.slu_alpha, target_skip=config.slu_target, seed=config.seed,
                  layer_wrapper=wrapper, input_size=(h, w))


def run_epochs(config: E2Config, techniques: tuple[str, ...]) -> int:
    """Epochs a row runs: the baseline's, or for SMD enough that the kept batches are about
    ``smd_energy_ratio`` of the baseline's (see the module docstring)."""
    if "smd" not in techniques or config.smd_p in (0.0, 1.0):
        return config.epochs            # p = 1 drops every batch: a run that trains nothing
    return max(1, round(config.epochs * config.smd_energy_ratio / (1.0 - config.smd_p)))


def lr_at(base: float, progress: float) -> float:
    """Step decay by 10x at 50 % and 75 % of training (the paper's 32k/48k of 64k iterations)."""
    return base * (0.1 if progress >= 0.5 else 1.0) * (0.1 if progress >= 0.75 else 1.0)


def _predicted_fractions(model: ResNet) -> dict[str, float]:
    """Per PSG layer, the fraction of its weight-gradient signs the predictor decided in its last
    backward (a layer SLU skipped this step keeps an older value, but it counts 0 samples)."""
    return {name: float(layer.last_predicted.mean()) for name, layer in model.weight_layers().items()
            if isinstance(layer, PSGLayer) and layer.last_predicted is not None}


#: Test samples of the curve's probe (the first of the row's test set, one evaluation batch), at
#: every point of the curve between the epochs' evaluations.
PROBE_SAMPLES = 500


def _accuracy(model: ResNet, x: np.ndarray, y: np.ndarray, batch: int = 500) -> float:
    correct = 0
    for i in range(0, len(x), batch):
        correct += int((model.forward(x[i:i + batch], train=False).argmax(axis=1) == y[i:i + batch]).sum())
    return correct / len(x)


def smd_drops(config: E2Config, batch: int) -> bool:
    """Whether SMD drops mini-batch ``batch`` (counted from the start of the row): a draw of its
    own from (seed, batch), so any batch's fate is the same after a resume."""
    return bool(np.random.default_rng([config.seed + 1, batch]).random() < config.smd_p)


class E2Learner:
    """One row on the sample stream of its training set (:func:`insitu.harness.sample_order`):
    one mini-batch a step, SGD with momentum (SignSGD with PSG), SMD's drops and the learning
    rate decided by the position, every executed step counted by the energy model."""

    def __init__(self, config: E2Config, techniques: tuple[str, ...], data: Data):
        self.config, self.techniques, self.data = config, techniques, data
        self.psg_stats = PSGStats()
        self.model = build_model(config, techniques, data, self.psg_stats)
        if "psg" in techniques:
            self.optimizer = SignSGD(self.model, lr=config.psg_lr, weight_decay=config.psg_weight_decay)
            self.base_lr = config.psg_lr
        else:
            self.optimizer = nn.SGD(self.model.parameters(), lr=config.lr, momentum=0.9,
                                    weight_decay=config.weight_decay)
            self.base_lr = config.lr
        self.counter = energy.EnergyCounter(self.model.layer_specs(),
                                            energy.PSG if "psg" in techniques else energy.FP32_SGD)
        self.batches_per_epoch = -(-len(data.x_train) // config.batch_size)
        self.total_batches = run_epochs(config, techniques) * self.batches_per_epoch
        self.skip_ratios: list[float] = []
        self.dropped = 0
        # The curve's training accuracy: right predictions of the training forward passes, over
        # the samples of the batches trained (SMD's dropped batches predict nothing).
        self.correct = self.scored = 0

    def batch_index(self, start: int) -> int:
        """The mini-batch that starts at stream position ``start`` (an epoch's last may be short)."""
        epoch, offset = divmod(start, len(self.data.x_train))
        return epoch * self.batches_per_epoch + offset // self.config.batch_size

    def train(self, start: int, count: int) -> float | None:
        batch = self.batch_index(start)
        # SMD: a dropped mini-batch is never loaded, run or counted, but the schedule counts it.
        if "smd" in self.techniques and smd_drops(self.config, batch):
            self.dropped += 1
            return None
        idx = sample_order(len(self.data.x_train), self.config.seed, start, count)
        self.optimizer.lr = lr_at(self.base_lr, batch / self.total_batches)
        self.optimizer.zero_grad()
        logits = self.model.forward(self.data.x_train[idx], train=True)
        self.correct += int((logits.argmax(axis=1) == self.data.y_train[idx]).sum())
        self.scored += len(idx)
        loss, dlogits = nn.softmax_cross_entropy(logits, self.data.y_train[idx])
        self.model.backward(dlogits)
        self.optimizer.step()
        self.counter.add_step(self.model.executed, len(idx), _predicted_fractions(self.model))
        if "slu" in self.techniques:
            self.skip_ratios.append(self.model.skip_ratio)
        return float(loss)

    def evaluate(self, samples: int | None = None) -> dict:
        """Test accuracy (on the first ``samples`` of the test set; None: all of it) and what
        training has cost so far."""
        x, y = self.data.x_test[:samples], self.data.y_test[:samples]
        return {"test_accuracy": _accuracy(self.model, x, y),
                "energy_j": self.counter.total_j, "macs": self.counter.total_macs}

    def probe(self) -> dict:
        """The curve's probe: :meth:`evaluate` on the first :data:`PROBE_SAMPLES` test samples (an
        inference pass: no weight, statistic or gate of training changes)."""
        return self.evaluate(PROBE_SAMPLES)

    def state(self) -> tuple[dict, dict]:
        arrays = {**{f"model.{k}": v for k, v in self.model.state_dict().items()},
                  **{f"optimizer.{k}": v for k, v in self.optimizer.state_dict().items()},
                  "slu_skip_ratios": np.asarray(self.skip_ratios, dtype=np.float64)}
        return arrays, {"counter": self.counter.state(),
                        "psg": {"predicted": self.psg_stats.predicted, "total": self.psg_stats.total},
                        "dropped_batches": self.dropped}

    def load_state(self, arrays: dict, meta: dict) -> None:
        self.model.load_state_dict({k.removeprefix("model."): v for k, v in arrays.items()
                                    if k.startswith("model.")})
        self.optimizer.load_state_dict({k.removeprefix("optimizer."): v for k, v in arrays.items()
                                        if k.startswith("optimizer.")})
        self.skip_ratios = arrays["slu_skip_ratios"].tolist()
        self.counter.load_state(meta["counter"])
        self.psg_stats.predicted, self.psg_stats.total = meta["psg"]["predicted"], meta["psg"]["total"]
        self.dropped = meta["dropped_batches"]


def train_row(config: E2Config, techniques: tuple[str, ...], data: Data,
              advance: Callable[[int], None] = lambda n: None, checkpoint: Path | None = None,
              weights_path: Path | None = None, say: Callable[[str], None] = lambda text: None) -> dict:
    """Train one row; returns accuracy, counted operations and energy, and per-epoch history.

    ``checkpoint`` (.npz): written at every epoch end and on SIGINT/SIGTERM; when it exists, the
    row resumes from it (``say`` tells) and ends exactly where an uninterrupted row would.
    ``weights_path``: where to save the trained model (an atomic .npz checkpoint; PSG rows hold
    the 8-bit weights they compute with)."""
    techniques = parse_techniques(techniques)
    name = row_name(techniques)
    learner = E2Learner(config, techniques, data)
    n = len(data.x_train)
    epochs = run_epochs(config, techniques)
    plan = RunPlan("insitu e2train run", {"row": name, **config.row_fields(techniques, data.key)},
                   samples=epochs * n, step=config.batch_size, checkpoint=checkpoint,
                   checkpoint_every=n, epoch_size=n, evaluate_every_epoch=True,
                   samples_option="--epochs")
    outcome = run_training(plan, learner, evaluate=learner.evaluate, advance=advance, say=say,
                           probe=learner.probe)
    if weights_path is not None:
        save_checkpoint(weights_path, learner.model.state_dict(),
                        {"row": name, "config": asdict(config),
                         "key": config.key(techniques, data.key)})
    return {
        "row": name, "techniques": list(techniques),
        "accuracy": outcome.evaluation["test_accuracy"], "history": outcome.history,
        "epochs": epochs, "samples": outcome.samples, "resumed_from": outcome.resumed_from,
        "final_loss": outcome.final_loss, "curve": outcome.curve,
        "steps": learner.counter.steps, "dropped_batches": learner.dropped,
        "batches": learner.total_batches,
        "psg_predicted_fraction": learner.psg_stats.fraction if "psg" in techniques else None,
        "slu_skip_ratio": float(np.mean(learner.skip_ratios)) if learner.skip_ratios else None,
        "counted": learner.counter.report(), "train_seconds": outcome.seconds,
    }


# ------------------------------------------------------------------------------------------ experiment

def _row_path(out: Path, name: str, key: str) -> Path:
    """A row's result file: by name and key, so rows of other settings sit side by side (its
    weights and its checkpoint in progress beside it)."""
    return Path(out) / "rows" / f"{name}-{key}.json"


def _cached_or_trained_row(config: E2Config, techniques: tuple[str, ...], data: Data, key: str,
                           path: Path | None, advance: Callable[[int], None],
                           log: Callable[[str], None]) -> dict:
    """The row's finished result from ``path`` when its key matches, else the row trained (its
    checkpoint beside ``path``) and written there."""
    name = row_name(techniques)
    if path and path.exists():
        cached = json.loads(path.read_text())
        if cached.get("key") == key:
            log(f"{name}: reusing {path}")
            advance(cached["samples"])
            return cached
    checkpoint = path.with_suffix(".ckpt.npz") if path else None
    with phase(name) as marker:
        result = train_row(config, techniques, data, advance, checkpoint=checkpoint,
                           weights_path=path.with_suffix(".npz") if path else None,
                           say=lambda text: log(f"{name}: {text}"))
        marker.samples = result["counted"]["samples"]
    result["key"] = key
    if path:
        atomic_write_json(path, result)
    if checkpoint:
        checkpoint.unlink()                     # the finished row's cache replaces it
    return result


def run_experiment(config: E2Config, rows: list[tuple[str, ...]], out: Path | None = None,
                   advance: Callable[[int], None] = lambda n: None,
                   log: Callable[[str], None] = lambda msg: None, data: Data | None = None) -> dict:
    """Train the 32-bit SGD baseline and ``rows``; savings are against the baseline.

    With ``out``, finished rows are kept in ``out/rows`` and reused when their key matches, and
    the row in progress keeps a checkpoint there (a rerun resumes it; ``log`` tells). Each
    trained row is a measurement phase (:func:`insitu.measure.phases.phase`, a no-op without a
    recorder) around the harness's ``train`` and ``test`` phases, so a power meter attributes
    measured energy to the row as well as to its training and its evaluations. ``data``: the
    config's :func:`load_data`, when the caller has it already.
    """
    data = data or load_data(config)
    results = {}
    for techniques in [()] + [r for r in rows if r]:
        name = row_name(techniques)
        if name in results:
            continue
        key = config.key(techniques, data.key)
        path = _row_path(out, name, key) if out else None
        # Sweep points sharing `out` train a row (the baseline) once: the others wait, then reuse it.
        with exclusive(path.with_suffix(".lock")) if path else contextlib.nullcontext():
            results[name] = _cached_or_trained_row(config, techniques, data, key, path, advance, log)
    base = results["sgd32"]
    table = []
    for name, r in results.items():
        row = {"row": name, "accuracy": r["accuracy"], "accuracy_loss": base["accuracy"] - r["accuracy"],
               **energy.savings(r["counted"], base["counted"]),
               "energy_j": r["counted"]["energy_j"], "macs": r["counted"]["macs"]["total"],
               "psg_predicted_fraction": r["psg_predicted_fraction"],
               "slu_skip_ratio": r["slu_skip_ratio"], "dropped_batches": r["dropped_batches"],
               "batches": r["batches"], "epochs": r["epochs"], "train_seconds": r["train_seconds"],
               "samples": r["samples"], "seconds": r["train_seconds"], "final_loss": r["final_loss"],
               "curve": r.get("curve", [])}          # rows cached before curves have none
        table.append(row)
    summary = {"config": asdict(config), "baseline_accuracy": base["accuracy"], "rows": table,
               "runs": results}
    if out:
        atomic_write_json(Path(out) / "e2train.json", summary)
    return summary


def total_samples(config: E2Config, rows: list[tuple[str, ...]]) -> int:
    """Progress-bar length: the stream positions of the baseline and each distinct row."""
    distinct = {r for r in rows if r} | {()}
    return sum(run_epochs(config, r) for r in distinct) * config.train_samples


def sweep_point(seed: int = 0, techniques: str = "smd,slu,psg", out: str | None = None, **settings) -> dict:
    """One point of ``insitu sweep`` (``run = "insitu.e2train.experiment:sweep_point"``): the
    baseline and one row with ``settings`` (E2Config fields); the row's figures against the
    baseline. ``out``: a folder shared by the points, so the baseline is trained once."""
    config = E2Config(seed=seed, **settings)
    rows = [parse_techniques(techniques)]
    summary = run_experiment(config, rows, Path(out) if out else None)
    row = summary["rows"][-1]
    return {**{k: row[k] for k in ("row", "accuracy", "accuracy_loss", "computational_saving",
                                   "energy_saving", "psg_predicted_fraction", "slu_skip_ratio")},
            "baseline_accuracy": summary["baseline_accuracy"]}

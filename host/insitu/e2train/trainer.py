"""E²-Train runs: a small ResNet on FashionMNIST with any of SMD, SLU and PSG, and 32-bit SGD.

One :func:`train_run` trains one configuration and counts what it computed
(:class:`~insitu.e2train.energy.EnergyCounter`); :func:`run_experiment` trains the 32-bit SGD
baseline and the requested rows, and reports accuracy and savings against the baseline (the
paper's Tables 2-3). Each finished row is written atomically to ``OUT/rows/<row>-<key>.json``
(its trained weights to ``.npz`` beside it), the key a hash of everything the row depends on, so
an interrupted experiment resumes at the row it stopped in, and experiments sharing a folder share
their rows (the baseline is trained once for any E2-Train settings).

The paper's protocol, scaled to a 2-core CPU (section 4.1 and appendix B):

* SGD baseline: momentum 0.9, weight decay 1e-4, He initialisation; learning rate decayed by 10x
  at 50 % and 75 % of the iterations (the paper: 32k and 48k of 64k).
* PSG: SignSGD with its own, smaller learning rate (the paper: 0.03) and weight decay 5e-4, the
  same step decay.
* SMD: each mini-batch is skipped with probability ``smd_p`` (0.5); the learning-rate schedule
  still counts the skipped iterations ("all other training protocols remain unchanged"). As in
  the paper's experiments after section 4.2 ("we adopt SMD under this energy ratio of 0.67 in
  all the remaining experiments"), an SMD row runs ``smd_energy_ratio / (1 - smd_p)`` times the
  baseline's epochs, so that it trains on about ``smd_energy_ratio`` of the baseline's batches
  (0.67: 8 epochs for the baseline's 6 at p = 0.5); ``smd_energy_ratio = 1 - smd_p`` keeps the
  baseline's epochs.
* The images are 2x2 average pooled to 14x14 (a 4x cheaper ResNet on this CPU) and standardised.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from insitu import nn
from insitu.checkpoint import save_checkpoint
from insitu.io import atomic_write_json
from insitu.measure.phases import phase

from . import energy
from .psg import PSGLayer, PSGStats, SignSGD, psg_wrapper
from .resnet import ResNet

TECHNIQUES = ("smd", "slu", "psg")
#: The rows of the ablation table (the paper's Fig. 4 / Tables 2-3): each technique alone and all.
ABLATION_ROWS = (("smd",), ("slu",), ("psg",), ("smd", "slu", "psg"))


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

    def __post_init__(self):
        if not 0.0 <= self.smd_p <= 1.0:
            raise ValueError(f"SMD drop probability must be in [0, 1], got {self.smd_p}")
        if not 0.0 < self.smd_energy_ratio <= 1.0:
            raise ValueError(f"SMD energy ratio must be in (0, 1], got {self.smd_energy_ratio}")
        if not 0.0 <= self.slu_target <= 1.0:
            raise ValueError(f"SLU target skip ratio must be in [0, 1], got {self.slu_target}")
        if not 0.0 < self.beta < 1.0:
            raise ValueError(f"PSG beta must be in (0, 1) (the paper uses 0.05), got {self.beta}")
        for name in ("epochs", "batch_size", "train_samples", "test_samples", "width", "downsample"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.blocks_per_stage < 0:
            raise ValueError(f"blocks_per_stage must be >= 0, got {self.blocks_per_stage}")
        for name in ("lr", "psg_lr"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.slu_alpha < 0 or self.weight_decay < 0 or self.psg_weight_decay < 0:
            raise ValueError("slu_alpha and the weight decays must be >= 0")

    def key(self, techniques: tuple[str, ...] = TECHNIQUES) -> str:
        """What a row's result depends on: the config less the settings of techniques the row
        does not use (the baseline ignores beta, SMD's p...), and the energy model's version.
        A cached row is reused only when its key matches, so rows are shared across runs."""
        fields = asdict(self)
        for technique, names in _TECHNIQUE_FIELDS.items():
            if technique not in techniques:
                for name in names:
                    fields.pop(name)
        if "psg" in techniques:
            fields.pop("lr")                # PSG rows train with psg_lr
            fields.pop("weight_decay")
        blob = json.dumps({**fields, "energy_model": energy.VERSION}, sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


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


def load_data(config: E2Config) -> Data:
    """A class-balanced-by-chance subset of the dataset, pooled and standardised (float32 NCHW)."""
    from insitu.data import load_dataset

    ds = load_dataset(config.dataset)
    if config.train_samples > len(ds.x_train) or config.test_samples > len(ds.x_test):
        raise ValueError(f"{config.dataset} has {len(ds.x_train)} training and {len(ds.x_test)} test "
                         f"images; asked for {config.train_samples} and {config.test_samples}")
    rng = np.random.default_rng(config.seed)
    tr = rng.permutation(len(ds.x_train))[:config.train_samples]
    te = rng.permutation(len(ds.x_test))[:config.test_samples]

    def prep(images):
        x = images.astype(np.float32) / 255.0
        k = config.downsample
        if k > 1:
            n, h, w = x.shape
            x = x[:, :h // k * k, :w // k * k].reshape(n, h // k, k, w // k, k).mean(axis=(2, 4))
        return x[:, None]

    x_train, x_test = prep(ds.x_train[tr]), prep(ds.x_test[te])
    mean, std = x_train.mean(), x_train.std()
    return Data((x_train - mean) / std, ds.y_train[tr].astype(np.int64),
                (x_test - mean) / std, ds.y_test[te].astype(np.int64), ds.num_classes)


# ------------------------------------------------------------------------------------------ one run

def build_model(config: E2Config, techniques: tuple[str, ...], data: Data,
                psg_stats: PSGStats | None = None) -> ResNet:
    wrapper = psg_wrapper(config.beta, psg_stats) if "psg" in techniques else None
    return ResNet(in_channels=data.x_train.shape[1], num_classes=data.num_classes, w0=config.width,
                  blocks_per_stage=config.blocks_per_stage, gated="slu" in techniques,
                  slu_alpha=config.slu_alpha, target_skip=config.slu_target, seed=config.seed,
                  layer_wrapper=wrapper, input_size=data.x_train.shape[2:])


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


def _accuracy(model: ResNet, x: np.ndarray, y: np.ndarray, batch: int = 500) -> float:
    correct = 0
    for i in range(0, len(x), batch):
        correct += int((model.forward(x[i:i + batch], train=False).argmax(axis=1) == y[i:i + batch]).sum())
    return correct / len(x)


def train_run(config: E2Config, techniques: tuple[str, ...], data: Data,
              advance: Callable[[int], None] = lambda n: None, weights_path: Path | None = None) -> dict:
    """Train one row; returns accuracy, counted operations and energy, and per-epoch history.
    ``weights_path``: where to save the trained model (an atomic .npz checkpoint; PSG rows hold
    the 8-bit weights they compute with)."""
    techniques = parse_techniques(techniques)
    stats = PSGStats()
    model = build_model(config, techniques, data, stats)
    if "psg" in techniques:
        opt = SignSGD(model, lr=config.psg_lr, weight_decay=config.psg_weight_decay)
        base_lr = config.psg_lr
    else:
        opt = nn.SGD(model, lr=config.lr, momentum=0.9, weight_decay=config.weight_decay)
        base_lr = config.lr
    counter = energy.EnergyCounter(model.layer_specs(), energy.PSG if "psg" in techniques else energy.FP32_SGD)
    rng = np.random.default_rng(config.seed + 1)
    n = len(data.x_train)
    batches_per_epoch = -(-n // config.batch_size)
    epochs = run_epochs(config, techniques)
    total_batches = epochs * batches_per_epoch
    history, skip_ratios = [], []
    dropped = 0
    t0 = time.perf_counter()
    for epoch in range(epochs):
        order = rng.permutation(n)
        for b in range(batches_per_epoch):
            it = epoch * batches_per_epoch + b
            advance(1)
            # SMD: a dropped mini-batch is never loaded, run or counted.
            if "smd" in techniques and rng.random() < config.smd_p:
                dropped += 1
                continue
            idx = order[b * config.batch_size:(b + 1) * config.batch_size]
            opt.lr = lr_at(base_lr, it / total_batches)
            opt.zero_grad()
            logits = model.forward(data.x_train[idx], train=True)
            _, dlogits = nn.softmax_cross_entropy(logits, data.y_train[idx])
            model.backward(dlogits)
            opt.step()
            counter.add_step(model.executed, len(idx), _predicted_fractions(model))
            if "slu" in techniques:
                skip_ratios.append(model.skip_ratio)
        history.append({"epoch": epoch + 1, "test_accuracy": _accuracy(model, data.x_test, data.y_test),
                        "energy_j": counter.total_j, "macs": counter.total_macs})
    seconds = time.perf_counter() - t0
    if weights_path is not None:
        save_checkpoint(weights_path, model.state_dict(),
                        {"row": row_name(techniques), "config": asdict(config), "key": config.key(techniques)})
    return {
        "row": row_name(techniques), "techniques": list(techniques),
        "accuracy": history[-1]["test_accuracy"], "history": history,
        "epochs": epochs, "steps": counter.steps, "dropped_batches": dropped, "batches": total_batches,
        "psg_predicted_fraction": stats.fraction if "psg" in techniques else None,
        "slu_skip_ratio": float(np.mean(skip_ratios)) if skip_ratios else None,
        "counted": counter.report(), "train_seconds": seconds,
    }


# ------------------------------------------------------------------------------------------ experiment

def _row_path(out: Path, name: str, key: str) -> Path:
    """A row's result file: by name and key, so rows of other settings sit side by side."""
    return Path(out) / "rows" / f"{name}-{key}.json"


def run_experiment(config: E2Config, rows: list[tuple[str, ...]], out: Path | None = None,
                   advance: Callable[[int], None] = lambda n: None,
                   log: Callable[[str], None] = lambda msg: None) -> dict:
    """Train the 32-bit SGD baseline and ``rows``; savings are against the baseline.

    With ``out``, finished rows are kept in ``out/rows`` and reused when their key matches.
    Each trained row is a measurement phase (:func:`insitu.measure.phases.phase`, a no-op
    without a recorder), so a power meter attributes measured energy to it.
    """
    data = load_data(config)
    results = {}
    for techniques in [()] + [r for r in rows if r]:
        name = row_name(techniques)
        if name in results:
            continue
        key = config.key(techniques)
        path = _row_path(out, name, key) if out else None
        if path and path.exists():
            cached = json.loads(path.read_text())
            if cached.get("key") == key:
                log(f"{name}: reusing {path}")
                results[name] = cached
                advance(cached["batches"])
                continue
        with phase(name) as marker:
            result = train_run(config, techniques, data, advance,
                               weights_path=path.with_suffix(".npz") if path else None)
            marker.samples = result["counted"]["samples"]
        result["key"] = key
        if path:
            atomic_write_json(path, result)
        results[name] = result
    base = results["sgd32"]
    table = []
    for name, r in results.items():
        row = {"row": name, "accuracy": r["accuracy"], "accuracy_loss": base["accuracy"] - r["accuracy"],
               **energy.savings(r["counted"], base["counted"]),
               "energy_j": r["counted"]["energy_j"], "macs": r["counted"]["macs"]["total"],
               "psg_predicted_fraction": r["psg_predicted_fraction"],
               "slu_skip_ratio": r["slu_skip_ratio"], "dropped_batches": r["dropped_batches"],
               "batches": r["batches"], "epochs": r["epochs"], "train_seconds": r["train_seconds"]}
        table.append(row)
    summary = {"config": asdict(config), "baseline_accuracy": base["accuracy"], "rows": table,
               "runs": results}
    if out:
        atomic_write_json(Path(out) / "e2train.json", summary)
    return summary


def total_batches(config: E2Config, rows: list[tuple[str, ...]]) -> int:
    """Progress-bar length: batches of the baseline and each distinct row."""
    distinct = {r for r in rows if r} | {()}
    return sum(run_epochs(config, r) for r in distinct) * -(-config.train_samples // config.batch_size)


def sweep_point(seed: int = 0, techniques: str = "smd,slu,psg", out: str | None = None, **settings) -> dict:
    """One point of ``insitu sweep`` (``run = "insitu.e2train.trainer:sweep_point"``): the
    baseline and one row with ``settings`` (E2Config fields); the row's figures against the
    baseline. ``out``: a folder shared by the points, so the baseline is trained once."""
    config = E2Config(seed=seed, **settings)
    rows = [parse_techniques(techniques)]
    summary = run_experiment(config, rows, Path(out) if out else None)
    row = summary["rows"][-1]
    return {**{k: row[k] for k in ("row", "accuracy", "accuracy_loss", "computational_saving",
                                   "energy_saving", "psg_predicted_fraction", "slu_skip_ratio")},
            "baseline_accuracy": summary["baseline_accuracy"]}

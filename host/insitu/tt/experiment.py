"""The FashionMNIST experiment of the TT paper (Table 1): five variants, one training loop, on any
dataset (the network's modes for it: :mod:`.network`).

The loop is the run harness (:mod:`insitu.harness`) driving a :class:`TTLearner`; ``insitu train
--algo tt`` runs the same learner with the accelerator as the PE ops' executor
(:mod:`insitu.fpga.board_runs`).

``dense`` is the vanilla network (896 -> 512 -> 16 dense layers, float, for FashionMNIST: the TT
network's padded sizes); the others are the two TT
layers in float or fixed point (4-bit BinaryConnect factors, golden-model PEs), without or with the
rank-adaptive prior. Every variant trains with Adam on mini-batches (the paper's appendix B) and
records per epoch: accuracies, TT ranks, parameters and memory.

The prior enters the mini-batch loss as ``mean CE + g / N`` (N: training-set size): eq. 1 written
per sample, the scaling under which ``g`` is the negative log-prior of the whole data set.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np

from insitu import nn
from insitu.checks import check_int
from insitu.data import load_dataset
from insitu.harness import RunPlan, run_training, sample_order

from .model import FLOAT_BITS, PAPER_LAYERS, TTNet
from .network import EVAL_BATCH, TTShape, fit_input, parse_input_size, parse_modes, tt_shape
from .prior import LAMBDA_FLOOR

VARIANTS = {
    # name: (tensorized, quantized, prior)
    "dense": (False, False, False),
    "float": (True, False, False),
    "fixed": (True, True, False),
    "float-prior": (True, False, True),
    "fixed-prior": (True, True, True),
}
CLASSES = 10                 # FashionMNIST's (other datasets: their own)
#: Test samples of the curve's probe (the first of the test set, one evaluation batch), at every
#: point of the curve between the epochs' evaluations.
PROBE_SAMPLES = EVAL_BATCH
LR_SCHEDULES = ("constant", "cosine")
#: The config fields that shape the network (--tt-modes, --input-size).
SHAPE_OPTIONS = ("tt_modes", "input_size")
#: The fields `insitu train --algo tt` takes besides its TrainConfig's (insitu.fpga.board_runs).
BOARD_OPTIONS = (*SHAPE_OPTIONS, "prior_weight")


@dataclass
class TTTrainConfig:
    variant: str = "fixed-prior"
    epochs: int = 10
    batch_size: int = 64
    lr: float = 1e-3
    lr_schedule: str = "cosine"        # "constant" or "cosine" (annealed to 0 over the epochs)
    rank: int = 16
    prune_threshold: float = 0.01      # relative to the largest lambda of the core
    prior_weight: float = 5.0          # multiplies g / N (docs/tt.md: 1, 3, 5, 10 measured)
    train_samples: int | None = None   # a prefix of the shuffled training set (quick runs)
    eval_train_samples: int = 10_000   # training accuracy is measured on this many samples
    seed: int = 0
    dataset: str = "fashion-mnist"
    data_dir: str | None = None
    tt_modes: tuple[int, ...] | None = None    # the first layer's input modes (None: the rule's)
    input_size: tuple[int, ...] | None = None  # images brought to (H, W[, C]) first (None: as they are)

    #: How the errors name each field: the option of `insitu tt train` that sets it.
    OPTIONS = {"variant": "--variant", "epochs": "--epochs", "batch_size": "--batch-size",
               "lr": "--lr", "lr_schedule": "--lr-schedule", "rank": "--rank",
               "prune_threshold": "--prune-threshold", "prior_weight": "--prior-weight",
               "train_samples": "--train-size", "seed": "--seed", "dataset": "--dataset",
               "tt_modes": "--tt-modes", "input_size": "--input-size"}

    def validate(self) -> None:
        opt = self.OPTIONS
        if self.variant not in VARIANTS:
            raise ValueError(f"unknown {opt['variant']} {self.variant!r}; choose one of {', '.join(VARIANTS)}")
        for name in ("epochs", "batch_size", "rank", "eval_train_samples"):
            check_int(opt.get(name, name), getattr(self, name))
        if self.train_samples is not None:
            check_int(opt["train_samples"], self.train_samples)
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"{opt['lr_schedule']} must be one of {', '.join(LR_SCHEDULES)}, "
                             f"got {self.lr_schedule!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"{opt['lr']} must be a positive number, got {self.lr}")
        if not 0 <= self.prune_threshold < 1:
            raise ValueError(f"{opt['prune_threshold']} must be in [0, 1), got {self.prune_threshold}")
        if not (math.isfinite(self.prior_weight) and self.prior_weight >= 0):
            raise ValueError(f"{opt['prior_weight']} must be >= 0, got {self.prior_weight}")
        # The shape options' syntax; whether the network fits the PEs depends on the data
        # (prepare_data).
        if self.tt_modes is not None:
            parse_modes(self.tt_modes, opt["tt_modes"])
        if self.input_size is not None:
            parse_input_size(self.input_size, opt["input_size"])


def prepare_data(config: TTTrainConfig):
    """Validate ``config``, load its dataset (brought to ``input_size`` if given) and choose the
    network for it: ``(dataset, TTShape)``.

    Raises ValueError for anything the user chose wrong (the CLI's exit 2), before any training:
    the TT variants' every op must fit the PEs (the float variants run the same ops).
    """
    config.validate()
    data = fit_input(load_dataset(config.dataset, config.data_dir), config.input_size)
    if config.train_samples is not None and config.train_samples > len(data.x_train):
        raise ValueError(f"{config.OPTIONS['train_samples']} {config.train_samples} exceeds the "
                         f"{len(data.x_train)} training samples of {config.dataset}")
    shape = tt_shape(data.sample_shape, data.num_classes, rank=config.rank, batch=config.batch_size,
                     modes=config.tt_modes, check=VARIANTS[config.variant][0])
    return data, shape


class NetworkInputs:
    """A split of the dataset as the network's input vectors, converted for the rows asked for
    (``x[index_array]``, ``x[a:b]``): a run takes a mini-batch or an evaluation slice at a time,
    and a whole split up front is 8 bytes a value (FashionMNIST's training set: 60,000 x 896,
    430 MB, most of a ZedBoard's memory) for a run that may train on 64 samples. Each sample is
    converted on its own: ``x[rows]`` is ``shape.vectors(data.float_images(split, np.float64))[rows]``
    bit for bit."""

    def __init__(self, data, split: str, shape: TTShape, rows=None):
        self.data, self.split, self.shape = data, split, shape
        self.rows = np.arange(data.splits[split]) if rows is None else np.asarray(rows)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index) -> np.ndarray:
        return self.shape.vectors(self.data.float_images(self.split, np.float64, self.rows[index]))

    def subset(self, index) -> NetworkInputs:
        """The ``index`` rows (an index array or a slice) of these, still converted when asked for."""
        return NetworkInputs(self.data, self.split, self.shape, self.rows[index])


def network_inputs(data, shape: TTShape):
    """The dataset as the network's input vectors: ``(x_train, y_train, x_test, y_test)``, the
    vectors as :class:`NetworkInputs`."""
    return (NetworkInputs(data, "train", shape), np.asarray(data.y_train),
            NetworkInputs(data, "test", shape), np.asarray(data.y_test))


def _sizes(layers) -> list[int]:
    return [math.prod(layers[0][0]), math.prod(layers[0][1]), math.prod(layers[1][1])]


def dense_network(seed: int, layers=PAPER_LAYERS) -> nn.Sequential:
    """The vanilla baseline: the TT layers' sizes (896 -> 512 -> 16 for FashionMNIST) as dense
    float layers."""
    sizes = _sizes(layers)
    return nn.Sequential(nn.Dense(sizes[0], sizes[1], seed=seed), nn.ReLU(),
                         nn.Dense(sizes[1], sizes[2], seed=seed + 1))


def dense_memory_bits(layers=PAPER_LAYERS) -> int:
    """Memory of the vanilla network: every weight and bias as a 32-bit float (the reference)."""
    net_sizes = [(math.prod(i), math.prod(o)) for i, o in layers]
    return sum(i * o + o for i, o in net_sizes) * FLOAT_BITS


class Model:
    """The variant's network behind one interface: logits, a training step, size figures."""

    def __init__(self, config: TTTrainConfig, train_size: int, layers=PAPER_LAYERS, executor=None,
                 classes: int = CLASSES):
        self.tensorized, quantized, self.use_prior = VARIANTS[config.variant]
        self.config = config
        self.train_size = train_size
        self.layers, self.classes = layers, classes
        self.net: TTNet | nn.Sequential
        if self.tensorized:
            self.net = TTNet(layers, rank=config.rank, quantized=quantized, seed=config.seed,
                             classes=classes, executor=executor)
        else:
            self.net = dense_network(config.seed, layers)
        self.optimizer = nn.Adam(self.net, lr=config.lr)
        self.last_correct = 0              # right predictions of the last step's forward pass

    @property
    def tt_net(self) -> TTNet:
        """The network of a tensorized variant (what its TT-only steps use)."""
        if not isinstance(self.net, TTNet):
            raise TypeError(f"the {self.config.variant!r} variant has no TT network")
        return self.net

    def logits(self, x: np.ndarray) -> np.ndarray:
        out = self.net.forward(x, train=False)
        return out if self.tensorized else out[:, :self.classes]

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One training step on the mini-batch; returns its loss (and counts in
        :attr:`last_correct` how many of its samples the forward pass predicted right)."""
        if self.tensorized:
            net = self.tt_net
            logits = net.forward(x)
            self.last_correct = int(np.sum(np.argmax(logits, axis=1) == y))
            loss, dlogits = nn.softmax_cross_entropy(logits, y)
            net.backward(dlogits)
            if self.use_prior:
                net.add_prior_grads(self.config.prior_weight / self.train_size)
            self.optimizer.step()
            net.after_step()
            return loss
        self.net.zero_grad()
        logits = self.net.forward(x)
        self.last_correct = int(np.sum(np.argmax(logits[:, :self.classes], axis=1) == y))
        loss, dlogits = nn.softmax_cross_entropy(logits[:, :self.classes], y)
        full = np.zeros_like(logits)
        full[:, :self.classes] = dlogits
        self.net.backward(full)
        self.optimizer.step()
        return loss

    def end_of_epoch(self) -> int:
        if self.tensorized and self.use_prior:
            return self.tt_net.prune(self.config.prune_threshold, self.optimizer)
        return 0

    # ------------------------------------------------------------------ checkpoints
    def state(self) -> tuple[dict, dict]:
        """``(arrays, meta)``: parameters, Adam moments and scales (the run's whole state)."""
        arrays = {f"param.{p.key}": p.value for p in self.net.parameters()}
        for key, moments in self.optimizer.state.items():
            arrays.update({f"adam.{name}.{key}": v for name, v in moments.items()})
        meta: dict = {"adam_steps": self.optimizer.steps}
        net = self.tt_net if self.tensorized else None
        if net is not None and net.quantized:
            assert net.executor is not None         # a quantized network has one
            meta["pe_scales"] = net.executor.state()
            meta["act_scales"] = {k: s.frac for k, s in net.act_scales.items()}
        return arrays, meta

    def load_state(self, arrays: dict, meta: dict) -> None:
        if self.tensorized:
            net = self.tt_net
            for k, ttm in enumerate(net.ttms):
                ttm.cores = [np.array(arrays[f"param.l{k}.g{n + 1}"]) for n in range(ttm.d)]
                net.biases[k] = np.array(arrays[f"param.l{k}.bias"])
            net.after_step()                               # lambdas from the loaded cores
            net.sync_params()
            if net.quantized:
                assert net.executor is not None     # a quantized network has one
                net.executor.load_state(meta["pe_scales"])
                net.load_act_scales(meta["act_scales"])
        else:
            for p in self.net.parameters():
                p.value[...] = arrays[f"param.{p.key}"]
        self.optimizer.steps = meta["adam_steps"]
        self.optimizer.state = {}
        for name, value in arrays.items():
            if name.startswith("adam."):
                _, moment, key = name.split(".", 2)
                self.optimizer.state.setdefault(key, {})[moment] = np.array(value)

    def figures(self) -> dict:
        if self.tensorized:
            net = self.tt_net
            params, bits, ranks = net.parameter_count, net.memory_bits, net.ranks
        else:
            params = sum(p.value.size for p in self.net.parameters())
            bits, ranks = params * FLOAT_BITS, None
        return {"parameters": params, "memory_bits": bits,
                "memory_reduction": dense_memory_bits(self.layers) / bits, "ranks": ranks}


def learning_rate(config: TTTrainConfig, progress: float) -> float:
    """The learning rate ``progress`` epochs into the run (cosine: half a cosine down to 0)."""
    if config.lr_schedule == "constant":
        return config.lr
    return config.lr * 0.5 * (1 + math.cos(math.pi * progress / config.epochs))


def accuracy(model: Model, x: np.ndarray | NetworkInputs, y: np.ndarray, batch: int = EVAL_BATCH) -> float:
    correct = 0
    for start in range(0, len(x), batch):
        correct += int(np.sum(model.logits(x[start:start + batch]).argmax(axis=1) == y[start:start + batch]))
    return correct / len(x)


def curve_probe(model: Model, x_test: np.ndarray | NetworkInputs, y_test: np.ndarray):
    """The curve's probe: the accuracy on the first :data:`PROBE_SAMPLES` of the test set (an
    inference pass: it leaves the weights and every scale as they are)."""
    n = min(PROBE_SAMPLES, len(y_test))
    return lambda: {"test_accuracy": accuracy(model, x_test[:n], y_test[:n])}


class TTLearner:
    """A :class:`Model` on the sample stream of a training set (:func:`insitu.harness.sample_order`),
    with the learning rate of its schedule at each step; its executor decides where the PE ops run."""

    def __init__(self, model: Model, x: np.ndarray | NetworkInputs, y: np.ndarray, seed: int):
        self.model, self.x, self.y, self.seed = model, x, y, seed
        self.pruned = 0                        # rank slices the prior removed so far
        self.correct = 0                       # right predictions while training (the curve's)

    def train(self, start: int, count: int) -> float:
        self.model.optimizer.lr = learning_rate(self.model.config, start / len(self.x))
        batch = sample_order(len(self.x), self.seed, start, count)
        loss = self.model.step(self.x[batch], self.y[batch])
        self.correct += self.model.last_correct
        return loss

    def end_of_epoch(self, epoch: int) -> dict:
        """The prior prunes once per epoch; the epoch's figures for the history."""
        pruned = self.model.end_of_epoch()
        self.pruned += pruned
        record = {"pruned_ranks": pruned, **self.model.figures()}
        if self.model.tensorized and self.model.use_prior:
            net = self.model.tt_net
            record["prior"] = net.prior()
            # lambda / the core's largest, per core: how close each rank slice is to pruning.
            record["lambda_ratios"] = [[(lam / max(lam.max(), LAMBDA_FLOOR)).round(5).tolist()
                                        for lam in layer] for layer in net.lambdas]
        return record

    def state(self) -> tuple[dict, dict]:
        arrays, meta = self.model.state()
        return arrays, {**meta, "pruned_ranks": self.pruned}

    def load_state(self, arrays: dict, meta: dict) -> None:
        self.model.load_state(arrays, meta)
        self.pruned = meta["pruned_ranks"]


def run_identity(config: TTTrainConfig, data=None) -> dict:
    """What makes a checkpoint this run's: the configuration (with a cosine schedule, the epoch
    budget too: it shapes every step's learning rate), and the data's key, not its spec (a
    checkpoint never resumes on a changed file of the user's)."""
    key = asdict(config)
    if data is not None:
        key["dataset"] = data.key
    key.pop("data_dir")
    if config.lr_schedule == "constant":
        key.pop("epochs")
    for name in SHAPE_OPTIONS:             # unset: the checkpoints of earlier versions resume
        if key[name] is None:
            key.pop(name)
    return key


def run_tt_training(config: TTTrainConfig, on_epoch=lambda record: None,
                    advance=lambda n: None, checkpoint=None, say=lambda text: None) -> dict:
    """Train one variant; returns the result record (per-epoch history included).

    ``checkpoint`` (.npz): written atomically after every epoch (and on SIGINT/SIGTERM); when it
    exists, the run resumes from it and ends exactly where an uninterrupted run would.
    """
    data, shape = prepare_data(config)
    x_train, y_train, x_test, y_test = network_inputs(data, shape)
    rng = np.random.default_rng(config.seed)
    if config.train_samples is not None:
        pick = rng.permutation(len(x_train))[:config.train_samples]
        x_train, y_train = x_train.subset(pick), y_train[pick]
    eval_pick = rng.permutation(len(x_train))[:config.eval_train_samples]
    learner = TTLearner(Model(config, len(x_train), shape.layers, classes=shape.classes), x_train,
                        y_train, config.seed)

    def evaluate() -> dict:
        return {"train_accuracy": accuracy(learner.model, x_train[eval_pick], y_train[eval_pick]),
                "test_accuracy": accuracy(learner.model, x_test, y_test)}

    plan = RunPlan("insitu tt train", run_identity(config, data), config.epochs * len(x_train),
                   config.batch_size, checkpoint, checkpoint_every=len(x_train),
                   epoch_size=len(x_train), evaluate_every_epoch=True, samples_option="--epochs")
    outcome = run_training(plan, learner, evaluate=evaluate, end_of_epoch=learner.end_of_epoch,
                           advance=advance, say=say, on_history=on_epoch,
                           probe=curve_probe(learner.model, x_test, y_test))
    history = outcome.history
    final = history[-1]
    best = max(history, key=lambda r: r["test_accuracy"])
    return {
        "variant": config.variant,
        "config": asdict(config),
        "test_accuracy": final["test_accuracy"],
        "train_accuracy": final["train_accuracy"],
        "best_test_accuracy": best["test_accuracy"],
        "best_epoch": best["epoch"],
        "parameters": final["parameters"],
        "memory_bits": final["memory_bits"],
        "memory_reduction": final["memory_reduction"],
        "dense_memory_bits": dense_memory_bits(shape.layers),
        "network": shape.describe(),
        "ranks": final["ranks"],
        "epochs": config.epochs,
        "train_samples": len(x_train),
        "samples": outcome.samples,
        "seconds": outcome.seconds,
        "final_loss": outcome.final_loss,
        "history": history,
        "curve": outcome.curve,
    }

"""On-device training: one entry point for every board and algorithm (`insitu train`).

An algorithm is registered in :data:`ALGORITHMS` with the kinds of board it runs on and a function
that trains and returns a JSON-ready result. The board decides the code path: a simulated twin runs
here, a real board runs the same code on the board itself.

The algorithm this module ships is ``sgd``: the reference float SGD of the NumPy training core, run
by the host processor model of a twin. It is the baseline the hardware algorithms are compared
against, and it exercises the shared pieces every algorithm uses: the dataset stream, the sample
budget, resumable checkpoints and the result record.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import AbstractSet, Callable

import numpy as np

from insitu import nn
from insitu.boards import Board, get_board, load_boards
from insitu.checks import check_int, check_number
from insitu.data import check_dataset, load_dataset
from insitu.data.files import is_file_spec
from insitu.sparse.models import model_names
from insitu.errors import InsituError, UsageError
from insitu.harness import RunPlan, run_identity, run_training, sample_order, say
from insitu.nn.networks import CNN_MIN_SIZE, NETWORKS, image_input
from insitu.sparse import DEFAULT_LR as SPARSE_DEFAULT_LR

@dataclass
class TrainConfig:
    board: str = "ultra96v2-sim"
    algo: str = "sgd"
    dataset: str | None = None         # None: the algorithm's default (its task)
    data_dir: str | None = None
    model: str | None = None           # None: the algorithm's default network
    samples: int = 60_000
    batch_size: int | None = None      # None: the algorithm's default
    lr: float | None = None            # None: the algorithm's default
    seed: int = 0
    checkpoint: str | None = None
    checkpoint_every: int = 10_000     # samples between checkpoints
    # The FPGA algorithms (tt, lrt):
    mode: str = "fast"                 # a twin's model of the PL: "fast" (functional), "rtl"
                                       # (RTL compiled with Verilator), "rtl-amaranth" (Amaranth sim)
    bitstream: str | None = None       # a real board's .bit (its .hwh beside it)
    rank: int | None = None            # None: the algorithm's default
    env: str = "shift"                 # lrt: the online environment
    # The TT network's shape for the dataset (insitu.tt.network) and its prior's weight:
    tt_modes: tuple[int, ...] | None = None     # the first layer's input modes (None: the rule's)
    input_size: tuple[int, ...] | None = None   # images resized to (H, W[, C]) first (None: as they are)
    prior_weight: float | None = None           # None: the TT experiment's default
    test_samples: int | None = None    # test samples to evaluate (None: the algorithm's default)
    # The MCU algorithm (sparse):
    scheme: str | None = None          # sparse-update scheme (None: the algorithm's default)
    port: str | None = None            # a real board's serial port (or a running twin's)
    heap: int | None = None            # a twin's heap in bytes (None: the board's training budget)
    flash_dir: str | None = None       # a twin's flash folder (None: a temporary one)
    twin: str | None = None            # the kind of twin started (None: the Cortex-M7 one)
    lr_scale: tuple[str, ...] = ()     # per-layer lr factors, "LAYER=FACTOR" (or a {layer: factor} dict)

    def validate(self, models, model_files: tuple[str, ...] = ()) -> None:
        """Checks after the algorithm's defaults are filled in; ``models``: the algorithm's, and
        ``model_files`` the suffixes of model files it takes (``.onnx``)."""
        for name in ("samples", "checkpoint_every", "batch_size", "rank", "test_samples", "heap"):
            value = getattr(self, name)
            if value is not None:
                check_int(f"--{name.replace('_', '-')}", value)
        check_int("--seed", self.seed, low=0)
        if self.lr is not None:
            check_number("--lr", self.lr)
        if model_files and Path(str(self.model)).suffix.lower() in model_files:
            if not Path(str(self.model)).is_file():
                raise UsageError(f"--model {self.model}: no such file")
        elif self.model not in models:
            files = f", or a {' / '.join(model_files)} file" if model_files else ""
            raise UsageError(f"unknown --model {self.model!r} for --algo {self.algo}; its models: "
                             f"{', '.join(models)}{files}")
        if self.dataset and is_file_spec(self.dataset):    # names are checked by each algorithm
            check_dataset(self.dataset, self.data_dir)


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    board_kinds: tuple[str, ...]
    twins_only: bool
    run: Callable[[TrainConfig, Board, Callable[[int], None]], dict]
    #: The options the algorithm takes beyond the COMMON ones; any other is refused.
    options: frozenset[str] = frozenset()
    #: Cheap checks of a config (defaults filled in) that need no data and no board: run before
    #: any slow work (pre-training, firmware builds, a power meter).
    check: Callable[[TrainConfig, Board], object] | None = None
    #: The algorithm's own defaults filled into a checked config (after the model, dataset,
    #: batch size and lr below), e.g. sparse's per-layer learning rates.
    fill_defaults: Callable[[TrainConfig], TrainConfig] | None = None
    #: models the algorithm trains (the first is its default), and its default batch size and lr
    models: tuple[str, ...] = ()
    #: suffixes of model files that --model takes besides the names (sparse: ".onnx")
    model_files: tuple[str, ...] = ()
    batch_size: int | None = 32
    lr: float | None = 0.05
    dataset: str = "fashion-mnist"


ALGORITHMS: dict[str, Algorithm] = {}

#: The options every algorithm takes.
COMMON_OPTIONS = frozenset({"board", "algo", "dataset", "data_dir", "model", "samples", "batch_size",
                            "lr", "seed", "test_samples"})
#: A checkpoint file on the host (sparse keeps its checkpoint on the device's flash instead).
HOST_CHECKPOINT = frozenset({"checkpoint", "checkpoint_every"})
#: Options that apply to some boards only: (applies to the board?, to which boards).
BOARD_OPTIONS: dict[str, tuple[Callable[[Board, TrainConfig], bool], str]] = {
    "mode": (lambda b, c: b.is_twin, "simulated FPGA twins (a -sim board)"),
    "heap": (lambda b, c: b.is_twin and not c.port, "microcontroller twins that insitu starts (no --port)"),
    "flash_dir": (lambda b, c: b.is_twin and not c.port,
                  "microcontroller twins that insitu starts (no --port)"),
    "twin": (lambda b, c: b.is_twin and not c.port, "microcontroller twins that insitu starts (no --port)"),
}


def applies(config: TrainConfig, name: str) -> bool:
    """Whether option ``name`` is one of ``config``'s algorithm's (or not a training option)."""
    algo = ALGORITHMS.get(config.algo)
    return algo is None or not hasattr(config, name) or name in COMMON_OPTIONS | algo.options


def check_applicable(config: TrainConfig, given: AbstractSet[str], board: Board | None = None) -> None:
    """Refuse an option the user gave (``given``: parameter names) that the algorithm or the board
    does not use: it would be ignored silently."""
    algo = ALGORITHMS.get(config.algo)
    if algo is None:
        raise UsageError(f"unknown --algo {config.algo!r}; known algorithms: {', '.join(ALGORITHMS)}")
    for name in sorted(given):
        flag = "--" + name.replace("_", "-")
        if not applies(config, name):
            users = [a.name for a in ALGORITHMS.values() if name in a.options]
            raise UsageError(f"{flag} does not apply to --algo {algo.name} (it is an option of "
                             f"--algo {', '.join(users)}): leave it out")
        if board is not None and name in BOARD_OPTIONS and not BOARD_OPTIONS[name][0](board, config):
            raise UsageError(f"{flag} does not apply to --board {board.name}: it applies to "
                             f"{BOARD_OPTIONS[name][1]}")


def register(algorithm: Algorithm) -> Algorithm:
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def prepare(config: TrainConfig, given: AbstractSet[str] = frozenset()) -> tuple[TrainConfig, Board]:
    """``config`` with the algorithm's defaults filled in, checked (cheap: no data, no board, no
    pre-training), and its board; ``given``: the options the user set (one that does not apply to
    the algorithm or the board is refused)."""
    board = get_board(config.board)
    check_applicable(config, given, board)
    algo = ALGORITHMS[config.algo]
    config = replace(config, model=algo.models[0] if config.model is None else config.model,
                     dataset=algo.dataset if config.dataset is None else config.dataset,
                     batch_size=algo.batch_size if config.batch_size is None else config.batch_size,
                     lr=algo.lr if config.lr is None else config.lr)
    config.validate(algo.models, algo.model_files)
    if board.kind not in algo.board_kinds:
        fits = [b.name for b in load_boards().values() if b.kind in algo.board_kinds]
        raise UsageError(f"algorithm {algo.name!r} does not run on {board.name} ({board.kind}); "
                         f"boards it runs on: {', '.join(fits)}")
    if algo.twins_only and not board.is_twin:
        raise UsageError(f"algorithm {algo.name!r} runs on simulated twins only; "
                         f"use --board {board.name}-sim")
    if algo.check is not None:
        algo.check(config, board)
    if algo.fill_defaults is not None:
        config = algo.fill_defaults(config)
    return config, board


def train(config: TrainConfig, advance: Callable[[int], None] = lambda n: None,
          given: AbstractSet[str] = frozenset()) -> dict:
    """Train as ``config`` says; ``advance(n)`` is called as samples are consumed (progress);
    ``given``: the options the user set (see :func:`prepare`)."""
    config, board = prepare(config, given)
    return ALGORITHMS[config.algo].run(config, board, advance)


# --------------------------------------------------------------------------- the reference SGD

#: Test samples of the curve's probe (the first of the test set), at every point of the curve.
PROBE_SAMPLES = 1000


def accuracy(model: nn.Sequential, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(model.predict(x), axis=1) == y))


class SGDLearner:
    """Float SGD of the NumPy core on mini-batches of the dataset's sample stream."""

    def __init__(self, model: nn.Sequential, lr: float, x: np.ndarray, y: np.ndarray, seed: int):
        self.model, self.optimizer = model, nn.SGD(model, lr=lr)
        self.x, self.y, self.seed = x, y, seed
        # The training accuracy of the run (kept in checkpoints: a resumed or complete run's
        # figure covers all its training passes, not only this session's).
        self.correct = self.seen = 0

    def train(self, start: int, count: int) -> float:
        batch = sample_order(len(self.x), self.seed, start, count)
        xb, yb = self.x[batch], self.y[batch]
        self.model.zero_grad()
        logits = self.model.forward(xb, train=True)
        loss, dlogits = nn.softmax_cross_entropy(logits, yb)
        self.model.backward(dlogits)
        self.optimizer.step()
        self.correct += int(np.sum(np.argmax(logits, axis=1) == yb))
        self.seen += len(batch)
        return loss

    def state(self) -> tuple[dict, dict]:
        return self.model.state_dict(), {"correct": self.correct, "seen": self.seen}

    def load_state(self, arrays: dict, meta: dict) -> None:
        try:
            self.model.load_state_dict(arrays)
        except (KeyError, ValueError) as exc:
            raise InsituError(f"the checkpoint does not fit the model ({exc})") from None
        # Checkpoints written before the run's counts were kept start them afresh.
        self.correct, self.seen = meta.get("correct", 0), meta.get("seen", 0)


def _run_sgd(config: TrainConfig, board: Board, advance) -> dict:
    # prepare() filled in sgd's defaults, none of which is None
    assert config.dataset is not None and config.model is not None
    assert config.lr is not None and config.batch_size is not None
    data = load_dataset(config.dataset, config.data_dir)
    if config.model == "cnn":       # grey, at the dataset's own size (see insitu.nn.networks)
        data = image_input(data, "--model cnn", CNN_MIN_SIZE, why="two 2x2 pools")
    x_train = data.float_images("train")              # the mlp flattens any sample
    x_test = data.float_images("test")
    if config.model == "cnn":                         # NCHW, one channel
        x_train, x_test = x_train[:, None], x_test[:, None]
    y_test = data.y_test
    if config.test_samples is not None:
        x_test, y_test = x_test[:config.test_samples], y_test[:config.test_samples]
    probe = min(PROBE_SAMPLES, len(y_test))
    model = NETWORKS[config.model](data.sample_shape, data.num_classes, config.seed)
    learner = SGDLearner(model, config.lr, x_train, data.y_train, config.seed)
    # The data's key, not its spec: a checkpoint never resumes on a changed file of the user's.
    identity = {**run_identity(config, drop=("test_samples",)), "dataset": data.key}
    plan = RunPlan("insitu train --algo sgd", identity, config.samples,
                   config.batch_size, config.checkpoint, config.checkpoint_every)
    outcome = run_training(plan, learner, advance=advance, say=say,
                           evaluate=lambda: {"accuracy": accuracy(model, x_test, y_test)},
                           probe=lambda: {"test_accuracy": accuracy(model, x_test[:probe], y_test[:probe])})
    return {
        "board": board.name,
        "algo": config.algo,
        # Where the arithmetic ran: the NumPy core on this host, standing in for the board's
        # processor; no accelerator is involved in this algorithm.
        "executor": "host-numpy" if board.is_twin else "board-cpu-numpy",
        "dataset": config.dataset,
        "model": config.model,
        **outcome.record(),
        "epochs": outcome.samples / len(x_train),
        "batch_size": config.batch_size,
        "lr": config.lr,
        "seed": config.seed,
        "accuracy": outcome.evaluation["accuracy"],
        "test_samples": len(y_test),
        "train_accuracy": learner.correct / learner.seen if learner.seen else None,
        "parameters": int(sum(p.value.size for p in model.parameters())),
    }


register(Algorithm(
    name="sgd",
    summary="reference float SGD of the NumPy core on the twin's processor model (the baseline)",
    board_kinds=("fpga-soc", "mcu"),
    twins_only=True,
    run=_run_sgd,
    models=tuple(NETWORKS),
    options=HOST_CHECKPOINT,
))


def _run_fpga(name):
    def run(config, board, advance):
        from insitu.fpga import board_runs       # pynq loads only when it is needed

        return getattr(board_runs, name)(config, board, advance)
    return run


register(Algorithm(
    name="tt",
    summary="tensor-train training, 4-bit factors and rank-adaptive prior, contractions on the PEs",
    board_kinds=("fpga-soc",),
    twins_only=False,
    run=_run_fpga("run_tt"),
    models=("paper", "tiny"),
    options=HOST_CHECKPOINT | {"mode", "bitstream", "rank", "tt_modes", "input_size", "prior_weight"},
    batch_size=64,
    lr=1e-3,
))
register(Algorithm(
    name="lrt",
    summary="LRT online adaptation of the last layer, per-sample vector work on the LRT PE",
    board_kinds=("fpga-soc",),
    twins_only=False,
    run=_run_fpga("run_lrt"),
    models=("cnn", "mlp"),
    options=HOST_CHECKPOINT | {"mode", "bitstream", "rank", "env"},
    batch_size=None,            # None: LRTConfig's dense_batch and lr (insitu lrt adapt's)
    lr=None,
))


def _run_sparse(config, board, advance):
    from insitu.mcu import board_runs      # the MCU toolchain loads only when it is needed

    return board_runs.run_sparse(config, board, advance)


def _check_sparse(config, board):
    from insitu.mcu import board_runs

    return board_runs.check_sparse(config, board)


def _sparse_defaults(config):
    from insitu.mcu import board_runs

    return board_runs.with_default_lr_scale(config)


register(Algorithm(
    name="sparse",
    summary="sparse update with QAS (tiny-training) on a MicroPython microcontroller, compiled on the host",
    board_kinds=("mcu",),
    twins_only=False,
    run=_run_sparse,
    check=_check_sparse,
    fill_defaults=_sparse_defaults,
    models=model_names(),
    model_files=(".onnx",),
    options=frozenset({"scheme", "port", "flash_dir", "heap", "twin", "lr_scale"}),
    batch_size=1,               # 1, as in the paper; N > 1 accumulates N samples' gradients per update
    lr=SPARSE_DEFAULT_LR,       # with the classifier at 5x (fill_defaults)
    dataset="digits",
))

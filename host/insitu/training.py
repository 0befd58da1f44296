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

import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

from insitu import nn
from insitu.boards import Board, get_board, load_boards
from insitu.checkpoint import load_checkpoint, save_checkpoint
from insitu.data import load_dataset
from insitu.errors import InsituError, UsageError
from insitu.io import check_writable


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
    test_samples: int | None = None    # test samples to evaluate (None: the algorithm's default)
    # The MCU algorithm (sparse):
    scheme: str | None = None          # sparse-update scheme (None: the algorithm's default)
    port: str | None = None            # a real board's serial port (or a running twin's)
    heap: int | None = None            # a twin's heap in bytes (None: the board's training budget)
    flash_dir: str | None = None       # a twin's flash folder (None: a temporary one)
    twin: str | None = None            # the kind of twin started (None: the Cortex-M7 one)

    def validate(self, models) -> None:
        """Checks after the algorithm's defaults are filled in; ``models``: the algorithm's."""
        if self.samples < 1:
            raise UsageError(f"--samples must be >= 1, got {self.samples}")
        if self.batch_size is not None and self.batch_size < 1:
            raise UsageError(f"--batch-size must be >= 1, got {self.batch_size}")
        if self.lr is not None and not (np.isfinite(self.lr) and self.lr > 0):
            raise UsageError(f"--lr must be a positive number, got {self.lr}")
        if self.checkpoint_every < 1:
            raise UsageError(f"--checkpoint-every must be >= 1, got {self.checkpoint_every}")
        if self.model not in models:
            raise UsageError(f"unknown --model {self.model!r} for --algo {self.algo}; its models: "
                             f"{', '.join(models)}")
        for name in ("rank", "test_samples", "heap"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise UsageError(f"--{name.replace('_', '-')} must be >= 1, got {value}")


@dataclass(frozen=True)
class Algorithm:
    name: str
    summary: str
    board_kinds: tuple[str, ...]
    twins_only: bool
    run: Callable[[TrainConfig, Board, Callable[[int], None]], dict]
    #: models the algorithm trains (the first is its default), and its default batch size and lr
    models: tuple[str, ...] = ()
    batch_size: int | None = 32
    lr: float | None = 0.05
    dataset: str = "fashion-mnist"


ALGORITHMS: dict[str, Algorithm] = {}


def register(algorithm: Algorithm) -> Algorithm:
    ALGORITHMS[algorithm.name] = algorithm
    return algorithm


def train(config: TrainConfig, advance: Callable[[int], None] = lambda n: None) -> dict:
    """Train as ``config`` says; ``advance(n)`` is called as samples are consumed (progress)."""
    board = get_board(config.board)
    if config.algo not in ALGORITHMS:
        raise UsageError(f"unknown --algo {config.algo!r}; known algorithms: {', '.join(ALGORITHMS)}")
    algo = ALGORITHMS[config.algo]
    config = replace(config, model=algo.models[0] if config.model is None else config.model,
                     dataset=algo.dataset if config.dataset is None else config.dataset,
                     batch_size=algo.batch_size if config.batch_size is None else config.batch_size,
                     lr=algo.lr if config.lr is None else config.lr)
    config.validate(algo.models)
    if board.kind not in algo.board_kinds:
        fits = [b.name for b in load_boards().values() if b.kind in algo.board_kinds]
        raise UsageError(f"algorithm {algo.name!r} does not run on {board.name} ({board.kind}); "
                         f"boards it runs on: {', '.join(fits)}")
    if config.twin is not None and board.kind != "mcu":
        raise UsageError(f"--twin chooses a microcontroller twin; {board.name} is not one")
    if algo.twins_only and not board.is_twin:
        raise UsageError(f"algorithm {algo.name!r} runs on simulated twins only; "
                         f"use --board {board.name}-sim")
    return algo.run(config, board, advance)


# --------------------------------------------------------------------------- the reference SGD

def _mlp(sample_shape, classes, seed):
    n_in = int(np.prod(sample_shape))
    return nn.Sequential(nn.Flatten(), nn.Dense(n_in, 128, seed=seed, dtype=np.float32), nn.ReLU(),
                         nn.Dense(128, classes, seed=seed + 1, dtype=np.float32))


def _cnn(sample_shape, classes, seed, hidden: int | None = None):
    """Two conv + pool stages and a classifier (with a hidden dense layer when ``hidden``)."""
    h, w = sample_shape
    flat = 16 * (h // 4) * (w // 4)
    head = ([nn.Dense(flat, hidden, seed=seed + 2, dtype=np.float32), nn.ReLU(),
             nn.Dense(hidden, classes, seed=seed + 3, dtype=np.float32)] if hidden
            else [nn.Dense(flat, classes, seed=seed + 2, dtype=np.float32)])
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1, seed=seed, dtype=np.float32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1, seed=seed + 1, dtype=np.float32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), *head)


MODELS = {"mlp": _mlp, "cnn": _cnn}


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


def accuracy(model: nn.Sequential, x: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.argmax(model.predict(x), axis=1) == y))


def _run_sgd(config: TrainConfig, board: Board, advance) -> dict:
    data = load_dataset(config.dataset, config.data_dir)
    x_train = data.float_images("train")[:, None]        # NCHW, one channel
    x_test = data.float_images("test")[:, None]
    model = MODELS[config.model](data.sample_shape, data.num_classes, config.seed)
    optimizer = nn.SGD(model, lr=config.lr)
    # What makes two runs the same run (a checkpoint of one resumes the other): not the sample
    # budget, nor where the files are or how often they are saved.
    identity = {k: v for k, v in asdict(config).items()
                if k not in ("samples", "checkpoint", "checkpoint_every", "data_dir")}
    done, resumed_from = 0, None
    if config.checkpoint:
        check_writable(config.checkpoint, "checkpoint")
    if config.checkpoint and Path(config.checkpoint).exists():
        arrays, meta = load_checkpoint(config.checkpoint)
        if meta.get("config") != identity or not isinstance(meta.get("samples_done"), int):
            raise InsituError(f"checkpoint {config.checkpoint} was written by a different run "
                              f"({meta.get('config')}); use another --checkpoint path or delete it")
        try:
            model.load_state_dict(arrays)
        except (KeyError, ValueError) as exc:
            raise InsituError(f"checkpoint {config.checkpoint} does not fit the model ({exc}); "
                              "delete it to start over") from None
        done = resumed_from = meta["samples_done"]
        advance(min(done, config.samples))

    def checkpoint():
        save_checkpoint(config.checkpoint, model.state_dict(), {"config": identity, "samples_done": done})

    started = time.perf_counter()
    losses, hits, seen = [], 0, 0
    next_checkpoint = (done // config.checkpoint_every + 1) * config.checkpoint_every
    while done < config.samples:
        batch = sample_order(len(x_train), config.seed, done, min(config.batch_size, config.samples - done))
        xb, yb = x_train[batch], data.y_train[batch]
        model.zero_grad()
        logits = model.forward(xb, train=True)
        loss, dlogits = nn.softmax_cross_entropy(logits, yb)
        model.backward(dlogits)
        optimizer.step()
        losses.append(loss)
        hits += int(np.sum(np.argmax(logits, axis=1) == yb))
        seen += len(batch)
        done += len(batch)
        advance(len(batch))
        if config.checkpoint and done >= next_checkpoint:
            checkpoint()
            next_checkpoint += config.checkpoint_every
    if config.checkpoint:
        checkpoint()
    seconds = time.perf_counter() - started
    return {
        "board": board.name,
        "algo": config.algo,
        # Where the arithmetic ran: the NumPy core on this host, standing in for the board's
        # processor; no accelerator is involved in this algorithm.
        "executor": "host-numpy" if board.is_twin else "board-cpu-numpy",
        "dataset": config.dataset,
        "model": config.model,
        "samples": done,
        "resumed_from": resumed_from,
        "epochs": done / len(x_train),
        "batch_size": config.batch_size,
        "lr": config.lr,
        "seed": config.seed,
        "accuracy": accuracy(model, x_test, data.y_test),
        "train_accuracy": hits / seen if seen else None,
        "final_loss": float(np.mean(losses[-50:])) if losses else None,
        "parameters": int(sum(p.value.size for p in model.parameters())),
        "seconds": seconds,
        "samples_per_second": seen / seconds if seconds > 0 else None,
    }


register(Algorithm(
    name="sgd",
    summary="reference float SGD of the NumPy core on the twin's processor model (the baseline)",
    board_kinds=("fpga-soc", "mcu"),
    twins_only=True,
    run=_run_sgd,
    models=tuple(MODELS),
))


def _run_fpga(name):
    def run(config, board, advance):
        from insitu.fpga import train as fpga_train       # pynq loads only when it is needed

        return getattr(fpga_train, name)(config, board, advance)
    return run


register(Algorithm(
    name="tt",
    summary="tensor-train training, 4-bit factors and rank-adaptive prior, contractions on the PEs",
    board_kinds=("fpga-soc",),
    twins_only=False,
    run=_run_fpga("run_tt"),
    models=("paper", "tiny"),
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
    batch_size=None,            # None: LRTConfig's dense_batch and lr (insitu lrt adapt's)
    lr=None,
))


def _run_sparse(config, board, advance):
    from insitu.mcu import train as mcu_train      # the MCU toolchain loads only when it is needed

    return mcu_train.run_sparse(config, board, advance)


register(Algorithm(
    name="sparse",
    summary="sparse update with QAS (tiny-training) on a MicroPython microcontroller, compiled on the host",
    board_kinds=("mcu",),
    twins_only=False,
    run=_run_sparse,
    models=("mbv2-28", "mbv2-tiny"),
    batch_size=1,               # 1, as in the paper; N > 1 accumulates N samples' gradients per update
    lr=0.05,
    dataset="digits",
))

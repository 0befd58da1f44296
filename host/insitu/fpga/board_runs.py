"""`insitu train --algo tt|lrt` on an FPGA board or its twin: the algorithms of :mod:`insitu.tt`
and :mod:`insitu.fpga.lrt_board` with their hardware work on the accelerator.

Both return the same record: ``board``, ``algo``, ``samples``, ``accuracy``, ``pl_cycles`` (the
accelerator's CYCLES register summed over every op), ``seconds_at_board_clock`` (those cycles at
the board's PL clock), ``energy_j`` (measured from the board's power rails where pynq exposes
them, else estimated from the counted operations: :mod:`insitu.measure.energy`), and the driver's
figures. Checkpoints are written atomically and resume to the uninterrupted result.
"""

from __future__ import annotations

import contextlib
from typing import cast

import numpy as np

from insitu.data import load_dataset
from insitu.errors import UsageError
from insitu.harness import RunPlan, run_identity, run_training, say
from insitu.measure.energy import estimate_energy
from insitu.measure.rails import RailsRecording
from insitu.tt.model import TTNet
from insitu.tt.experiment import (BOARD_OPTIONS, Model, TTLearner, TTTrainConfig, accuracy, curve_probe,
                                  network_inputs)
from insitu.tt.network import ARCHITECTURES, fit_input, tt_shape

from . import power
from .boards import open_board
from .regs import bitstream_params
from .tt_board import BoardExecutor, mac_counters


def _executor_name(board, accel) -> str:
    return f"twin-{accel.device.mode}" if board.is_twin else "board"


def _identity(config, data=None) -> dict:
    """What makes two runs the same run (a run on the RTL twin resumes on the fast one: they
    compute the same; the TT options when unset: earlier checkpoints resume); with ``data``, its
    key instead of the spec (a checkpoint never resumes on a changed file of the user's)."""
    unset = tuple(name for name in BOARD_OPTIONS if getattr(config, name) is None)
    identity = run_identity(config, drop=("bitstream", "mode", "test_samples", *unset))
    return identity if data is None else {**identity, "dataset": data.key}


def _energy(board, accel, counters: dict, recorder) -> dict:
    seconds = accel.cycles / accel.clock_hz
    if recorder is not None:
        return recorder.summary()
    counters = {**counters, "dram_bytes": accel.dma_bytes}
    return estimate_energy(counters, seconds, power.table_for(board.name))


def _counters(accel, executor=None) -> dict:
    """The accelerator's running counts, saved with a checkpoint so that a resumed run reports
    the whole run's cycles and energy."""
    return {"ops": dict(accel.ops), "cycles_by_op": dict(accel.cycles_by_op),
            "dma_bytes": accel.dma_bytes, "macs": dict(executor.macs) if executor else {}}


def _restore_counters(accel, saved: dict | None, executor=None) -> None:
    if not saved:
        return
    accel.ops.update(saved["ops"])
    accel.cycles_by_op.update(saved["cycles_by_op"])
    accel.dma_bytes += saved["dma_bytes"]
    if executor is not None:
        executor.macs.update(saved["macs"])


@contextlib.contextmanager
def _rails(board):
    """The board's rails recorder (None on twins, and on boards whose rails pynq cannot read)."""
    recorder = None if board.is_twin else RailsRecording.open()
    if recorder is None:
        yield None
        return
    with recorder:
        yield recorder


# ---------------------------------------------------------------------------------------- TT

class BoardTTLearner(TTLearner):
    """:class:`insitu.tt.experiment.TTLearner` with the PE ops on the accelerator; its checkpoints
    keep the accelerator's counters, so a resumed run reports the whole run's cycles."""

    def __init__(self, model: Model, x, y, seed: int, accel, executor: BoardExecutor):
        super().__init__(model, x, y, seed)
        self.accel, self.executor = accel, executor

    def state(self) -> tuple[dict, dict]:
        arrays, meta = super().state()
        return arrays, {**meta, "counters": _counters(self.accel, self.executor)}

    def load_state(self, arrays: dict, meta: dict) -> None:
        super().load_state(arrays, meta)
        _restore_counters(self.accel, meta["counters"], self.executor)


def run_tt(config, board, advance) -> dict:
    """The TT network trained with 4-bit factors and the rank-adaptive prior, contractions on
    the PEs (:mod:`insitu.fpga.tt_board`): the loop of ``insitu tt train`` with the accelerator
    as the executor, a constant learning rate and a sample budget. The network's modes follow the
    dataset (:mod:`insitu.tt.network`) within the bitstream's bounds (its CAP_* registers): the
    PEs take any sizes up to them; one beyond them is refused, naming the limit, before training.

    ``config``: :class:`insitu.training.TrainConfig`; its ``tt_modes``, ``input_size`` and
    ``prior_weight`` are `insitu train`'s --tt-modes, --input-size, --prior-weight."""
    rank = config.rank or ARCHITECTURES[config.model].rank
    given = {name: getattr(config, name) for name in BOARD_OPTIONS}
    tt_config = TTTrainConfig(variant="fixed-prior", batch_size=config.batch_size, lr=config.lr,
                              rank=rank, seed=config.seed, dataset=config.dataset,
                              lr_schedule="constant",
                              **{name: value for name, value in given.items() if value is not None})
    try:
        tt_config.validate()
        data = fit_input(load_dataset(config.dataset, config.data_dir), tt_config.input_size)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    accel = open_board(board, config.mode, config.bitstream)
    try:
        shape = tt_shape(data.sample_shape, data.num_classes, model=config.model, rank=rank,
                         batch=config.batch_size, modes=tt_config.tt_modes,
                         params=bitstream_params(accel.read))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    x_train, y_train, x_test, y_test = network_inputs(data, shape)
    if config.test_samples:
        x_test, y_test = x_test.subset(slice(config.test_samples)), y_test[:config.test_samples]
    executor = BoardExecutor(accel)
    model = Model(tt_config, len(x_train), layers=shape.layers, executor=executor,
                  classes=shape.classes)
    learner = BoardTTLearner(model, x_train, y_train, config.seed, accel, executor)
    plan = RunPlan("insitu train --algo tt", _identity(config, data), config.samples,
                   config.batch_size, config.checkpoint, config.checkpoint_every,
                   epoch_size=len(x_train))
    with _rails(board) as recorder:
        outcome = run_training(plan, learner, end_of_epoch=learner.end_of_epoch, advance=advance,
                               say=say, probe=curve_probe(model, x_test, y_test),
                               evaluate=lambda: {"accuracy": accuracy(model, x_test, y_test)})
        energy = _energy(board, accel, mac_counters(executor.macs), recorder)
    return {
        "board": board.name, "algo": "tt", "executor": _executor_name(board, accel),
        "dataset": config.dataset, "model": config.model, "network": shape.describe(),
        **outcome.record(), "epochs": outcome.samples / len(x_train),
        "batch_size": config.batch_size, "lr": config.lr, "seed": config.seed,
        "accuracy": outcome.evaluation["accuracy"], "test_samples": int(len(y_test)),
        # (the fixed-prior variant: a TT network)
        "ranks": cast(TTNet, model.net).ranks, "pruned_ranks": learner.pruned, **model.figures(),
        **accel.figures(), **mac_counters(executor.macs),
        "energy_j": energy["energy_j"], "energy": energy,
    }


# ---------------------------------------------------------------------------------------- LRT

class _AcceleratorCounts:
    """The accelerator's counters as part of a checkpoint (a resumed run reports the whole run)."""

    def __init__(self, accel):
        self.accel = accel

    def state(self) -> dict:
        return _counters(self.accel)

    def load_state(self, meta: dict) -> None:
        _restore_counters(self.accel, meta)


def run_lrt(config, board, advance) -> dict:
    """LRT online adaptation of the pre-trained network's last layer, per-sample vector work on
    the LRT PE (:func:`insitu.fpga.lrt_board.run_board_adapt`: the loop of ``insitu lrt adapt``)."""
    accel = open_board(board, config.mode, config.bitstream)
    kwargs = {k: v for k, v in (("rank", config.rank), ("batch", config.batch_size),
                                ("lr", config.lr)) if v is not None}
    with _rails(board) as recorder:
        try:
            # Imported here: the TT path on a board needs none of LRT's modules.
            from .lrt_board import run_board_adapt

            result = run_board_adapt(accel, config.env, config.samples, seed=config.seed,
                                     arch=config.model, dataset=config.dataset,
                                     data_dir=config.data_dir,
                                     test_samples=config.test_samples or 1000,
                                     chunk=min(config.checkpoint_every, 1000),
                                     checkpoint=config.checkpoint,
                                     checkpoint_every=config.checkpoint_every,
                                     identity=_identity(config), counters=_AcceleratorCounts(accel),
                                     advance=advance, **kwargs)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        pe_cycles = accel.cycles
        energy = _energy(board, accel, {"macs_16x16": _lrt_macs(accel)}, recorder)
    counts = result.pop("write_counts")
    return {
        "board": board.name, "algo": "lrt", "executor": _executor_name(board, accel),
        "dataset": config.dataset, "model": config.model, **result,
        "write_counts": np.asarray(counts).tolist(),
        **accel.figures(), "pl_cycles": pe_cycles,
        "energy_j": energy["energy_j"], "energy": energy,
    }


def _lrt_macs(accel) -> int:
    """An upper bound of the LRT PE's 16x16 products: its q-wide datapath (``lrt_cols_max``
    multipliers) busy in every cycle of every op."""
    q = bitstream_params(accel.read).lrt_cols_max
    return q * sum(cycles for op, cycles in accel.cycles_by_op.items() if op.startswith("LRT_"))

"""`insitu train --algo tt|lrt` on an FPGA board or its twin: the algorithms of :mod:`insitu.tt`
and :mod:`insitu.fpga.lrt_board` with their hardware work on the accelerator.

Both return the same record: ``board``, ``algo``, ``samples``, ``accuracy``, ``pl_cycles`` (the
accelerator's CYCLES register summed over every op), ``seconds_at_board_clock`` (those cycles at
the board's PL clock), ``energy_j`` (measured from the board's power rails where pynq exposes
them, else estimated from the counted operations: :mod:`insitu.fpga.power`), and the driver's
figures. Checkpoints are written atomically and resume to the uninterrupted result.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np

from insitu.checkpoint import load_checkpoint, save_checkpoint
from insitu.data import load_dataset
from insitu.errors import InsituError, UsageError
from insitu.io import check_writable

from . import power
from .boards import open_board
from .regs import bitstream_params
from .tt_board import NETWORKS, BoardExecutor, check_fits, mac_counters


#: Training steps whose mean loss is the record's final_loss.
LOSS_WINDOW = 20


def _executor_name(board, accel) -> str:
    return f"twin-{accel.device.mode}" if board.is_twin else "board"


def _identity(config) -> dict:
    """What makes two runs the same run (a checkpoint of one resumes the other; a run on the
    RTL twin resumes on the fast one: they compute the same)."""
    drop = {"samples", "checkpoint", "checkpoint_every", "data_dir", "bitstream", "mode",
            "test_samples"}
    return {k: v for k, v in asdict(config).items() if k not in drop}


def _load(config, identity):
    if not config.checkpoint:
        return None
    check_writable(config.checkpoint, "checkpoint")
    if not Path(config.checkpoint).exists():
        return None
    arrays, meta = load_checkpoint(config.checkpoint)
    if meta.get("config") != identity:
        raise InsituError(f"checkpoint {config.checkpoint} was written by a different run "
                          f"({meta.get('config')}); use another --checkpoint path or delete it")
    return arrays, meta


def _energy(board, accel, counters: dict, recorder) -> dict:
    seconds = accel.cycles / accel.clock_hz
    if recorder is not None:
        return recorder.summary()
    counters = {**counters, "dram_bytes": accel.dma_bytes}
    return power.estimate_energy(counters, seconds, power.table_for(board.name))


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
    recorder = None if board.is_twin else power.RailRecorder.open()
    if recorder is None:
        yield None
        return
    with recorder:
        yield recorder


def _phase(recorder, name):
    return recorder.phase(name) if recorder is not None else contextlib.nullcontext()


# ---------------------------------------------------------------------------------------- TT

def run_tt(config, board, advance) -> dict:
    """The TT network trained with 4-bit factors and the rank-adaptive prior, contractions on
    the PEs (:mod:`insitu.fpga.tt_board`)."""
    from insitu.tt.train import Model, TTTrainConfig

    layers, transform, default_rank = NETWORKS[config.model]
    rank = config.rank or default_rank
    tt_config = TTTrainConfig(variant="fixed-prior", batch_size=config.batch_size, lr=config.lr,
                              rank=rank, seed=config.seed, dataset=config.dataset,
                              lr_schedule="constant")
    data = load_dataset(config.dataset, config.data_dir)
    if data.sample_shape != (28, 28) or data.num_classes != 10:
        raise UsageError(f"the TT networks take 28x28 images of 10 classes; {config.dataset} has "
                         f"{data.sample_shape} samples of {data.num_classes} classes")
    accel = open_board(board, config.mode, config.bitstream)
    try:
        check_fits(layers, rank, config.batch_size, bitstream_params(accel.read))
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    from insitu.training import sample_order

    x_train = transform(data.x_train / 255.0)
    x_test = transform(data.x_test / 255.0)
    if config.test_samples:
        x_test, y_test = x_test[:config.test_samples], data.y_test[:config.test_samples]
    else:
        y_test = data.y_test
    model = Model(tt_config, len(x_train), layers=layers)
    executor = model.net.executor = BoardExecutor(accel)
    identity = _identity(config)
    done, resumed_from, losses, pruned = 0, None, [], 0
    saved = _load(config, identity)
    if saved:
        arrays, meta = saved
        model.load_state(arrays, meta)
        done = resumed_from = meta["samples_done"]
        losses, pruned = list(meta["recent_losses"]), meta["pruned_ranks"]
        _restore_counters(accel, meta["counters"], executor)
        advance(min(done, config.samples))

    def checkpoint(counters):
        arrays, meta = model.state()
        save_checkpoint(config.checkpoint, arrays, {
            **meta, "config": identity, "samples_done": done, "recent_losses": losses[-LOSS_WINDOW:],
            "pruned_ranks": pruned, "counters": counters})

    started = time.perf_counter()
    with _rails(board) as recorder:
        with _phase(recorder, "train"):
            next_save = (done // config.checkpoint_every + 1) * config.checkpoint_every
            while done < config.samples:
                batch = sample_order(len(x_train), config.seed, done,
                                     min(config.batch_size, config.samples - done))
                losses.append(model.step(x_train[batch], data.y_train[batch]))
                epoch_before = done // len(x_train)
                done += len(batch)
                advance(len(batch))
                if done // len(x_train) > epoch_before:
                    pruned += model.end_of_epoch()           # the prior prunes once per epoch
                if config.checkpoint and done >= next_save:
                    checkpoint(_counters(accel, executor))
                    next_save += config.checkpoint_every
        train_seconds = time.perf_counter() - started
        trained = _counters(accel, executor)        # what the checkpoint keeps: not the test
        with _phase(recorder, "test"):
            predictions = np.concatenate([model.logits(x_test[i:i + 250]).argmax(axis=1)
                                          for i in range(0, len(x_test), 250)])
        energy = _energy(board, accel, mac_counters(executor.macs), recorder)
    if config.checkpoint:
        checkpoint(trained)
    return {
        "board": board.name, "algo": "tt", "executor": _executor_name(board, accel),
        "dataset": config.dataset, "model": config.model, "samples": done,
        "resumed_from": resumed_from, "epochs": done / len(x_train),
        "batch_size": config.batch_size, "lr": config.lr, "seed": config.seed,
        "accuracy": float(np.mean(predictions == y_test)), "test_samples": int(len(y_test)),
        "final_loss": float(np.mean(losses[-LOSS_WINDOW:])) if losses else None,
        "ranks": model.net.ranks, "pruned_ranks": pruned, **model.figures(),
        **accel.figures(), **mac_counters(executor.macs),
        "energy_j": energy["energy_j"], "energy": energy,
        "seconds": time.perf_counter() - started,
        "samples_per_second": (done - (resumed_from or 0)) / train_seconds if train_seconds > 0 else None,
    }


# ---------------------------------------------------------------------------------------- LRT

def run_lrt(config, board, advance) -> dict:
    """LRT online adaptation of the pre-trained network's last layer, per-sample vector work on
    the LRT PE (:func:`insitu.fpga.lrt_board.run_board_adapt`)."""
    from .lrt_board import run_board_adapt

    accel = open_board(board, config.mode, config.bitstream)
    identity = _identity(config)
    saved = _load(config, identity)
    resume = None
    if saved:
        arrays, meta = saved
        resume = (arrays, meta["trainer"])
        _restore_counters(accel, meta["counters"])

    def after_chunk(trainer):
        if config.checkpoint:
            arrays, meta = trainer.state()
            save_checkpoint(config.checkpoint, arrays, {"config": identity, "trainer": meta,
                                                        "counters": _counters(accel)})

    kwargs = {k: v for k, v in (("rank", config.rank), ("batch", config.batch_size),
                                ("lr", config.lr)) if v is not None}
    started = time.perf_counter()
    with _rails(board) as recorder:
        with _phase(recorder, "adapt"):
            try:
                result = run_board_adapt(accel, config.env, config.samples, seed=config.seed,
                                         arch=config.model, dataset=config.dataset,
                                         data_dir=config.data_dir,
                                         test_samples=config.test_samples or 1000,
                                         chunk=min(config.checkpoint_every, 1000), resume=resume,
                                         after_chunk=after_chunk, advance=advance, **kwargs)
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
        "seconds": time.perf_counter() - started,
    }


def _lrt_macs(accel) -> int:
    """An upper bound of the LRT PE's 16x16 products: its q-wide datapath (``lrt_cols_max``
    multipliers) busy in every cycle of every op."""
    q = bitstream_params(accel.read).lrt_cols_max
    return q * sum(cycles for op, cycles in accel.cycles_by_op.items() if op.startswith("LRT_"))

"""Tensor-train training on the board: contractions on the PEs, the rest on the processor.

The TT network of :mod:`insitu.tt` (4-bit BinaryConnect factors, rank-adaptive prior) trains as
on the golden model, with one difference: :class:`BoardExecutor` sends every op of the schedule
(forward, input gradients, the full-weight gradient, factor gradients) to PE1/PE2/PE3 through the
driver, as streams of :mod:`insitu.tt.pe_stream`. The processor keeps what the TT paper leaves to
the ARM core: quantizing layer inputs and gradients, bias and ReLU, the loss, the Adam update of
the float shadow factors, lambdas and pruning.

An op's output scale is chosen by :class:`insitu.numerics.AutoScale` from its previous outputs;
the very first run of each op has no previous output, so the processor computes that op's exact
sums once to pick it (first step only). With the same scales the PEs give the golden model's
codes bit for bit, so a board run equals ``insitu tt train`` of the same network step for step:
both are the same loop (:class:`insitu.tt.experiment.TTLearner` in the run harness) with one
executor or the other (``tests/unit/test_tt_loop_executors.py``).

Two networks: ``paper`` (the TT paper's FashionMNIST network, 896 -> 512 -> 16, rank 16) and
``tiny`` (images pooled 2x2 to 14x14 and padded to 16x16, 256 -> 64 -> 16, rank 4), small enough
to train on the RTL in simulation.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from insitu.tt.execute import FixedExecutor, factor_operand
from insitu.tt.model import PAPER_LAYERS, pad_images
from insitu.accel.regmap import PE_OPS
from insitu.tt.pe_stream import (config_for, cfg_error, pe3_operands, stream_in,
                                 unpack_out)
from insitu.tt.schedule import layer_schedule

#: 256 = 4x4x16 -> 64 = 1x4x16 -> 16 = 4x16 -> 1x16.
TINY_LAYERS = (((4, 4, 16), (1, 4, 16)), ((4, 16), (1, 16)))


def tiny_images(x: np.ndarray) -> np.ndarray:
    """``(N, 28, 28)`` images -> ``(N, 256)``: 2x2 mean pooling to 14x14, zero-padded to 16x16."""
    x = np.asarray(x, dtype=np.float64).reshape(len(x), 14, 2, 14, 2).mean(axis=(2, 4))
    out = np.zeros((len(x), 16, 16))
    out[:, :14, :14] = x
    return out.reshape(len(x), -1)


#: name -> (layers, input transform of (N, 28, 28) images in [0, 1], default rank)
NETWORKS = {"paper": (PAPER_LAYERS, pad_images, 16), "tiny": (TINY_LAYERS, tiny_images, 4)}


def check_fits(layers, rank: int, batch: int, params) -> None:
    """Every op of a training step must be one the PEs accept (else a ValueError naming it)."""
    for k, (in_modes, out_modes) in enumerate(layers):
        for op in layer_schedule(in_modes, out_modes, rank, batch, input_grad=k > 0):
            code = cfg_error(config_for(op, out_modes=out_modes), params)
            if code:
                raise ValueError(f"rank {rank} with batch {batch}: layer {k + 1}'s {op.kind} op "
                                 f"{op.src}->{op.dst} (a={op.a}, b={op.b}, c={op.c}, d={op.d}) does "
                                 f"not fit the accelerator ({code.name}); lower the rank or batch")


class BoardExecutor(FixedExecutor):
    """The golden executor with its arithmetic on the accelerator (module docstring).

    ``port``: an :class:`insitu.fpga.driver.Accelerator`. Counts the MACs each PE ran.
    """

    def __init__(self, port, limits=None):
        super().__init__(*(() if limits is None else (limits,)))
        self.port = port
        self.macs: Counter = Counter()

    def compute(self, op, lhs, other, modes, shift: int) -> np.ndarray:
        out_modes, in_modes = modes
        cfg = config_for(op, shift, out_modes=out_modes)
        if op.kind == "PE3":
            lhs, rhs = pe3_operands(np.reshape(lhs, (op.b, -1)), np.reshape(other, (op.b, -1)),
                                    in_modes, out_modes)
        else:
            lhs, rhs = np.reshape(lhs, (op.a, op.b, op.c)), factor_operand(op, other)
        lhs, rhs = np.asarray(lhs, np.int64), np.asarray(rhs, np.int64)
        words = self.port.run(PE_OPS[op.kind], stream_in(cfg, lhs, rhs), SIZE_A=cfg.a,
                              SIZE_B=cfg.b, SIZE_C=cfg.c, SIZE_D=cfg.d, SHIFT=shift)
        self.macs[op.kind] += cfg.macs()
        out = unpack_out(cfg, words)
        if op.kind == "PE2":
            out = out[:, :, :op.c]                 # the lanes the schedule padded c with
        return np.ascontiguousarray(out).ravel()


def mac_counters(macs: Counter) -> dict:
    """The executor's MAC counts by operand widths (PE1/PE2: 16 x 4 bits; PE3: 16 x 16)."""
    return {"macs_16x4": macs["PE1"] + macs["PE2"], "macs_16x16": macs["PE3"]}

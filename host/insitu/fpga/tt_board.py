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

Two networks (:data:`insitu.tt.network.ARCHITECTURES`, their modes chosen for the dataset):
``paper`` (the TT paper's FashionMNIST network, 896 -> 512 -> 16, rank 16) and ``tiny`` (images
pooled 2x2, for FashionMNIST 14x14 padded to 16x16, 256 -> 64 -> 16, rank 4), small enough to train
on the RTL in simulation.
"""

from __future__ import annotations

from collections import Counter

import numpy as np

from insitu.tt.execute import FixedExecutor, factor_operand
from insitu.accel.regmap import PE_OPS
from insitu.tt.network import ARCHITECTURES, tt_shape
from insitu.tt.pe_stream import config_for, pe3_operands, stream_in, unpack_out


def _network_28x28(name: str):
    shape = tt_shape((28, 28), 10, model=name)
    return shape.layers, shape.vectors, shape.architecture.rank


#: name -> (layers, input transform of (N, 28, 28) images in [0, 1], default rank): the networks
#: for FashionMNIST (``insitu train --algo tt`` chooses them for its dataset).
NETWORKS = {name: _network_28x28(name) for name in ARCHITECTURES}


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

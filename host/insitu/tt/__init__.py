"""Tensor-train (TT) training: TT-matrix layers, the PE op schedule, rank-adaptive low-precision training.

Implements the TT paper (../shared/papers/tt-on-fpga-training-low-precision-tensor.md):

* :class:`TTMatrix`: a TT-matrix weight, forward/backward/factor gradients through the schedule;
* :mod:`.schedule`: the primitive ops (PE1, PE2, PE3) that the accelerator and driver execute;
* :mod:`.execute`: the float executor and the fixed-point golden model of the PEs.
"""

from .execute import FixedExecutor, FloatExecutor, contract
from .schedule import (DEFAULT_LIMITS, PE_KINDS, Op, PELimits, check_op, factor_grad_ops, grad_buffer,
                       forward_ops, input_grad_ops, layer_schedule, macs_by_kind, weight_grad_op)
from .ttm import TTMatrix

__all__ = [
    "TTMatrix",
    "Op",
    "PELimits",
    "DEFAULT_LIMITS",
    "PE_KINDS",
    "check_op",
    "layer_schedule",
    "forward_ops",
    "input_grad_ops",
    "weight_grad_op",
    "factor_grad_ops",
    "grad_buffer",
    "macs_by_kind",
    "contract",
    "FloatExecutor",
    "FixedExecutor",
]

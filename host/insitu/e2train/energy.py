"""Counted operations and estimated energy of a training run (E²-Train's accounting).

What is counted comes from what ran: the model reports, per training step, how many samples each
layer processed (SLU's skipped blocks report 0; SMD's dropped mini-batches report nothing at all,
so they cost nothing), and PSG reports, per layer, the fraction of weight-gradient signs its
predictor decided. :class:`EnergyCounter` turns these into operation counts by kind and width,
and prices them with Horowitz's 45 nm per-operation energies (ISSCC 2014, the table E²-Train
cites as [59]; the figures and the multiplier interpolation are :mod:`insitu.measure.energy`'s).

Per weight layer (conv, dense) and executed sample, with ``M`` its forward MACs per sample:

* forward ``M`` MACs of weight x activation; backward ``M`` MACs of weight x output gradient for
  the input gradient, and ``M`` MACs of output gradient x activation for the weight gradient;
* 32-bit SGD: all float32 (3.7 pJ multiply + 0.9 pJ add);
* PSG: integer MACs, 8 x 8 forward, 8 x 16 input gradient; the weight gradient's predicted
  entries cost only the MSB MAC (10 x 4 bits) and the others the full 16 x 8 MAC -- the predictor
  is the top part of the full product (the paper: "embedded within that of g_w"), so an entry
  whose sign it decides stops there. An integer MAC is the multiplier (linear in the product of
  the widths between Horowitz's 8x8 and 32x32 points) plus a 32-bit integer add.

Data movement, in two levels:

* on-chip SRAM (64-bit read of an 8 KB SRAM, 10 pJ: 0.156 pJ a bit): every operand and result of
  a pass crosses it once at its width -- forward reads x and W, writes y; the input gradient
  reads dy and W, writes dx; the weight gradient reads dy and x, writes g_W (32 bits for SGD, 2
  for a sign);
* DRAM (Horowitz's 1.3-2.6 nJ per 64 bits, the middle: 30.5 pJ a bit): training keeps every
  layer's input for the backward pass, and those activations do not fit on chip, so each weight
  layer's input is written to DRAM in the forward pass and read back in the backward pass, at the
  activation width (BatchNorm's input likewise: 32 bits for SGD, the 16-bit layer output for
  PSG -- :data:`~insitu.numerics.PSG_OUTPUT_BITS`); the weights are read once a step
  and written back by the update (32-bit float masters for both schemes, plus the 8-bit copy
  for PSG).

Updates: SGD with momentum reads w, g, v and writes w, v (32 bits each through SRAM; two
multiplies and two adds); SignSGD reads the master weight and the sign and writes the master
and the 8-bit weight (one multiply for weight decay, two adds).

BatchNorm, ReLU and residual adds are float32 in both (the NumPy PSG keeps them in float):
``ELEMENTWISE_OPS`` float multiply-adds per output element forward and twice that backward, data
32 bits in and out. SLU gates are priced as float32 MACs. Skipped SLU blocks cost nothing in
forward and backward, but the optimizer still steps every parameter every step (momentum and
weight decay move them), so the update is priced per step for all weights.

These are rules for comparing training algorithms with each other, not a model of a particular
chip; the measured energy (``--meter``) is the other half of the report.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from insitu.measure.energy import ACCUMULATE_PJ, HOROWITZ_PJ, mult_pj
from insitu.numerics import (PSG_ACTIVATION_BITS, PSG_ACTIVATION_MSB_BITS, PSG_GRADIENT_BITS,
                             PSG_GRADIENT_MSB_BITS, PSG_OUTPUT_BITS, PSG_WEIGHT_BITS)

#: One bit moved through on-chip SRAM (64-bit read of an 8 KB SRAM: 10 pJ).
SRAM_PJ_PER_BIT = HOROWITZ_PJ["sram_8kb_read_64b"] / 64
#: One bit moved to or from DRAM (the middle of 1.3-2.6 nJ per 64 bits).
DRAM_PJ_PER_BIT = (HOROWITZ_PJ["dram_read_64b_low"] + HOROWITZ_PJ["dram_read_64b_high"]) / 2 / 64
#: Bumped whenever the pricing rules change (results keyed by it are recomputed).
VERSION = 3
FP32_MAC_PJ = HOROWITZ_PJ["fp32_mult"] + HOROWITZ_PJ["fp32_add"]
FP32_MULT_PJ, FP32_ADD_PJ = HOROWITZ_PJ["fp32_mult"], HOROWITZ_PJ["fp32_add"]
#: Float multiply-adds per element of BatchNorm + ReLU (+ residual add) in a forward pass.
ELEMENTWISE_OPS = 2
#: Bits of a PSG weight-gradient word (a sign in {-1, 0, +1}).
SIGN_BITS = 2


def int_mac_pj(a_bits: int, b_bits: int) -> float:
    """An integer MAC: the a x b multiplier plus a 32-bit accumulator add."""
    return mult_pj(a_bits, b_bits) + ACCUMULATE_PJ


@dataclass(frozen=True)
class Precision:
    """Widths (bits) and MAC energies (pJ) of one training scheme."""

    name: str
    forward_mac_pj: float
    input_grad_mac_pj: float
    full_weight_grad_mac_pj: float          # an entry computed at full precision
    predicted_weight_grad_mac_pj: float     # an entry the predictor decided (PSG only)
    activation_bits: int
    weight_bits: int
    gradient_bits: int
    weight_grad_bits: int
    output_bits: int                        # a weight layer's output, BatchNorm's stashed input
    # Update, per weight per step: bits through SRAM, bits written back to DRAM, float ops.
    update_bits: int
    writeback_bits: int
    update_mults: int
    update_adds: int


FP32_SGD = Precision(
    "32-bit float SGD (momentum)", FP32_MAC_PJ, FP32_MAC_PJ, FP32_MAC_PJ, FP32_MAC_PJ,
    32, 32, 32, 32, 32, update_bits=5 * 32, writeback_bits=32, update_mults=2, update_adds=2)
PSG = Precision(
    "PSG: 8-bit x/w, 16-bit g, 4x10-bit predictor, SignSGD",
    int_mac_pj(PSG_WEIGHT_BITS, PSG_ACTIVATION_BITS),
    int_mac_pj(PSG_WEIGHT_BITS, PSG_GRADIENT_BITS),
    int_mac_pj(PSG_GRADIENT_BITS, PSG_ACTIVATION_BITS),
    int_mac_pj(PSG_GRADIENT_MSB_BITS, PSG_ACTIVATION_MSB_BITS),
    PSG_ACTIVATION_BITS, PSG_WEIGHT_BITS, PSG_GRADIENT_BITS, SIGN_BITS, PSG_OUTPUT_BITS,
    update_bits=32 + SIGN_BITS + 32 + PSG_WEIGHT_BITS, writeback_bits=32 + PSG_WEIGHT_BITS,
    update_mults=1, update_adds=2)


class EnergyCounter:
    """Accumulates operation counts and energy (pJ) over the steps of one run.

    ``specs``: the model's :meth:`layer_specs` -- dicts with ``name``, ``kind`` ("conv", "dense",
    "bn", "gate", ...), ``macs`` (forward MACs per sample), ``in_elems``, ``out_elems`` (per
    sample) and ``weight_elems``.
    """

    def __init__(self, specs: list[dict], precision: Precision = FP32_SGD):
        self.specs = {s["name"]: s for s in specs}
        self.precision = precision
        self.macs = defaultdict(int)            # forward / input_grad / weight_grad / gate / elementwise
        self.energy_pj = defaultdict(float)     # compute / sram / dram / update
        self.steps = 0
        self.samples = 0
        self._n_params = sum(s.get("weight_elems", 0) for s in specs)

    def state(self) -> dict:
        """The counts so far (JSON-ready): a resumed run goes on counting from them."""
        return {"macs": dict(self.macs), "energy_pj": dict(self.energy_pj), "steps": self.steps,
                "samples": self.samples}

    def load_state(self, state: dict) -> None:
        self.macs = defaultdict(int, state["macs"])
        self.energy_pj = defaultdict(float, state["energy_pj"])
        self.steps, self.samples = state["steps"], state["samples"]

    def add_step(self, executed: dict[str, int], batch: int, predicted: dict[str, float] | None = None,
                 trainable_params: int | None = None) -> None:
        """One optimizer step: ``executed[name]`` samples ran through each layer (forward and
        backward); ``predicted[name]`` is the fraction of that layer's weight-gradient entries
        the PSG predictor decided; ``trainable_params`` (default: the weights in ``specs``) is
        what the optimizer updates."""
        p = self.precision
        predicted = predicted or {}
        self.steps += 1
        self.samples += batch
        for name, n in executed.items():
            if n == 0:
                continue
            s = self.specs[name]
            kind, macs = s["kind"], s["macs"] * n
            if kind in ("conv", "dense"):
                f = predicted.get(name, 0.0)
                self.macs["forward"] += macs
                self.macs["input_grad"] += macs
                self.macs["weight_grad"] += macs
                self.energy_pj["compute"] += macs * (p.forward_mac_pj + p.input_grad_mac_pj
                                                     + f * p.predicted_weight_grad_mac_pj
                                                     + (1 - f) * p.full_weight_grad_mac_pj)
                x_bits, y_bits = n * s["in_elems"], n * s["out_elems"]
                w_bits = s["weight_elems"]
                bits = (x_bits * p.activation_bits + w_bits * p.weight_bits + y_bits * p.output_bits  # fwd
                        + y_bits * p.gradient_bits + w_bits * p.weight_bits + x_bits * p.gradient_bits  # dx
                        + y_bits * p.gradient_bits + x_bits * p.activation_bits + w_bits * p.weight_grad_bits)
                self.energy_pj["sram"] += bits * SRAM_PJ_PER_BIT
                # The activation stash: x written in the forward pass, read in the backward.
                self.energy_pj["dram"] += 2 * x_bits * p.activation_bits * DRAM_PJ_PER_BIT
            elif kind == "gate":
                self.macs["gate"] += 3 * macs          # forward, and backward for inputs and weights
                self.energy_pj["compute"] += 3 * macs * FP32_MAC_PJ
            else:                                      # BatchNorm / ReLU / adds: float32 elementwise
                ops = 3 * ELEMENTWISE_OPS * n * s["out_elems"]
                self.macs["elementwise"] += ops
                self.energy_pj["compute"] += ops * FP32_MAC_PJ
                self.energy_pj["sram"] += 4 * n * s["out_elems"] * 32 * SRAM_PJ_PER_BIT
                self.energy_pj["dram"] += 2 * n * s["in_elems"] * p.output_bits * DRAM_PJ_PER_BIT
        n_params = self._n_params if trainable_params is None else trainable_params
        self.energy_pj["update"] += n_params * (p.update_bits * SRAM_PJ_PER_BIT + p.update_mults * FP32_MULT_PJ
                                                + p.update_adds * FP32_ADD_PJ)
        self.energy_pj["dram"] += n_params * (p.weight_bits + p.writeback_bits) * DRAM_PJ_PER_BIT

    @property
    def total_macs(self) -> int:
        """Multiply-accumulates of weight layers and gates (the computational cost)."""
        return self.macs["forward"] + self.macs["input_grad"] + self.macs["weight_grad"] + self.macs["gate"]

    @property
    def total_j(self) -> float:
        return sum(self.energy_pj.values()) * 1e-12

    def report(self) -> dict:
        return {"precision": self.precision.name, "steps": self.steps, "samples": self.samples,
                "macs": dict(self.macs, total=self.total_macs),
                "energy_j": self.total_j,
                "energy_by_kind_j": {k: v * 1e-12 for k, v in self.energy_pj.items()}}


def savings(run: dict, baseline: dict) -> dict:
    """Computational and energy savings of a run's :meth:`EnergyCounter.report` over a baseline's."""
    def saving(a, b):
        return 1.0 - a / b if b else 0.0
    return {"computational_saving": saving(run["macs"]["total"], baseline["macs"]["total"]),
            "energy_saving": saving(run["energy_j"], baseline["energy_j"])}

"""Executors of the primitive-op schedule: float, and fixed point (the golden model of the PEs).

Both run exactly the ops of :mod:`insitu.tt.schedule`, reshaping flat row-major buffers the way
the PEs address DRAM. :func:`contract` is the arithmetic of one op; the fixed-point executor feeds
it integer codes and rounds its exact sums with the numerics spec:

* operands: 16-bit PE data (activations use the low 8 bits) and 4-bit factor codes;
* the sum of products is exact (the accumulator width of :func:`insitu.numerics.accumulator_bits`);
* the output is requantized to 16 bits at a power-of-2 scale (round half up, saturate), the scale
  chosen per output buffer by :class:`insitu.numerics.AutoScale` (mean |x| in [0.1, 0.3] of the
  Q4.11 unit): at an op's first run from its exact sums, afterwards from the previous outputs.

Integer sums are computed in float64 BLAS, which is exact while the accumulator fits 53 bits;
every op checks that bound before it runs.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from insitu.accel.params import DEFAULT_PARAMS
from insitu.numerics import (TT_FACTOR_BITS, TT_PE_DATA_BITS, AutoScale, accumulator_bits,
                             code_range, tt_autoscale, tt_pe_format)

from .schedule import DEFAULT_LIMITS, Op, PELimits, check_op

#: float64 holds every integer below 2**53 exactly: the widest accumulator computed through BLAS.
EXACT_FLOAT_BITS = 53


def factor_operand(op: Op, core: np.ndarray) -> np.ndarray:
    """The core reordered into the op's factor operand: ``(b, d, c)`` for PE1, ``(b, d)`` for PE2."""
    assert op.core is not None                  # a PE1 or PE2 op names its core
    shape = [core.shape[ax] for ax in op.factor_axes]
    b = math.prod(shape[:op.len_b])
    d = math.prod(shape[op.len_b:op.len_b + op.len_d])
    g = core.transpose(op.factor_axes)
    if op.kind == "PE1":
        if (b, d, math.prod(shape[op.len_b + op.len_d:])) != (op.b, op.d, op.c):
            raise ValueError(f"PE1 op {op.dst!r}: core {op.core + 1} of shape {core.shape} does not "
                             f"give the operand (b, d, c) = ({op.b}, {op.d}, {op.c})")
        return g.reshape(op.b, op.d, op.c)
    if (b, d) != (op.b, op.d):
        raise ValueError(f"PE2 op {op.dst!r}: core {op.core + 1} of shape {core.shape} does not give "
                         f"the operand (b, d) = ({op.b}, {op.d})")
    return g.reshape(op.b, op.d)


def _check_size(op: Op, buffer: np.ndarray, expected: int, name: str) -> None:
    if buffer.size != expected:
        raise ValueError(f"{op.kind} op {op.dst!r}: buffer {name!r} holds {buffer.size} values; the "
                         f"op's sizes need {expected}")


def _pad_c(z: np.ndarray, c_padded: int) -> np.ndarray:
    """Zero-pad the last axis to the PE's lane multiple (the DRAM layout the PE reads)."""
    if z.shape[-1] == c_padded:
        return z
    pad = [(0, 0)] * (z.ndim - 1) + [(0, c_padded - z.shape[-1])]
    return np.pad(z, pad)


def contract(op: Op, lhs: np.ndarray, other: np.ndarray, out_modes: Sequence[int] | None = None,
             in_modes: Sequence[int] | None = None) -> np.ndarray:
    """The sums of one op, exact for integer-valued float64 operands; returns a flat buffer.

    ``lhs`` is the streamed buffer (flat). ``other`` is the op's core (PE1/PE2) or, for PE3, the
    layer input X ``(batch, I)``; PE3 also needs the modes to interleave its output.
    """
    lhs = np.asarray(lhs, dtype=np.float64)
    if op.kind == "PE3":
        if out_modes is None or in_modes is None or op.src2 is None:
            raise ValueError(f"PE3 op {op.dst!r}: needs its second buffer (src2), out_modes and in_modes")
        x = np.asarray(other, dtype=np.float64)
        _check_size(op, lhs, op.b * math.prod(out_modes), op.src)
        _check_size(op, x, op.b * op.a * op.c // math.prod(out_modes), op.src2)
        dw = lhs.reshape(op.b, -1).T @ x.reshape(op.b, -1)          # (J, I)
        d = len(in_modes)
        dw = dw.reshape(*out_modes, *in_modes)
        interleave = [ax for n in range(d) for ax in (n, d + n)]
        return np.ascontiguousarray(dw.transpose(interleave)).ravel()
    _check_size(op, lhs, op.a * op.b * op.c, op.src)
    z = _pad_c(lhs.reshape(op.a, op.b, op.c), op.c_padded)
    g = factor_operand(op, np.asarray(other, dtype=np.float64))
    if op.kind == "PE1":
        g = _pad_c(g, op.c_padded)
        out = z.reshape(op.a, -1) @ g.transpose(0, 2, 1).reshape(-1, op.d)
        return out.ravel()
    out = np.matmul(g.T, z)                                       # (a, d, c_padded)
    return np.ascontiguousarray(out[:, :, :op.c]).ravel()


def _check_codes(op: Op, codes, bits: int, name: str) -> None:
    lo, hi = code_range(bits)
    codes = np.asarray(codes)
    if codes.size and (codes.min() < lo or codes.max() > hi):
        raise ValueError(f"{op.kind} op {op.dst!r}: operand {name} holds codes outside the "
                         f"{bits}-bit range [{lo}, {hi}]")


class FloatExecutor:
    """Runs ops in float64 on real values (the float variants and the reference)."""

    quantized = False

    def run(self, op: Op, buffers: dict, cores, modes) -> None:
        other = buffers[op.src2] if op.kind == "PE3" else cores[op.core]
        buffers[op.dst] = contract(op, buffers[op.src], other, *modes)


class FixedExecutor:
    """The golden model of the PEs: integer codes in, spec-rounded 16-bit codes out.

    ``buffers`` hold integer codes (int64) and ``fracs`` their power-of-2 scales; ``cores`` are
    4-bit codes with fixed scales ``core_fracs``. Scales of op outputs live in :attr:`scales`,
    keyed by ``prefix + dst``, and persist across steps (:meth:`state` / :meth:`load_state`).
    """

    quantized = True

    def __init__(self, limits: PELimits = DEFAULT_LIMITS):
        self.limits = limits
        self.scales: dict[str, AutoScale] = {}

    def _scale(self, key: str, values_first_seen) -> AutoScale:
        scale = self.scales.get(key)
        if scale is None:
            scale = self.scales[key] = tt_autoscale("pe", key)
            scale.observe(values_first_seen())
        return scale

    def run(self, op: Op, buffers: dict, fracs: dict, cores, core_fracs, modes, prefix: str = "",
            observe: bool = True) -> None:
        """Run one op; ``observe=False`` (inference) leaves the output scale as it is, once set.

        An op the PEs cannot take (:func:`check_op` against ``limits``) is refused.
        """
        check_op(op, self.limits)
        if op.kind == "PE3":
            assert op.src2 is not None          # a PE3 op's second buffer (the layer input)
            other, other_frac, other_bits = buffers[op.src2], fracs[op.src2], TT_PE_DATA_BITS
            other_name = op.src2
        else:
            assert op.core is not None          # a PE1 or PE2 op names its core
            other, other_frac, other_bits = cores[op.core], core_fracs[op.core], TT_FACTOR_BITS
            other_name = op.src2 or f"core {op.core + 1}"
        _check_codes(op, buffers[op.src], TT_PE_DATA_BITS, op.src)
        _check_codes(op, other, other_bits, other_name)
        acc_bits = accumulator_bits(TT_PE_DATA_BITS, other_bits, op.terms)
        if acc_bits > EXACT_FLOAT_BITS:
            raise ValueError(f"{op.kind} op {op.dst!r}: a {acc_bits}-bit accumulator ({op.terms} terms) "
                             f"exceeds the {EXACT_FLOAT_BITS} bits the golden model computes exactly")
        acc_frac = fracs[op.src] + other_frac
        scale = self._scale(prefix + op.dst,
                            lambda: np.ldexp(contract(op, buffers[op.src], other, *modes), -acc_frac))
        fmt = scale.format
        shift = acc_frac - fmt.frac
        if not DEFAULT_PARAMS.shift_min <= shift <= DEFAULT_PARAMS.shift_max:
            # The PEs rescale by SHIFT in [shift_min, shift_max] only (a collapsed layer's tiny
            # sums ask for more): the output takes the nearest scale they give.
            shift = min(max(shift, DEFAULT_PARAMS.shift_min), DEFAULT_PARAMS.shift_max)
            fmt = tt_pe_format(acc_frac - shift)
        out = self.compute(op, buffers[op.src], other, modes, shift=shift)
        if observe:
            scale.observe(fmt.to_float(out))      # the scale of this buffer at the next step
        buffers[op.dst], fracs[op.dst] = out, fmt.frac

    def compute(self, op: Op, lhs, other, modes, shift: int) -> np.ndarray:
        """The op's 16-bit output codes (flat, the schedule's layout): the exact sums rescaled by
        ``shift`` (right shift; negative: left) with the spec's rounding and saturation. The
        board's executor (:class:`insitu.fpga.tt_board.BoardExecutor`) runs this on the PEs."""
        acc = contract(op, lhs, other, *modes)
        return tt_pe_format(0).requantize(acc.astype(np.int64), shift)

    def state(self) -> dict:
        return {key: s.frac for key, s in self.scales.items()}

    def load_state(self, state: dict) -> None:
        self.scales = {key: tt_autoscale("pe", key, int(frac)) for key, frac in state.items()}

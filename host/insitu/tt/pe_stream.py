"""Golden model of the TT PEs at their stream interface: configurations, stream layouts, results.

This is what the RTL is verified against word for word, and what the board driver uses to turn
the schedule's row-major buffers into DMA streams and back. A stream is a flat int64 array of
16-bit words (8 per 128-bit beat, word 0 first); its length is always a multiple of 8.

Layouts (``C = c / 16`` lane chunks; ``a8 = ceil(a/8)*8``; ``d8 = ceil(d/8)*8``):

* **PE1** ``Z'(a,d) = sum_{b,c} Z(a,b,c) G(b,d,c)``. In: ``G`` as ``(b, d, c)``, then ``Z`` as
  ``(a8, b, c)`` (zero rows up to a multiple of 8). Out: for each group of 8 rows, for each ``d``,
  the 8 rows' outputs: ``(a8/8, d, 8)``.
* **PE2** ``Z'(a,d,c) = sum_b Z(a,b,c) G(b,d)``. In: ``G`` as ``(b, d8)`` (zero columns), then
  ``Z`` as ``(a, C, b, 16)``. Out: ``(a, C, d8, 16)``.
* **PE3** ``W'(row, l) = sum_s dY_row(s) X_block(s, l)``: rows come in blocks of ``d`` that share
  an X block of ``(b, 16)``. In: for each block, the X block ``(b, 16)``, then for each of its
  ``d`` rows the ``b`` values of dY padded with zeros to a multiple of 8. Out: ``(a, 16)``.
* **PE3_PSG** (E2-Train's predictive sign gradient on PE3, :class:`PSGConfig` adds PSG_TAU): PE3's
  input layout, each X word taken as its low 8 bits sign-extended (:func:`psg_activations`).
  Out: ``(a, 2, 16)``: per row the 16 predictor sums ``g_msb`` rescaled by SHIFT, then the 16
  eq.-2 signs (-1/0/+1). :func:`psg_run` also gives the PSG_PREDICTED and PSG_MAX registers.

Every output word (PE3_PSG's signs aside) is an exact sum of products rescaled by ``SHIFT`` with the spec's rounding and
16-bit saturation (:meth:`insitu.numerics.FixedPoint.requantize`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import cast

import numpy as np

from insitu.numerics import (PSG_ACTIVATION_BITS, TT_FACTOR_BITS, TT_PE_DATA_BITS, code_range,
                              psg_sign, psg_weight_gradient, tt_pe_format)
from insitu.accel.params import DEFAULT_PARAMS, STREAM_WORDS, AcceleratorParams, mac_units
from insitu.accel.regmap import PE_OPS, ErrorCode
from insitu.accel.stream import from_words, to_words

from .schedule import C_LANES, Op

#: Rows (PE1) and d outputs (PE2) computed at once (the generated design's).
PE_ROWS = DEFAULT_PARAMS.pe_rows
#: The kinds PE3 serves (one input layout).
PE3_KINDS = ("PE3", "PE3_PSG")


def _ceil_to(n: int, k: int) -> int:
    return -(-n // k) * k


@dataclass(frozen=True)
class PEConfig:
    """The register values of one PE op (OP, SIZE_A..SIZE_D, SHIFT)."""

    kind: str
    a: int
    b: int
    c: int
    d: int
    shift: int = 0

    @property
    def op(self) -> int:
        return PE_OPS[self.kind]

    @property
    def chunks(self) -> int:
        return self.c // C_LANES

    def in_words(self) -> int:
        a, b, c, d = self.a, self.b, self.c, self.d
        if self.kind == "PE1":
            return b * d * c + _ceil_to(a, PE_ROWS) * b * c
        if self.kind == "PE2":
            return b * _ceil_to(d, PE_ROWS) + a * b * c
        return (a // d) * b * C_LANES + a * _ceil_to(b, STREAM_WORDS)

    def out_words(self) -> int:
        a, c, d = self.a, self.c, self.d
        if self.kind == "PE1":
            return _ceil_to(a, PE_ROWS) * d
        if self.kind == "PE2":
            return a * c * _ceil_to(d, PE_ROWS)
        if self.kind == "PE3_PSG":
            return a * 2 * C_LANES
        return a * C_LANES

    def in_beats(self) -> int:
        return self.in_words() // STREAM_WORDS

    def out_beats(self) -> int:
        return self.out_words() // STREAM_WORDS

    def macs(self) -> int:
        """MACs the PE array performs (row, d and lane padding included)."""
        a, b, c, d = self.a, self.b, self.c, self.d
        if self.kind == "PE1":
            return _ceil_to(a, PE_ROWS) * b * c * d
        if self.kind == "PE2":
            return a * b * c * _ceil_to(d, PE_ROWS)
        return a * b * C_LANES


@dataclass(frozen=True)
class PSGConfig(PEConfig):
    """A PE3_PSG op: PE3's sizes and SHIFT, and ``tau`` (PSG_TAU, the predictor's threshold in
    g_msb codes; 0 is refused). Build it with :func:`psg_config`."""

    tau: int = 1

    def __post_init__(self):
        if self.kind != "PE3_PSG":
            raise ValueError(f"PSGConfig is for PE3_PSG ops, got kind {self.kind!r}")


def psg_config(a: int, b: int, d: int, shift: int = 0, tau: int = 1, c: int = C_LANES) -> PSGConfig:
    """The configuration of a PE3_PSG op (``a`` rows in blocks of ``d``, batch ``b``)."""
    return PSGConfig("PE3_PSG", a, b, c, d, shift, tau)


def config_for(op: Op, shift: int = 0, out_modes=None) -> PEConfig:
    """The PE configuration of a schedule op; PE3 needs the layer's ``out_modes`` (block = J_d rows)."""
    if op.kind == "PE3":
        if out_modes is None:
            raise ValueError(f"PE3 op {op.dst!r}: give out_modes (rows per X block = J_d)")
        return PEConfig("PE3", op.a, op.b, op.c, int(out_modes[-1]), shift)
    return PEConfig(op.kind, op.a, op.b, op.c_padded, op.d, shift)


def _codes(x, bits: int, name: str) -> np.ndarray:
    x = np.asarray(x)
    if x.dtype.kind not in "iu":
        raise ValueError(f"{name}: integer codes expected, got dtype {x.dtype}")
    lo, hi = code_range(bits)
    if x.size and (x.min() < lo or x.max() > hi):
        raise ValueError(f"{name}: codes outside the {bits}-bit range [{lo}, {hi}]")
    return x.astype(np.int64)


def _check_shape(name: str, x: np.ndarray, shape: tuple) -> None:
    if x.shape != shape:
        raise ValueError(f"{name}: expected shape {shape}, got {x.shape}")


def rescale(acc, shift: int) -> np.ndarray:
    """The PE output stage: the spec's rounding shift and 16-bit saturation."""
    return tt_pe_format(0).requantize(np.asarray(acc, dtype=np.int64), shift)


# ----------------------------------------------------------------------------------- operands

def check_operands(cfg: PEConfig, lhs, rhs) -> tuple[np.ndarray, np.ndarray]:
    """Validate the two operands of ``cfg`` as codes of the right shapes and widths.

    PE1: ``Z (a, b, c)``, ``G (b, d, c)``; PE2: ``Z (a, b, c)``, ``G (b, d)``;
    PE3: ``dY rows (a, b)``, ``X blocks (a/d, b, 16)``. A ``c`` axis shorter than ``cfg.c`` (a
    schedule op's unpadded c) is zero-padded.
    """
    a, b, c, d = cfg.a, cfg.b, cfg.c, cfg.d
    if cfg.kind in PE3_KINDS:
        dy, x = _codes(lhs, TT_PE_DATA_BITS, "dY"), _codes(rhs, TT_PE_DATA_BITS, "X")
        _check_shape("dY rows", dy, (a, b))
        _check_shape("X blocks", x, (a // d, b, C_LANES))
        return dy, x
    z, g = _codes(lhs, TT_PE_DATA_BITS, "Z"), _codes(rhs, TT_FACTOR_BITS, "G")
    # A schedule op's c is zero-padded to the 16 lanes (cfg.c is the padded size).
    if z.ndim == 3 and z.shape[2] < c:
        z = np.pad(z, [(0, 0), (0, 0), (0, c - z.shape[2])])
    if cfg.kind == "PE1" and g.ndim == 3 and g.shape[2] < c:
        g = np.pad(g, [(0, 0), (0, 0), (0, c - g.shape[2])])
    _check_shape("Z", z, (a, b, c))
    _check_shape("G", g, (b, d, c) if cfg.kind == "PE1" else (b, d))
    return z, g


def sums(cfg: PEConfig, lhs, rhs) -> np.ndarray:
    """Exact integer sums of the op that SHIFT rescales, in the natural layout (PE1 ``(a,d)``,
    PE2 ``(a,d,c)``, PE3 ``(a, 16)``; PE3_PSG: the predictor ``g_msb``, ``(a, 16)``)."""
    if cfg.kind == "PE3_PSG":
        return psg_sums(cfg, lhs, rhs)[1]
    lhs, rhs = check_operands(cfg, lhs, rhs)
    if cfg.kind == "PE1":
        return np.einsum("abc,bdc->ad", lhs, rhs)
    if cfg.kind == "PE2":
        return np.einsum("abc,bd->adc", lhs, rhs)
    blocks = np.repeat(rhs, cfg.d, axis=0)                       # (a, b, 16)
    return np.einsum("rs,rsl->rl", lhs, blocks)


def result(cfg: PEConfig, lhs, rhs) -> np.ndarray:
    """The op's output codes in the natural layout."""
    if cfg.kind == "PE3_PSG":
        return psg_run(cast(PSGConfig, cfg), lhs, rhs).out
    return rescale(sums(cfg, lhs, rhs), cfg.shift)


# ----------------------------------------------------------------------------------- PE3_PSG

def psg_activations(x_words) -> np.ndarray:
    """What PE3_PSG makes of X words: the low 8 bits, sign-extended (the upper byte ignored)."""
    low = np.asarray(x_words, dtype=np.int64) & ((1 << PSG_ACTIVATION_BITS) - 1)
    return np.where(low >= 1 << (PSG_ACTIVATION_BITS - 1), low - (1 << PSG_ACTIVATION_BITS), low)


def psg_sums(cfg: PEConfig, dy_rows, x_blocks) -> tuple[np.ndarray, np.ndarray]:
    """``(g_full, g_msb)`` of a PE3_PSG op, each ``(a, 16)``: per X block, the spec's
    :func:`insitu.numerics.psg_weight_gradient` of its ``d`` rows of dY (16-bit codes) against
    the block's 8-bit activations (:func:`psg_activations`), the batch ``b`` being the sum's K."""
    dy, x = check_operands(cfg, dy_rows, x_blocks)
    x8 = psg_activations(x)
    g_full = np.zeros((cfg.a, C_LANES), np.int64)
    g_msb = np.zeros((cfg.a, C_LANES), np.int64)
    for t in range(cfg.a // cfg.d):
        rows = slice(t * cfg.d, (t + 1) * cfg.d)
        g_full[rows], g_msb[rows] = psg_weight_gradient(dy[rows].T, x8[t])
    return g_full, g_msb


@dataclass(frozen=True)
class PSGRun:
    """What a PE3_PSG op produces: ``out`` (natural layout ``(a, 2, 16)``: rescaled g_msb, then
    the signs), the exact ``g_full``, ``g_msb``, ``sign`` and ``predicted`` mask (``(a, 16)``),
    and the PSG_PREDICTED and PSG_MAX registers after it."""

    out: np.ndarray
    g_full: np.ndarray
    g_msb: np.ndarray
    sign: np.ndarray
    predicted: np.ndarray

    @property
    def predicted_count(self) -> int:
        return int(self.predicted.sum())

    @property
    def peak(self) -> int:
        return int(np.abs(self.g_msb).max()) if self.g_msb.size else 0


def psg_run(cfg: PSGConfig, dy_rows, x_blocks) -> PSGRun:
    """The golden model of a PE3_PSG op: eq. 2 by :func:`insitu.numerics.psg_sign` with
    ``cfg.tau`` on the sums of :func:`psg_sums`; g_msb rescaled as PE3 rescales its sums."""
    if not isinstance(cfg, PSGConfig):
        raise ValueError(f"psg_run: a PSGConfig (psg_config) is needed, got {cfg!r}")
    g_full, g_msb = psg_sums(cfg, dy_rows, x_blocks)
    sign, predicted = psg_sign(g_full, g_msb, cfg.tau)
    out = np.stack([rescale(g_msb, cfg.shift), sign.astype(np.int64)], axis=1)
    return PSGRun(out, g_full, g_msb, sign.astype(np.int64), predicted)


# ----------------------------------------------------------------------------------- streams

def stream_in(cfg: PEConfig, lhs, rhs) -> np.ndarray:
    """The input stream of the op (words)."""
    lhs, rhs = check_operands(cfg, lhs, rhs)
    a, b, c, d = cfg.a, cfg.b, cfg.c, cfg.d
    if cfg.kind == "PE1":
        z = np.zeros((_ceil_to(a, PE_ROWS), b, c), np.int64)
        z[:a] = lhs
        words = [rhs.ravel(), z.ravel()]
    elif cfg.kind == "PE2":
        g = np.zeros((b, _ceil_to(d, PE_ROWS)), np.int64)
        g[:, :d] = rhs
        z = lhs.reshape(a, b, cfg.chunks, C_LANES).transpose(0, 2, 1, 3)
        words = [g.ravel(), z.ravel()]
    else:
        dy = np.zeros((a, _ceil_to(b, STREAM_WORDS)), np.int64)
        dy[:, :b] = lhs
        words = []
        for t in range(a // d):
            words += [rhs[t].ravel(), dy[t * d:(t + 1) * d].ravel()]
    out = np.concatenate(words)
    assert out.size == cfg.in_words()
    return out


def pack_out(cfg: PEConfig, out: np.ndarray) -> np.ndarray:
    """Natural-layout outputs -> the output stream (padding as the PE produces it: zeros)."""
    a, c, d = cfg.a, cfg.c, cfg.d
    if cfg.kind == "PE1":
        full = np.zeros((_ceil_to(a, PE_ROWS), d), np.int64)
        full[:a] = out
        return full.reshape(-1, PE_ROWS, d).transpose(0, 2, 1).ravel()
    if cfg.kind == "PE3_PSG":
        return np.asarray(out, np.int64).reshape(a, 2, C_LANES).ravel()
    if cfg.kind == "PE2":
        full = np.zeros((a, _ceil_to(d, PE_ROWS), c), np.int64)
        full[:, :d] = out
        return full.reshape(a, -1, cfg.chunks, C_LANES).transpose(0, 2, 1, 3).ravel()
    return np.asarray(out, np.int64).ravel()


def unpack_out(cfg: PEConfig, words) -> np.ndarray:
    """The output stream -> natural-layout outputs (padding dropped)."""
    words = np.asarray(words, dtype=np.int64)
    if words.size != cfg.out_words():
        raise ValueError(f"{cfg.kind}: the output stream holds {words.size} words; the op produces "
                         f"{cfg.out_words()}")
    a, c, d = cfg.a, cfg.c, cfg.d
    if cfg.kind == "PE1":
        return words.reshape(-1, d, PE_ROWS).transpose(0, 2, 1).reshape(-1, d)[:a]
    if cfg.kind == "PE2":
        d8 = _ceil_to(d, PE_ROWS)
        return words.reshape(a, cfg.chunks, d8, C_LANES).transpose(0, 2, 1, 3).reshape(a, d8, c)[:, :d]
    if cfg.kind == "PE3_PSG":
        return words.reshape(a, 2, C_LANES)
    return words.reshape(a, C_LANES)


def reference_stream_out(cfg: PEConfig, lhs, rhs) -> np.ndarray:
    """The output stream the PE must produce for these operands."""
    return pack_out(cfg, result(cfg, lhs, rhs))


# ------------------------------------------------------------------- PE3 from layer tensors

def pe3_operands(dy, x, in_modes, out_modes) -> tuple[np.ndarray, np.ndarray]:
    """The PE3 operands for a layer: ``dY (B, J)`` and ``X (B, I)`` -> rows ``(a, B)`` and
    X blocks ``(a/J_d, B, I_d)`` in the interleaved row order ``(j_1, i_1, .., j_d)``."""
    I, J = tuple(in_modes), tuple(out_modes)
    dn = len(I)
    dy, x = np.asarray(dy), np.asarray(x)
    batch = dy.shape[0]
    dy_t = dy.reshape(batch, *J).transpose(*range(1, dn + 1), 0)          # (J_1..J_d, B)
    rows_shape = [s for n in range(dn - 1) for s in (J[n], I[n])] + [J[-1], batch]
    dy_rows = np.broadcast_to(dy_t.reshape([s for n in range(dn - 1) for s in (J[n], 1)] + [J[-1], batch]),
                              rows_shape).reshape(-1, batch)
    x_t = x.reshape(batch, *I).transpose(*range(1, dn), 0, dn)            # (I_1..I_{d-1}, B, I_d)
    blocks_shape = [s for n in range(dn - 1) for s in (J[n], I[n])] + [batch, I[-1]]
    x_blocks = np.broadcast_to(x_t.reshape([s for n in range(dn - 1) for s in (1, I[n])] + [batch, I[-1]]),
                               blocks_shape).reshape(-1, batch, I[-1])
    assert dy_rows.shape[0] == math.prod(J) * math.prod(I[:-1])
    return np.ascontiguousarray(dy_rows), np.ascontiguousarray(x_blocks)


# ------------------------------------------------------- what the board's functional model needs

def cfg_error(cfg: PEConfig, params=DEFAULT_PARAMS):
    """The :class:`~insitu.accel.regmap.ErrorCode` the PE reports at START for ``cfg`` (``NONE``: it
    runs), checked in the RTL's order (``rtl/pe1.py``, ``pe2.py``, ``pe3.py``)."""
    broken = broken_limit(cfg, params)
    return ErrorCode.NONE if broken is None else broken[0]


def broken_limit(cfg: PEConfig, params=DEFAULT_PARAMS) -> tuple[ErrorCode, str] | None:
    """The first limit of the generated design that ``cfg`` breaks, in the RTL's order, as its
    error code and a sentence naming the limit (an :class:`AcceleratorParams` field where one sets
    it), its value and the op's size that breaks it; None when the PE takes ``cfg``."""
    a, b, c, d = cfg.a, cfg.b, cfg.c, cfg.d
    if min(a, b, c, d) == 0:
        return ErrorCode.ZERO_SIZE, "a size is 0"
    chunks = c // C_LANES
    if cfg.kind in PE3_KINDS:
        if c != C_LANES:
            return ErrorCode.C_LANES, (f"c = {c}: PE3 takes exactly c_lanes = {C_LANES} (its lanes "
                                       "along the last input mode)")
        if a % d:
            return ErrorCode.BLOCK, f"a = {a} is not a multiple of d = {d} (rows per X block)"
        if b > params.pe3_b_max:
            return ErrorCode.TILE, (f"the batch b = {b} exceeds pe3_b_max = {params.pe3_b_max} "
                                    "(PE3's X block buffer)")
    elif c % C_LANES:
        return ErrorCode.C_LANES, f"c = {c} is not a multiple of c_lanes = {C_LANES}"
    elif cfg.kind == "PE1":
        if b * chunks > params.pe1_row_entries:
            return ErrorCode.TILE, (f"b*c/{C_LANES} = {b * chunks} row entries exceed pe1_row_entries = "
                                    f"{params.pe1_row_entries} (PE1's row tile)")
        if b * d * chunks > params.factor_words // params.c_lanes:
            return ErrorCode.FACTOR_WORDS, (f"the factor operand b*d*c = {b * d * c} words exceeds "
                                            f"factor_words = {params.factor_words}")
    else:
        factor_entries = params.factor_words // params.pe_rows
        if b > params.pe2_b_max:
            return ErrorCode.TILE, f"b = {b} exceeds pe2_b_max = {params.pe2_b_max} (PE2's tile)"
        if a * c >= (1 << 32) // factor_entries:
            return ErrorCode.TILE, (f"a*c = {a * c} reaches 2^32 / (factor_words/{params.pe_rows}) = "
                                    f"{(1 << 32) // factor_entries} (PE2's 32-bit beat count)")
        if b * -(-d // PE_ROWS) > factor_entries:
            return ErrorCode.FACTOR_WORDS, (f"the factor operand b*ceil(d/{PE_ROWS})*{PE_ROWS} = "
                                            f"{b * -(-d // PE_ROWS) * PE_ROWS} words exceeds "
                                            f"factor_words = {params.factor_words}")
    if not params.shift_min <= cfg.shift <= params.shift_max:
        return ErrorCode.SHIFT, f"SHIFT {cfg.shift} is outside [{params.shift_min}, {params.shift_max}]"
    if cfg.kind == "PE3_PSG" and getattr(cfg, "tau", 1) == 0:
        return ErrorCode.PSG_TAU, "PSG_TAU is 0 (the threshold must be >= 1)"
    return None


def operands_from_stream(cfg: PEConfig, words) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`stream_in`: the input stream -> ``(lhs, rhs)`` in the layouts of
    :func:`check_operands` (padding dropped). What a functional model of the PEs reads."""
    words = from_words(words)
    if words.size != cfg.in_words():
        raise ValueError(f"{cfg.kind}: the input stream holds {words.size} words; the op takes "
                         f"{cfg.in_words()}")
    a, b, c, d = cfg.a, cfg.b, cfg.c, cfg.d
    if cfg.kind == "PE1":
        g = words[:b * d * c].reshape(b, d, c)
        return words[b * d * c:].reshape(-1, b, c)[:a], g
    if cfg.kind == "PE2":
        d8 = _ceil_to(d, PE_ROWS)
        g = words[:b * d8].reshape(b, d8)[:, :d]
        z = words[b * d8:].reshape(a, cfg.chunks, b, C_LANES).transpose(0, 2, 1, 3).reshape(a, b, c)
        return z, g
    b8 = _ceil_to(b, STREAM_WORDS)
    block = words.reshape(a // d, b * C_LANES + d * b8)
    x = block[:, :b * C_LANES].reshape(a // d, b, C_LANES)
    dy = block[:, b * C_LANES:].reshape(a, b8)[:, :b]
    return dy, x


def estimated_cycles(cfg: PEConfig, params: AcceleratorParams = DEFAULT_PARAMS) -> int:
    """Cycles of the op on the PE of the design generated with ``params`` when its streams never
    stall, for the functional model.

    The larger of the MAC bound and the longer stream (one 128-bit beat per cycle each way), plus
    what does not overlap: PE1 and PE2 load their factor operand before the first MAC, and every
    op pays a short pipeline fill. PE3 with ``pe3_batch_lanes`` = 2 takes two batch entries a
    step: ceil(b / 2) steps a row, and one pipeline stage more (the pair sum).
    ``tests/unit/test_fpga_functional.py`` checks it against the CYCLES measured in simulation
    (``docs/results/rtl/report.json``).
    """
    mac_cycles = -(-cfg.macs() // mac_units(cfg.kind, params))
    if cfg.kind == "PE1":
        # each DSP computes two d's at once: an odd d costs a whole last pair
        mac_cycles = mac_cycles * _ceil_to(cfg.d, 2) // cfg.d
        # the factor operand and the first group of 8 rows load before the first MAC
        mac_cycles += (cfg.b * cfg.d * cfg.c + PE_ROWS * cfg.b * cfg.c) // STREAM_WORDS
    elif cfg.kind == "PE2":
        # the factor operand loads first; each tile's first entries arrive before its MACs
        mac_cycles += cfg.b * _ceil_to(cfg.d, PE_ROWS) // STREAM_WORDS + cfg.b
    else:
        lanes = params.pe3_batch_lanes
        # a row of b entries takes ceil(b / lanes) steps of 16 lanes x lanes entries
        mac_cycles = cfg.a * -(-cfg.b // lanes)
        mac_cycles += lanes - 1                              # the pair sum's stage
        mac_cycles += cfg.b * C_LANES // STREAM_WORDS        # the first X block
        # added for 100 MHz: two output stages (lane mux, rescale), the operands' register
        # before the multipliers
        mac_cycles += 3
    return max(mac_cycles, cfg.in_beats(), cfg.out_beats()) + PIPELINE_CYCLES


#: Cycles from START to the first MAC and from the last MAC to the last output beat (approximate).
PIPELINE_CYCLES = 9       # (the top's CHECK takes two cycles: the PE's verdict is registered)

"""Golden model of the LRT processing element (``insitu.rtl.pe_lrt``): bit-exact, at its streams.

The PE does the O((n+m)·q) vector work of one SKS sample (:mod:`insitu.lrt.sks`) and the rank-r
weight update in integers; the q × q SVD and the estimator stay on the processor. Its state:

* the bases ``Q_L`` (``lrt_rows_max × lrt_cols_max``) and ``Q_R``, :data:`~insitu.numerics.LRT_BASIS`
  codes (Q1.14);
* the residual of the last projection (``lrt_rows_max`` 16-bit words) and its squared norm;
* the weights (``lrt_cells_max`` :data:`~insitu.numerics.LRT_WEIGHT` codes, cell ``i·n + j`` for
  the ``m × n`` matrix of the current LRT_ROWS_L × LRT_ROWS_R), one write counter per cell, and the
  WRITES_MAX / WRITES_TOTAL registers.

Registers (attributes of :class:`LRTPEModel`, named like the register map): ``side`` (0: Q_L with
``rows_l`` rows, 1: Q_R with ``rows_r``), ``rows_l`` (m), ``rows_r`` (n), ``cols`` (r, so
q = r + 1), ``recip`` (unsigned 16 bits), ``shift`` (the generic SHIFT, signed).

"round(v, s)" is the spec's rounding shift (:func:`~insitu.numerics.shift_round`, ties toward
+infinity, ``s <= 0`` an exact left shift) and "sat16" saturation to 16 signed bits. ``rows`` is the
selected side's rows. Streams are flat int64 arrays of signed 16-bit words (8 per 128-bit beat,
padded with words the PE ignores on input and produces as 0 on output):

========================  ===========================  =============================================
op                        in / out stream              effect
========================  ===========================  =============================================
LRT_LOAD_BASIS            Q: rows × lrt_cols_max /     Q[:rows] of the side
LRT_READ_BASIS            – / Q: rows × lrt_cols_max
LRT_PROJECT               x: rows / c: r               residual = x; then the MGS pass below
LRT_REPROJECT             – / c: r                     the MGS pass on the residual held on chip
LRT_APPEND                – / –                        Q[i, r] = sat16(round(res_i · recip, SHIFT))
LRT_ROTATE                M: q × r (row-major) / –     Q[i, :r] = sat16(round(Q[i, :q] · M, 14))
LRT_UPDATE                s: r / –                     W -= round(Q_L diag(s) Q_R^T, SHIFT), counted
LRT_LOAD_WEIGHTS          W: m × n / –                 W = sat8(words); counters and totals = 0
LRT_READ_WEIGHTS          – / W: m × n                 (sign-extended codes)
LRT_READ_COUNTS           – / counts: m × n            (unsigned 16-bit counts)
========================  ===========================  =============================================

The MGS pass (modified Gram-Schmidt, one basis vector after another): for j = 0..r−1,
``c_j = sat16(round(Σ_i Q[i,j]·x_i, 14))``, then ``x_i ← sat16(x_i − round(c_j·Q[i,j], 14))``;
afterwards ``norm2 = Σ_i x_i²`` (exact). LRT_UPDATE, for every cell (i < m, j < n) row-major:
``Δ = round(Σ_k Q_L[i,k]·s_k·Q_R[j,k], SHIFT)`` (exact sum, one rounding),
``new = saturate(W[i,j] − Δ, 8)``; a cell whose code changes is written and its counter
incremented (saturating at 2**16 − 1), WRITES_TOTAL += 1 (saturating 32-bit), WRITES_MAX = max.
Cells whose code does not change are not written.

A configuration the hardware refuses (:meth:`LRTPEModel.cfg_error`) raises :class:`LRTConfigError`
with its :class:`~insitu.accel.regmap.ErrorCode`; the state is then unchanged.
"""

from __future__ import annotations

import math

import numpy as np

from insitu.numerics import (
    LRT_BASIS,
    LRT_NORM2_BITS,
    LRT_PE_DELTA_BITS,
    LRT_PE_WORD_BITS,
    LRT_RECIP_BITS,
    LRT_WEIGHT,
    LRT_WRITE_COUNT_BITS,
    LRT_WRITES_TOTAL_BITS,
    code_range,
    round_half_up,
    saturate,
    shift_round,
)
from insitu.accel.params import DEFAULT_PARAMS, STREAM_WORDS, AcceleratorParams
from insitu.accel.regmap import LRT_OPS, ErrorCode, Op, register
from insitu.accel.stream import beats, pad_words, words_of

__all__ = [
    "LRT_OPS",
    "LRTConfigError",
    "LRTPEModel",
    "append_reciprocal",
    "beats",
    "pad_words",
    "words_of",
]

#: Ops that work on one basis (rows = LRT_ROWS_L or LRT_ROWS_R by LRT_SIDE).
_BASIS_OPS = frozenset({Op.LRT_LOAD_BASIS, Op.LRT_READ_BASIS, Op.LRT_PROJECT, Op.LRT_REPROJECT,
                        Op.LRT_APPEND, Op.LRT_ROTATE})
#: Ops that use the columns register r.
_COLS_OPS = frozenset({Op.LRT_PROJECT, Op.LRT_REPROJECT, Op.LRT_APPEND, Op.LRT_ROTATE, Op.LRT_UPDATE})
#: Ops that use SHIFT.
_SHIFT_OPS = frozenset({Op.LRT_APPEND, Op.LRT_UPDATE})

#: The model's register attributes and the registers of the map they stand for.
REGISTER_NAMES = {"side": "LRT_SIDE", "rows_l": "LRT_ROWS_L", "rows_r": "LRT_ROWS_R",
                  "cols": "LRT_COLS", "recip": "LRT_RECIP", "shift": "SHIFT"}

_COUNT_MAX = (1 << LRT_WRITE_COUNT_BITS) - 1
_TOTAL_MAX = (1 << LRT_WRITES_TOTAL_BITS) - 1


class LRTConfigError(ValueError):
    """The PE refuses the configuration (``code``: the ErrorCode the hardware reports)."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _sat16(v) -> np.ndarray:
    return saturate(v, LRT_PE_WORD_BITS)


def append_reciprocal(norm2: int, frac: int = LRT_BASIS.frac) -> tuple[int, int]:
    """``(LRT_RECIP, SHIFT)`` that make LRT_APPEND write ``residual / sqrt(norm2)`` as Q1.``frac``
    codes: ``recip · 2**-shift ≈ 2**frac / sqrt(norm2)`` with ``recip`` in ``[2**15, 2**16)`` (16
    significant bits). A zero norm gives ``(0, 0)``: a zero column, as
    :func:`~insitu.lrt.sks.mgs_project` writes. What the processor computes from LRT_NORM2 (a float
    square root, then integers)."""
    norm2 = int(norm2)
    if norm2 < 0:
        raise ValueError(f"append_reciprocal: norm2 must be >= 0, got {norm2}")
    if norm2 == 0:
        return 0, 0
    norm = math.sqrt(norm2)
    # recip = 2**(frac + shift) / norm in [2**15, 2**16) <=> shift = 16 - frac + floor(log2 norm)
    # (up to float rounding at powers of two, which the loop below settles).
    shift = LRT_RECIP_BITS - frac + math.frexp(norm)[1] - 1
    while True:
        recip = int(round_half_up(math.ldexp(1.0, frac + shift) / norm))
        if recip >= 1 << LRT_RECIP_BITS:
            shift -= 1
        elif recip < 1 << (LRT_RECIP_BITS - 1):
            shift += 1
        else:
            return recip, shift


class LRTPEModel:
    """The LRT PE's state and ops, bit for bit (see the module docstring for the semantics).

    Set the registers as attributes (``side``, ``rows_l``, ``rows_r``, ``cols``, ``recip``,
    ``shift``) or with :meth:`configure`, then run an op with :meth:`execute` (by op code) or its
    method. Input and output streams are flat arrays of words, ``in_beats(op) * 8`` and
    ``out_beats(op) * 8`` long.
    """

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS):
        self.params = params
        rows, q, cells = params.lrt_rows_max, params.lrt_cols_max, params.lrt_cells_max
        self.QL = np.zeros((rows, q), np.int64)
        self.QR = np.zeros((rows, q), np.int64)
        self.residual = np.zeros(rows, np.int64)
        self.W = np.zeros(cells, np.int64)
        self.counts = np.zeros(cells, np.int64)
        self.norm2 = 0
        self.writes_max = 0
        self.writes_total = 0
        # Registers.
        self.side = 0
        self.rows_l = 0
        self.rows_r = 0
        self.cols = 0
        self.recip = 0
        self.shift = 0

    # ------------------------------------------------------------------------------ registers
    def configure(self, **regs) -> LRTPEModel:
        """Set registers by name (side, rows_l, rows_r, cols, recip, shift); checks their widths."""
        for name, value in regs.items():
            if name not in REGISTER_NAMES:
                raise ValueError(f"LRTPEModel.configure: no register {name!r} "
                                 f"(have {', '.join(REGISTER_NAMES)})")
            reg = register(REGISTER_NAMES[name])
            lo, hi = code_range(reg.width, reg.signed)
            is_int = isinstance(value, (int, np.integer)) and not isinstance(value, bool)
            if not is_int or not lo <= value <= hi:
                raise ValueError(f"LRTPEModel.configure: {name} must be an integer in [{lo}, {hi}], "
                                 f"got {value!r}")
            setattr(self, name, int(value))
        return self

    @property
    def rows(self) -> int:
        """Rows of the selected basis (LRT_ROWS_R if LRT_SIDE else LRT_ROWS_L)."""
        return self.rows_r if self.side else self.rows_l

    def basis(self, side: int | None = None) -> np.ndarray:
        """The basis memory of ``side`` (default: LRT_SIDE), all ``lrt_rows_max`` rows (a view)."""
        return self.QR if (self.side if side is None else side) else self.QL

    def weights(self) -> np.ndarray:
        """The current ``m × n`` weight codes (a copy)."""
        return self.W[:self.rows_l * self.rows_r].reshape(self.rows_l, self.rows_r).copy()

    def write_counts(self) -> np.ndarray:
        """The current ``m × n`` write counters (a copy)."""
        return self.counts[:self.rows_l * self.rows_r].reshape(self.rows_l, self.rows_r).copy()

    # ------------------------------------------------------------------------------ the contract
    def cfg_error(self, op: int) -> ErrorCode:
        """The error the PE reports for ``op`` with the current registers (``NONE``: it runs).

        Checked in this order: op not an LRT op (BAD_OP); a size the op uses is 0 (ZERO_SIZE: the
        side's rows, or m or n for LRT_UPDATE and the weight ops); beyond the memories (LRT_SIZE:
        rows, m or n above lrt_rows_max, q = r + 1 above lrt_cols_max, m·n above lrt_cells_max);
        SHIFT outside [shift_min, shift_max] for LRT_APPEND and LRT_UPDATE (SHIFT).
        """
        p = self.params
        if op not in LRT_OPS:
            return ErrorCode.BAD_OP
        op = Op(op)
        sizes = [self.rows] if op in _BASIS_OPS else [self.rows_l, self.rows_r]
        if min(sizes) == 0:
            return ErrorCode.ZERO_SIZE
        if max(sizes) > p.lrt_rows_max or (op in _COLS_OPS and self.cols + 1 > p.lrt_cols_max):
            return ErrorCode.LRT_SIZE
        if op not in _BASIS_OPS and self.rows_l * self.rows_r > p.lrt_cells_max:
            return ErrorCode.LRT_SIZE
        if op in _SHIFT_OPS and not p.shift_min <= self.shift <= p.shift_max:
            return ErrorCode.SHIFT
        return ErrorCode.NONE

    def in_words(self, op: int) -> int:
        """Words of the op's input stream (padded to a whole beat)."""
        r, cells = self.cols, self.rows_l * self.rows_r
        words: dict[int, int] = {
            Op.LRT_LOAD_BASIS: self.rows * self.params.lrt_cols_max, Op.LRT_PROJECT: self.rows,
            Op.LRT_ROTATE: (r + 1) * r, Op.LRT_UPDATE: r, Op.LRT_LOAD_WEIGHTS: cells}
        n = words.get(op, 0)
        return _ceil_div(n, STREAM_WORDS) * STREAM_WORDS

    def out_words(self, op: int) -> int:
        """Words of the op's output stream (padded to a whole beat)."""
        r, cells = self.cols, self.rows_l * self.rows_r
        words: dict[int, int] = {
            Op.LRT_READ_BASIS: self.rows * self.params.lrt_cols_max, Op.LRT_PROJECT: r,
            Op.LRT_REPROJECT: r, Op.LRT_READ_WEIGHTS: cells, Op.LRT_READ_COUNTS: cells}
        n = words.get(op, 0)
        return _ceil_div(n, STREAM_WORDS) * STREAM_WORDS

    def in_beats(self, op: int) -> int:
        return self.in_words(op) // STREAM_WORDS

    def out_beats(self, op: int) -> int:
        return self.out_words(op) // STREAM_WORDS

    def cycles(self, op: int) -> int:
        """Cycles the RTL (``insitu.rtl.pe_lrt``) is busy for ``op`` with the current registers when
        its streams never stall (the RTL tests check these figures)."""
        rows, r, q = self.rows, self.cols, self.cols + 1
        cells = self.rows_l * self.rows_r

        def b(words):                                             # beats
            return _ceil_div(words, STREAM_WORDS)

        # MGS passes, then the c beat (two cycles: its output state and the FIFO drain); without
        # columns (r = 0) there is no c beat and the last pass ends a cycle earlier.
        # (The compute ops' pipeline is 9 stages deep after the issue: each
        # pass, and each op, drains it.)
        # An op with an input stream takes its beats one cycle after the stream delivers them
        # (the PE's input skid buffer, whose TREADY is a register): one cycle more.
        skid = 1 if self.in_beats(op) else 0
        passes = (r + 1) * (rows + 10) + (1 if r else -1)
        return {
            Op.LRT_LOAD_BASIS: rows + 2 + skid,
            Op.LRT_READ_BASIS: rows + 3,
            Op.LRT_PROJECT: b(rows) + passes + 3 + skid,
            Op.LRT_REPROJECT: passes + 2,
            Op.LRT_APPEND: rows + 10,
            Op.LRT_ROTATE: b(q * r) + q * r + rows * r + 11 + skid if r else 2,
            Op.LRT_UPDATE: b(r) + self.rows_l * (self.rows_r + 3) + 11 + skid,
            Op.LRT_LOAD_WEIGHTS: max(b(cells) + 2 + skid, b(self.params.lrt_cells_max) + 1),
            Op.LRT_READ_WEIGHTS: b(cells) + 3,
            Op.LRT_READ_COUNTS: b(cells) + 3,
        }[Op(op)]

    def execute(self, op: int, words=None) -> np.ndarray:
        """Run ``op`` (an :class:`~insitu.accel.regmap.Op` code) on its input stream; returns the
        output stream (an empty array for ops without one)."""
        code = self.cfg_error(op)
        if code:
            raise LRTConfigError(code, f"op {op} refused with side={self.side} rows_l={self.rows_l} "
                                       f"rows_r={self.rows_r} cols={self.cols} shift={self.shift}")
        op = Op(op)
        want = self.in_words(op)
        words = np.zeros(0, np.int64) if words is None else np.asarray(words).ravel()
        if words.size != want:
            raise ValueError(f"{op.name}: the input stream must hold {want} words, got {words.size}")
        if words.size:
            if words.dtype.kind not in "iu":
                raise ValueError(f"{op.name}: integer words expected, got dtype {words.dtype}")
            lo, hi = code_range(LRT_PE_WORD_BITS)
            if words.min() < lo or words.max() > hi:
                raise ValueError(f"{op.name}: words outside the signed 16-bit range [{lo}, {hi}]")
        words = words.astype(np.int64)
        out = getattr(self, "_" + op.name[4:].lower())(words)
        out = pad_words(np.zeros(0, np.int64) if out is None else out)
        assert out.size == self.out_words(op)
        return out

    # ------------------------------------------------------------------------------ one method per op
    def load_basis(self, words) -> None:
        self.execute(Op.LRT_LOAD_BASIS, words)

    def read_basis(self) -> np.ndarray:
        return self.execute(Op.LRT_READ_BASIS)

    def project(self, words) -> np.ndarray:
        return self.execute(Op.LRT_PROJECT, words)

    def reproject(self) -> np.ndarray:
        return self.execute(Op.LRT_REPROJECT)

    def append(self) -> None:
        self.execute(Op.LRT_APPEND)

    def rotate(self, words) -> None:
        self.execute(Op.LRT_ROTATE, words)

    def update(self, words) -> None:
        self.execute(Op.LRT_UPDATE, words)

    def load_weights(self, words) -> None:
        self.execute(Op.LRT_LOAD_WEIGHTS, words)

    def read_weights(self) -> np.ndarray:
        return self.execute(Op.LRT_READ_WEIGHTS)

    def read_counts(self) -> np.ndarray:
        return self.execute(Op.LRT_READ_COUNTS)

    # ------------------------------------------------------------------------------ the ops
    def _load_basis(self, words):
        rows, q = self.rows, self.params.lrt_cols_max
        self.basis()[:rows] = words[:rows * q].reshape(rows, q)

    def _read_basis(self, words):
        return self.basis()[:self.rows].ravel()

    def _mgs_pass(self):
        Q, rows, r = self.basis(), self.rows, self.cols
        x = self.residual[:rows].copy()
        c = np.zeros(r, np.int64)
        for j in range(r):
            c[j] = _sat16(shift_round(Q[:rows, j] @ x, LRT_BASIS.frac))
            x = _sat16(x - shift_round(c[j] * Q[:rows, j], LRT_BASIS.frac))
        self.residual[:rows] = x
        self.norm2 = int(x @ x)
        assert self.norm2 < 1 << (LRT_NORM2_BITS - 1)
        return c

    def _project(self, words):
        self.residual[:self.rows] = words[:self.rows]
        return self._mgs_pass()

    def _reproject(self, words):
        return self._mgs_pass()

    def _append(self, words):
        rows = self.rows
        column = shift_round(self.residual[:rows] * self.recip, self.shift)
        self.basis()[:rows, self.cols] = _sat16(column)

    def _rotate(self, words):
        Q, rows, r = self.basis(), self.rows, self.cols
        M = words[:(r + 1) * r].reshape(r + 1, r)
        Q[:rows, :r] = _sat16(shift_round(Q[:rows, :r + 1] @ M, LRT_BASIS.frac))

    def _update(self, words):
        m, n, r = self.rows_l, self.rows_r, self.cols
        s = words[:r]
        # Exact: |Q_L s| < 2**30 per term and r <= 7 terms of < 2**45 each.
        acc = (self.QL[:m, :r] * s) @ self.QR[:n, :r].T
        if self.shift < 0:
            # An exact left shift; what exceeds the step's saturation range saturates anyway.
            bound = 1 << LRT_PE_DELTA_BITS
            acc = np.clip(acc, -bound, bound)
        delta = saturate(shift_round(acc, self.shift), LRT_PE_DELTA_BITS).ravel()
        cells = m * n
        old = self.W[:cells]
        new = LRT_WEIGHT.saturate(old - delta)
        changed = new != old
        self.W[:cells] = new
        counts = self.counts[:cells]
        counts[changed] = np.minimum(counts[changed] + 1, _COUNT_MAX)
        self.writes_total = min(self.writes_total + int(changed.sum()), _TOTAL_MAX)
        if changed.any():
            self.writes_max = max(self.writes_max, int(counts[changed].max()))

    def _load_weights(self, words):
        cells = self.rows_l * self.rows_r
        self.W[:cells] = LRT_WEIGHT.saturate(words[:cells])
        self.counts[:] = 0
        self.writes_total = 0
        self.writes_max = 0

    def _read_weights(self, words):
        return self.W[:self.rows_l * self.rows_r]

    def _read_counts(self, words):
        return self.counts[:self.rows_l * self.rows_r]

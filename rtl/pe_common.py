"""Pieces the TT contraction PEs (:mod:`insitu.rtl.pe1`, :mod:`insitu.rtl.pe2`) share.

* word / lane slicing of the 128-bit stream payload and of the wide buffer entries;
* the output stage: a bank of :class:`~insitu.rtl.requantize.RoundShiftSaturate` feeding an
  output FIFO (registered output, ``SyncFIFOBuffered``) that drives the ``m`` stream;
* the configuration checks both PEs make (zero sizes, 16 lanes, SHIFT range).

Both PEs issue a MAC cycle only when the output side is sure to take every result that can still
be in flight (credits), so a full output never needs to stall the MAC pipeline itself.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Signal, Value
from amaranth.lib.fifo import SyncFIFOBuffered

from insitu.numerics import TT_FACTOR_BITS, TT_PE_DATA_BITS

from .params import STREAM_BITS, STREAM_WORDS, WORD_BITS, AcceleratorParams
from .regmap import ErrorCode
from .requantize import RoundShiftSaturate

#: Bits of one factor code inside the factor buffers (the low 4 bits of a stream word).
CODE_BITS = TT_FACTOR_BITS
DATA_BITS = TT_PE_DATA_BITS


def check_params(params: AcceleratorParams, who: str) -> None:
    """The PEs are built for 8 rows (one output beat of 8 words) and 16 lanes (two beats)."""
    if params.pe_rows != STREAM_WORDS or params.c_lanes != 2 * STREAM_WORDS:
        raise ValueError(f"{who}: generated for pe_rows == {STREAM_WORDS} and c_lanes == "
                         f"{2 * STREAM_WORDS}, got {params.pe_rows} and {params.c_lanes}")


def words(value: Value, n: int, width: int = WORD_BITS) -> list[Value]:
    """The ``n`` ``width``-bit fields of ``value``, field 0 in the low bits, as signed values."""
    return [value[k * width:(k + 1) * width].as_signed() for k in range(n)]


def payload_codes(payload: Value) -> Value:
    """The low 4 bits of each of the 8 words of a beat: 8 packed factor codes (32 bits)."""
    return Cat(*(payload[k * WORD_BITS:k * WORD_BITS + CODE_BITS] for k in range(STREAM_WORDS)))


def adder_tree(terms: list[Value]) -> Value:
    """Balanced sum of ``terms`` (Amaranth widens each addition by one bit: no overflow)."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def common_cfg_errors(a, b, c, d, shift, params: AcceleratorParams):
    """The checks both PEs share, in priority order: ``(condition, ErrorCode)`` pairs."""
    return [
        ((a == 0) | (b == 0) | (c == 0) | (d == 0), ErrorCode.ZERO_SIZE),
        (c[:4] != 0, ErrorCode.C_LANES),
    ], ((shift < params.shift_min) | (shift > params.shift_max), ErrorCode.SHIFT)


def drive_cfg_error(m: Module, cfg_error: Signal, checks) -> None:
    """``cfg_error`` = the code of the first failing check, 0 when all pass (combinational)."""
    first = True
    for cond, code in checks:
        ctx = m.If(cond) if first else m.Elif(cond)
        with ctx:
            m.d.comb += cfg_error.eq(code)
        first = False


class OutputStage:
    """``STREAM_WORDS`` rescalers feeding a ``depth``-entry output FIFO that drives ``m``.

    ``values`` (8 signed accumulators) are rescaled by ``shift`` and written when ``write`` is
    high; the caller guarantees room (``free`` is the number of entries it may still write).
    """

    def __init__(self, m: Module, pe, acc_bits: int, params: AcceleratorParams, depth: int,
                 prefix: str):
        self.fifo = fifo = SyncFIFOBuffered(width=STREAM_BITS, depth=depth)
        m.submodules[f"{prefix}_fifo"] = fifo
        self.depth = depth
        self.values = [Signal(range(-(1 << (acc_bits - 1)), 1 << (acc_bits - 1)),
                              name=f"{prefix}_val{k}") for k in range(STREAM_WORDS)]
        self.write = Signal(name=f"{prefix}_write")
        outs = []
        for k in range(STREAM_WORDS):
            rss = RoundShiftSaturate(acc_bits, WORD_BITS, params.shift_max, params.shift_min)
            m.submodules[f"{prefix}_rss{k}"] = rss
            m.d.comb += [rss.data_in.eq(self.values[k]), rss.shift.eq(pe.shift)]
            outs.append(rss.data_out)
        m.d.comb += [
            fifo.w_data.eq(Cat(*outs)),
            fifo.w_en.eq(self.write),
            pe.m.payload.eq(fifo.r_data),
            pe.m.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(pe.m.ready),
        ]
        #: Output beats accepted on ``m`` this cycle.
        self.fire = Signal(name=f"{prefix}_fire")
        m.d.comb += self.fire.eq(pe.m.valid & pe.m.ready)
        #: Entries that can still be written (a SyncFIFOBuffered of depth >= 3 accepts a write
        #: whenever its level is below its depth).
        self.free = Signal(range(depth + 1), name=f"{prefix}_free")
        m.d.comb += self.free.eq(depth - fifo.level)

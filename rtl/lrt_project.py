"""The MGS projection of the LRT PE (:mod:`insitu.rtl.pe_lrt`): LRT_PROJECT / LRT_REPROJECT's
coefficients ``c_p`` and the residual's squared norm."""

from __future__ import annotations

from amaranth.hdl import Array, Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from insitu.numerics import LRT_BASIS, LRT_NORM2_BITS, LRT_PE_WORD_BITS

from .requantize import RoundShiftSaturate


class LrtProjection(wiring.Component):
    """The pass state of modified Gram-Schmidt: the pass ``p``, the multiply-accumulate of
    ``Q[i, p] x'_i`` (``x'_i^2`` in the last pass, ``p == r``) over the rows, and at the end of a
    pass ``c_p = round(acc, 14)``, kept for the output beat (``c_beat``, lanes ``>= r`` zero) and as
    ``c_prev``, the coefficient the next pass subtracts; the last pass's sum is ``norm2``.

    Separate from the shared lane datapath because it is the one op state that lives across
    passes, and its multiply-accumulate (S8 product, S9 sum) follows the write back, after the
    lanes: the PE only tells it when a pass starts over (``start``), when a row's new residual
    word is written back (``wb_valid``, ``new_word`` and ``q_col``, its ``Q[i, p]``), when the
    product is due in the accumulator (``acc_valid``) and when a pass has drained
    (``pass_done``).
    """

    def __init__(self, lanes: int, acc_bits: int, cols_bits: int):
        self.lanes, self.acc_bits = lanes, acc_bits
        word = signed(LRT_PE_WORD_BITS)
        super().__init__({
            "start": In(1),
            "r": In(cols_bits),
            "wb_valid": In(1),
            "new_word": In(word),
            "q_col": In(word),
            "acc_valid": In(1),
            "pass_done": In(1),
            "p": Out(range(lanes + 1)),
            "last": Out(1),                      # p == r: the squared-norm pass
            "c_prev": Out(word),
            "c_beat": Out(lanes * LRT_PE_WORD_BITS),
            "norm2": Out(LRT_NORM2_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        L, WB, frac = self.lanes, LRT_PE_WORD_BITS, LRT_BASIS.frac
        p, r = self.p, self.r
        # No reset: every op's start clears it, and the PE's reset would fan out to its 40 bits.
        acc = Signal(signed(self.acc_bits), reset_less=True)
        cvec = Array(Signal(signed(WB), name=f"c{k}") for k in range(L))
        m.d.comb += [self.last.eq(p == r),
                     self.c_beat.eq(Cat(*(Mux(k < r, cvec[k], 0) for k in range(L))))]

        # S8 multiplies x'_i by Q[i, p] (or by itself in the last pass); S9 adds.
        mac7 = Signal(signed(2 * WB), reset_less=True)
        last_pass = Signal()
        m.d.sync += last_pass.eq(p == r)
        with m.If(self.wb_valid):
            m.d.sync += mac7.eq(self.new_word * Mux(last_pass, self.new_word, self.q_col))
        with m.If(self.acc_valid):
            m.d.sync += acc.eq(acc + mac7)

        m.submodules.c_round = c_round = RoundShiftSaturate(self.acc_bits, WB, frac)
        m.d.comb += [c_round.data_in.eq(acc), c_round.shift.eq(frac)]

        with m.If(self.start):
            m.d.sync += [p.eq(0), acc.eq(0), self.c_prev.eq(0)]
        with m.If(self.pass_done):
            m.d.sync += acc.eq(0)
            with m.If(self.last):
                m.d.sync += self.norm2.eq(acc)
            with m.Else():
                m.d.sync += [cvec[p].eq(c_round.data_out), self.c_prev.eq(c_round.data_out),
                             p.eq(p + 1)]
        return m

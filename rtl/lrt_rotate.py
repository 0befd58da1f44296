"""The basis rotation of the LRT PE (:mod:`insitu.rtl.pe_lrt`): LRT_ROTATE's matrix M and the
row buffer of its outputs."""

from __future__ import annotations

from amaranth.hdl import Array, Module, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from insitu.numerics import LRT_PE_WORD_BITS


class LrtRotation(wiring.Component):
    """LRT_ROTATE's own state: M (``q r`` words, at most 56) deserialized from the input stream
    into registers ``M[k][j]`` by lane ``k``, one word a cycle; column ``j`` of it as the lanes'
    multiplier operands (``m_col``, for the output ``Q[i, j]``); and the new row, collected
    output by output (``rot_row``) and written back whole once its r outputs are done
    (``jlast``), so every output of a row reads the old row.

    Separate from the shared lane datapath: M and the row buffer are used by no other op, and
    the deserializer has its own handshake with the stream (``s_ready``, while ``loading``).
    """

    def __init__(self, lanes: int, cols_bits: int):
        self.lanes = lanes
        word = signed(LRT_PE_WORD_BITS)
        row = data.ArrayLayout(word, lanes)
        super().__init__({
            "start": In(1),
            "qr": In(range(lanes * lanes + 1)),  # words of M
            "r_m1": In(signed(cols_bits + 1)),
            "loading": In(1),                    # the PE is in M's input state
            "s_valid": In(1),
            "payload": In(row),
            "s_ready": Out(1),
            "loaded": Out(1),                    # all of M is in
            "j_operand": In(range(lanes)),       # the output column at the operand stage (S1)
            "m_col": Out(row),
            "j_wb": In(range(lanes)),            # and at the difference stage (S7)
            "wb_valid": In(1),                   # an output is written back (S8)
            "new_word": In(word),
            "rot_row": Out(row),
            "jsel": Out(lanes),                  # the write-back output's lane, one-hot
            "jlast": Out(1),                     # ... and it is the row's last
        })

    def elaborate(self, platform):
        m = Module()
        L = self.lanes
        word = signed(LRT_PE_WORD_BITS)
        # M and the row buffer have no reset (each op loads them before it reads them): the PE's
        # reset would fan out into their 1,152 bits.
        mreg = [Array(Signal(word, name=f"m{k}_{jj}", reset_less=True) for jj in range(L))
                for k in range(L)]
        mk = Signal(range(L + 1))
        mj = Signal(range(L + 1))
        words_left = Signal(range(L * L + 1))
        buf = Signal(self.payload.shape())
        buf_full = Signal()
        buf_w = Signal(range(L))
        rot_out = Array(Signal(word, name=f"rot{k}", reset_less=True) for k in range(L))
        m.d.comb += [self.m_col[k].eq(mreg[k][self.j_operand]) for k in range(L)]
        m.d.comb += [self.rot_row[k].eq(rot_out[k]) for k in range(L)]

        # The deserializer: a beat into buf, then its words into M one a cycle.
        m.d.comb += [self.loaded.eq(words_left == 0), self.s_ready.eq(~buf_full)]
        with m.If(self.start):
            m.d.sync += [buf_full.eq(0), mk.eq(0), mj.eq(0), words_left.eq(self.qr)]
        with m.Elif(self.loading & ~self.loaded):
            with m.If(~buf_full):
                with m.If(self.s_valid):
                    m.d.sync += [buf.eq(self.payload), buf_full.eq(1), buf_w.eq(0)]
            with m.Else():
                for k in range(L):
                    with m.If(mk == k):
                        m.d.sync += mreg[k][mj].eq(buf[buf_w])
                m.d.sync += [words_left.eq(words_left - 1), buf_w.eq(buf_w + 1)]
                with m.If(mj == self.r_m1):
                    m.d.sync += [mj.eq(0), mk.eq(mk + 1)]
                with m.Else():
                    m.d.sync += mj.eq(mj + 1)
                with m.If(buf_w == L - 1):
                    m.d.sync += buf_full.eq(0)

        # S7: the output's lane and whether it ends the row; S8: into the row buffer.
        jsel = Signal(L, reset_less=True)
        jlast = Signal(reset_less=True)
        m.d.sync += [jsel.eq(1 << self.j_wb), jlast.eq(self.j_wb == self.r_m1)]
        m.d.comb += [self.jsel.eq(jsel), self.jlast.eq(jlast)]
        with m.If(self.wb_valid):
            for k in range(L):
                with m.If(jsel[k]):
                    m.d.sync += rot_out[k].eq(self.new_word)
        return m

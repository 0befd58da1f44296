"""The weight update of the LRT PE (:mod:`insitu.rtl.pe_lrt`): LRT_UPDATE's operands, its
write-if-changed with the write counters, and LRT_LOAD_WEIGHTS' counter clear."""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from insitu.numerics import (LRT_PE_WORD_BITS, LRT_WEIGHT, LRT_WRITE_COUNT_BITS,
                             LRT_WRITES_TOTAL_BITS)

from .requantize import RoundShiftSaturate


class LrtWeightUpdate(wiring.Component):
    """The weight side of the LRT PE:

    * LRT_UPDATE's operands: ``s`` (from the stream, lanes ``>= r`` zero) and, per row, the exact
      products ``u_k = Q_L[i, k] s_k`` taken from the lanes' multipliers (``u_fwd`` says they are
      in the product registers this cycle, not yet in ``u``);
    * the new code ``W - y`` saturated to 8 bits (S7) and its write back (S8): the cell and its
      counter (saturating at 2**16 - 1) are written only when the code changes, and
      ``writes_total`` / ``writes_max`` count those writes;
    * LRT_LOAD_WEIGHTS' clear of every write counter, one memory word a cycle, and of the two
      counts.

    Separate from the shared lane datapath because the write-if-changed, the counters and the
    statistics are the write endurance bookkeeping of the weights and nothing else: the PE
    gives it the write-back stage's data and takes the counter memory's write port from it.
    """

    def __init__(self, lanes: int, u_bits: int, prod_bits: int, cell_bits: int, cell_depth: int,
                 y_bits: int):
        self.lanes, self.cell_depth = lanes, cell_depth
        word = signed(LRT_PE_WORD_BITS)
        wbits = LRT_WEIGHT.bits
        super().__init__({
            "start": In(1),
            "clear_start": In(1),                # LRT_LOAD_WEIGHTS starts
            "r": In(range(lanes + 1)),
            "s_load": In(1),                     # the stream beat of s is taken
            "payload": In(data.ArrayLayout(word, lanes)),
            "s": Out(data.ArrayLayout(word, lanes)),
            "row_step": In(1),                   # S1 of a row step: u_k is in the products in 3
            "products": In(data.ArrayLayout(signed(prod_bits), lanes)),
            "u": Out(data.ArrayLayout(signed(u_bits), lanes)),
            "u_fwd": Out(1),
            "y": In(signed(y_bits)),             # S6: round(sum_k u_k Q_R[j, k], SHIFT)
            "w_diff": In(signed(wbits)),         # S6 (for S7, the difference): the code and counter
            "n_diff": In(LRT_WRITE_COUNT_BITS),
            "wb_valid": In(1),                   # S8: a cell of LRT_UPDATE
            "w_wb": In(signed(wbits)),
            "cell_wb": In(cell_bits),
            "new_w": Out(signed(wbits)),
            "w_write": Out(lanes),               # the weight memory's lane enables
            "cnt_en": Out(lanes),                # the counter memory's write port
            "cnt_addr": Out(range(cell_depth)),
            "cnt_data": Out(LRT_WRITE_COUNT_BITS),
            "clearing": Out(1),
            "writes_max": Out(LRT_WRITES_TOTAL_BITS),
            "writes_total": Out(LRT_WRITES_TOTAL_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        L = self.lanes
        wbits = LRT_WEIGHT.bits
        writes_max, writes_total = self.writes_max, self.writes_total

        with m.If(self.start):
            m.d.sync += [self.s[k].eq(0) for k in range(L)]
        with m.Elif(self.s_load):
            m.d.sync += [self.s[k].eq(Mux(k < self.r, self.payload[k], 0)) for k in range(L)]
        # u_k reaches the products three cycles after the row step's S1.
        u_load = Signal(2)
        m.d.sync += [u_load.eq(Cat(self.row_step, u_load[0])), self.u_fwd.eq(u_load[1])]
        with m.If(self.u_fwd):
            m.d.sync += [self.u[k].eq(self.products[k]) for k in range(L)]

        # S7: the new code and the counter's next value.
        m.submodules.sat_weight = sat_weight = RoundShiftSaturate(LRT_PE_WORD_BITS + 3, wbits, 0)
        m.d.comb += [sat_weight.data_in.eq(self.w_diff - self.y), sat_weight.shift.eq(0)]
        m.d.sync += self.new_w.eq(sat_weight.data_out)
        bumped = Signal(LRT_WRITE_COUNT_BITS, reset_less=True)
        n_diff = self.n_diff
        m.d.sync += bumped.eq(Mux(n_diff == (1 << LRT_WRITE_COUNT_BITS) - 1, n_diff, n_diff + 1))

        # S8: write if changed.
        with m.If(self.wb_valid & (self.new_w != self.w_wb)):
            m.d.comb += self.w_write.eq(1 << self.cell_wb[:3])
            m.d.sync += writes_total.eq(Mux(writes_total == (1 << LRT_WRITES_TOTAL_BITS) - 1,
                                            writes_total, writes_total + 1))
            with m.If(bumped > writes_max):
                m.d.sync += writes_max.eq(bumped)

        # The counter clear, one memory word (8 counters) a cycle.
        clearing = self.clearing
        clr_addr = Signal(range(self.cell_depth))
        with m.If(clearing):
            m.d.sync += clr_addr.eq(clr_addr + 1)
            with m.If(clr_addr == self.cell_depth - 1):
                m.d.sync += clearing.eq(0)
        with m.If(self.clear_start):
            m.d.sync += [clearing.eq(1), clr_addr.eq(0), writes_total.eq(0), writes_max.eq(0)]
        m.d.comb += [
            self.cnt_en.eq(Mux(clearing, (1 << L) - 1, self.w_write)),
            self.cnt_addr.eq(Mux(clearing, clr_addr, self.cell_wb >> 3)),
            self.cnt_data.eq(Mux(clearing, 0, bumped)),
        ]
        return m

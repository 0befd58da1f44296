"""The LRT PE's output side: memory reads towards the output stream, and its FIFO.

Separate from the control (:mod:`insitu.rtl.lrt_control`), which only says when to read
(``issue``, while ``room`` says the FIFO can take it): this part picks the row (a basis row, or
weights / write counters with the lanes past ``m n`` as 0), writes it into the FIFO a cycle later
with the memory's data, and also takes PROJECT's c beat (``c_out``). The FIFO drives the PE's
output stream ``m``.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFO
from amaranth.lib.wiring import In, Out

from insitu.accel.params import SIZE_BITS

__all__ = ["LrtReadout"]

#: Beats the output FIFO holds.
OUT_FIFO_DEPTH = 4


class LrtReadout(wiring.Component):
    def __init__(self, row_layout: data.ArrayLayout, weight_layout: data.ArrayLayout,
                 count_layout: data.ArrayLayout, cells_max: int):
        self.lanes = row_layout.length
        super().__init__({
            "start": In(1),
            "cells": In(range(cells_max + 1)),    # m n: the words the weight reads return
            "rd_basis": In(1),                    # the op reads a basis (else weights / counters)
            "rd_wts": In(1),                      # ... weights (else counters)
            "issue": In(1),                       # a memory word is read this cycle
            "qrow": In(row_layout),               # the memories' read data, a cycle after issue
            "w_data": In(weight_layout),
            "c_data": In(count_layout),
            "c_out": In(1),                       # PROJECT's c beat, into the FIFO now
            "c_beat": In(row_layout),
            "m": Out(stream.Signature(row_layout.size)),
            "room": Out(1),                       # the FIFO can take one more read
            "pending": Out(1),                    # a read in flight or a beat in the FIFO
        })

    def elaborate(self, platform):
        m = Module()
        L = self.lanes
        m.submodules.fifo = fifo = SyncFIFO(width=self.m.payload.shape().width, depth=OUT_FIFO_DEPTH)
        m.d.comb += [self.m.valid.eq(fifo.r_rdy), self.m.payload.eq(fifo.r_data),
                     fifo.r_en.eq(self.m.ready)]
        # Words still to read out (the lanes past m n read as 0): a counter, not a comparator of
        # beat * 8 + k with m n.
        left = Signal(signed(2 * SIZE_BITS + 1))
        left1 = Signal.like(left)
        inflight = Signal()
        m.d.sync += [inflight.eq(self.issue), left1.eq(left)]
        with m.If(self.start):
            m.d.sync += left.eq(self.cells)
        with m.Elif(self.issue):
            m.d.sync += left.eq(left - L)
        with m.If(inflight):
            m.d.comb += fifo.w_en.eq(1)
            out_row = Signal(self.qrow.shape())
            with m.If(self.rd_basis):
                m.d.comb += out_row.eq(self.qrow)
            with m.Elif(self.rd_wts):
                m.d.comb += [out_row[k].eq(Mux(left1 > k, self.w_data[k], 0)) for k in range(L)]
            with m.Else():
                m.d.comb += [out_row[k].eq(Mux(left1 > k, self.c_data[k], 0)) for k in range(L)]
            m.d.comb += fifo.w_data.eq(out_row)
        with m.If(self.c_out):
            m.d.comb += [fifo.w_en.eq(1), fifo.w_data.eq(self.c_beat)]
        m.d.comb += [self.room.eq(fifo.level + inflight < OUT_FIFO_DEPTH),
                     self.pending.eq(inflight | (fifo.level != 0))]
        return m

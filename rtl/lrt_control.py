"""The LRT PE's op control: the state machine that sequences each op and the counters it steps.

Separate from the datapath (:mod:`insitu.rtl.pe_lrt`): it sees only the op, its sizes and a few
status bits (the input stream's valid, the parts' "done" flags, the pipeline and the output
drained), and gives back what the datapath is steered by: the issue strobes of the pipeline and
of the output reads, the row / column / cell / beat counters, and flags that are flip-flops
(``busy``, ``in_run``), not state decodes, where they fan out into write enables or reach the
top level.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from insitu.accel.params import SIZE_BITS
from insitu.accel.regmap import Op
from .pe_interface import BEATS_BITS

__all__ = ["LrtControl"]


class LrtControl(wiring.Component):
    """States: IDLE; IN (the op's input beats: LOAD_BASIS, PROJECT, UPDATE, LOAD_WEIGHTS); PASS
    and PASS_END (each MGS pass, then the pipeline's drain) and C_OUT (the c beat); APPEND; ROT_IN
    (M into the rotation part) and ROT; UROW, UROW2, UROW3 (an UPDATE row step: u_k reaches the
    products) and UCELL; READ (reads towards the output FIFO); FINISH (until everything drained).
    """

    def __init__(self, lanes: int, cells_max: int, beat_max: int, cols_bits: int):
        self.lanes = lanes
        super().__init__({
            "start": In(1),
            "op": In(8),
            "in_beats": In(BEATS_BITS),
            "takes_in": In(1),                    # the op's IN state has beats to take
            "out_beats": In(BEATS_BITS),
            "rows": In(SIZE_BITS),                # the side's rows (in_left's start)
            "cells": In(range(cells_max + 1)),    # m n (LOAD_WEIGHTS' in_left)
            "cols": In(cols_bits),                # r
            "rows_m1": In(SIZE_BITS),
            "rows_l_m1": In(SIZE_BITS),
            "rows_r_m1": In(SIZE_BITS),
            "r_m1": In(signed(cols_bits + 1)),
            "in_valid": In(1),                    # the input stream (behind the skid buffer)
            "rot_loaded": In(1),                  # all of M is in
            "mgs_last": In(1),                    # the pass just drained was the last
            "pipe_empty": In(1),                  # no element in the pipeline after the issue
            "drained": In(1),                     # ... nor in the output reads, FIFO, counter clear
            "read_room": In(1),                   # the output FIFO can take another read
            "busy": Out(1),
            "op_start": Out(1),
            "in_run": Out(1),                     # in IN with beats to come
            "rot_in": Out(1),                     # in ROT_IN
            "pass_end": Out(1),                   # a pass has drained
            "c_out": Out(1),                      # the c beat goes into the output FIFO
            "urow": Out(1),                       # an UPDATE row step is issued
            "issue": Out(1),                      # S0: an element enters the pipeline
            "read_issue": Out(1),                 # a memory word is read towards the output
            "beat": Out(range(beat_max + 1)),     # input / output beat
            "in_left": Out(signed(2 * SIZE_BITS + 1)),  # words still to come in
            "i": Out(SIZE_BITS),                  # row (issue stage)
            "j": Out(SIZE_BITS),                  # column (ROTATE) or weight column (UPDATE)
            "cell": Out(range(cells_max + 1)),    # i * n + j (UPDATE)
            "i1": Out(SIZE_BITS),                 # ... and at S1
            "j1": Out(range(lanes)),
            "cell1": Out(range(cells_max + 1)),
        })

    def elaborate(self, platform):
        m = Module()
        L, op = self.lanes, self.op
        beat, i, j, cell, in_left = self.beat, self.i, self.j, self.cell, self.in_left
        i1, j1, cell1 = self.i1, self.j1, self.cell1
        # beat == in_beats as a flag set with the last beat (a compare off the stream handshake),
        # and beat + 1 kept as a register.
        in_done = Signal()
        beat1 = Signal.like(self.in_beats)
        # busy as a register set and cleared with the IDLE transitions (the same cycles as
        # ~ongoing("IDLE")): the top's done/error logic reads a flip-flop, not the state decode.
        busy, in_run = self.busy, self.in_run
        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += [busy.eq(1), in_run.eq(self.takes_in)]
                    m.d.sync += [beat.eq(0), beat1.eq(1), i.eq(0), j.eq(0), cell.eq(0),
                                 in_done.eq(self.in_beats == 0),
                                 in_left.eq(Mux(op == Op.LRT_LOAD_WEIGHTS, self.cells, self.rows))]
                    with m.Switch(op):
                        with m.Case(Op.LRT_LOAD_BASIS, Op.LRT_PROJECT, Op.LRT_UPDATE,
                                    Op.LRT_LOAD_WEIGHTS):
                            m.next = "IN"
                        with m.Case(Op.LRT_ROTATE):
                            m.next = "ROT_IN"
                        with m.Case(Op.LRT_READ_BASIS, Op.LRT_READ_WEIGHTS, Op.LRT_READ_COUNTS):
                            m.next = "READ"
                        with m.Case(Op.LRT_REPROJECT):
                            m.next = "PASS"
                        with m.Case(Op.LRT_APPEND):
                            m.next = "APPEND"
                        with m.Default():
                            m.d.sync += busy.eq(0)          # no op of this PE: stays IDLE

            with m.State("IN"):
                with m.If(in_done):
                    with m.Switch(op):
                        with m.Case(Op.LRT_PROJECT):
                            m.next = "PASS"
                        with m.Case(Op.LRT_UPDATE):
                            m.next = "UROW"
                        with m.Default():
                            m.next = "FINISH"
                with m.Elif(self.in_valid):
                    m.d.sync += [beat.eq(beat + 1), beat1.eq(beat1 + 1), in_left.eq(in_left - L),
                                 in_done.eq(beat1 == self.in_beats),
                                 in_run.eq(beat1 != self.in_beats)]

            # LRT_PROJECT / LRT_REPROJECT: pass p over the rows, then drain and finish the pass.
            with m.State("PASS"):
                m.d.sync += [i1.eq(i), i.eq(i + 1)]
                with m.If(i == self.rows_m1):
                    m.d.sync += i.eq(0)
                    m.next = "PASS_END"
            with m.State("PASS_END"):
                with m.If(self.pipe_empty):
                    with m.If(self.mgs_last):
                        with m.If(self.cols != 0):
                            m.next = "C_OUT"
                        with m.Else():
                            m.next = "FINISH"
                    with m.Else():
                        m.next = "PASS"
            with m.State("C_OUT"):
                m.next = "FINISH"

            with m.State("APPEND"):
                m.d.sync += [i1.eq(i), i.eq(i + 1)]
                with m.If(i == self.rows_m1):
                    m.next = "FINISH"

            # LRT_ROTATE: M into the rotation part's registers, then one output (i, j) per cycle.
            with m.State("ROT_IN"):
                with m.If(self.rot_loaded):
                    with m.If(self.cols == 0):
                        m.next = "FINISH"
                    with m.Else():
                        m.next = "ROT"
            with m.State("ROT"):
                m.d.sync += [i1.eq(i), j1.eq(j), j.eq(j + 1)]
                with m.If(j == self.r_m1):
                    m.d.sync += [j.eq(0), i.eq(i + 1)]
                    with m.If(i == self.rows_m1):
                        m.next = "FINISH"

            # LRT_UPDATE: a row step (u_k = Q_L[i, k] s_k), then the row's cells.
            with m.State("UROW"):
                m.next = "UROW2"
            with m.State("UROW2"):
                m.next = "UROW3"
            with m.State("UROW3"):
                m.next = "UCELL"
            with m.State("UCELL"):
                m.d.sync += [cell1.eq(cell), cell.eq(cell + 1), j.eq(j + 1)]
                with m.If(j == self.rows_r_m1):
                    m.d.sync += [j.eq(0), i.eq(i + 1)]
                    with m.If(i == self.rows_l_m1):
                        m.next = "FINISH"
                    with m.Else():
                        m.next = "UROW"

            # Reads towards the output stream, as the FIFO has room.
            with m.State("READ"):
                with m.If(self.read_issue):
                    m.d.sync += [beat.eq(beat + 1), beat1.eq(beat1 + 1)]
                    with m.If(beat1 == self.out_beats):
                        m.next = "FINISH"

            with m.State("FINISH"):
                with m.If(self.drained):
                    m.d.sync += busy.eq(0)
                    m.next = "IDLE"

        # The strobes decoded from the state outside the FSM's processes: assigned in them they
        # stay X on a 4-state simulator from power-up until the state first changes (the process
        # never wakes), and that X would run down the pipeline's reset valid bits.
        m.d.comb += [
            self.issue.eq(Cat(*(fsm.ongoing(st) for st in ("PASS", "APPEND", "ROT", "UCELL"))).any()),
            self.read_issue.eq(fsm.ongoing("READ") & self.read_room),
            self.op_start.eq(~busy & self.start),
            self.rot_in.eq(fsm.ongoing("ROT_IN")),
            self.pass_end.eq(fsm.ongoing("PASS_END") & self.pipe_empty),
            self.c_out.eq(fsm.ongoing("C_OUT")),
            self.urow.eq(fsm.ongoing("UROW")),
        ]
        return m

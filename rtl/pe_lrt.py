"""The LRT processing element: the per-sample vector work of low-rank training and the weight update.

Bit-exact to its golden model, :mod:`insitu.lrt.pe_ops` (op semantics, stream layouts, errors).
The PE keeps in on-chip memories (``amaranth.lib.memory.Memory``):

* ``Q_L``, ``Q_R``: ``lrt_rows_max`` rows of ``lrt_cols_max`` (= 8) Q1.14 words, one row per
  128-bit memory word, written per 16-bit lane;
* the residual of the last projection: ``lrt_rows_max`` 16-bit words, 8 per memory word;
* the weights (``lrt_cells_max`` 8-bit codes, 8 per memory word, written per cell) and the write
  counters (16 bits, 8 per memory word, written per cell).

Datapath: 8 multiplier lanes (32 x 18 bits, each as two one-DSP multiplies of the operand's
halves, shared by all ops) feed an adder tree, then one
:class:`~insitu.rtl.requantize.RoundShiftSaturate` (shift 14 or SHIFT) and the saturations; a
separate 16 x 16 multiply-accumulator forms the MGS dot products and the squared norm. Every op
that computes is a pipeline of one element per cycle, nine registered stages after the issue:
memory read and operand muxes, the two multiplies, their sum, the lanes' sum, rounding shift,
saturation, differences and their saturation, write back (the MGS passes add the accumulate
stage). The input stream goes through a skid buffer (:class:`~insitu.rtl.skid.InputSkid`): the
top level sees TREADY from registers, and an op with an input takes its beats a cycle later.

* LRT_PROJECT / LRT_REPROJECT: ``r + 1`` passes over the rows, one row per cycle; pass ``p``
  subtracts ``c_{p-1} Q[:, p-1]`` from the residual and accumulates ``Q[:, p] . residual`` (the
  last pass: the squared norm). The passes are sequential (MGS: c_p needs the updated residual),
  so the pipeline drains between passes.
* LRT_ROTATE: M (at most 56 words) is deserialized into registers, one word per cycle; then one
  output ``Q[i, j]`` per cycle (a q-term dot product across the lanes). The new row collects in a
  row buffer and is written back once its r outputs are done, so every output reads the old row.
* LRT_UPDATE: per row i a three-cycle step loads ``u_k = Q_L[i, k] s_k`` (exact 32-bit products),
  then one cell per cycle: ``sum_k u_k Q_R[j, k]`` across the lanes (exact), the rounding shift, the
  saturated new code, a write (and counter increment) only when the code changes.
* LRT_APPEND: one row per cycle, ``residual_i * LRT_RECIP`` rescaled by SHIFT into column r.

Cycle counts (cycles with ``busy`` high, what the CYCLES register counts) when the streams never
stall; ``rows`` of the side, ``q = r + 1``, ``B(x) = ceil(x / 8)`` beats (checked by the RTL tests):

==================  ================================================
op                  cycles
==================  ================================================
LRT_LOAD_BASIS      rows + 3
LRT_READ_BASIS      rows + 3
LRT_PROJECT         B(rows) + (r + 1)(rows + 10) + 5 when r > 0, + 3 when r = 0
LRT_REPROJECT       (r + 1)(rows + 10) + 3 when r > 0, + 1 when r = 0
LRT_APPEND          rows + 10
LRT_ROTATE          B(q r) + q r + rows r + 12 (r > 0; 2 for r = 0)
LRT_UPDATE          B(r) + m (n + 3) + 12 when r > 0, + 11 when r = 0
LRT_LOAD_WEIGHTS    max(B(m n) + 3, lrt_cells_max / 8 + 1)
LRT_READ_WEIGHTS    B(m n) + 3
LRT_READ_COUNTS     B(m n) + 3
==================  ================================================

(:meth:`insitu.lrt.pe_ops.LRTPEModel.cycles` gives these figures.) LRT_LOAD_WEIGHTS clears every
write counter, one memory word (8 counters) per cycle, in parallel with the weight stream.
LRT_NORM2, LRT_WRITES_MAX and LRT_WRITES_TOTAL reset to 0 with the PE (``aresetn``, and ABORT or a
short stream, for which the top holds the PE in reset). The memories keep their contents through
a reset, so after one the processor reloads the weights (LRT_LOAD_WEIGHTS clears the counters);
an op cut short leaves its memory partly updated (a partial LOAD_WEIGHTS: counters partly
cleared; a partial UPDATE: some cells written).

The parts, each an Amaranth component: :class:`LrtConfig` (the configuration results and the op
decodes), :class:`~insitu.rtl.lrt_control.LrtControl` (the op state machine and its counters),
:class:`~insitu.rtl.lrt_readout.LrtReadout` (reads towards the output stream, its FIFO),
:class:`~insitu.rtl.skid.InputSkid` (the input stream's skid buffer),
:class:`~insitu.rtl.lrt_lanes.LrtLanes` (S2-S6: the multipliers, their sum, the rescale),
:class:`~insitu.rtl.lrt_project.LrtProjection` (the MGS passes),
:class:`~insitu.rtl.lrt_rotate.LrtRotation` (LRT_ROTATE's M and row buffer) and
:class:`~insitu.rtl.lrt_update.LrtWeightUpdate` (LRT_UPDATE's operands, write-if-changed, the
write counters and their clear). :class:`PELRT` keeps the memories and their ports, the S1
operand muxes, the valid bits and delay lines of the pipeline, and connects the parts.
"""

from __future__ import annotations

from types import SimpleNamespace

from amaranth.hdl import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from insitu.numerics import (
    LRT_BASIS,
    LRT_NORM2_BITS,
    LRT_PE_WORD_BITS,
    LRT_RECIP_BITS,
    LRT_WEIGHT,
    LRT_WRITE_COUNT_BITS,
    LRT_WRITES_TOTAL_BITS,
    accumulator_bits,
    product_bits,
)

from insitu.accel.params import DEFAULT_PARAMS, SIZE_BITS, STREAM_WORDS, AcceleratorParams
from .pe_interface import BEATS_BITS, ERROR_BITS, SHIFT_BITS, PE, settled
from insitu.accel.regmap import ErrorCode, Op, register
from .lrt_control import LrtControl
from .lrt_lanes import LrtLanes
from .lrt_project import LrtProjection
from .lrt_readout import LrtReadout
from .lrt_rotate import LrtRotation
from .lrt_update import LrtWeightUpdate
from .requantize import RoundShiftSaturate
from .skid import InputSkid

__all__ = ["PELRT"]

def _or_all(pairs):
    """The OR of the values whose (one-hot) select is high: a flat AND-OR, not a priority chain."""
    out = Mux(pairs[0][0], pairs[0][1], 0)
    for sel, val in pairs[1:]:
        out = out | Mux(sel, val, 0)
    return out


def _ceil8(v):
    return (v + (STREAM_WORDS - 1)) >> 3


def _is_op(op, *ops):
    """``op`` is one of ``ops``."""
    return Cat(*(op == o for o in ops)).any()


class LrtConfig(wiring.Component):
    """The LRT PE's configuration results: ``cfg_error``, ``in_beats`` and ``out_beats``,
    registered two cycles after the configuration (``cfg_ready``), and what the PE's control
    uses: the sizes (the side's ``rows``, ``q r``, ``m n`` registered) and the op decodes and
    bounds, registered.

    Separate from the PE's datapath and control: it reads only the held configuration, and the
    ops' checks and stream lengths are a table of their own (see the module docstring).
    """

    #: The PE's configuration ports this reads (same names here).
    INPUTS = ("op", "cols", "side", "rows_l", "rows_r", "shift")

    def __init__(self, params: AcceleratorParams):
        self.params = params
        L = params.lrt_cols_max
        super().__init__({
            "op": In(8),
            "cols": In(register("LRT_COLS").width),
            "side": In(register("LRT_SIDE").width),
            "rows_l": In(SIZE_BITS),
            "rows_r": In(SIZE_BITS),
            "shift": In(signed(SHIFT_BITS)),
            "cfg_error": Out(ERROR_BITS),
            "cfg_ready": Out(1),
            "in_beats": Out(BEATS_BITS),
            "out_beats": Out(BEATS_BITS),
            "rows": Out(SIZE_BITS),
            "qr": Out(range(L * L + 1)),
            "cells": Out(2 * SIZE_BITS),
            # The op decodes and the bounds the control compares against, registered.
            "m_pass": Out(1), "m_rot": Out(1), "m_app": Out(1), "m_upd": Out(1),
            "rd_basis": Out(1), "rd_wts": Out(1), "ld_basis": Out(1),
            "takes_in": Out(1),                  # the op's IN state has beats to take
            "rows_m1": Out(signed(SIZE_BITS + 1)),
            "rows_l_m1": Out(signed(SIZE_BITS + 1)),
            "rows_r_m1": Out(signed(SIZE_BITS + 1)),
            "r_m1": Out(signed(register("LRT_COLS").width + 1)),
            "rot_b": Out(L),                     # ROTATE's lanes k < q
            "app_en": Out(L),                    # APPEND's lane r
            "rot_en": Out(L),                    # ROTATE's lanes below r
        })

    def elaborate(self, platform):
        m = Module()
        P = self.params
        L = P.lrt_cols_max
        rows_max, cells_max = P.lrt_rows_max, P.lrt_cells_max
        op, r, rows = self.op, self.cols, self.rows
        q = Signal(range(256 + 1))
        cells = Signal(2 * SIZE_BITS)
        # q r on r's low 3 bits: an op runs only with r < 8 (LRT_SIZE otherwise), and a 9 x 8
        # multiply would be a long path from the register file.
        qr3 = self.qr
        m.d.comb += qr3.eq((r[:3] + 1) * r[:3])
        m.d.comb += [q.eq(r + 1), rows.eq(Mux(self.side, self.rows_r, self.rows_l)),
                     cells.eq(self.rows_l * self.rows_r)]
        cells_r = self.cells
        m.d.sync += cells_r.eq(cells)

        lrt = (op >= Op.LRT_LOAD_BASIS) & (op <= Op.LRT_READ_COUNTS)
        basis_op = _is_op(op, Op.LRT_LOAD_BASIS, Op.LRT_READ_BASIS, Op.LRT_PROJECT,
                          Op.LRT_REPROJECT, Op.LRT_APPEND, Op.LRT_ROTATE)
        cols_op = _is_op(op, Op.LRT_PROJECT, Op.LRT_REPROJECT, Op.LRT_APPEND, Op.LRT_ROTATE,
                         Op.LRT_UPDATE)
        shift_op = _is_op(op, Op.LRT_APPEND, Op.LRT_UPDATE)
        zero = Mux(basis_op, rows == 0, (self.rows_l == 0) | (self.rows_r == 0))
        too_big = (Mux(basis_op, rows > rows_max,
                       (self.rows_l > rows_max) | (self.rows_r > rows_max) | (cells_r > cells_max))
                   | (cols_op & (r >= L)))
        bad_shift = shift_op & ((self.shift < P.shift_min) | (self.shift > P.shift_max))
        # cfg_error, in_beats and out_beats are registered, two cycles after the configuration
        # (cfg_ready says when): m n is a DSP multiply, registered first (cells_r).
        m.d.comb += self.cfg_ready.eq(settled(
            m, [op, r, self.side, self.rows_l, self.rows_r, self.shift], 2))
        with m.If(~lrt):
            m.d.sync += self.cfg_error.eq(ErrorCode.BAD_OP)
        with m.Elif(zero):
            m.d.sync += self.cfg_error.eq(ErrorCode.ZERO_SIZE)
        with m.Elif(too_big):
            m.d.sync += self.cfg_error.eq(ErrorCode.LRT_SIZE)
        with m.Elif(bad_shift):
            m.d.sync += self.cfg_error.eq(ErrorCode.SHIFT)
        with m.Else():
            m.d.sync += self.cfg_error.eq(ErrorCode.NONE)

        in_beats, out_beats = Signal(BEATS_BITS), Signal(BEATS_BITS)
        m.d.sync += [self.in_beats.eq(in_beats), self.out_beats.eq(out_beats),
                     self.takes_in.eq(_is_op(op, Op.LRT_LOAD_BASIS, Op.LRT_PROJECT, Op.LRT_UPDATE,
                                             Op.LRT_LOAD_WEIGHTS) & (in_beats != 0))]
        with m.Switch(op):
            with m.Case(Op.LRT_LOAD_BASIS):
                m.d.comb += in_beats.eq(rows)                            # L words = one beat a row
            with m.Case(Op.LRT_READ_BASIS):
                m.d.comb += out_beats.eq(rows)
            with m.Case(Op.LRT_PROJECT):
                m.d.comb += [in_beats.eq(_ceil8(rows)), out_beats.eq(_ceil8(r))]
            with m.Case(Op.LRT_REPROJECT):
                m.d.comb += out_beats.eq(_ceil8(r))
            with m.Case(Op.LRT_ROTATE):
                m.d.comb += in_beats.eq(_ceil8(qr3))
            with m.Case(Op.LRT_UPDATE):
                m.d.comb += in_beats.eq(_ceil8(r))
            with m.Case(Op.LRT_LOAD_WEIGHTS):
                m.d.comb += in_beats.eq(_ceil8(cells_r))
            with m.Case(Op.LRT_READ_WEIGHTS, Op.LRT_READ_COUNTS):
                m.d.comb += out_beats.eq(_ceil8(cells_r))

        # The op decodes and the bounds, registered like cfg_error (the configuration is frozen
        # while an op runs and cfg_ready waits for them): the register file's outputs would
        # otherwise start long paths into the PE's write enables.
        m.d.sync += [self.ld_basis.eq(op == Op.LRT_LOAD_BASIS), self.app_en.eq(1 << r[:3]),
                     self.rot_en.eq((1 << r[:4]) - 1),
                     self.rot_b.eq(Cat(*((op == Op.LRT_ROTATE) & (k < q) for k in range(L))))]
        m.d.sync += [self.m_pass.eq(_is_op(op, Op.LRT_PROJECT, Op.LRT_REPROJECT)),
                     self.m_rot.eq(op == Op.LRT_ROTATE), self.m_app.eq(op == Op.LRT_APPEND),
                     self.m_upd.eq(op == Op.LRT_UPDATE), self.rd_basis.eq(op == Op.LRT_READ_BASIS),
                     self.rd_wts.eq(op == Op.LRT_READ_WEIGHTS),
                     self.rows_m1.eq(rows - 1), self.rows_l_m1.eq(self.rows_l - 1),
                     self.rows_r_m1.eq(self.rows_r - 1), self.r_m1.eq(r - 1)]
        return m


class PELRT(PE):
    """The LRT PE (see the module docstring). ``params.lrt_cols_max`` must be 8: one basis row is
    one stream beat and one memory word."""

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS):
        if params.lrt_cols_max != STREAM_WORDS:
            raise ValueError(f"PELRT: lrt_cols_max must be {STREAM_WORDS} (one basis row per stream "
                             f"beat), got {params.lrt_cols_max}")
        self.params = params
        super().__init__({
            "side": In(register("LRT_SIDE").width),
            "rows_l": In(SIZE_BITS),
            "rows_r": In(SIZE_BITS),
            "cols": In(register("LRT_COLS").width),
            "recip": In(LRT_RECIP_BITS),
            "norm2": Out(LRT_NORM2_BITS),
            "writes_max": Out(LRT_WRITES_TOTAL_BITS),
            "writes_total": Out(LRT_WRITES_TOTAL_BITS),
        })
        # The memories (attributes, so that a testbench can preload them).
        L = params.lrt_cols_max
        row_layout = data.ArrayLayout(signed(LRT_PE_WORD_BITS), L)
        cell_depth = -(-params.lrt_cells_max // L)
        self._q_l_mem = Memory(shape=row_layout, depth=params.lrt_rows_max, init=[])
        self._q_r_mem = Memory(shape=row_layout, depth=params.lrt_rows_max, init=[])
        self._res_mem = Memory(shape=row_layout, depth=-(-params.lrt_rows_max // L), init=[])
        self._wts_mem = Memory(shape=data.ArrayLayout(signed(LRT_WEIGHT.bits), L), depth=cell_depth,
                               init=[])
        self._cnt_mem = Memory(shape=data.ArrayLayout(unsigned(LRT_WRITE_COUNT_BITS), L),
                               depth=cell_depth, init=[])

    def elaborate(self, platform):
        m = Module()
        P = self.params
        L = P.lrt_cols_max                       # lanes = basis columns = words per beat
        WB = LRT_PE_WORD_BITS
        cells_max, cell_depth = P.lrt_cells_max, self._cnt_mem.depth
        u_bits = product_bits(WB, WB)            # u_k = Q_L[i, k] s_k, exact

        m.submodules.config = config = LrtConfig(P)
        m.d.comb += [getattr(config, name).eq(getattr(self, name)) for name in LrtConfig.INPUTS]
        m.d.comb += [self.cfg_error.eq(config.cfg_error), self.cfg_ready.eq(config.cfg_ready),
                     self.in_beats.eq(config.in_beats), self.out_beats.eq(config.out_beats)]
        mem = self._memories(m)

        # The input stream through the skid buffer (the top sees TREADY from registers); the
        # ops consume `sin` as they would the stream.
        m.submodules.skid = skid = InputSkid(L * WB)
        wiring.connect(m, wiring.flipped(self.s), skid.i)
        sin = skid.o
        pay = data.View(mem.row_layout, sin.payload)

        # The op control, the output side, and the ops' own state: the MGS passes, LRT_ROTATE's
        # M and row buffer, the weight update and counters.
        m.submodules.control = ctl = LrtControl(L, cells_max, max(P.lrt_rows_max, cell_depth) + 1,
                                                len(self.cols))
        m.submodules.readout = out = LrtReadout(mem.row_layout, self._wts_mem.shape,
                                                self._cnt_mem.shape, cells_max)
        wiring.connect(m, out.m, wiring.flipped(self.m))
        m.submodules.projection = mgs = LrtProjection(L, accumulator_bits(WB, WB, P.lrt_rows_max),
                                                      len(self.cols))
        m.submodules.rotation = rot = LrtRotation(L, len(self.cols))
        m.submodules.update = upd = LrtWeightUpdate(
            L, u_bits, u_bits + LRT_RECIP_BITS + 1, len(ctl.cell), cell_depth, WB + 2)
        m.d.comb += [self.norm2.eq(mgs.norm2), self.writes_max.eq(upd.writes_max),
                     self.writes_total.eq(upd.writes_total), self.busy.eq(ctl.busy)]

        pipe = self._pipeline(m, config, mem, ctl, mgs, rot, upd)

        in_beat = ctl.in_run & sin.valid
        op_start = ctl.op_start
        m.d.comb += [
            ctl.start.eq(self.start), ctl.op.eq(self.op), ctl.in_beats.eq(self.in_beats),
            ctl.takes_in.eq(config.takes_in),
            ctl.out_beats.eq(self.out_beats), ctl.rows.eq(config.rows), ctl.cells.eq(config.cells),
            ctl.cols.eq(self.cols), ctl.rows_m1.eq(config.rows_m1),
            ctl.rows_l_m1.eq(config.rows_l_m1), ctl.rows_r_m1.eq(config.rows_r_m1),
            ctl.r_m1.eq(config.r_m1), ctl.in_valid.eq(sin.valid), ctl.rot_loaded.eq(rot.loaded),
            ctl.mgs_last.eq(mgs.last), ctl.pipe_empty.eq(~pipe.in_flight),
            ctl.drained.eq(~(pipe.in_flight | out.pending | upd.clearing)),
            ctl.read_room.eq(out.room),
            sin.ready.eq(ctl.in_run | (ctl.rot_in & ~rot.loaded & rot.s_ready)),
            skid.start.eq(op_start), skid.beats.eq(self.in_beats),
            out.start.eq(op_start), out.cells.eq(config.cells), out.rd_basis.eq(config.rd_basis),
            out.rd_wts.eq(config.rd_wts), out.issue.eq(ctl.read_issue), out.qrow.eq(mem.qrow),
            out.w_data.eq(mem.w_rd.data), out.c_data.eq(mem.c_rd.data), out.c_out.eq(ctl.c_out),
            out.c_beat.eq(mgs.c_beat),
            mgs.start.eq(op_start), mgs.pass_done.eq(ctl.pass_end),
            rot.start.eq(op_start), rot.qr.eq(config.qr), rot.loading.eq(ctl.rot_in),
            rot.s_valid.eq(sin.valid), rot.payload.eq(pay),
            upd.start.eq(op_start), upd.clear_start.eq(op_start & (self.op == Op.LRT_LOAD_WEIGHTS)),
            upd.r.eq(self.cols), upd.s_load.eq(in_beat & (self.op == Op.LRT_UPDATE)),
            upd.payload.eq(pay),
        ]
        self._memory_ports(m, config, mem, ctl, rot, upd, pipe, pay, in_beat)
        return m

    def _memories(self, m) -> SimpleNamespace:
        """The memories' ports, one write view of the selected basis (``qw_*``) and one read view
        (``qrow``)."""
        L = self.params.lrt_cols_max
        mems = (self._q_l_mem, self._q_r_mem, self._res_mem, self._wts_mem, self._cnt_mem)
        for name, mem in zip(("q_l", "q_r", "res", "wts", "cnt"), mems):
            m.submodules[name] = mem
        row_layout = self._q_l_mem.shape
        ql_rd, qr_rd, res_rd, w_rd, c_rd = (mem.read_port() for mem in mems)
        ql_wr, qr_wr, res_wr, w_wr, c_wr = (mem.write_port(granularity=1)       # per-lane enables
                                            for mem in mems)
        qw_addr = Signal(range(self.params.lrt_rows_max))
        qw_data = Signal(row_layout)
        qw_en = Signal(L)
        qrow = Signal(row_layout)
        m.d.comb += [
            ql_wr.addr.eq(qw_addr), qr_wr.addr.eq(qw_addr),
            ql_wr.data.eq(qw_data), qr_wr.data.eq(qw_data),
            ql_wr.en.eq(Mux(self.side, 0, qw_en)), qr_wr.en.eq(Mux(self.side, qw_en, 0)),
            qrow.eq(Mux(self.side, qr_rd.data.as_value(), ql_rd.data.as_value())),
        ]
        return SimpleNamespace(row_layout=row_layout, ql_rd=ql_rd, qr_rd=qr_rd, res_rd=res_rd,
                               w_rd=w_rd, c_rd=c_rd, res_wr=res_wr, w_wr=w_wr, c_wr=c_wr,
                               qw_addr=qw_addr, qw_data=qw_data, qw_en=qw_en, qrow=qrow)

    def _pipeline(self, m, config, mem, ctl, mgs, rot, upd) -> SimpleNamespace:
        """The compute pipeline, nine stages after the issue: S1 memory data and the operand
        muxes, S2 the multiplies (operand and product registers, DSP friendly), S3 the sum of a
        lane's two partial products, S4 the adder tree with the rounding term, S5 the shift, S6
        its saturation, S7 the differences and their saturation, S8 the write back
        (write-if-changed) and the MGS product, S9 (MGS passes) the accumulation. Datapath
        registers have no reset (the reset valid bits qualify them); control (valid bits, flags,
        counters, bounds) is reset or registered from the registers."""
        P = self.params
        L = P.lrt_cols_max
        word = signed(LRT_PE_WORD_BITS)
        wbits = LRT_WEIGHT.bits
        WR, ACC = 8, 9                            # the write-back and accumulate stages
        v = [ctl.issue] + [Signal(name=f"v{k}") for k in range(1, ACC + 1)]
        m.d.sync += [v[k].eq(v[k - 1]) for k in range(1, ACC + 1)]

        def delay(first, stages, shape, name):
            """``first`` (the signal of stage ``stages[0]``) and its copies down to ``stages[-1]``."""
            sigs = {stages[0]: first}
            for k in stages[1:]:
                sigs[k] = Signal(shape, name=f"{name}{k}", reset_less=True)
                m.d.sync += sigs[k].eq(sigs[k - 1])
            return sigs

        i1, j1, cell1 = ctl.i1, ctl.j1, ctl.cell1
        x2 = Signal(word, reset_less=True)
        qc2 = Signal(word, reset_less=True)
        w2 = Signal(signed(wbits), reset_less=True)
        n2 = Signal(LRT_WRITE_COUNT_BITS, reset_less=True)
        i_ = delay(i1, range(1, WR + 1), SIZE_BITS, "i")
        j_ = delay(j1, range(1, WR + 1), range(L), "j")
        cell_ = delay(cell1, range(1, WR + 1), len(cell1), "cell")
        x_ = delay(x2, range(2, WR + 1), word, "x")
        qc_ = delay(qc2, range(2, WR + 1), word, "qc")
        w_ = delay(w2, range(2, WR + 1), signed(wbits), "w")
        n_ = delay(n2, range(2, WR + 1), LRT_WRITE_COUNT_BITS, "n")

        # S1: memory data arrive; the operand muxes, into the lanes' operand registers.
        # a: a word or u_k (32 bits); b: a word or the unsigned LRT_RECIP (17 bits signed).
        # S2-S6: the lanes' products, their sum and its rescale by 14 or SHIFT into y.
        m.submodules.lanes = lanes = LrtLanes(P, L, product_bits(LRT_PE_WORD_BITS, LRT_PE_WORD_BITS))
        prod, qrow, p = lanes.products, mem.qrow, mgs.p
        resword = mem.res_rd.data[i1[:3]]
        row_step = Signal()                      # S1 of an LRT_UPDATE row step (u_k = Q_L s_k)
        m.d.sync += row_step.eq(ctl.urow)
        # AND-OR selects (the op flags are static during an op), not an If/Elif priority chain.
        m_pass, m_rot, m_app, m_upd = config.m_pass, config.m_rot, config.m_app, config.m_upd
        sel_ql, sel_prod, sel_u, sel_qr = Signal(), Signal(), Signal(), Signal()
        m.d.comb += [sel_ql.eq(m_upd & row_step), sel_prod.eq(m_upd & ~row_step & upd.u_fwd),
                     sel_u.eq(m_upd & ~row_step & ~upd.u_fwd), sel_qr.eq(m_upd & ~row_step)]
        for k in range(L):
            a_terms = [(m_rot, qrow[k]), (sel_ql, mem.ql_rd.data[k]), (sel_prod, prod[k]),
                       (sel_u, upd.u[k])]
            b_terms = [(config.rot_b[k], rot.m_col[k]), (sel_ql, upd.s[k]),
                       (sel_qr, mem.qr_rd.data[k])]
            if k == 0:
                a_terms += [(m_pass, mgs.c_prev), (m_app, resword)]
                b_terms += [(m_pass, qrow[(p - 1)[:3]]), (m_app, self.recip)]
            m.d.comb += [lanes.a[k].eq(_or_all(a_terms)),
                         lanes.b[k].eq(_or_all(b_terms))]
        m.d.sync += [x2.eq(resword), qc2.eq(qrow[p[:3]]),
                     w2.eq(mem.w_rd.data[cell1[:3]]), n2.eq(mem.c_rd.data[cell1[:3]])]
        m.d.comb += [upd.row_step.eq(row_step), rot.j_operand.eq(j1), upd.products.eq(prod)]
        m.d.comb += lanes.shift.eq(Mux(_is_op(self.op, Op.LRT_PROJECT, Op.LRT_REPROJECT,
                                              Op.LRT_ROTATE), LRT_BASIS.frac, self.shift))
        # y keeps 18 bits (|c Q| <= 2**30 in the MGS step); for the other ops saturating to 18
        # and then to 16 (or W - y to 8, see numerics.LRT_PE_DELTA_BITS) is saturating once.
        y = lanes.y

        # S7: the differences and their saturation (the weight update saturates W - y itself),
        # and what the write back decides on (in the op parts): the counter's next value and
        # ROTATE's output lane (one-hot) and last output of the row.
        m.submodules.sat_word = sat_word = RoundShiftSaturate(LRT_PE_WORD_BITS + 3, LRT_PE_WORD_BITS, 0)
        m.d.comb += [sat_word.data_in.eq(Mux(m_pass, x_[WR - 1] - y, y)), sat_word.shift.eq(0)]
        new_word = Signal(word)
        m.d.sync += new_word.eq(sat_word.data_out)
        m.d.comb += [upd.y.eq(y), upd.w_diff.eq(w_[WR - 1]), upd.n_diff.eq(n_[WR - 1]),
                     rot.j_wb.eq(j_[WR - 1]), rot.r_m1.eq(config.r_m1)]
        # S8: the write back; S8 (MGS) also multiplies x'_i by Q[i, p], S9 accumulates.
        m.d.comb += [
            mgs.r.eq(self.cols), mgs.wb_valid.eq(v[WR] & m_pass), mgs.new_word.eq(new_word),
            mgs.q_col.eq(qc_[WR]), mgs.acc_valid.eq(v[ACC] & m_pass),
            rot.wb_valid.eq(v[WR] & m_rot), rot.new_word.eq(new_word),
            upd.wb_valid.eq(v[WR] & m_upd), upd.w_wb.eq(w_[WR]), upd.cell_wb.eq(cell_[WR]),
        ]
        return SimpleNamespace(in_flight=Cat(*v[1:]).any(), wb_valid=v[WR], new_word=new_word,
                               i_wb=i_[WR], cell_wb=cell_[WR])

    def _memory_ports(self, m, config, mem, ctl, rot, upd, pipe, pay, in_beat):
        """Addresses, data and write enables of the memories: from the op flags and the flag
        registers (``in_run``), not the state machine's decode."""
        L = self.params.lrt_cols_max
        in_run, beat = ctl.in_run, ctl.beat
        res_wr, w_wr, c_wr = mem.res_wr, mem.w_wr, mem.c_wr
        # Input lanes still to come (write enables: lane k while k < in_left).
        in_lanes = Cat(*(ctl.in_left > k for k in range(L)))
        sat_in = []                              # stream words saturated to weight codes
        for k in range(L):
            s8 = RoundShiftSaturate(LRT_PE_WORD_BITS, LRT_WEIGHT.bits, 0)
            m.submodules[f"sat_in{k}"] = s8
            m.d.comb += [s8.data_in.eq(pay[k]), s8.shift.eq(0)]
            sat_in.append(s8.data_out)
        m.d.comb += w_wr.en.eq(upd.w_write)
        with m.If(pipe.wb_valid & config.m_pass):
            m.d.comb += res_wr.en.eq(1 << pipe.i_wb[:3])
        with m.If(in_beat):
            with m.Switch(self.op):
                with m.Case(Op.LRT_PROJECT):
                    m.d.comb += res_wr.en.eq(in_lanes)
                with m.Case(Op.LRT_LOAD_WEIGHTS):
                    m.d.comb += w_wr.en.eq(in_lanes)
        # The basis write data without a priority chain: the stream (LOAD_BASIS) or the write
        # back (the enables pick the lanes).
        m.d.comb += [mem.qw_data[k].eq(Mux(config.ld_basis, pay[k],
                                           Mux(config.m_rot & ~rot.jsel[k], rot.rot_row[k],
                                               pipe.new_word)))
                     for k in range(L)]
        q_addr = Mux(config.rd_basis, beat, ctl.i)
        m.d.comb += [
            mem.qw_addr.eq(Mux(config.ld_basis, beat, pipe.i_wb)),
            mem.qw_en.eq(Mux(in_beat & config.ld_basis, (1 << L) - 1, 0)
                         | Mux(pipe.wb_valid & config.m_app, config.app_en, 0)
                         | Mux(pipe.wb_valid & config.m_rot & rot.jlast, config.rot_en, 0)),
            mem.ql_rd.addr.eq(q_addr), mem.qr_rd.addr.eq(Mux(config.m_upd, ctl.j, q_addr)),
            mem.res_rd.addr.eq(ctl.i >> 3),
            mem.w_rd.addr.eq(Mux(config.m_upd, ctl.cell >> 3, beat)),
            mem.c_rd.addr.eq(Mux(config.m_upd, ctl.cell >> 3, beat)),
            res_wr.addr.eq(Mux(in_run, beat, pipe.i_wb >> 3)),
            w_wr.addr.eq(Mux(in_run, beat, pipe.cell_wb >> 3)),
            c_wr.addr.eq(upd.cnt_addr), c_wr.en.eq(upd.cnt_en),
        ]
        m.d.comb += [res_wr.data[k].eq(Mux(in_run, pay[k], pipe.new_word)) for k in range(L)]
        m.d.comb += [w_wr.data[k].eq(Mux(in_run, sat_in[k], upd.new_w)) for k in range(L)]
        m.d.comb += [c_wr.data[k].eq(upd.cnt_data) for k in range(L)]

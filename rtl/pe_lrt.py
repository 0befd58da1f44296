"""The LRT processing element: the per-sample vector work of low-rank training and the weight update.

Bit-exact to its golden model, :mod:`insitu.lrt.pe_ops` (op semantics, stream layouts, errors).
The PE keeps in on-chip memories (``amaranth.lib.memory.Memory``):

* ``Q_L``, ``Q_R``: ``lrt_rows_max`` rows of ``lrt_cols_max`` (= 8) Q1.14 words, one row per
  128-bit memory word, written per 16-bit lane;
* the residual of the last projection: ``lrt_rows_max`` 16-bit words, 8 per memory word;
* the weights (``lrt_cells_max`` 8-bit codes, 8 per memory word, written per cell) and the write
  counters (16 bits, 8 per memory word, written per cell).

Datapath: 8 multiplier lanes (32 x 17 bits, shared by all ops) feed an adder tree, then one
:class:`~insitu.rtl.requantize.RoundShiftSaturate` (shift 14 or SHIFT) and the saturations; a
separate 16 x 16 multiply-accumulator forms the MGS dot products and the squared norm. Every op
that computes is a pipeline of one element per cycle, registered for a 100 MHz clock: issue and
memory read, operand muxes, multiply, sum, rounding shift, saturation, differences and their
saturation, write back (the MGS passes add the accumulate stage):

* LRT_PROJECT / LRT_REPROJECT: ``r + 1`` passes over the rows, one row per cycle; pass ``p``
  subtracts ``c_{p-1} Q[:, p-1]`` from the residual and accumulates ``Q[:, p] . residual`` (the
  last pass: the squared norm). The passes are sequential (MGS: c_p needs the updated residual),
  so the pipeline drains between passes.
* LRT_ROTATE: M (at most 56 words) is deserialized into registers, one word per cycle; then one
  output ``Q[i, j]`` per cycle (a q-term dot product across the lanes). The new row collects in a
  row buffer and is written back once its r outputs are done, so every output reads the old row.
* LRT_UPDATE: per row i a two-cycle step loads ``u_k = Q_L[i, k] s_k`` (exact 32-bit products),
  then one cell per cycle: ``sum_k u_k Q_R[j, k]`` across the lanes (exact), the rounding shift, the
  saturated new code, a write (and counter increment) only when the code changes.
* LRT_APPEND: one row per cycle, ``residual_i * LRT_RECIP`` rescaled by SHIFT into column r.

Cycle counts (cycles with ``busy`` high, what the CYCLES register counts) when the streams never
stall; ``rows`` of the side, ``q = r + 1``, ``B(x) = ceil(x / 8)`` beats (checked by the RTL tests):

==================  ================================================
op                  cycles
==================  ================================================
LRT_LOAD_BASIS      rows + 2
LRT_READ_BASIS      rows + 3
LRT_PROJECT         B(rows) + (r + 1)(rows + 9) + 4 when r > 0, + 2 when r = 0
LRT_REPROJECT       (r + 1)(rows + 9) + 3 when r > 0, + 1 when r = 0
LRT_APPEND          rows + 9
LRT_ROTATE          B(q r) + q r + rows r + 10 (r > 0; 2 for r = 0)
LRT_UPDATE          B(r) + m (n + 2) + 10
LRT_LOAD_WEIGHTS    max(B(m n) + 2, lrt_cells_max / 8 + 1)
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
decodes), :class:`~insitu.rtl.lrt_lanes.LrtLanes` (S2-S6: the multipliers, their sum, the
rescale), :class:`~insitu.rtl.lrt_project.LrtProjection` (the MGS passes),
:class:`~insitu.rtl.lrt_rotate.LrtRotation` (LRT_ROTATE's M and row buffer) and
:class:`~insitu.rtl.lrt_update.LrtWeightUpdate` (LRT_UPDATE's operands, write-if-changed, the
write counters and their clear). :class:`PELRT` keeps the memories, the control FSM, the S1
operand muxes, the valid bits and delay lines of the pipeline, the output reads and FIFO.
"""

from __future__ import annotations


from amaranth.hdl import Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.fifo import SyncFIFO
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
from .lrt_lanes import LrtLanes
from .lrt_project import LrtProjection
from .lrt_rotate import LrtRotation
from .lrt_update import LrtWeightUpdate
from .requantize import RoundShiftSaturate
from .skid import InputSkid

__all__ = ["PELRT"]

_OUT_FIFO_DEPTH = 4


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
        m.d.sync += [self.in_beats.eq(in_beats), self.out_beats.eq(out_beats)]
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
        word = signed(WB)
        wbits = LRT_WEIGHT.bits
        rows_max, cells_max = P.lrt_rows_max, P.lrt_cells_max
        cell_depth = self._cnt_mem.depth
        # Exact widths: the MGS accumulator (rows_max products of words), the 32-bit u_k.
        acc_bits = accumulator_bits(WB, WB, rows_max)
        u_bits = product_bits(WB, WB)
        frac = LRT_BASIS.frac

        # ------------------------------------------------------------------ configuration
        op, r = self.op, self.cols
        m.submodules.config = config = LrtConfig(P)
        m.d.comb += [getattr(config, name).eq(getattr(self, name)) for name in LrtConfig.INPUTS]
        m.d.comb += [self.cfg_error.eq(config.cfg_error), self.cfg_ready.eq(config.cfg_ready),
                     self.in_beats.eq(config.in_beats), self.out_beats.eq(config.out_beats)]
        rows, qr3, cells_r = config.rows, config.qr, config.cells

        # The op decodes and bounds, registered (in the configuration part).
        m_pass, m_rot, m_app, m_upd = config.m_pass, config.m_rot, config.m_app, config.m_upd
        rd_basis, rd_wts, ld_basis = config.rd_basis, config.rd_wts, config.ld_basis
        rows_m1, rows_l_m1, rows_r_m1, r_m1 = (config.rows_m1, config.rows_l_m1, config.rows_r_m1,
                                               config.r_m1)
        rot_b, app_en, rot_en = config.rot_b, config.app_en, config.rot_en

        # ------------------------------------------------------------------ memories
        row_layout = self._q_l_mem.shape
        q_l, q_r, res, wts, cnt = (self._q_l_mem, self._q_r_mem, self._res_mem, self._wts_mem,
                                   self._cnt_mem)
        m.submodules.q_l, m.submodules.q_r, m.submodules.res = q_l, q_r, res
        m.submodules.wts, m.submodules.cnt = wts, cnt
        ql_rd, qr_rd, res_rd, w_rd, c_rd = (mem.read_port() for mem in (q_l, q_r, res, wts, cnt))
        ql_wr, qr_wr, res_wr, w_wr, c_wr = (mem.write_port(granularity=1)       # per-lane enables
                                            for mem in (q_l, q_r, res, wts, cnt))

        # One write port view of the selected basis, one read view.
        qw_addr = Signal(range(rows_max))
        qw_data = Signal(row_layout)
        qw_en = Signal(L)
        ld_accept = Signal()                     # LOAD_BASIS takes a beat
        q_addr = Signal(range(rows_max))
        qrow = Signal(row_layout)
        m.d.comb += [
            ql_wr.addr.eq(qw_addr), qr_wr.addr.eq(qw_addr),
            ql_wr.data.eq(qw_data), qr_wr.data.eq(qw_data),
            ql_wr.en.eq(Mux(self.side, 0, qw_en)), qr_wr.en.eq(Mux(self.side, qw_en, 0)),
            qrow.eq(Mux(self.side, qr_rd.data.as_value(), ql_rd.data.as_value())),
        ]

        # ------------------------------------------------------------------ input skid buffer
        # The top sees TREADY from registers; the ops consume `sin` as they would the stream.
        m.submodules.skid = skid = InputSkid(L * WB)
        wiring.connect(m, wiring.flipped(self.s), skid.i)
        sin = skid.o

        # ------------------------------------------------------------------ output FIFO
        m.submodules.out_fifo = fifo = SyncFIFO(width=L * WB, depth=_OUT_FIFO_DEPTH)
        m.d.comb += [self.m.valid.eq(fifo.r_rdy), self.m.payload.eq(fifo.r_data),
                     fifo.r_en.eq(self.m.ready)]

        # ------------------------------------------------------------------ state
        beat = Signal(range(max(rows_max, cell_depth) + 2))
        i = Signal(SIZE_BITS)                    # row (issue stage)
        j = Signal(SIZE_BITS)                    # column (ROTATE) or weight column (UPDATE)
        cell = Signal(range(cells_max + 1))      # i * n + j (UPDATE)
        # The ops' own state: the MGS passes, LRT_ROTATE's M and row buffer, the weight update
        # and counters (their data come from the lanes' write-back stages, below).
        m.submodules.projection = mgs = LrtProjection(L, acc_bits, len(r))
        m.submodules.rotation = rot = LrtRotation(L, len(r))
        m.submodules.update = upd = LrtWeightUpdate(
            L, u_bits, u_bits + LRT_RECIP_BITS + 1, len(cell), cell_depth, WB + 2)
        p, c_prev, u_fwd = mgs.p, mgs.c_prev, upd.u_fwd
        m.d.comb += [self.norm2.eq(mgs.norm2), self.writes_max.eq(upd.writes_max),
                     self.writes_total.eq(upd.writes_total)]
        # Reads in flight towards the output FIFO.
        inflight = Signal()
        # Words still to come in (write enables: lane k while k < in_left) and to read out (the
        # lanes past m n read as 0): counters, not beat * 8 + k < limit comparators.
        in_left = Signal(signed(2 * SIZE_BITS + 1))
        # beat == in_beats as a flag set with the last beat (a compare off the stream handshake).
        in_done = Signal()
        in_run = Signal()                        # in IN with beats to come: ~in_done there
        beat1 = Signal.like(self.in_beats)       # beat + 1, kept as a register
        rd_left = Signal(signed(2 * SIZE_BITS + 1))
        rd_left1 = Signal(signed(2 * SIZE_BITS + 1))

        # ------------------------------------------------------------------ the pipeline
        # Nine stages after the issue: S1 memory data and the operand muxes, S2 the multiplies
        # (operand and product registers, DSP friendly), S3 the sum of a lane's two partial
        # products, S4 the adder tree with the rounding term, S5 the shift, S6 its saturation, S7
        # the differences and their saturation, S8 the write back (write-if-changed) and the MGS
        # product, S9 (MGS passes)
        # the accumulation. Datapath registers have no reset (the reset valid bits qualify them);
        # control (valid bits, flags, counters, bounds) is reset or registered from the registers.
        WR, ACC = 8, 9                            # the write-back and accumulate stages
        issue = Signal()                          # S0: an element enters this cycle
        v = [issue] + [Signal(name=f"v{k}") for k in range(1, ACC + 1)]
        m.d.sync += [v[k].eq(v[k - 1]) for k in range(1, ACC + 1)]

        def delay(first, stages, shape, name):
            """``first`` (the signal of stage ``stages[0]``) and its copies down to ``stages[-1]``."""
            sigs = {stages[0]: first}
            for k in stages[1:]:
                sigs[k] = Signal(shape, name=f"{name}{k}", reset_less=True)
                m.d.sync += sigs[k].eq(sigs[k - 1])
            return sigs

        i1 = Signal(SIZE_BITS, reset_less=True)
        j1 = Signal(range(L), reset_less=True)
        cell1 = Signal(range(cells_max + 1), reset_less=True)
        x2 = Signal(word, reset_less=True)
        qc2 = Signal(word, reset_less=True)
        w2 = Signal(signed(wbits), reset_less=True)
        n2 = Signal(LRT_WRITE_COUNT_BITS, reset_less=True)
        i_ = delay(i1, range(1, WR + 1), SIZE_BITS, "i")
        j_ = delay(j1, range(1, WR + 1), range(L), "j")
        cell_ = delay(cell1, range(1, WR + 1), range(cells_max + 1), "cell")
        x_ = delay(x2, range(2, WR + 1), word, "x")
        qc_ = delay(qc2, range(2, WR + 1), word, "qc")
        w_ = delay(w2, range(2, WR + 1), signed(wbits), "w")
        n_ = delay(n2, range(2, WR + 1), LRT_WRITE_COUNT_BITS, "n")

        # S1: memory data arrive; the operand muxes, into the lanes' operand registers.
        # a: a word or u_k (32 bits); b: a word or the unsigned LRT_RECIP (17 bits signed).
        # S2-S6: the lanes' products, their sum and its rescale by 14 or SHIFT into y.
        m.submodules.lanes = lanes = LrtLanes(P, L, u_bits)
        prod = lanes.products
        resword = res_rd.data[i1[:3]]
        row_step = Signal()                      # S1 of an LRT_UPDATE row step (u_k = Q_L s_k)
        # AND-OR selects (the op flags are static during an op), not an If/Elif priority chain.
        sel_ql = Signal()
        sel_prod = Signal()
        sel_u = Signal()
        sel_qr = Signal()
        m.d.comb += [sel_ql.eq(m_upd & row_step), sel_prod.eq(m_upd & ~row_step & u_fwd),
                     sel_u.eq(m_upd & ~row_step & ~u_fwd), sel_qr.eq(m_upd & ~row_step)]
        for k in range(L):
            a_terms = [(m_rot, qrow[k]), (sel_ql, ql_rd.data[k]), (sel_prod, prod[k]),
                       (sel_u, upd.u[k])]
            b_terms = [(rot_b[k], rot.m_col[k]), (sel_ql, upd.s[k]), (sel_qr, qr_rd.data[k])]
            if k == 0:
                a_terms += [(m_pass, c_prev), (m_app, resword)]
                b_terms += [(m_pass, qrow[(p - 1)[:3]]), (m_app, self.recip)]
            m.d.comb += [lanes.a[k].eq(_or_all(a_terms)),
                         lanes.b[k].eq(_or_all(b_terms))]
        m.d.sync += [x2.eq(resword), qc2.eq(qrow[p[:3]]),
                     w2.eq(w_rd.data[cell1[:3]]), n2.eq(c_rd.data[cell1[:3]])]
        m.d.comb += [upd.row_step.eq(row_step), rot.j_operand.eq(j1)]
        m.d.comb += upd.products.eq(prod)
        m.d.comb += lanes.shift.eq(
            Mux(_is_op(op, Op.LRT_PROJECT, Op.LRT_REPROJECT, Op.LRT_ROTATE), frac, self.shift))
        # y keeps 18 bits (|c Q| <= 2**30 in the MGS step); for the other ops saturating to 18
        # and then to 16 (or W - y to 8, see numerics.LRT_PE_DELTA_BITS) is saturating once.
        y = lanes.y

        # S7: the differences and their saturation.
        # (The weight update saturates W - y itself.)
        m.submodules.sat_word = sat_word = RoundShiftSaturate(WB + 3, WB, 0)
        m.d.comb += [
            sat_word.data_in.eq(Mux(m_pass, x_[WR - 1] - y, y)),
            sat_word.shift.eq(0),
        ]
        new_word = Signal(word)
        m.d.sync += new_word.eq(sat_word.data_out)
        # Also in S7, what the write back decides on (in the op parts): the counter's next value
        # and ROTATE's output lane (one-hot) and last output of the row.
        m.d.comb += [upd.y.eq(y), upd.w5.eq(w_[WR - 1]), upd.n5.eq(n_[WR - 1]),
                     rot.j_wb.eq(j_[WR - 1]), rot.r_m1.eq(r_m1)]
        jsel = rot.jsel
        # S8: the write back; S8 (MGS) also multiplies x'_i by Q[i, p], S9 accumulates.
        i6, cell6 = i_[WR], cell_[WR]
        with m.If(v[WR] & m_pass):
            m.d.comb += res_wr.en.eq(1 << i6[:3])
        m.d.comb += [
            mgs.r.eq(r), mgs.wb_valid.eq(v[WR] & m_pass), mgs.new_word.eq(new_word),
            mgs.q_col.eq(qc_[WR]), mgs.acc_valid.eq(v[ACC] & m_pass),
            rot.wb_valid.eq(v[WR] & m_rot), rot.new_word.eq(new_word),
            upd.wb_valid.eq(v[WR] & m_upd), upd.w6.eq(w_[WR]), upd.cell6.eq(cell6),
            w_wr.en.eq(upd.w_write),
        ]

        # ------------------------------------------------------------------ streams in
        pay = data.View(row_layout, sin.payload)
        # The basis write data without the FSM's priority chain: the stream (LOAD_BASIS) or the
        # write back (the enables pick the lanes).
        m.d.comb += [qw_data[k].eq(Mux(ld_basis, pay[k],
                                       Mux(m_rot & ~jsel[k], rot.rot_row[k], new_word)))
                     for k in range(L)]
        in_lanes = Cat(*(in_left > k for k in range(L)))
        sat_in = []
        for k in range(L):
            s8 = RoundShiftSaturate(WB, wbits, 0)
            m.submodules[f"sat_in{k}"] = s8
            m.d.comb += [s8.data_in.eq(pay[k]), s8.shift.eq(0)]
            sat_in.append(s8.data_out)

        # ------------------------------------------------------------------ output reads
        read_issue = Signal()
        m.d.sync += [inflight.eq(read_issue), rd_left1.eq(rd_left)]
        with m.If(read_issue):
            m.d.sync += rd_left.eq(rd_left - L)
        with m.If(inflight):
            m.d.comb += fifo.w_en.eq(1)
            out_row = Signal(row_layout)
            with m.If(rd_basis):
                m.d.comb += out_row.eq(qrow)
            with m.Elif(rd_wts):
                m.d.comb += [out_row[k].eq(Mux(rd_left1 > k, w_rd.data[k], 0))
                             for k in range(L)]
            with m.Else():
                m.d.comb += [out_row[k].eq(Mux(rd_left1 > k, c_rd.data[k], 0))
                             for k in range(L)]
            m.d.comb += fifo.w_data.eq(out_row)

        pipe_busy = Cat(*v[1:]).any() | inflight | (fifo.level != 0) | upd.clearing

        # ------------------------------------------------------------------ control
        # busy as a register set and cleared with the IDLE transitions (the same cycles as
        # ~ongoing("IDLE")): the top's done/error logic reads a flip-flop, not the state decode.
        busy = Signal()
        m.d.comb += self.busy.eq(busy)
        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += busy.eq(1)
                    m.d.sync += [beat.eq(0), beat1.eq(1), i.eq(0), j.eq(0), cell.eq(0),
                                 rd_left.eq(cells_r), in_done.eq(self.in_beats == 0),
                                 in_left.eq(Mux(op == Op.LRT_LOAD_WEIGHTS, cells_r, rows))]
                    with m.Switch(op):
                        with m.Case(Op.LRT_LOAD_BASIS, Op.LRT_PROJECT, Op.LRT_UPDATE,
                                    Op.LRT_LOAD_WEIGHTS):
                            m.d.sync += in_run.eq(self.in_beats != 0)
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
                with m.Elif(sin.valid):
                    m.d.sync += [beat.eq(beat + 1), beat1.eq(beat1 + 1), in_left.eq(in_left - L),
                                 in_done.eq(beat1 == self.in_beats),
                                 in_run.eq(beat1 != self.in_beats)]

            # LRT_PROJECT / LRT_REPROJECT: pass p over the rows, then drain and finish the pass.
            with m.State("PASS"):
                m.d.sync += [i1.eq(i), i.eq(i + 1)]
                with m.If(i == rows_m1):
                    m.d.sync += i.eq(0)
                    m.next = "PASS_END"
            with m.State("PASS_END"):
                with m.If(~Cat(*v[1:]).any()):
                    with m.If(mgs.last):
                        with m.If(r != 0):
                            m.next = "C_OUT"
                        with m.Else():
                            m.next = "FINISH"
                    with m.Else():
                        m.next = "PASS"
            with m.State("C_OUT"):
                m.d.comb += fifo.w_en.eq(1)
                m.d.comb += fifo.w_data.eq(mgs.c_beat)
                m.next = "FINISH"

            with m.State("APPEND"):
                m.d.sync += [i1.eq(i), i.eq(i + 1)]
                with m.If(i == rows_m1):
                    m.next = "FINISH"

            # LRT_ROTATE: M into the rotation part's registers, then one output (i, j) per cycle.
            with m.State("ROT_IN"):
                with m.If(rot.loaded):
                    with m.If(r == 0):
                        m.next = "FINISH"
                    with m.Else():
                        m.next = "ROT"
            with m.State("ROT"):
                m.d.sync += [i1.eq(i), j1.eq(j), j.eq(j + 1)]
                with m.If(j == r_m1):
                    m.d.sync += [j.eq(0), i.eq(i + 1)]
                    with m.If(i == rows_m1):
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
                with m.If(j == rows_r_m1):
                    m.d.sync += [j.eq(0), i.eq(i + 1)]
                    with m.If(i == rows_l_m1):
                        m.next = "FINISH"
                    with m.Else():
                        m.next = "UROW"

            # Reads towards the output stream, as the FIFO has room.
            with m.State("READ"):
                with m.If(read_issue):
                    m.d.sync += [beat.eq(beat + 1), beat1.eq(beat1 + 1)]
                    with m.If(beat1 == self.out_beats):
                        m.next = "FINISH"

            with m.State("FINISH"):
                with m.If(~pipe_busy):
                    m.d.sync += busy.eq(0)
                    m.next = "IDLE"

        # issue and read_issue decoded from the state outside the FSM's processes: assigned in them
        # stays X on a 4-state simulator from power-up until the state first changes (the
        # process never wakes), and that X would run down the reset valid bits v1..v8.
        m.d.comb += issue.eq(Cat(*(fsm.ongoing(st) for st in ("PASS", "APPEND", "ROT", "UCELL"))).any())
        m.d.comb += read_issue.eq(fsm.ongoing("READ") & (fifo.level + inflight < _OUT_FIFO_DEPTH))
        # Memory addresses and write data from the op flags, outside the FSM (its priority
        # chains were the long paths); the write enables stay with the states.
        # The input state's handshake and write enables from the flag in_run (IN and beats to
        # come), the op's start from busy: flip-flops, not the state decode, in front of the
        # enables' fan-out.
        rot_in = fsm.ongoing("ROT_IN")
        op_start = ~busy & self.start
        in_beat = in_run & sin.valid
        m.d.comb += sin.ready.eq(in_run | (rot_in & ~rot.loaded & rot.s_ready))
        with m.If(in_beat):
            with m.Switch(op):
                with m.Case(Op.LRT_PROJECT):
                    m.d.comb += res_wr.en.eq(in_lanes)
                with m.Case(Op.LRT_LOAD_WEIGHTS):
                    m.d.comb += w_wr.en.eq(in_lanes)
        m.d.comb += [skid.start.eq(op_start), skid.beats.eq(self.in_beats)]
        m.d.comb += [
            mgs.start.eq(op_start),
            mgs.pass_done.eq(fsm.ongoing("PASS_END") & ~Cat(*v[1:]).any()),
            rot.start.eq(op_start), rot.qr.eq(qr3), rot.loading.eq(rot_in),
            rot.s_valid.eq(sin.valid), rot.payload.eq(pay),
            upd.start.eq(op_start), upd.clear_start.eq(op_start & (op == Op.LRT_LOAD_WEIGHTS)),
            upd.r.eq(r), upd.s_load.eq(in_beat & (op == Op.LRT_UPDATE)), upd.payload.eq(pay),
        ]
        m.d.comb += ld_accept.eq(in_beat & ld_basis)
        m.d.comb += [
            qw_addr.eq(Mux(ld_basis, beat, i6)),
            qw_en.eq(Mux(ld_accept, (1 << L) - 1, 0) | Mux(v[WR] & m_app, app_en, 0)
                     | Mux(v[WR] & m_rot & rot.jlast, rot_en, 0)),
        ]
        m.d.sync += row_step.eq(fsm.ongoing("UROW"))          # UROW2 follows UROW
        m.d.comb += [
            q_addr.eq(Mux(rd_basis, beat, i)),
            ql_rd.addr.eq(q_addr), qr_rd.addr.eq(Mux(m_upd, j, q_addr)),
            res_rd.addr.eq(i >> 3),
            w_rd.addr.eq(Mux(m_upd, cell >> 3, beat)), c_rd.addr.eq(Mux(m_upd, cell >> 3, beat)),
            res_wr.addr.eq(Mux(in_run, beat, i6 >> 3)),
            w_wr.addr.eq(Mux(in_run, beat, cell6 >> 3)),
            c_wr.addr.eq(upd.cnt_addr), c_wr.en.eq(upd.cnt_en),
        ]
        m.d.comb += [res_wr.data[k].eq(Mux(in_run, pay[k], new_word)) for k in range(L)]
        m.d.comb += [w_wr.data[k].eq(Mux(in_run, sat_in[k], upd.new_w)) for k in range(L)]
        m.d.comb += [c_wr.data[k].eq(upd.cnt_data) for k in range(L)]
        return m

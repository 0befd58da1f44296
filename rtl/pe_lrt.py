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
"""

from __future__ import annotations


from amaranth.hdl import Array, Cat, Module, Mux, Signal, signed, unsigned
from amaranth.lib import data
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
from .pe_interface import PE, settled
from insitu.accel.regmap import ErrorCode, Op, register
from .requantize import RoundShiftSaturate

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
        # Exact widths: the MGS accumulator (rows_max products of words), the 32-bit u_k, the
        # lane sums (at most L products of u_k and a word).
        acc_bits = accumulator_bits(WB, WB, rows_max)
        u_bits = product_bits(WB, WB)
        sum_bits = accumulator_bits(u_bits, WB, L)
        frac = LRT_BASIS.frac

        # ------------------------------------------------------------------ configuration
        op = self.op
        r = self.cols
        q = Signal(range(256 + 1))
        rows = Signal(SIZE_BITS)
        cells = Signal(2 * SIZE_BITS)
        # q r on r's low 3 bits: an op runs only with r < 8 (LRT_SIZE otherwise), and a 9 x 8
        # multiply would be a long path from the register file.
        qr3 = Signal(range(L * L + 1))
        m.d.comb += qr3.eq((r[:3] + 1) * r[:3])
        m.d.comb += [q.eq(r + 1), rows.eq(Mux(self.side, self.rows_r, self.rows_l)),
                     cells.eq(self.rows_l * self.rows_r)]
        cells_r = Signal.like(cells)
        m.d.sync += cells_r.eq(cells)

        def is_op(*ops):
            return Cat(*(op == o for o in ops)).any()

        lrt = (op >= Op.LRT_LOAD_BASIS) & (op <= Op.LRT_READ_COUNTS)
        basis_op = is_op(Op.LRT_LOAD_BASIS, Op.LRT_READ_BASIS, Op.LRT_PROJECT, Op.LRT_REPROJECT,
                         Op.LRT_APPEND, Op.LRT_ROTATE)
        cols_op = is_op(Op.LRT_PROJECT, Op.LRT_REPROJECT, Op.LRT_APPEND, Op.LRT_ROTATE, Op.LRT_UPDATE)
        shift_op = is_op(Op.LRT_APPEND, Op.LRT_UPDATE)
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

        in_beats, out_beats = Signal.like(self.in_beats), Signal.like(self.out_beats)
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

        # The op decodes and the bounds the control compares against, registered like cfg_error
        # (the configuration is frozen while an op runs and cfg_ready waits for them): the
        # register file's outputs would otherwise start long paths into the write enables.
        m_pass, m_rot, m_app, m_upd = Signal(), Signal(), Signal(), Signal()
        rd_basis, rd_wts = Signal(), Signal()
        rows_m1 = Signal(signed(SIZE_BITS + 1))
        rows_l_m1, rows_r_m1 = Signal(signed(SIZE_BITS + 1)), Signal(signed(SIZE_BITS + 1))
        r_m1 = Signal(signed(len(r) + 1))
        ld_basis = Signal()
        rot_b = Signal(L)                        # ROTATE's lanes k < q
        app_en, rot_en = Signal(L), Signal(L)    # APPEND's lane r, ROTATE's lanes below r
        m.d.sync += [ld_basis.eq(op == Op.LRT_LOAD_BASIS), app_en.eq(1 << r[:3]),
                     rot_en.eq((1 << r[:4]) - 1),
                     rot_b.eq(Cat(*((op == Op.LRT_ROTATE) & (k < q) for k in range(L))))]
        q_reg = Signal.like(q)
        m.d.sync += [m_pass.eq(is_op(Op.LRT_PROJECT, Op.LRT_REPROJECT)), m_rot.eq(op == Op.LRT_ROTATE),
                     m_app.eq(op == Op.LRT_APPEND), m_upd.eq(op == Op.LRT_UPDATE),
                     rd_basis.eq(op == Op.LRT_READ_BASIS), rd_wts.eq(op == Op.LRT_READ_WEIGHTS),
                     rows_m1.eq(rows - 1), rows_l_m1.eq(self.rows_l - 1),
                     rows_r_m1.eq(self.rows_r - 1), r_m1.eq(r - 1), q_reg.eq(q)]

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

        # ------------------------------------------------------------------ output FIFO
        m.submodules.out_fifo = fifo = SyncFIFO(width=L * WB, depth=_OUT_FIFO_DEPTH)
        m.d.comb += [self.m.valid.eq(fifo.r_rdy), self.m.payload.eq(fifo.r_data),
                     fifo.r_en.eq(self.m.ready)]

        # ------------------------------------------------------------------ state
        beat = Signal(range(max(rows_max, cell_depth) + 2))
        i = Signal(SIZE_BITS)                    # row (issue stage)
        j = Signal(SIZE_BITS)                    # column (ROTATE) or weight column (UPDATE)
        cell = Signal(range(cells_max + 1))      # i * n + j (UPDATE)
        p = Signal(range(L + 1))                 # MGS pass
        acc = Signal(signed(acc_bits))           # MGS dot product / squared norm
        cvec = Array(Signal(word, name=f"c{k}") for k in range(L))
        c_prev = Signal(word)                    # c_{p-1}
        norm2 = Signal(LRT_NORM2_BITS)
        writes_max = Signal(LRT_WRITES_TOTAL_BITS)
        writes_total = Signal(LRT_WRITES_TOTAL_BITS)
        m.d.comb += [self.norm2.eq(norm2), self.writes_max.eq(writes_max),
                     self.writes_total.eq(writes_total)]
        # LRT_ROTATE: M[k][j] by lane k; the word deserializer of its input.
        mreg = [Array(Signal(word, name=f"m{k}_{jj}") for jj in range(L)) for k in range(L)]
        mk = Signal(range(L + 1))
        mj = Signal(range(L + 1))
        words_left = Signal(range(L * L + 1))
        buf = Signal(row_layout)
        buf_full = Signal()
        buf_w = Signal(range(L))
        rot_out = Array(Signal(word, name=f"rot{k}") for k in range(L))
        # LRT_UPDATE: s (lanes >= r hold 0) and u_k = Q_L[i, k] s_k of the current row.
        svec = [Signal(word, name=f"s{k}") for k in range(L)]
        uvec = [Signal(signed(u_bits), name=f"u{k}") for k in range(L)]
        u_load = Signal()
        u_fwd = Signal()                         # u_k is in prod this cycle, not yet in uvec
        m.d.sync += u_fwd.eq(u_load)
        # LRT_LOAD_WEIGHTS: the counter clear.
        clr_active = Signal()
        clr_addr = Signal(range(cell_depth))
        # Reads in flight towards the output FIFO.
        inflight = Signal()
        # Words still to come in (write enables: lane k while k < in_left) and to read out (the
        # lanes past m n read as 0): counters, not beat * 8 + k < limit comparators.
        in_left = Signal(signed(2 * SIZE_BITS + 1))
        # beat == in_beats as a flag set with the last beat (a compare off the stream handshake).
        in_done = Signal()
        beat1 = Signal.like(self.in_beats)       # beat + 1, kept as a register
        rd_left = Signal(signed(2 * SIZE_BITS + 1))
        rd_left1 = Signal(signed(2 * SIZE_BITS + 1))

        # ------------------------------------------------------------------ the pipeline
        # Eight stages after the issue, for 100 MHz: S1 memory data and the operand muxes, S2 the
        # multiplies (operand and product registers, DSP friendly), S3 the adder tree with the
        # rounding term, S4 the shift, S5 its saturation, S6 the differences and their
        # saturation, S7 the write back (write-if-changed) and the MGS product, S8 (MGS passes)
        # the accumulation. Datapath registers have no reset (the reset valid bits qualify them);
        # control (valid bits, flags, counters, bounds) is reset or registered from the registers.
        WR, ACC = 7, 8                            # the write-back and accumulate stages
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

        # S1: memory data arrive; the operand muxes, into registers.
        # a: a word or u_k (32 bits); b: a word or the unsigned LRT_RECIP (17 bits signed).
        mul_a = [Signal(signed(u_bits), name=f"mul_a{k}") for k in range(L)]
        mul_b = [Signal(signed(LRT_RECIP_BITS + 1), name=f"mul_b{k}") for k in range(L)]
        opa = [Signal(signed(u_bits), name=f"opa{k}", reset_less=True) for k in range(L)]
        opb = [Signal(signed(LRT_RECIP_BITS + 1), name=f"opb{k}", reset_less=True) for k in range(L)]
        prod = [Signal(signed(u_bits + LRT_RECIP_BITS + 1), name=f"prod{k}", reset_less=True)
                for k in range(L)]
        m.d.sync += [opa[k].eq(mul_a[k]) for k in range(L)]
        m.d.sync += [opb[k].eq(mul_b[k]) for k in range(L)]
        # S2: the multiplies.
        m.d.sync += [prod[k].eq(opa[k] * opb[k]) for k in range(L)]
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
            a_terms = [(m_rot, qrow[k]), (sel_ql, ql_rd.data[k]), (sel_prod, prod[k]), (sel_u, uvec[k])]
            b_terms = [(rot_b[k], mreg[k][j1]), (sel_ql, svec[k]), (sel_qr, qr_rd.data[k])]
            if k == 0:
                a_terms += [(m_pass, c_prev), (m_app, resword)]
                b_terms += [(m_pass, qrow[(p - 1)[:3]]), (m_app, self.recip)]
            m.d.comb += [mul_a[k].eq(_or_all(a_terms)),
                         mul_b[k].eq(_or_all(b_terms))]
        m.d.sync += [x2.eq(resword), qc2.eq(qrow[p[:3]]),
                     w2.eq(w_rd.data[cell1[:3]]), n2.eq(c_rd.data[cell1[:3]])]
        with m.If(u_fwd):
            m.d.sync += [uvec[k].eq(prod[k]) for k in range(L)]

        # S3: the adder tree.
        # The rounding term rides in the tree (prerounded), so that the rescale only shifts.
        shift_src = Mux(is_op(Op.LRT_PROJECT, Op.LRT_REPROJECT, Op.LRT_ROTATE), frac, self.shift)
        rshift = Signal(range(P.shift_min, P.shift_max + 1), reset_less=True)   # static in an op
        # Written every cycle from rshift and read only by total (itself reset-less, gated by
        # the valid bits): no reset, so aresetn does not drive its 52 resets.
        half = Signal(signed(sum_bits + 1), reset_less=True)
        m.d.sync += half.eq(RoundShiftSaturate.half_of(rshift, sum_bits, P.shift_max))
        total = Signal(signed(sum_bits + 1), reset_less=True)
        m.d.sync += total.eq(sum(prod) + half)

        # S4-S5: rescale (round half up by 14 or SHIFT: S4 the rounding shift, S5 the
        # saturation into y). y keeps 18 bits: the MGS step round(c Q, 14) (|c Q| <= 2**30) must
        # not saturate before x - y is; for the others saturating to 18 and then to 16 (or W - y
        # to 8, see numerics.LRT_PE_DELTA_BITS) is saturating once.
        m.submodules.rescale = rescale = RoundShiftSaturate(sum_bits + 1, WB + 2, P.shift_max, P.shift_min,
                                                            stages=1, prerounded=True)
        y = Signal(signed(WB + 2), reset_less=True)
        m.d.sync += [rshift.eq(shift_src), y.eq(rescale.data_out)]
        m.d.comb += [rescale.data_in.eq(total), rescale.shift.eq(rshift)]

        # S6: the differences and their saturation.
        m.submodules.sat_word = sat_word = RoundShiftSaturate(WB + 3, WB, 0)
        m.submodules.sat_weight = sat_weight = RoundShiftSaturate(WB + 3, wbits, 0)
        m.d.comb += [
            sat_word.data_in.eq(Mux(m_pass, x_[WR - 1] - y, y)),
            sat_word.shift.eq(0),
            sat_weight.data_in.eq(w_[WR - 1] - y),
            sat_weight.shift.eq(0),
        ]
        new_word = Signal(word)
        new_w = Signal(signed(wbits))
        m.d.sync += [new_word.eq(sat_word.data_out), new_w.eq(sat_weight.data_out)]
        # Also in S6, what the write back decides on: the counter's next value and ROTATE's
        # output lane (one-hot) and last output of the row.
        bumped = Signal(LRT_WRITE_COUNT_BITS, reset_less=True)
        jsel = Signal(L, reset_less=True)
        jlast = Signal(reset_less=True)
        n5 = n_[WR - 1]
        m.d.sync += [bumped.eq(Mux(n5 == (1 << LRT_WRITE_COUNT_BITS) - 1, n5, n5 + 1)),
                     jsel.eq(1 << j_[WR - 1]), jlast.eq(j_[WR - 1] == r_m1)]
        # S7: the write back.
        x6, w6, n6, i6, j6, cell6 = x_[WR], w_[WR], n_[WR], i_[WR], j_[WR], cell_[WR]
        # S7 (MGS) also multiplies x'_i by Q[i, p] (or by itself in the last pass); S8 adds.
        mac7 = Signal(signed(2 * WB), reset_less=True)
        last_pass = Signal()
        m.d.sync += last_pass.eq(p == r)
        with m.If(v[WR] & m_pass):
            m.d.comb += res_wr.en.eq(1 << i6[:3])
            m.d.sync += mac7.eq(new_word * Mux(last_pass, new_word, qc_[WR]))
        with m.If(v[WR] & m_rot):
            for k in range(L):
                with m.If(jsel[k]):
                    m.d.sync += rot_out[k].eq(new_word)
        with m.If(v[WR] & m_upd):
            with m.If(new_w != w6):
                m.d.comb += [w_wr.en.eq(1 << cell6[:3]), c_wr.en.eq(1 << cell6[:3])]
                m.d.sync += writes_total.eq(Mux(writes_total == (1 << LRT_WRITES_TOTAL_BITS) - 1,
                                                writes_total, writes_total + 1))
                with m.If(bumped > writes_max):
                    m.d.sync += writes_max.eq(bumped)

        # S8 (MGS passes): accumulate Q[i, p] x'_i, or x'_i^2 in the last pass.
        with m.If(v[ACC] & m_pass):
            m.d.sync += acc.eq(acc + mac7)

        m.submodules.c_round = c_round = RoundShiftSaturate(acc_bits, WB, frac)
        m.d.comb += [c_round.data_in.eq(acc), c_round.shift.eq(frac)]

        # ------------------------------------------------------------------ streams in
        pay = data.View(row_layout, self.s.payload)
        # The basis write data without the FSM's priority chain: the stream (LOAD_BASIS) or the
        # write back (the enables pick the lanes).
        m.d.comb += [qw_data[k].eq(Mux(ld_basis, pay[k], Mux(m_rot & ~jsel[k], rot_out[k], new_word)))
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

        # ------------------------------------------------------------------ counter clear
        with m.If(clr_active):
            m.d.comb += c_wr.en.eq((1 << L) - 1)
            m.d.sync += clr_addr.eq(clr_addr + 1)
            with m.If(clr_addr == cell_depth - 1):
                m.d.sync += clr_active.eq(0)

        pipe_busy = Cat(*v[1:]).any() | inflight | (fifo.level != 0) | clr_active

        # ------------------------------------------------------------------ control
        # busy as a register set and cleared with the IDLE transitions (the same cycles as
        # ~ongoing("IDLE")): the top's done/error logic reads a flip-flop, not the state decode.
        busy = Signal()
        m.d.comb += self.busy.eq(busy)
        with m.FSM() as fsm:
            with m.State("IDLE"):
                with m.If(self.start):
                    m.d.sync += busy.eq(1)
                    m.d.sync += [beat.eq(0), beat1.eq(1), i.eq(0), j.eq(0), p.eq(0), cell.eq(0), acc.eq(0),
                                 c_prev.eq(0), buf_full.eq(0), mk.eq(0), mj.eq(0),
                                 words_left.eq(qr3), rd_left.eq(cells_r), in_done.eq(self.in_beats == 0),
                                 in_left.eq(Mux(op == Op.LRT_LOAD_WEIGHTS, cells_r, rows))]
                    m.d.sync += [s.eq(0) for s in svec]
                    with m.Switch(op):
                        with m.Case(Op.LRT_LOAD_BASIS, Op.LRT_PROJECT, Op.LRT_UPDATE):
                            m.next = "IN"
                        with m.Case(Op.LRT_LOAD_WEIGHTS):
                            m.d.sync += [clr_active.eq(1), clr_addr.eq(0),
                                         writes_total.eq(0), writes_max.eq(0)]
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
                with m.Else():
                    m.d.comb += self.s.ready.eq(1)
                    with m.If(self.s.valid):
                        m.d.sync += [beat.eq(beat + 1), beat1.eq(beat1 + 1), in_left.eq(in_left - L),
                                     in_done.eq(beat1 == self.in_beats)]
                        with m.Switch(op):
                            with m.Case(Op.LRT_PROJECT):
                                m.d.comb += res_wr.en.eq(in_lanes)
                            with m.Case(Op.LRT_UPDATE):
                                m.d.sync += [svec[k].eq(Mux(k < r, pay[k], 0)) for k in range(L)]
                            with m.Case(Op.LRT_LOAD_WEIGHTS):
                                m.d.comb += w_wr.en.eq(in_lanes)

            # LRT_PROJECT / LRT_REPROJECT: pass p over the rows, then drain and finish the pass.
            with m.State("PASS"):
                m.d.sync += [i1.eq(i), i.eq(i + 1)]
                with m.If(i == rows_m1):
                    m.d.sync += i.eq(0)
                    m.next = "PASS_END"
            with m.State("PASS_END"):
                with m.If(~Cat(*v[1:]).any()):
                    m.d.sync += acc.eq(0)
                    with m.If(p == r):
                        m.d.sync += norm2.eq(acc)
                        with m.If(r != 0):
                            m.next = "C_OUT"
                        with m.Else():
                            m.next = "FINISH"
                    with m.Else():
                        m.d.sync += [cvec[p].eq(c_round.data_out), c_prev.eq(c_round.data_out),
                                     p.eq(p + 1)]
                        m.next = "PASS"
            with m.State("C_OUT"):
                m.d.comb += fifo.w_en.eq(1)
                m.d.comb += fifo.w_data.eq(Cat(*(Mux(k < r, cvec[k], 0) for k in range(L))))
                m.next = "FINISH"

            with m.State("APPEND"):
                m.d.sync += [i1.eq(i), i.eq(i + 1)]
                with m.If(i == rows_m1):
                    m.next = "FINISH"

            # LRT_ROTATE: deserialize M into mreg[k][j], then one output (i, j) per cycle.
            with m.State("ROT_IN"):
                with m.If(words_left == 0):
                    with m.If(r == 0):
                        m.next = "FINISH"
                    with m.Else():
                        m.next = "ROT"
                with m.Elif(~buf_full):
                    m.d.comb += self.s.ready.eq(1)
                    with m.If(self.s.valid):
                        m.d.sync += [buf.eq(pay), buf_full.eq(1), buf_w.eq(0)]
                with m.Else():
                    for k in range(L):
                        with m.If(mk == k):
                            m.d.sync += mreg[k][mj].eq(buf[buf_w])
                    m.d.sync += [words_left.eq(words_left - 1), buf_w.eq(buf_w + 1)]
                    with m.If(mj == r_m1):
                        m.d.sync += [mj.eq(0), mk.eq(mk + 1)]
                    with m.Else():
                        m.d.sync += mj.eq(mj + 1)
                    with m.If(buf_w == L - 1):
                        m.d.sync += buf_full.eq(0)
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
                m.d.sync += u_load.eq(1)
                m.next = "UCELL"
            with m.State("UCELL"):
                m.d.sync += [u_load.eq(0), cell1.eq(cell), cell.eq(cell + 1), j.eq(j + 1)]
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
        in_st = fsm.ongoing("IN")
        m.d.comb += ld_accept.eq(in_st & ~in_done & self.s.valid & ld_basis)
        m.d.comb += [
            qw_addr.eq(Mux(ld_basis, beat, i6)),
            qw_en.eq(Mux(ld_accept, (1 << L) - 1, 0) | Mux(v[WR] & m_app, app_en, 0)
                     | Mux(v[WR] & m_rot & jlast, rot_en, 0)),
        ]
        m.d.sync += row_step.eq(fsm.ongoing("UROW"))          # UROW2 follows UROW
        m.d.comb += [
            q_addr.eq(Mux(rd_basis, beat, i)),
            ql_rd.addr.eq(q_addr), qr_rd.addr.eq(Mux(m_upd, j, q_addr)),
            res_rd.addr.eq(i >> 3),
            w_rd.addr.eq(Mux(m_upd, cell >> 3, beat)), c_rd.addr.eq(Mux(m_upd, cell >> 3, beat)),
            res_wr.addr.eq(Mux(in_st, beat, i6 >> 3)),
            w_wr.addr.eq(Mux(in_st, beat, cell6 >> 3)),
            c_wr.addr.eq(Mux(clr_active, clr_addr, cell6 >> 3)),
        ]
        m.d.comb += [res_wr.data[k].eq(Mux(in_st, pay[k], new_word)) for k in range(L)]
        m.d.comb += [w_wr.data[k].eq(Mux(in_st, sat_in[k], new_w)) for k in range(L)]
        m.d.comb += [c_wr.data[k].eq(Mux(clr_active, 0, bumped)) for k in range(L)]
        return m

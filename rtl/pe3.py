"""PE3: outer products summed over a batch, ``W'(row, l) = sum_s dY_row(s) X_block(s, l)``.

The stream layout is :mod:`insitu.tt.pe_stream`'s: rows come in blocks of ``d`` that share one X
block of ``b`` entries of 16 words; per block the input stream holds the X block (2 beats an
entry), then the ``d`` rows of dY, each ``b`` words zero-padded to whole beats. The output is 16
words (2 beats) per row.

Datapath (16 multipliers along the last input mode, the paper's PE3; the X operand is cached):

* **loader** (input side): X beats go to a ping-pong X buffer (two banks of ``pe3_b_max`` entries
  of 256 bits, written 128 bits at a time), dY beats to a FIFO of ``DY_FIFO_BEATS`` beats. A bank
  is marked full when its block is loaded and freed when the last row of that block has issued its
  last MAC, so the next block loads while the current one computes, and the dY FIFO lets the
  input run ahead into the next block.
* **issue**: one MAC step per cycle: word ``s`` of the current dY beat (unpacked one word a cycle
  from the FIFO head) and X entry ``s`` of the block's bank; no bubbles between rows or blocks.
* **pipeline**: X read + dY register -> 16 products (registered, DSP friendly) -> 16 accumulators
  of ``accumulator_bits(16, 16, pe3_b_max)`` bits; the last step of a row copies the sums into a
  holding register.
* **output**: the 16 sums go through 8 :class:`RoundShiftSaturate` stages in two cycles (lanes
  0-7, then 8-15) into a small output FIFO. A row may only start when its two beats have room in
  that FIFO (a credit counter), so the pipeline after the issue stage never stalls.

``cfg_error`` and ``in_beats`` divide ``a`` by ``d`` combinationally (a 16-bit divider): they are
only meaningful while the configuration is held stable, and a top level that samples them should
allow them a few cycles after a configuration change (or register them).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.memory import Memory
from amaranth.utils import ceil_log2

from insitu.numerics import TT_PE_DATA_BITS, accumulator_bits

from .params import DEFAULT_PARAMS, STREAM_BITS, STREAM_WORDS, AcceleratorParams
from .pe_interface import BEATS_BITS, PE
from .regmap import ErrorCode
from .requantize import RoundShiftSaturate

#: Depth (beats) of the dY FIFO: how far the input may run ahead of the multipliers.
DY_FIFO_BEATS = 256
#: Depth (beats) of the output FIFO; rows start only when their 2 beats fit.
OUT_FIFO_BEATS = 16
#: Rescaling stages: the 16 lanes are requantized 8 at a time (one output beat a cycle).
RESCALE_LANES = STREAM_WORDS


class PE3(PE):
    """The outer-product PE (``op`` = 3); see the module docstring."""

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS, *,
                 dy_fifo_beats: int = DY_FIFO_BEATS, out_fifo_beats: int = OUT_FIFO_BEATS):
        self.params = params
        # The output FIFO must take a row (2 beats) beyond one more beat in flight; see elaborate.
        if dy_fifo_beats < 2 or out_fifo_beats < 3:
            raise ValueError(f"PE3: need dy_fifo_beats >= 2 and out_fifo_beats >= 3, got "
                             f"{dy_fifo_beats} and {out_fifo_beats}")
        self.dy_fifo_beats, self.out_fifo_beats = dy_fifo_beats, out_fifo_beats
        self.lanes = params.c_lanes
        if self.lanes != 2 * STREAM_WORDS:
            raise ValueError(f"PE3: c_lanes must be {2 * STREAM_WORDS} (two beats an X entry), "
                             f"got {self.lanes}")
        self.acc_bits = accumulator_bits(TT_PE_DATA_BITS, TT_PE_DATA_BITS, params.pe3_b_max)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        p = self.params
        W = TT_PE_DATA_BITS
        L = self.lanes
        bmax = p.pe3_b_max
        a, b, c, d = self.a, self.b, self.c, self.d

        # ------------------------------------------------------------ configuration checks
        row_beats = (b + STREAM_WORDS - 1) >> ceil_log2(STREAM_WORDS)     # dY beats a row
        in_beats = (a // d) * b * (L // STREAM_WORDS) + a * row_beats
        m.d.comb += [
            self.in_beats.eq(in_beats[:BEATS_BITS]),
            self.out_beats.eq(a * (L // STREAM_WORDS)),
        ]
        with m.If((a == 0) | (b == 0) | (c == 0) | (d == 0)):
            m.d.comb += self.cfg_error.eq(ErrorCode.ZERO_SIZE)
        with m.Elif(c != L):
            m.d.comb += self.cfg_error.eq(ErrorCode.C_LANES)
        with m.Elif(a % d != 0):
            m.d.comb += self.cfg_error.eq(ErrorCode.BLOCK)
        with m.Elif(b > bmax):
            m.d.comb += self.cfg_error.eq(ErrorCode.TILE)
        with m.Elif((self.shift < p.shift_min) | (self.shift > p.shift_max)):
            m.d.comb += self.cfg_error.eq(ErrorCode.SHIFT)

        # ------------------------------------------------------------ storage
        entry_bits = ceil_log2(bmax)
        xmem = m.submodules.xmem = Memory(shape=L * W, depth=2 << entry_bits, init=[])
        x_wr = xmem.write_port(granularity=STREAM_BITS)
        x_rd = xmem.read_port(domain="sync")
        dyf = m.submodules.dy_fifo = SyncFIFOBuffered(width=STREAM_BITS, depth=self.dy_fifo_beats)
        outf = m.submodules.out_fifo = SyncFIFOBuffered(width=STREAM_BITS, depth=self.out_fifo_beats)

        full = [Signal(name=f"bank{i}_full") for i in range(2)]
        set_full = [Signal(name=f"bank{i}_set") for i in range(2)]
        clr_full = [Signal(name=f"bank{i}_clr") for i in range(2)]
        for i in range(2):
            with m.If(self.start):
                m.d.sync += full[i].eq(0)
            with m.Elif(set_full[i]):
                m.d.sync += full[i].eq(1)
            with m.Elif(clr_full[i]):
                m.d.sync += full[i].eq(0)

        # ------------------------------------------------------------ loader (input side)
        ld_active = Signal()
        ld_x = Signal()                                 # 1: loading an X block; 0: dY rows
        wr_bank = Signal()
        ld_idx = Signal(range(2 * bmax))                # X beat within the block
        ld_beat = Signal(range(max(2, -(-bmax // STREAM_WORDS))))  # dY beat within the row
        ld_row_blk = Signal(16)                         # row within the block
        ld_rows = Signal(16)                            # rows loaded
        bank_free = Mux(wr_bank, ~full[1], ~full[0])

        s_fire = Signal()
        m.d.comb += [
            self.s.ready.eq(ld_active & Mux(ld_x, bank_free, dyf.w_rdy)),
            s_fire.eq(self.s.valid & self.s.ready),
            x_wr.addr.eq(Cat(ld_idx[1:], wr_bank)),
            x_wr.data.eq(Cat(self.s.payload, self.s.payload)),
            x_wr.en.eq(Mux(s_fire & ld_x, Cat(~ld_idx[0], ld_idx[0]), 0)),
            dyf.w_data.eq(self.s.payload),
            dyf.w_en.eq(self.s.valid & ld_active & ~ld_x),
        ]
        with m.If(self.start):
            m.d.sync += [ld_active.eq(1), ld_x.eq(1), wr_bank.eq(0), ld_idx.eq(0), ld_beat.eq(0),
                         ld_row_blk.eq(0), ld_rows.eq(0)]
        with m.Elif(s_fire & ld_x):
            with m.If(ld_idx == 2 * b - 1):
                m.d.sync += [ld_idx.eq(0), ld_x.eq(0), wr_bank.eq(~wr_bank)]
                m.d.comb += [set_full[0].eq(~wr_bank), set_full[1].eq(wr_bank)]
            with m.Else():
                m.d.sync += ld_idx.eq(ld_idx + 1)
        with m.Elif(s_fire):
            with m.If(ld_beat == row_beats - 1):
                m.d.sync += [ld_beat.eq(0), ld_rows.eq(ld_rows + 1)]
                with m.If(ld_row_blk == d - 1):
                    m.d.sync += [ld_row_blk.eq(0), ld_x.eq(1)]
                with m.Else():
                    m.d.sync += ld_row_blk.eq(ld_row_blk + 1)
                with m.If(ld_rows == a - 1):
                    m.d.sync += ld_active.eq(0)
            with m.Else():
                m.d.sync += ld_beat.eq(ld_beat + 1)

        # ------------------------------------------------------------ issue
        cp_active = Signal()
        rd_bank = Signal()
        s_idx = Signal(max(1, entry_bits))              # batch index within the row
        w_idx = Signal(3)                               # word within the current dY beat
        cp_row_blk = Signal(16)
        cp_rows = Signal(16)
        out_left = Signal(range(2 * (1 << 16) + 1))     # output beats still to send
        credits = Signal(range(self.out_fifo_beats + 1))     # output beats reserved, not yet sent
        prev_first = Signal()                           # a row started last cycle (b == 1)
        # (Implied by dyf.r_rdy -- a block's dY is queued after its X block -- but kept as a guard.)
        bank_full = Mux(rd_bank, full[1], full[0])

        first = s_idx == 0
        last = s_idx == b - 1
        room = (credits <= self.out_fifo_beats - 2) & ~prev_first
        issue = Signal()
        m_fire = Signal()
        m.d.comb += [
            issue.eq(cp_active & bank_full & dyf.r_rdy & (~first | room)),
            dyf.r_en.eq(issue & (last | (w_idx == STREAM_WORDS - 1))),
            x_rd.addr.eq(Cat(s_idx[:entry_bits], rd_bank)),
            m_fire.eq(self.m.valid & self.m.ready),
        ]
        m.d.sync += prev_first.eq(issue & first)
        with m.If(self.start):
            m.d.sync += credits.eq(0)
        with m.Else():
            m.d.sync += credits.eq(credits + Mux(issue & first, 2, 0) - m_fire)

        with m.If(self.start):
            m.d.sync += [cp_active.eq(1), rd_bank.eq(0), s_idx.eq(0), w_idx.eq(0),
                         cp_row_blk.eq(0), cp_rows.eq(0)]
        with m.Elif(issue):
            with m.If(last):
                m.d.sync += [s_idx.eq(0), w_idx.eq(0), cp_rows.eq(cp_rows + 1)]
                with m.If(cp_row_blk == d - 1):
                    m.d.sync += [cp_row_blk.eq(0), rd_bank.eq(~rd_bank)]
                    m.d.comb += [clr_full[0].eq(~rd_bank), clr_full[1].eq(rd_bank)]
                with m.Else():
                    m.d.sync += cp_row_blk.eq(cp_row_blk + 1)
                with m.If(cp_rows == a - 1):
                    m.d.sync += cp_active.eq(0)
            with m.Else():
                m.d.sync += [s_idx.eq(s_idx + 1), w_idx.eq(w_idx + 1)]

        # ------------------------------------------------------------ MAC pipeline
        v1, first1, last1 = Signal(), Signal(), Signal()
        dy1 = Signal(signed(W))
        m.d.sync += [
            v1.eq(issue & ~self.start),
            first1.eq(first),
            last1.eq(last),
            dy1.eq(dyf.r_data.word_select(w_idx, W)),
        ]
        v2, first2, last2 = Signal(), Signal(), Signal()
        prod = [Signal(signed(2 * W), name=f"prod{k}") for k in range(L)]
        m.d.sync += [v2.eq(v1 & ~self.start), first2.eq(first1), last2.eq(last1)]
        for k in range(L):
            m.d.sync += prod[k].eq(dy1 * x_rd.data.word_select(k, W).as_signed())

        acc = [Signal(signed(self.acc_bits), name=f"acc{k}") for k in range(L)]
        res = [Signal(signed(self.acc_bits), name=f"res{k}") for k in range(L)]
        res_v = Signal()
        m.d.sync += res_v.eq(v2 & last2 & ~self.start)
        for k in range(L):
            total = Mux(first2, 0, acc[k]) + prod[k]
            with m.If(v2):
                m.d.sync += acc[k].eq(total)
                with m.If(last2):
                    m.d.sync += res[k].eq(total)

        # ------------------------------------------------------------ rescale and output
        hi_half = Signal()                               # second beat of the row
        m.d.sync += hi_half.eq(res_v & ~self.start)
        words = []
        for k in range(RESCALE_LANES):
            rss = RoundShiftSaturate(self.acc_bits, W, p.shift_max, p.shift_min)
            m.submodules[f"rescale{k}"] = rss
            m.d.comb += [
                rss.data_in.eq(Mux(hi_half, res[k + RESCALE_LANES], res[k])),
                rss.shift.eq(self.shift),
            ]
            words.append(rss.data_out)
        # The rescaled beat is registered before the FIFO (timing: the rescale is a wide add,
        # a barrel shift and a compare).
        beat, beat_v = Signal(STREAM_BITS), Signal()
        m.d.sync += [beat.eq(Cat(*words)), beat_v.eq((res_v | hi_half) & ~self.start)]
        m.d.comb += [
            outf.w_data.eq(beat),
            outf.w_en.eq(beat_v),
            self.m.payload.eq(outf.r_data),
            self.m.valid.eq(outf.r_rdy),
            outf.r_en.eq(self.m.ready),
        ]

        # ------------------------------------------------------------ busy
        with m.If(self.start):
            m.d.sync += [self.busy.eq(1), out_left.eq(self.out_beats)]
        with m.Elif(m_fire & self.busy):
            m.d.sync += out_left.eq(out_left - 1)
            with m.If(out_left == 1):
                m.d.sync += self.busy.eq(0)
        return m

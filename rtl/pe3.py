"""PE3: outer products summed over a batch, ``W'(row, l) = sum_s dY_row(s) X_block(s, l)``.

The stream layout is :mod:`insitu.tt.pe_stream`'s: rows come in blocks of ``d`` that share one X
block of ``b`` entries of 16 words; per block the input stream holds the X block (2 beats an
entry), then the ``d`` rows of dY, each ``b`` words zero-padded to whole beats. The output is 16
words (2 beats) per row (PE3_PSG: 4 beats, see below).

Datapath (16 multipliers along the last input mode, the paper's PE3; the X operand is cached):

* **loader** (input side): X beats go to a ping-pong X buffer (two banks of ``pe3_b_max`` entries
  of 256 bits, written 128 bits at a time; with ``pe3_batch_lanes`` = 2 a memory word holds the
  two entries of a MAC step), dY beats to a FIFO of ``DY_FIFO_BEATS`` beats. A bank
  is marked full when its block is loaded and freed when the last row of that block has issued its
  last MAC, so the next block loads while the current one computes, and the dY FIFO lets the
  input run ahead into the next block.
* **issue**: one MAC step per cycle: word ``s`` of the current dY beat (unpacked one word a cycle
  from the FIFO head) and X entry ``s`` of the block's bank; no bubbles between rows or blocks.
  With ``pe3_batch_lanes`` = 2 (a generate-time parameter) a step is two consecutive batch entries
  ``s, s + 1`` (two dY words, two X entries): a row takes ``ceil(b / 2)`` steps. For odd ``b`` the
  last step's second entry lies beyond the row (its dY word is padding, its X entry stale): its
  products are masked by a registered flag.
* **pipeline**: X read + dY word register -> both registered again (the block RAM outputs stay off
  the DSP inputs) -> 16 products (registered, DSP friendly; 2 x 16 with two entries a step, then
  each lane's pair summed in a registered stage, one cycle more per op) -> 16 accumulators
  of ``accumulator_bits(16, 16, pe3_b_max)`` bits; the last step of a row copies the sums into a
  holding register.
* **output**: the 16 sums go through 8 :class:`RoundShiftSaturate` stages in two cycles (lanes
  0-7, then 8-15) into a small output FIFO, three registered stages deep (lane mux plus the
  rounding term, shift, saturation) for a 100 MHz clock. A row may only start when its beats
  have room in that FIFO (a credit counter), so the pipeline after the issue stage never stalls.

**PE3_PSG** (``op`` = :attr:`~insitu.accel.regmap.Op.PE3_PSG`, E2-Train's predictive sign gradient,
spec :func:`insitu.numerics.psg_weight_gradient` / :func:`~insitu.numerics.psg_sign`, golden
model :func:`insitu.tt.pe_stream.psg_run`): the same input stream, sizes and checks, plus
``psg_tau`` >= 1 (else :attr:`~insitu.accel.regmap.ErrorCode.PSG_TAU`, checked after SHIFT).

* Operands: an X word is an 8-bit activation code, taken as **its low 8 bits sign-extended** (the
  upper byte is ignored, so any 16-bit word has a defined result); dY words are 16-bit gradient
  codes. The loader writes the sign-extended X into the X buffer, so the 16 full MACs compute
  ``g_full = sum dY * x8`` exactly as PE3 would on 8-bit codes.
* Beside them, 16 narrow MACs compute the predictor ``g_msb = sum msb10(dY) * msb4(x8)``
  (:func:`insitu.numerics.msb_code`: a code rounded to its top bits, add half then shift,
  saturated; 10-bit x 4-bit signed products; accumulators of ``accumulator_bits(10, 4,
  pe3_b_max)`` bits, 22 for b_max = 256). dY's MSB code is formed once per word (stage 1), x8's
  per lane at the multipliers. They run in PE3 ops too (their results are unused there).
* Output: 4 beats a row: beats 0-1 are lanes 0-15 of ``g_msb`` through the same rounding shift
  and 16-bit saturation as PE3 (SHIFT; SHIFT = 0 gives g_msb exactly while |g_msb| < 2**15),
  beats 2-3 the eq.-2 signs as int16 -1/0/+1: ``sgn(g_msb)`` where ``|g_msb| >= psg_tau``,
  else ``sgn(g_full)``. Rows start at most every 4 cycles (2 in PE3 ops), so the rescale stage
  takes 4 cycles a row; a row of >= 4 MAC steps still runs at one step a cycle.
* Status: ``psg_predicted`` counts the entries the predictor decided and ``psg_max`` is the max
  of ``|g_msb|`` over the op (both cleared at a PE3_PSG start, kept through other ops, final once
  ``busy`` falls); the host forms the next threshold ``max(1, ceil(beta * psg_max))``
  (:func:`insitu.numerics.psg_threshold`), as E2-Train's adaptive threshold one step late.

``cfg_error``, ``in_beats`` and ``out_beats`` are registers, settled ``CFG_STAGES`` cycles after
a configuration change (``cfg_ready``): ``a / d`` is an exact division by multiplies (see
:class:`PE3Config`), so no long combinational path reaches the top's beat checks. For a configuration
refused with BLOCK (d does not divide a), ``in_beats`` means nothing.

The parts, each an Amaranth component: :class:`PE3Config` (the configuration results),
:class:`PE3Loader` (the X buffer's banks and the dY FIFO's input), :class:`PE3Issue` (the MAC
steps: steps, rows and blocks, the bank read and release), :class:`PE3Credits` (whether a row's
beats fit in the output FIFO), :class:`PE3MacArray` (the multipliers and accumulators) and
:class:`PE3RowOutput` (rescale, signs, PSG status); :class:`PE3` wires them, holds the dY and
output FIFOs, and drives ``cfg_ready`` and ``busy``.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out
from amaranth.lib.memory import Memory
from amaranth.utils import ceil_log2

from insitu.numerics import (PSG_ACTIVATION_BITS, PSG_ACTIVATION_MSB_BITS, PSG_GRADIENT_BITS,
                              PSG_GRADIENT_MSB_BITS, TT_PE_DATA_BITS, accumulator_bits)

from insitu.accel.params import (DEFAULT_PARAMS, SIZE_BITS, STREAM_BITS, STREAM_WORDS,
                                 AcceleratorParams)
from .pe_interface import BEATS_BITS, ERROR_BITS, SHIFT_BITS, PE, settled
from insitu.accel.regmap import ErrorCode, Op
from .requantize import RoundShiftSaturate

#: Depth (beats) of the dY FIFO: how far the input may run ahead of the multipliers.
DY_FIFO_BEATS = 256
#: Depth (beats) of the output FIFO; rows start only when their beats (2, PE3_PSG: 4) fit.
OUT_FIFO_BEATS = 16
#: Output beats of a row: PE3 sends the 16 sums; PE3_PSG the 16 rescaled g_msb, then 16 signs.
ROW_BEATS = 2
PSG_ROW_BEATS = 4
#: Width of the PSG_TAU / PSG_PREDICTED / PSG_MAX ports (the registers).
PSG_REG_BITS = 32
#: Registered cycles from a configuration change to its cfg_error / in_beats / out_beats.
CFG_STAGES = 5
#: Rescaling stages: the 16 lanes are requantized 8 at a time (one output beat a cycle).
RESCALE_LANES = STREAM_WORDS


class PE3(PE):
    """The outer-product PE (``op`` = 3, and 4 = PE3_PSG); see the module docstring.

    What is left here is the wiring of the parts, the two FIFOs between them, and what the PE
    interface asks of every PE (``cfg_ready``, ``busy``): the loader fills the X buffer and the
    dY FIFO, the issue logic takes a step a cycle from both into the MAC array while the credits
    allow a row, and the row output fills the output FIFO, which is the PE's output stream.
    """

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS, *,
                 dy_fifo_beats: int = DY_FIFO_BEATS, out_fifo_beats: int = OUT_FIFO_BEATS):
        self.params = params
        # The output FIFO must take a whole PE3_PSG row (4 beats); a SyncFIFOBuffered also
        # needs depth >= 3 to accept a write whenever its level is below its depth.
        if dy_fifo_beats < 2 or out_fifo_beats < PSG_ROW_BEATS:
            raise ValueError(f"PE3: need dy_fifo_beats >= 2 and out_fifo_beats >= {PSG_ROW_BEATS}, "
                             f"got {dy_fifo_beats} and {out_fifo_beats}")
        self.dy_fifo_beats, self.out_fifo_beats = dy_fifo_beats, out_fifo_beats
        self.lanes = params.c_lanes
        if self.lanes != 2 * STREAM_WORDS:
            raise ValueError(f"PE3: c_lanes must be {2 * STREAM_WORDS} (two beats an X entry), "
                             f"got {self.lanes}")
        self.acc_bits = accumulator_bits(TT_PE_DATA_BITS, TT_PE_DATA_BITS, params.pe3_b_max)
        self.msb_acc_bits = accumulator_bits(PSG_GRADIENT_MSB_BITS, PSG_ACTIVATION_MSB_BITS,
                                             params.pe3_b_max)
        super().__init__({
            "psg_tau": In(PSG_REG_BITS),
            "psg_predicted": Out(PSG_REG_BITS),
            "psg_max": Out(PSG_REG_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        a, b, c, d = self.a, self.b, self.c, self.d

        psg = Signal()
        out_row_beats = Signal(range(PSG_ROW_BEATS + 1))                   # output beats a row
        # Registered (op is a held configuration): the row issue logic depends on it.
        m.d.sync += psg.eq(self.op == Op.PE3_PSG)
        m.d.comb += out_row_beats.eq(Mux(psg, PSG_ROW_BEATS, ROW_BEATS))
        m.d.comb += self.cfg_ready.eq(settled(
            m, [self.op, a, b, c, d, self.shift, self.psg_tau], CFG_STAGES))
        m.submodules.config = config = PE3Config(p)
        m.d.comb += [getattr(config, name).eq(getattr(self, name)) for name in PE3Config.INPUTS]
        m.d.comb += [self.cfg_error.eq(config.cfg_error), self.in_beats.eq(config.in_beats),
                     self.out_beats.eq(config.out_beats)]

        # ------------------------------------------------------------ FIFOs
        dyf = m.submodules.dy_fifo = SyncFIFOBuffered(width=STREAM_BITS, depth=self.dy_fifo_beats)
        outf = m.submodules.out_fifo = SyncFIFOBuffered(width=STREAM_BITS, depth=self.out_fifo_beats)
        # The counters' last values, registered from the held sizes (settled long before start):
        # the loader's and the issue logic's compares then have no subtractor in front of them.
        a_m1, d_m1 = Signal(16), Signal(16)
        m.d.sync += [a_m1.eq(a - 1), d_m1.eq(d - 1)]

        # ------------------------------------------------------------ loader and issue
        m.submodules.loader = loader = PE3Loader(p)
        m.submodules.issue = issue = PE3Issue(p)
        m.submodules.credits = credits = PE3Credits(self.out_fifo_beats)
        wiring.connect(m, wiring.flipped(self.s), loader.s)
        wiring.connect(m, loader.dy, dyf.w_stream)
        wiring.connect(m, dyf.r_stream, issue.dy)
        m_fire = Signal()
        m.d.comb += [
            m_fire.eq(self.m.valid & self.m.ready),
            loader.start.eq(self.start), loader.psg.eq(psg), loader.a_m1.eq(a_m1),
            loader.d_m1.eq(d_m1), loader.b.eq(b),
            loader.release.eq(issue.release), loader.x_rd_addr.eq(issue.x_rd_addr),
            issue.start.eq(self.start), issue.a_m1.eq(a_m1), issue.d_m1.eq(d_m1), issue.b.eq(b),
            issue.full.eq(loader.full), issue.room.eq(credits.room),
            credits.start.eq(self.start), credits.out_row_beats.eq(out_row_beats),
            credits.row_start.eq(issue.row_start), credits.sent.eq(m_fire),
        ]

        # ------------------------------------------------------------ MAC array and output
        m.submodules.macs = macs = PE3MacArray(self.lanes, self.acc_bits, self.msb_acc_bits,
                                               p.pe3_batch_lanes)
        m.d.comb += [macs.start.eq(self.start), macs.step.eq(issue.step),
                     macs.first.eq(issue.first), macs.last.eq(issue.last),
                     macs.dy_word.eq(issue.dy_word), macs.x_entry.eq(loader.x_entry)]
        if p.pe3_batch_lanes > 1:
            m.d.comb += macs.entry_ok.eq(issue.entry_ok)
        m.submodules.rows_out = rows_out = PE3RowOutput(p, self.acc_bits, self.msb_acc_bits)
        m.d.comb += [
            rows_out.start.eq(self.start), rows_out.psg.eq(psg),
            rows_out.out_row_beats.eq(out_row_beats), rows_out.shift.eq(self.shift),
            rows_out.psg_tau.eq(self.psg_tau), rows_out.res.eq(macs.res),
            rows_out.msb_res.eq(macs.msb_res), rows_out.res_due.eq(macs.res_due),
            rows_out.res_valid.eq(macs.res_valid),
            # No ready: the credits reserve a row's beats in the output FIFO before it starts.
            outf.w_data.eq(rows_out.beat),
            outf.w_en.eq(rows_out.beat_valid),
            self.psg_predicted.eq(rows_out.psg_predicted),
            self.psg_max.eq(rows_out.psg_max),
        ]
        wiring.connect(m, outf.r_stream, wiring.flipped(self.m))

        # ------------------------------------------------------------ busy
        out_left = Signal(range(2 * (1 << 16) + 1))     # output beats still to send
        with m.If(self.start):
            m.d.sync += [self.busy.eq(1), out_left.eq(self.out_beats)]
        with m.Elif(m_fire & self.busy):
            m.d.sync += out_left.eq(out_left - 1)
            with m.If(out_left == 1):
                m.d.sync += self.busy.eq(0)
        return m


class PE3Issue(wiring.Component):
    """PE3's issue logic: one MAC step a cycle, ``dy_word`` (word(s) ``s`` of the dY FIFO's head
    beat, unpacked one step a cycle) with X entry (step) ``s`` of the block's bank
    (``x_rd_addr``, read by the loader's X buffer), no bubbles between rows or blocks. It counts
    the steps of a row (``first``, ``last``), the rows of a block (then ``release`` frees the
    block's bank and the next bank is read) and the rows of the op; a row starts only while
    ``room`` (the credits) allows it. With ``pe3_batch_lanes`` = 2, ``entry_ok`` masks the
    second entry of an odd ``b``'s last step.

    Separate because it is the one scheduler between the two sides: the loader's bank flags
    (``full``) and the dY FIFO (``dy``, a stream it takes words from) come in, the MAC array's
    step controls go out; only these ports cross, and the counters are its own.
    """

    def __init__(self, params: AcceleratorParams):
        self.params = params
        BL = params.pe3_batch_lanes
        ports = {
            "start": In(1),
            "a_m1": In(16),                      # rows - 1, block rows - 1 (held sizes)
            "d_m1": In(16),
            "b": In(SIZE_BITS),
            "full": In(2),
            "release": Out(2),
            "dy": In(stream.Signature(STREAM_BITS)),
            "room": In(1),
            "x_rd_addr": Out(pe3_step_bits(params) + 1),
            "step": Out(1),
            "row_start": Out(1),
            "first": Out(1, init=1),
            "last": Out(1),
            "dy_word": Out(BL * TT_PE_DATA_BITS),
        }
        if BL > 1:
            ports["entry_ok"] = Out(BL)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        BL = self.params.pe3_batch_lanes               # batch entries per MAC step
        step_bits = pe3_step_bits(self.params)        # X buffer address within a bank
        a_m1, d_m1, b = self.a_m1, self.d_m1, self.b
        first, last, step = self.first, self.last, self.step

        cp_active = Signal()
        rd_bank = Signal()
        s_idx = Signal(max(1, step_bits))               # MAC step within the row (BL entries)
        w_idx = Signal(ceil_log2(STREAM_WORDS // BL))   # step within the current dY beat
        cp_row_blk = Signal(16)
        cp_rows = Signal(16)
        # (Implied by dy.valid -- a block's dY is queued after its X block -- but kept as a guard.)
        bank_full = Mux(rd_bank, self.full[1], self.full[0])

        # first (s_idx == 0) and last (s_idx == steps - 1) are registers, set a cycle ahead from
        # one_step and steps_m2 (registered; b is held from several cycles before start): no
        # size arithmetic or wide compare in front of step, which drives the dY FIFO's read
        # side. A row takes steps = ceil(b / BL) MAC steps.
        one_step = Signal()
        steps_m2 = Signal(16)
        steps = b if BL == 1 else (b + BL - 1) >> ceil_log2(BL)
        m.d.sync += [one_step.eq(steps == 1), steps_m2.eq(steps - 2)]
        m.d.comb += [
            step.eq(cp_active & bank_full & self.dy.valid & (~first | self.room)),
            self.row_start.eq(step & first),
            self.dy.ready.eq(step & (last | (w_idx == STREAM_WORDS // BL - 1))),
            self.dy_word.eq(self.dy.payload.word_select(w_idx, BL * TT_PE_DATA_BITS)),
            self.x_rd_addr.eq(Cat(s_idx[:step_bits], rd_bank)),
        ]
        with m.If(self.start):
            m.d.sync += [cp_active.eq(1), rd_bank.eq(0), s_idx.eq(0), w_idx.eq(0),
                         cp_row_blk.eq(0), cp_rows.eq(0), first.eq(1), last.eq(one_step)]
        with m.Elif(step):
            m.d.sync += first.eq(last)
            with m.If(last):
                m.d.sync += last.eq(one_step)
            with m.Else():
                m.d.sync += last.eq(s_idx == steps_m2)
            with m.If(last):
                m.d.sync += [s_idx.eq(0), w_idx.eq(0), cp_rows.eq(cp_rows + 1)]
                with m.If(cp_row_blk == d_m1):
                    m.d.sync += [cp_row_blk.eq(0), rd_bank.eq(~rd_bank)]
                    m.d.comb += [self.release[0].eq(~rd_bank), self.release[1].eq(rd_bank)]
                with m.Else():
                    m.d.sync += cp_row_blk.eq(cp_row_blk + 1)
                with m.If(cp_rows == a_m1):
                    m.d.sync += cp_active.eq(0)
            with m.Else():
                m.d.sync += [s_idx.eq(s_idx + 1), w_idx.eq(w_idx + 1)]

        if BL > 1:
            # Entry j of a step is within the row unless it is the last step and j >= the
            # entries left (b odd: the pair's second entry, whose X may be stale or unwritten).
            # tail_ok[j]: entry j of the last step is within b (registered from the held b).
            tail_ok = Signal(BL)
            rem_m1 = (b - 1)[:ceil_log2(BL)]           # entries of the last step, minus 1
            m.d.sync += tail_ok.eq(Cat(*(rem_m1 >= j for j in range(BL))))
            m.d.comb += self.entry_ok.eq(Mux(last, tail_ok, (1 << BL) - 1))
        return m


class PE3Credits(wiring.Component):
    """PE3's row credits: ``room`` says a row may start now, its beats (``out_row_beats``, 2 or
    PE3_PSG's 4) fit in the output FIFO beside those reserved for rows started and not yet sent,
    and ``out_row_beats`` cycles have passed since the last row start (so a row's sums leave the
    MAC array's holding register before the next row's land, ``b`` small). Counts the reserved
    beats: + ``out_row_beats`` at a ``row_start``, - 1 a beat ``sent``.

    Separate because it only counts: it sees the issue logic's row starts and the output
    stream's handshakes, and gives back one registered flag, so the pipeline after the issue
    stage never stalls and no compare sits on the issue path.
    """

    def __init__(self, out_fifo_beats: int):
        self.out_fifo_beats = out_fifo_beats
        super().__init__({
            "start": In(1),
            "out_row_beats": In(range(PSG_ROW_BEATS + 1)),
            "row_start": In(1),
            "sent": In(1),
            "room": Out(1, init=1),
        })

    def elaborate(self, platform):
        m = Module()
        out_row_beats = self.out_row_beats
        credits = Signal(range(self.out_fifo_beats + 1))     # output beats reserved, not yet sent
        # Cycles before the next row may start: rows start at most every out_row_beats cycles.
        cooldown = Signal(range(PSG_ROW_BEATS))
        cooldown_next = Signal.like(cooldown)
        with m.If(self.row_start):
            m.d.comb += cooldown_next.eq(out_row_beats - 1)
        with m.Elif(cooldown != 0):
            m.d.comb += cooldown_next.eq(cooldown - 1)
        with m.Else():
            m.d.comb += cooldown_next.eq(0)
        m.d.sync += cooldown.eq(cooldown_next)
        # credits' next value for each (row start, beat sent): the four candidates and whether a
        # row still fits after each are formed from registers; the row start only picks one.
        # Whether it fits, (credits + i out_row_beats - j, at credits' width) + out_row_beats <=
        # the FIFO's depth, is a function of credits and out_row_beats alone: a table on their
        # bits (LUTs), not an adder and a compare behind out_row_beats (the psg flag).
        cand = [[Signal.like(credits, name=f"credits_{i}{j}") for j in range(2)] for i in range(2)]
        cand_fits = [[Signal(name=f"fits_{i}{j}") for j in range(2)] for i in range(2)]
        c_bits, r_bits = len(credits), len(out_row_beats)
        for i in range(2):
            for j in range(2):
                fits = [((c + i * r - j) % (1 << c_bits)) + r <= self.out_fifo_beats
                        for r in range(1 << r_bits) for c in range(1 << c_bits)]
                table = Const(sum(f << n for n, f in enumerate(fits)), len(fits))
                m.d.comb += [cand[i][j].eq(credits + Mux(i, out_row_beats, 0) - j),
                             cand_fits[i][j].eq(table.bit_select(Cat(credits, out_row_beats), 1))]
        pick = Cat(self.sent, self.row_start)
        credits_next = Signal.like(credits)
        fits_next = Signal()
        with m.If(self.start):
            m.d.comb += [credits_next.eq(0), fits_next.eq(1)]
        with m.Else():
            with m.Switch(pick):
                for i in range(2):
                    for j in range(2):
                        with m.Case(2 * i + j):
                            m.d.comb += [credits_next.eq(cand[i][j]),
                                         fits_next.eq(cand_fits[i][j])]
        # Whether a row's beats fit and the cooldown is over, registered: off the issue path.
        m.d.sync += [credits.eq(credits_next), self.room.eq(fits_next & (cooldown_next == 0))]
        return m


class PE3Config(wiring.Component):
    """PE3's configuration results, ``cfg_error``, ``in_beats`` and ``out_beats``, registered
    ``CFG_STAGES`` cycles after the configuration (the PE's ``cfg_ready`` waits for them).

    Separate from the datapath: it reads only the held configuration, and it is a pipeline of
    its own (``a / d`` as an exact division by multiplies, see ``elaborate``).
    """

    #: The PE's configuration ports this reads (same names here).
    INPUTS = ("op", "a", "b", "c", "d", "shift", "psg_tau")

    def __init__(self, params: AcceleratorParams):
        self.params = params
        super().__init__({
            "op": In(8),
            "a": In(SIZE_BITS), "b": In(SIZE_BITS), "c": In(SIZE_BITS), "d": In(SIZE_BITS),
            "shift": In(signed(SHIFT_BITS)),
            "psg_tau": In(PSG_REG_BITS),
            "cfg_error": Out(ERROR_BITS),
            "in_beats": Out(BEATS_BITS),
            "out_beats": Out(BEATS_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        L = p.c_lanes
        bmax = p.pe3_b_max
        a, b, c, d = self.a, self.b, self.c, self.d
        row_beats = dy_row_beats(b)
        # in_beats needs a / d, and a combinational divider is ~45 logic levels. A valid
        # configuration has d | a, so a / d is an exact division, done with multiplies:
        # a / d = (a >> k) * inverse(d >> k) mod 2**16 with k the trailing zeros of d, the
        # inverse of the odd part from an 8-bit table and one Newton step; d | a exactly when
        # the quotient times d gives a back (the BLOCK check).
        # stage 1: k, the odd parts, the table; a * row_beats; every check but BLOCK
        k = Signal(range(16))
        for bit in reversed(range(16)):                  # the lowest set bit wins
            with m.If(d[bit]):
                m.d.comb += k.eq(bit)
        inv_table = Memory(shape=8, depth=128, init=[pow(2 * i + 1, -1, 256) for i in range(128)])
        m.submodules.inv_table = inv_table
        inv_rd = inv_table.read_port(domain="comb")
        d_odd = Signal(16)
        m.d.comb += [d_odd.eq(d >> k), inv_rd.addr.eq(d_odd[1:8])]
        d1, a_odd1, x0 = Signal(16), Signal(16), Signal(8)
        block_due = Signal()                             # BLOCK decides unless an earlier check
        # The checks registered one flag each, their priority in stage 2: the compares on the
        # sizes feed plain D inputs, not an If chain that Yosys maps onto early_err's reset/CE.
        zero1, clanes1, tile1, shift1, tau1 = (Signal(name=f"{n}_bad1")
                                               for n in ("zero", "clanes", "tile", "shift", "tau"))
        # a and row_beats registered, a * row_beats in stage 2 (the b adder not in front of it).
        a1, row_beats1 = Signal(16), Signal(16)
        m.d.sync += [
            zero1.eq((a == 0) | (b == 0) | (c == 0) | (d == 0)),
            clanes1.eq(c != L),
            tile1.eq(b > bmax),
            shift1.eq((self.shift < p.shift_min) | (self.shift > p.shift_max)),
            tau1.eq((self.op == Op.PE3_PSG) & (self.psg_tau == 0)),
            a1.eq(a), row_beats1.eq(row_beats),
        ]
        m.d.sync += [
            block_due.eq((a != 0) & (b != 0) & (c != 0) & (d != 0) & (c == L)),
            d1.eq(d), a_odd1.eq(a >> k), x0.eq(inv_rd.data),
            self.out_beats.eq(a * Mux(self.op == Op.PE3_PSG, PSG_ROW_BEATS, ROW_BEATS)),
        ]
        # stage 2: e = 2 - d_odd x0 (the Newton step's factor), p = (a >> k) x0, mod 2**16.
        # d_odd x0 is 1 mod 256 (x0 inverts d_odd's low byte; d = 0: d_odd = 0, x0 = 1, 0), so
        # e's low byte is 1 (d = 0: 2) and only the high byte is a subtraction, an 8-bit negate
        # after the multiply instead of a 16-bit subtract (the stage's longest path).
        e2, p2 = Signal(16), Signal(16)
        d2, a2, b2 = Signal(16), Signal(16), Signal(16)
        a_rows2, err2, due2 = Signal(32), Signal(ERROR_BITS), Signal()
        d_odd1 = Signal(16)
        m.d.sync += d_odd1.eq(d_odd)
        dx = (d_odd1 * x0)[:16]
        m.d.sync += [
            e2.eq(Cat(Mux(dx[0], Const(1, 8), Const(2, 8)), (-dx[8:16])[:8])),
            p2.eq((a_odd1 * x0)[:16]),
            d2.eq(d1), a2.eq(a), b2.eq(b), a_rows2.eq(a1 * row_beats1),
            due2.eq(block_due),
        ]
        with m.If(zero1):
            m.d.sync += err2.eq(ErrorCode.ZERO_SIZE)
        with m.Elif(clanes1):
            m.d.sync += err2.eq(ErrorCode.C_LANES)
        with m.Elif(tile1):
            m.d.sync += err2.eq(ErrorCode.TILE)
        with m.Elif(shift1):
            m.d.sync += err2.eq(ErrorCode.SHIFT)
        with m.Elif(tau1):
            m.d.sync += err2.eq(ErrorCode.PSG_TAU)
        with m.Else():
            m.d.sync += err2.eq(ErrorCode.NONE)
        # stage 3: the quotient
        q3 = Signal(16)
        d3, a3, b3 = Signal(16), Signal(16), Signal(16)
        a_rows3, err3, due3 = Signal(32), Signal(ERROR_BITS), Signal()
        m.d.sync += [q3.eq((p2 * e2)[:16]), d3.eq(d2), a3.eq(a2), b3.eq(b2), a_rows3.eq(a_rows2),
                     err3.eq(err2), due3.eq(due2)]
        # stage 4: the products (a / d) * 2b and q d (all 32 bits: BLOCK needs them), registered (xcup: DSPs without registers)
        qb4, qd4 = Signal(BEATS_BITS), Signal(32)
        a4, a_rows4, err4, due4 = Signal(16), Signal(32), Signal(ERROR_BITS), Signal()
        m.d.sync += [qb4.eq(q3 * (b3 << 1)), qd4.eq(q3 * d3), a4.eq(a3),
                     a_rows4.eq(a_rows3), err4.eq(err3), due4.eq(due3)]
        # stage 5: in_beats = (a / d) * 2b + a * row_beats; BLOCK where q d != a
        m.d.sync += self.in_beats.eq((qb4 + a_rows4)[:BEATS_BITS])
        with m.If(due4 & (qd4 != a4)):
            m.d.sync += self.cfg_error.eq(ErrorCode.BLOCK)
        with m.Else():
            m.d.sync += self.cfg_error.eq(err4)
        return m


class PE3Loader(wiring.Component):
    """PE3's input side: X blocks into the two banks of the X buffer (ping-pong, 256 bits an
    entry, written 128 bits at a time; PE3_PSG's X words sign-extended from their low byte), dY
    rows into the dY FIFO. A bank is full from its block's last beat until the issue logic
    releases it (``release``), so the next block loads while the current one computes.

    ``s`` is the PE's input stream; ``dy`` gives its dY beats to the dY FIFO (a stream: valid
    while a dY beat is in ``s``, whatever the FIFO's room; ``s`` waits on ``dy.ready`` then).

    Separate from the issue logic: the two meet only at the bank flags, the X buffer's read port
    (``x_rd_addr``, ``x_entry`` a cycle later) and the dY FIFO.
    """

    def __init__(self, params: AcceleratorParams):
        self.params = params
        L, W = params.c_lanes, TT_PE_DATA_BITS
        super().__init__({
            "start": In(1),
            "psg": In(1),
            "a_m1": In(16),                      # rows - 1, block rows - 1 (held sizes)
            "d_m1": In(16),
            "b": In(SIZE_BITS),
            "s": In(stream.Signature(STREAM_BITS)),
            "dy": Out(stream.Signature(STREAM_BITS)),
            "full": Out(2),
            "release": In(2),
            "x_rd_addr": In(pe3_step_bits(params) + 1),
            "x_entry": Out(params.pe3_batch_lanes * L * W),
        })

    def elaborate(self, platform):
        m = Module()
        L, W = self.params.c_lanes, TT_PE_DATA_BITS
        bmax = self.params.pe3_b_max
        BL = self.params.pe3_batch_lanes
        step_bits = pe3_step_bits(self.params)
        # One memory word holds the BL entries of a MAC step (entries BL*k .. BL*k + BL - 1),
        # written one beat (128 bits, half an entry) at a time.
        xmem = m.submodules.xmem = Memory(shape=BL * L * W, depth=2 << step_bits, init=[])
        x_wr = xmem.write_port(granularity=STREAM_BITS)
        x_rd = xmem.read_port(domain="sync")
        m.d.comb += [x_rd.addr.eq(self.x_rd_addr), self.x_entry.eq(x_rd.data)]

        full = self.full
        set_full = [Signal(name=f"bank{i}_set") for i in range(2)]
        clr_full = self.release
        for i in range(2):
            with m.If(self.start):
                m.d.sync += full[i].eq(0)
            with m.Elif(set_full[i]):
                m.d.sync += full[i].eq(1)
            with m.Elif(clr_full[i]):
                m.d.sync += full[i].eq(0)

        ld_active = Signal()
        ld_x = Signal()                                 # 1: loading an X block; 0: dY rows
        wr_bank = Signal()
        ld_idx = Signal(range(2 * bmax))                # X beat within the block
        ld_beat = Signal(range(max(2, -(-bmax // STREAM_WORDS))))  # dY beat within the row
        ld_row_blk = Signal(16)                         # row within the block
        ld_rows = Signal(16)                            # rows loaded
        bank_free = Mux(wr_bank, ~full[1], ~full[0])
        # The counters' last values, registered from the held sizes (settled long before start):
        # the compares below then have no subtractor in front of them (a - 1 and d - 1 come in
        # so, the issue logic compares against them too).
        a_m1, d_m1, b = self.a_m1, self.d_m1, self.b
        b2_m1, rb_m1 = Signal(17), Signal(16)
        m.d.sync += [b2_m1.eq(2 * b - 1), rb_m1.eq(dy_row_beats(b) - 1)]

        x_fire, dy_fire = Signal(), Signal()
        part_bits = ceil_log2(2 * BL)
        # PE3_PSG: X words are 8-bit codes, their low byte sign-extended (the upper byte ignored).
        x_words = [self.s.payload.word_select(k, W) for k in range(STREAM_WORDS)]
        x8_beat = Cat(*(Cat(w[:PSG_ACTIVATION_BITS], w[PSG_ACTIVATION_BITS - 1].replicate(
            W - PSG_ACTIVATION_BITS)) for w in x_words))
        x_beat = Mux(self.psg, x8_beat, self.s.payload)
        m.d.comb += [
            self.s.ready.eq(ld_active & Mux(ld_x, bank_free, self.dy.ready)),
            # The two handshakes apart (s.ready picks bank_free while ld_x): the X buffer's write
            # enables and the bank flags then do not wait on the dY FIFO's level.
            x_fire.eq(self.s.valid & ld_active & ld_x & bank_free),
            dy_fire.eq(self.dy.valid & self.dy.ready),
            # X beat ld_idx is 128-bit part ld_idx % (2 BL) of word ld_idx // (2 BL).
            x_wr.addr.eq(Cat(ld_idx[part_bits:part_bits + step_bits], wr_bank)),
            x_wr.data.eq(Cat(*([x_beat] * (2 * BL)))),
            x_wr.en.eq(Mux(x_fire, Cat(*(ld_idx[:part_bits] == i for i in range(2 * BL))),
                           0)),
            self.dy.payload.eq(self.s.payload),
            self.dy.valid.eq(self.s.valid & ld_active & ~ld_x),
        ]
        with m.If(self.start):
            m.d.sync += [ld_active.eq(1), ld_x.eq(1), wr_bank.eq(0), ld_idx.eq(0), ld_beat.eq(0),
                         ld_row_blk.eq(0), ld_rows.eq(0)]
        with m.Elif(x_fire):
            with m.If(ld_idx == b2_m1):
                m.d.sync += [ld_idx.eq(0), ld_x.eq(0), wr_bank.eq(~wr_bank)]
                m.d.comb += [set_full[0].eq(~wr_bank), set_full[1].eq(wr_bank)]
            with m.Else():
                m.d.sync += ld_idx.eq(ld_idx + 1)
        with m.Elif(dy_fire):
            with m.If(ld_beat == rb_m1):
                m.d.sync += [ld_beat.eq(0), ld_rows.eq(ld_rows + 1)]
                with m.If(ld_row_blk == d_m1):
                    m.d.sync += [ld_row_blk.eq(0), ld_x.eq(1)]
                with m.Else():
                    m.d.sync += ld_row_blk.eq(ld_row_blk + 1)
                with m.If(ld_rows == a_m1):
                    m.d.sync += ld_active.eq(0)
            with m.Else():
                m.d.sync += ld_beat.eq(ld_beat + 1)
        return m


class PE3MacArray(wiring.Component):
    """PE3's multipliers: 16 multiply-accumulate lanes (dY word times X entry) and the PSG
    predictor's 16 narrow ones, from an issued step to the row's sums in holding registers
    (``res``, ``msb_res``; ``res_due`` the cycle before they land, ``res_valid`` the cycle after).

    With ``batch_lanes`` = BL > 1 a step is BL consecutive batch entries: ``dy_word`` holds BL
    dY words, ``x_entry`` BL X entries, and each lane has BL multipliers (and BL narrow ones)
    whose products are summed in a registered stage of their own before the accumulator (one
    cycle more per op). ``entry_ok`` (BL > 1 only) says which entries of the step are within
    the row: a masked entry's products are dropped (its X may be stale or never written).

    Separate because it is pure datapath: the issue logic decides when a step enters (``step``,
    with the row's ``first`` and ``last`` step) and nothing flows back to it.
    """

    def __init__(self, lanes: int, acc_bits: int, msb_acc_bits: int, batch_lanes: int = 1):
        self.lanes, self.acc_bits, self.msb_acc_bits = lanes, acc_bits, msb_acc_bits
        self.batch_lanes = batch_lanes
        ports = {
            "start": In(1),
            "step": In(1),
            "first": In(1),
            "last": In(1),
            "dy_word": In(batch_lanes * TT_PE_DATA_BITS),
            "x_entry": In(batch_lanes * lanes * TT_PE_DATA_BITS),
            "res": Out(data.ArrayLayout(signed(acc_bits), lanes)),
            "msb_res": Out(data.ArrayLayout(signed(msb_acc_bits), lanes)),
            "res_due": Out(1),
            "res_valid": Out(1),
        }
        if batch_lanes > 1:
            ports["entry_ok"] = In(batch_lanes)
        super().__init__(ports)

    def elaborate(self, platform):
        m = Module()
        W = TT_PE_DATA_BITS
        L = self.lanes
        BL = self.batch_lanes
        entries = range(BL)

        def name(base, j):
            """Signal names of batch entry j (entry 0's as with one entry a step)."""
            return base if j == 0 else f"{base}_e{j}"

        # Datapath registers have no reset (the valid bits qualify them): fewer flip-flops on
        # the reset net, and the DSPs can take the product registers.
        v1, first1, last1 = Signal(), Signal(), Signal()
        dy1 = [Signal(signed(W), name=name("dy1", j), reset_less=True) for j in entries]
        m.d.sync += [
            v1.eq(self.step & ~self.start),
            first1.eq(self.first),
            last1.eq(self.last),
            *(dy1[j].eq(self.dy_word.word_select(j, W)) for j in entries),
        ]
        # Stage 1b: the X entry and the dY word registered once more before the multipliers. The
        # block RAM outputs (no output register) would otherwise run through the word select and
        # the MSB rounding straight into the DSPs (~9.6 ns on xc7z020); one cycle more per op.
        # The dY MSB code is formed here from dy1, a fabric register: from the FIFO output,
        # Yosys packs dy1 and dy1b into all 16 DSPs (AREG=2) and the rounding's net fans out to
        # them all behind the block RAM (11 ns).
        v1b, first1b, last1b = Signal(), Signal(), Signal()
        x1b = [Signal(L * W, name=name("x1b", j), reset_less=True) for j in entries]
        x1b_msb = [[Signal(signed(PSG_ACTIVATION_MSB_BITS), name=name(f"x1b_msb{k}", j),
                           reset_less=True) for k in range(L)] for j in entries]
        dy1b = [Signal(signed(W), name=name("dy1b", j), reset_less=True) for j in entries]
        dy1b_msb = [Signal(signed(PSG_GRADIENT_MSB_BITS), name=name("dy1b_msb", j),
                           reset_less=True) for j in entries]
        m.d.sync += [v1b.eq(v1 & ~self.start), first1b.eq(first1), last1b.eq(last1)]
        for j in entries:
            x_entry = self.x_entry.word_select(j, L * W)
            m.d.sync += [x1b[j].eq(x_entry), dy1b[j].eq(dy1[j]),
                         dy1b_msb[j].eq(msb_code(dy1[j], PSG_GRADIENT_BITS, PSG_GRADIENT_MSB_BITS))]
            for k in range(L):
                x_word = x_entry.word_select(k, W)
                m.d.sync += x1b_msb[j][k].eq(msb_code(x_word[:PSG_ACTIVATION_BITS],
                                                      PSG_ACTIVATION_BITS, PSG_ACTIVATION_MSB_BITS))
        v2, first2, last2 = Signal(), Signal(), Signal()
        prod = [[Signal(signed(2 * W), name=name(f"prod{k}", j), reset_less=True)
                 for k in range(L)] for j in entries]
        m.d.sync += [v2.eq(v1b & ~self.start), first2.eq(first1b), last2.eq(last1b)]
        # The PSG predictor's narrow products: msb10(dY) times msb4(x8).
        msb_prod = [[Signal(signed(PSG_GRADIENT_MSB_BITS + PSG_ACTIVATION_MSB_BITS),
                            name=name(f"msb_prod{k}", j), reset_less=True) for k in range(L)]
                    for j in entries]
        for j in entries:
            for k in range(L):
                m.d.sync += [
                    prod[j][k].eq(dy1b[j] * x1b[j].word_select(k, W).as_signed()),
                    msb_prod[j][k].eq(dy1b_msb[j] * x1b_msb[j][k]),
                ]

        # What the accumulators add: the products (one entry a step), or their sum over the
        # step's entries, registered (stage 2s), entries beyond the row masked.
        v_acc, first_acc, last_acc = v2, first2, last2
        term, msb_term = prod[0], msb_prod[0]
        if BL > 1:
            ok1, ok1b, ok2 = Signal(BL), Signal(BL), Signal(BL)
            m.d.sync += [ok1.eq(self.entry_ok), ok1b.eq(ok1), ok2.eq(ok1b)]
            v_acc, first_acc, last_acc = Signal(name="v2s"), Signal(name="first2s"), \
                Signal(name="last2s")
            m.d.sync += [v_acc.eq(v2 & ~self.start), first_acc.eq(first2), last_acc.eq(last2)]
            grow = ceil_log2(BL)
            term = [Signal(signed(2 * W + grow), name=f"pair_sum{k}", reset_less=True)
                    for k in range(L)]
            msb_term = [Signal(signed(PSG_GRADIENT_MSB_BITS + PSG_ACTIVATION_MSB_BITS + grow),
                               name=f"msb_pair_sum{k}", reset_less=True) for k in range(L)]
            for k in range(L):
                # entry 0 of a step is always within the row
                m.d.sync += [
                    term[k].eq(sum((Mux(ok2[j], prod[j][k], 0) for j in entries[1:]),
                                   prod[0][k])),
                    msb_term[k].eq(sum((Mux(ok2[j], msb_prod[j][k], 0) for j in entries[1:]),
                                       msb_prod[0][k])),
                ]

        acc = [Signal(signed(self.acc_bits), name=f"acc{k}", reset_less=True) for k in range(L)]
        res = [Signal(signed(self.acc_bits), name=f"res{k}", reset_less=True) for k in range(L)]
        msb_acc = [Signal(signed(self.msb_acc_bits), name=f"msb_acc{k}", reset_less=True)
                   for k in range(L)]
        msb_res = [Signal(signed(self.msb_acc_bits), name=f"msb_res{k}", reset_less=True)
                   for k in range(L)]
        res_v = self.res_valid
        m.d.comb += self.res_due.eq(v_acc & last_acc & ~self.start)
        m.d.sync += res_v.eq(self.res_due)
        for k in range(L):
            total = Mux(first_acc, 0, acc[k]) + term[k]
            msb_total = Mux(first_acc, 0, msb_acc[k]) + msb_term[k]
            with m.If(v_acc):
                m.d.sync += [acc[k].eq(total), msb_acc[k].eq(msb_total)]
                with m.If(last_acc):
                    m.d.sync += [res[k].eq(total), msb_res[k].eq(msb_total)]

        m.d.comb += [self.res[k].eq(res[k]) for k in range(L)]
        m.d.comb += [self.msb_res[k].eq(msb_res[k]) for k in range(L)]
        return m


class PE3RowOutput(wiring.Component):
    """PE3's output side, one beat a cycle from a row's sums: the rounding shift and saturation
    (PE3's beats and PE3_PSG's g_msb beats), the eq.-2 signs (PE3_PSG's sign beats), and the PSG
    status registers (``psg_predicted``, ``psg_max``).

    Separate from the MAC array because it runs at its own pace, ``out_row_beats`` cycles a row
    through three registered stages, on the holding registers the MAC array fills once a row.
    """

    def __init__(self, params: AcceleratorParams, acc_bits: int, msb_acc_bits: int):
        self.params, self.acc_bits, self.msb_acc_bits = params, acc_bits, msb_acc_bits
        lanes = params.c_lanes
        super().__init__({
            "start": In(1),
            "psg": In(1),
            "out_row_beats": In(range(PSG_ROW_BEATS + 1)),
            "shift": In(signed(SHIFT_BITS)),
            "psg_tau": In(PSG_REG_BITS),
            "res": In(data.ArrayLayout(signed(acc_bits), lanes)),
            "msb_res": In(data.ArrayLayout(signed(msb_acc_bits), lanes)),
            "res_due": In(1),
            "res_valid": In(1),
            "beat": Out(STREAM_BITS),
            "beat_valid": Out(1),
            "psg_predicted": Out(PSG_REG_BITS),
            "psg_max": Out(PSG_REG_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        p = self.params
        W = TT_PE_DATA_BITS
        # One beat a cycle from the holding registers: phase 0 is the cycle self.res_valid is high, then
        # 1 .. out_row_beats - 1. Bit 0 of the phase picks lanes 0-7 or 8-15; bit 1 (PE3_PSG)
        # the sign beats instead of the rescaled ones.
        phase = Signal(range(PSG_ROW_BEATS))
        phase_on = Signal()
        phase_next = Signal.like(phase)
        m.d.comb += phase_next.eq(phase)
        with m.If(self.start):
            m.d.sync += phase_on.eq(0)
        with m.Elif(self.res_valid):
            m.d.comb += phase_next.eq(1)
            m.d.sync += phase_on.eq(1)
        with m.Elif(phase_on):
            with m.If(phase == self.out_row_beats - 1):
                m.d.sync += phase_on.eq(0)
            with m.Else():
                m.d.comb += phase_next.eq(phase + 1)
        m.d.sync += phase.eq(phase_next)
        # The beat in hand (0 the cycle self.res_valid is high, else phase) is a register formed from the
        # next values: its bits select the lanes of all 16 x 2 sums (~1.3k loads), so no gate
        # sits between the flip-flop and that fan-out.
        cur = Signal(range(PSG_ROW_BEATS))
        cur_v = Signal()
        m.d.sync += cur.eq(Mux(self.res_due, 0, phase_next))
        m.d.comb += cur_v.eq(self.res_valid | phase_on)
        upper, sign_beat = cur[0], cur[1]

        # Three registered stages (each well under 8 ns at 100 MHz): the lane mux (o1), the
        # rounding shift (o2, inside RoundShiftSaturate; the PSG signs beside it), then the
        # saturation and the beat mux into `beat`.
        R = RESCALE_LANES
        # The lane mux stage also adds the rounding term (RoundShiftSaturate prerounded), so the
        # rescale stage only shifts: the add and the barrel shift in one cycle were ~8.2 ns.
        sel_in = [Signal(signed(self.acc_bits + 1), name=f"sel_in{k}", reset_less=True)
                  for k in range(R)]
        half = Signal(self.acc_bits + 1, reset_less=True)     # shift is held: registered
        m.d.sync += half.eq(RoundShiftSaturate.half_of(self.shift, self.acc_bits, p.shift_max))
        sel_pred = [Signal(signed(self.msb_acc_bits), name=f"sel_pred{k}", reset_less=True)
                    for k in range(R)]
        full_neg = Signal(R, reset_less=True)        # sign and nonzero of the full sums
        full_nz = Signal(R, reset_less=True)
        o1_v, o1_sign = Signal(), Signal()
        m.d.sync += [o1_v.eq(cur_v & ~self.start), o1_sign.eq(sign_beat)]
        for k in range(R):
            full_k = Mux(upper, self.res[k + R], self.res[k])
            pred_k = Mux(upper, self.msb_res[k + R], self.msb_res[k])
            m.d.sync += [sel_in[k].eq(Mux(self.psg, pred_k, full_k) + half), sel_pred[k].eq(pred_k),
                         full_neg[k].eq(full_k < 0), full_nz[k].eq(full_k != 0)]

        words, signs_r, predicted, mags = [], [], [], []
        for k in range(R):
            rss = RoundShiftSaturate(self.acc_bits + 1, W, p.shift_max, p.shift_min, stages=1,
                                     prerounded=True)
            m.submodules[f"rescale{k}"] = rss
            m.d.comb += [rss.data_in.eq(sel_in[k]), rss.shift.eq(self.shift)]
            words.append(rss.data_out)
            # Eq. 2: the predictor's sign where |g_msb| >= tau, else the full gradient's.
            mag = Signal(self.msb_acc_bits, name=f"psg_mag{k}")
            hit = Signal(name=f"psg_hit{k}")
            sign = Signal(signed(W), name=f"psg_sign{k}", reset_less=True)
            full_sgn = Mux(full_neg[k], -1, Mux(full_nz[k], 1, 0))
            m.d.comb += [mag.eq(abs(sel_pred[k])), hit.eq(mag >= self.psg_tau)]
            m.d.sync += sign.eq(Mux(hit, _sgn(sel_pred[k]), full_sgn))
            signs_r.append(sign)
            predicted.append(hit)
            mags.append(mag)
        o2_v, o2_sign = Signal(), Signal()
        m.d.sync += [o2_v.eq(o1_v & ~self.start), o2_sign.eq(o1_sign)]
        beat, beat_v = Signal(STREAM_BITS, reset_less=True), Signal()
        m.d.sync += [beat.eq(Mux(o2_sign, Cat(*signs_r), Cat(*words))),
                     beat_v.eq(o2_v & ~self.start)]
        m.d.comb += [self.beat.eq(beat), self.beat_valid.eq(beat_v)]

        # ------------------------------------------------------------ PSG status
        # Registered in stages off the beat path: the 8 |g_msb| of a g_msb beat, their max, then
        # the running max; the 8 decisions of a sign beat, then the count.
        mag_r = [Signal(self.msb_acc_bits, name=f"psg_mag_r{k}") for k in range(R)]
        mag_v, peak8, peak8_v = Signal(), Signal(self.msb_acc_bits), Signal()
        hits_r, hits_v = Signal(R), Signal()
        # The max of 8 in two registered steps (pairs, then the 4 pair maxima).
        peak2 = [Signal(self.msb_acc_bits, name=f"psg_peak2_{k}") for k in range(R // 2)]
        peak2_v = Signal()
        m.d.sync += [
            mag_v.eq(o1_v & ~o1_sign & self.psg & ~self.start),
            hits_v.eq(o1_v & o1_sign & self.psg & ~self.start),
            hits_r.eq(Cat(*predicted)),
            *(peak2[k].eq(_max_tree(mag_r[2 * k:2 * k + 2])) for k in range(R // 2)),
            peak2_v.eq(mag_v & ~self.start),
            peak8.eq(_max_tree(peak2)),
            peak8_v.eq(peak2_v & ~self.start),
        ]
        m.d.sync += [mag_r[k].eq(mags[k]) for k in range(R)]
        with m.If(self.start & self.psg):
            m.d.sync += [self.psg_predicted.eq(0), self.psg_max.eq(0)]
        with m.Else():
            with m.If(hits_v):
                m.d.sync += self.psg_predicted.eq(self.psg_predicted + sum(hits_r))
            with m.If(peak8_v & (peak8 > self.psg_max)):
                m.d.sync += self.psg_max.eq(peak8)

        return m


def pe3_step_bits(params: AcceleratorParams) -> int:
    """Address bits of one X buffer bank: ``ceil(pe3_b_max / pe3_batch_lanes)`` words of
    ``pe3_batch_lanes`` entries each."""
    return ceil_log2(-(-params.pe3_b_max // params.pe3_batch_lanes))


def dy_row_beats(b):
    """The dY beats of a row: its ``b`` words zero-padded to whole beats."""
    return (b + STREAM_WORDS - 1) >> ceil_log2(STREAM_WORDS)


def msb_code(code, bits: int, keep: int):
    """:func:`insitu.numerics.msb_code` of a ``bits``-wide signed code: its top ``keep`` bits
    plus the rounding bit below them (add half, then shift), except at the largest top value,
    which would round out of range (saturation)."""
    top = code[bits - keep:bits]
    round_up = code[bits - keep - 1] & (top != (1 << (keep - 1)) - 1)
    return (top.as_signed() + round_up)[:keep].as_signed()


def _sgn(value):
    """-1, 0 or +1 of a signed value, as a 16-bit word."""
    return Mux(value < 0, -1, Mux(value != 0, 1, 0))


def _max_tree(values):
    """The largest of ``values`` (unsigned), as a balanced tree of compares."""
    while len(values) > 1:
        values = [Mux(values[i] >= values[i + 1], values[i], values[i + 1]) if i + 1 < len(values)
                  else values[i] for i in range(0, len(values), 2)]
    return values[0]

"""PE1: ``Z'(a,d) = sum_{b,c} Z(a,b,c) G(b,d,c)`` with 128 MACs (16 lanes on c x 8 rows on a).

Stream layouts are those of :mod:`insitu.tt.pe_stream` (in: ``G (b,d,c)`` then ``Z (a8,b,c)``;
out: ``(a8/8, d, 8)``). With ``C = c/16`` lane chunks and ``K = b*C`` entries of 16 words per row:

* **factor buffer**: ``G`` as entries of 16 codes x 4 bits (depth ``factor_words/16``), two beats
  per entry, stored in ``(d, b, chunk)`` order (address ``d*K + b*C + chunk``) so that the MAC
  loop reads it sequentially;
* **tile buffers**: one memory per row of a group of 8 rows, entries of 16 words (two beats per
  entry), two banks (ping-pong): group ``g+1`` loads while group ``g`` computes;
* **MAC loop** per group: for each ``d``, for each ``k < K``: the 8 rows' entry ``k`` times the
  factor entry ``(d, k)``: 128 products, 8 adder trees over the 16 lanes, 8 accumulators; after
  ``K`` cycles 8 results, rescaled (8 x RoundShiftSaturate), are one output beat;
* pipeline: issue (buffer addresses) -> buffer data -> 128 products -> 8 lane sums -> 8
  accumulators -> rescale into the output FIFO. A cycle that completes a result issues only while
  the FIFO has room for every result still in flight (credits), so back-pressure on ``m`` only
  stalls issue.

One MAC cycle per clock in steady state: loading a group (``16*K`` beats) overlaps the previous
group's ``d*K`` MAC cycles; there is no dead cycle between ``d`` iterations or groups.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib.memory import Memory

from insitu.numerics import accumulator_bits, product_bits

from .params import DEFAULT_PARAMS, STREAM_WORDS, AcceleratorParams
from .pe_common import (CODE_BITS, DATA_BITS, OutputStage, adder_tree, check_params,
                        common_cfg_errors, drive_cfg_error, payload_codes, words)
from .pe_interface import PE
from .regmap import ErrorCode


class PE1(PE):
    """The PE1 contraction (see the module docstring)."""

    #: Output FIFO entries (also the most results in flight: pipeline + FIFO).
    OUT_DEPTH = 16

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS):
        check_params(params, "PE1")
        self.params = params
        self.rows = params.pe_rows
        self.lanes = params.c_lanes
        self.row_entries = params.pe1_row_entries
        self.factor_entries = params.factor_words // params.c_lanes
        #: Accumulator width: never overflows for ``b*c <= pe1_row_entries*16`` terms.
        self.acc_bits = accumulator_bits(DATA_BITS, CODE_BITS, self.row_entries * self.lanes)
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        p = self.params
        ROWS, LANES, R, FE = self.rows, self.lanes, self.row_entries, self.factor_entries
        a, b, c, d = self.a, self.b, self.c, self.d

        # ---------------------------------------------------------------- configuration
        C = Signal(12)                          # lane chunks c/16
        groups = Signal(14)                     # groups of 8 rows: ceil(a/8)
        m.d.comb += [C.eq(c >> 4), groups.eq((a + 7) >> 3)]
        checks, shift_check = common_cfg_errors(a, b, c, d, self.shift, p)
        drive_cfg_error(m, self.cfg_error, checks + [
            (b * C > R, ErrorCode.TILE),
            (b * d * C > FE, ErrorCode.FACTOR_WORDS),
            shift_check,
        ])
        m.d.comb += [
            self.in_beats.eq((b * c * (d + (groups << 3))) >> 3),
            self.out_beats.eq(groups * d),
        ]
        # Derived sizes, registered (the configuration is stable from START on; the first use is
        # in the cycle after START). Meaningful for accepted configurations only.
        K = Signal(range(R + 1))                # entries per row: b*C
        Km1 = Signal(range(R))
        Cm1 = Signal(range(R))
        bm1, dm1, gm1 = Signal(16), Signal(16), Signal(14)
        m.d.sync += [K.eq(b * C), Km1.eq(b * C - 1), Cm1.eq(C - 1), bm1.eq(b - 1), dm1.eq(d - 1),
                     gm1.eq(groups - 1)]

        # ---------------------------------------------------------------- buffers
        m.submodules.gmem = gmem = Memory(shape=LANES * CODE_BITS, depth=FE, init=[])
        g_w = gmem.write_port(granularity=STREAM_WORDS * CODE_BITS)
        g_r = gmem.read_port()
        row_w, row_r = [], []
        for r in range(ROWS):
            mem = Memory(shape=LANES * DATA_BITS, depth=2 * R, init=[])
            m.submodules[f"row{r}"] = mem
            row_w.append(mem.write_port(granularity=STREAM_WORDS * DATA_BITS))
            row_r.append(mem.read_port())

        busy = self.busy
        full = Signal(2)                        # tile bank holds a complete group

        # ---------------------------------------------------------------- input: G then Z
        g_phase, z_phase = Signal(), Signal()
        lbank = Signal()
        z_ready = Signal()
        m.d.comb += [
            z_ready.eq(z_phase & ~Mux(lbank, full[1], full[0])),
            self.s.ready.eq(g_phase | z_ready),
        ]
        g_fire, z_fire = Signal(), Signal()
        m.d.comb += [g_fire.eq(self.s.valid & g_phase), z_fire.eq(self.s.valid & z_ready)]

        # G beats arrive in (b, d, chunk, half) order; entry address d*K + b*C + chunk.
        gw_half = Signal()
        gw_chunk = Signal(range(R))
        gw_d, gw_b = Signal(16), Signal(16)
        gw_addr, gw_dbase, gw_bbase = Signal(16), Signal(16), Signal(16)
        m.d.comb += [
            g_w.addr.eq(gw_addr),
            g_w.data.eq(Cat(payload_codes(self.s.payload), payload_codes(self.s.payload))),
            g_w.en.eq(Mux(g_fire, Mux(gw_half, 0b10, 0b01), 0)),
        ]
        with m.If(g_fire):
            m.d.sync += gw_half.eq(~gw_half)
            with m.If(gw_half):
                with m.If(gw_chunk == Cm1):
                    m.d.sync += gw_chunk.eq(0)
                    with m.If(gw_d == dm1):
                        m.d.sync += [gw_d.eq(0), gw_b.eq(gw_b + 1), gw_bbase.eq(gw_bbase + C),
                                     gw_dbase.eq(gw_bbase + C), gw_addr.eq(gw_bbase + C)]
                        with m.If(gw_b == bm1):
                            m.d.sync += [g_phase.eq(0), z_phase.eq(1)]
                    with m.Else():
                        m.d.sync += [gw_d.eq(gw_d + 1), gw_dbase.eq(gw_dbase + K),
                                     gw_addr.eq(gw_dbase + K)]
                with m.Else():
                    m.d.sync += [gw_chunk.eq(gw_chunk + 1), gw_addr.eq(gw_addr + 1)]

        # Z beats arrive per group in (row, k, half) order; row r goes to its own memory.
        tw_half = Signal()
        tw_k = Signal(range(R))
        tw_row = Signal(range(ROWS))
        loaded = Signal(14)
        for r in range(ROWS):
            m.d.comb += [
                row_w[r].addr.eq(Mux(lbank, tw_k + R, tw_k)),
                row_w[r].data.eq(Cat(self.s.payload, self.s.payload)),
                row_w[r].en.eq(Mux(z_fire & (tw_row == r), Mux(tw_half, 0b10, 0b01), 0)),
            ]
        with m.If(z_fire):
            m.d.sync += tw_half.eq(~tw_half)
            with m.If(tw_half):
                with m.If(tw_k == Km1):
                    m.d.sync += tw_k.eq(0)
                    with m.If(tw_row == ROWS - 1):
                        m.d.sync += [tw_row.eq(0), lbank.eq(~lbank), loaded.eq(loaded + 1)]
                        with m.If(lbank):
                            m.d.sync += full[1].eq(1)
                        with m.Else():
                            m.d.sync += full[0].eq(1)
                        with m.If(loaded == gm1):
                            m.d.sync += z_phase.eq(0)
                    with m.Else():
                        m.d.sync += tw_row.eq(tw_row + 1)
                with m.Else():
                    m.d.sync += tw_k.eq(tw_k + 1)

        # ---------------------------------------------------------------- MAC issue
        out = OutputStage(m, self, self.acc_bits, p, self.OUT_DEPTH, "out")
        pending = Signal(range(self.OUT_DEPTH + 1))     # results issued, not yet sent on m
        cbank = Signal()
        k_c = Signal(range(R))
        d_c = Signal(16)
        g_c = Signal(range(FE))
        computed = Signal(14)
        comp_done = Signal()
        last_k = Signal()
        issue = Signal()
        m.d.comb += [
            last_k.eq(k_c == Km1),
            issue.eq(busy & ~comp_done & Mux(cbank, full[1], full[0]) &
                     (~last_k | (pending < self.OUT_DEPTH))),
            g_r.addr.eq(g_c),
        ]
        for r in range(ROWS):
            m.d.comb += row_r[r].addr.eq(Mux(cbank, k_c + R, k_c))
        with m.If(issue):
            with m.If(last_k):
                m.d.sync += k_c.eq(0)
                with m.If(d_c == dm1):
                    m.d.sync += [d_c.eq(0), g_c.eq(0), cbank.eq(~cbank), computed.eq(computed + 1)]
                    with m.If(cbank):
                        m.d.sync += full[1].eq(0)
                    with m.Else():
                        m.d.sync += full[0].eq(0)
                    with m.If(computed == gm1):
                        m.d.sync += comp_done.eq(1)
                with m.Else():
                    m.d.sync += [d_c.eq(d_c + 1), g_c.eq(g_c + 1)]
            with m.Else():
                m.d.sync += [k_c.eq(k_c + 1), g_c.eq(g_c + 1)]

        # ---------------------------------------------------------------- MAC pipeline
        s1_v, s1_first, s1_last = Signal(), Signal(), Signal()
        m.d.sync += [s1_v.eq(issue), s1_first.eq(k_c == 0), s1_last.eq(last_k)]
        # Stage 1 -> 2: 128 products of the buffers' outputs.
        g_lanes = words(g_r.data, LANES, CODE_BITS)
        pbits = product_bits(DATA_BITS, CODE_BITS)
        prods = []
        for r in range(ROWS):
            z_lanes = words(row_r[r].data, LANES, DATA_BITS)
            row = []
            for lane in range(LANES):
                prod = Signal(signed(pbits), name=f"prod_{r}_{lane}")
                m.d.sync += prod.eq(z_lanes[lane] * g_lanes[lane])
                row.append(prod)
            prods.append(row)
        s2_v, s2_first, s2_last = Signal(), Signal(), Signal()
        m.d.sync += [s2_v.eq(s1_v), s2_first.eq(s1_first), s2_last.eq(s1_last)]
        # Stage 2 -> 3: lane sums.
        sbits = accumulator_bits(DATA_BITS, CODE_BITS, LANES)
        sums = []
        for r in range(ROWS):
            s = Signal(signed(sbits), name=f"sum_{r}")
            m.d.sync += s.eq(adder_tree(prods[r]))
            sums.append(s)
        s3_v, s3_first, s3_last = Signal(), Signal(), Signal()
        m.d.sync += [s3_v.eq(s2_v), s3_first.eq(s2_first), s3_last.eq(s2_last)]
        # Stage 3 -> 4: accumulate over the K entries of a row.
        accs = []
        for r in range(ROWS):
            acc = Signal(signed(self.acc_bits), name=f"acc_{r}")
            with m.If(s3_v):
                m.d.sync += acc.eq(Mux(s3_first, 0, acc) + sums[r])
            accs.append(acc)
        s4_write = Signal()
        m.d.sync += s4_write.eq(s3_v & s3_last)
        # Stage 4: rescale the 8 results into one output beat.
        m.d.comb += [out.values[r].eq(accs[r]) for r in range(ROWS)]
        m.d.comb += out.write.eq(s4_write)
        m.d.sync += pending.eq(pending + (issue & last_k) - out.fire)

        # ---------------------------------------------------------------- start / busy
        with m.If(self.start):
            m.d.sync += [
                busy.eq(1), g_phase.eq(1), z_phase.eq(0), full.eq(0), lbank.eq(0), cbank.eq(0),
                gw_half.eq(0), gw_chunk.eq(0), gw_d.eq(0), gw_b.eq(0), gw_addr.eq(0),
                gw_dbase.eq(0), gw_bbase.eq(0),
                tw_half.eq(0), tw_k.eq(0), tw_row.eq(0), loaded.eq(0),
                k_c.eq(0), d_c.eq(0), g_c.eq(0), computed.eq(0), comp_done.eq(0),
            ]
        with m.Elif(busy & comp_done & ((pending == 0) | ((pending == 1) & out.fire))):
            m.d.sync += busy.eq(0)
        return m

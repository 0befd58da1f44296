"""PE2: ``Z'(a,d,c) = sum_b Z(a,b,c) G(b,d)`` with 128 MACs (16 lanes on c x 8 outputs on d).

Stream layouts are those of :mod:`insitu.tt.pe_stream` (in: ``G (b, d8)`` then ``Z (a, C, b, 16)``;
out: ``(a, C, d8, 16)``). With ``G8 = d8/8`` groups of 8 outputs:

* **factor buffer**: entries of 8 codes x 4 bits (one beat each, depth ``factor_words/8``), stored
  in ``(group, b)`` order (address ``g*b + b``) so that the MAC loop reads it sequentially;
* **tile buffer**: a tile is ``(a, chunk)``: ``b`` entries of 16 words (two beats per entry), two
  banks (ping-pong): the next tile loads while the current one computes;
* **MAC loop** per tile: for each group ``g`` of 8 d's, for each ``b``: 16 lanes x 8 d's = 128
  products into 128 accumulators; after ``b`` cycles the 128 results go to a shadow bank that
  drains (8 x RoundShiftSaturate, d then lane: 16 beats) into the output FIFO one beat per cycle
  while the next group accumulates;
* pipeline: issue (buffer addresses) -> buffer data -> DSP A/B registers -> M -> P (64 DSPs,
  two products each, see :func:`~insitu.rtl.pe_common.pack_codes`) -> 128 accumulators ->
  shadow bank -> rescale -> register -> output FIFO. The cycle that completes a group issues only when
  the shadow bank is sure to be drained by the time the new results reach it (at most
  ``DRAIN_SLACK`` beats left and room for them in the FIFO), so back-pressure on ``m`` only
  stalls issue.

One MAC cycle per clock in steady state as long as ``b >= 16`` (a group's 16 output beats drain
while the next group computes) and the input keeps up: a tile's ``2*b`` beats load during its
predecessor's ``G8*b`` MAC cycles, so ``d <= 8`` (one group) is bound by the input stream.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib.memory import Memory

from insitu.numerics import accumulator_bits

from .params import DEFAULT_PARAMS, STREAM_WORDS, AcceleratorParams
from .pe_common import (CODE_BITS, DATA_BITS, PACK_BIAS, PACK_BITS, PACKED_PRODUCT_BITS,
                        OutputStage, check_params, common_cfg_errors, drive_cfg_error, pack_codes,
                        payload_codes, unpack_products, words)
from .pe_interface import PE
from .regmap import ErrorCode


class PE2(PE):
    """The PE2 contraction (see the module docstring)."""

    #: Output FIFO entries.
    OUT_DEPTH = 16
    #: Beats the shadow bank may still hold when a group's last MAC cycle issues: they drain in
    #: the cycles before the new results arrive (issue -> products -> accumulators -> shadow).
    DRAIN_SLACK = 6

    def __init__(self, params: AcceleratorParams = DEFAULT_PARAMS):
        check_params(params, "PE2")
        self.params = params
        self.outs = params.pe_rows                      # d outputs at once
        self.lanes = params.c_lanes
        self.b_max = params.pe2_b_max
        self.factor_entries = params.factor_words // params.pe_rows
        #: a * c below this keeps both beat counts below 2**32: OUT_BEATS = a*c*ceil(d/8) with
        #: ceil(d/8) <= factor_entries, IN_BEATS = b*(8*ceil(d/8) + a*c)/8 with b <= pe2_b_max.
        self.ac_limit = (1 << 32) // self.factor_entries
        if self.b_max * (params.factor_words + self.ac_limit) >= 1 << 35:
            raise ValueError("PE2: pe2_b_max too large for 32-bit beat counts")
        #: Accumulator width: never overflows for ``b <= pe2_b_max`` terms.
        self.acc_bits = accumulator_bits(DATA_BITS, CODE_BITS, self.b_max)
        #: Simulation check: high in a cycle where the shadow bank would be overwritten before it
        #: drained (never, by construction).
        self.overrun = Signal()
        super().__init__()

    def elaborate(self, platform):
        m = Module()
        p = self.params
        OUTS, LANES, B, FE = self.outs, self.lanes, self.b_max, self.factor_entries
        a, b, c, d = self.a, self.b, self.c, self.d

        # ---------------------------------------------------------------- configuration
        C = Signal(12)                          # lane chunks c/16
        G8 = Signal(14)                         # groups of 8 d's: ceil(d/8)
        m.d.comb += [C.eq(c >> 4), G8.eq((d + 7) >> 3)]
        checks, shift_check = common_cfg_errors(a, b, c, d, self.shift, p)
        # Beat counts must fit 32 bits (the top level's counters, an AXI DMA transfer). With
        # b <= pe2_b_max and b * ceil(d/8) <= factor_words / 8, bounding a * c does it without a
        # wide multiplier: see ac_limit.
        # One product each for a*c and b*G8, shared by the checks, the beat counts and the tile
        # count (a*c/16), so that each is one DSP.
        ac, bg = Signal(32), Signal(30)
        m.d.comb += [ac.eq(a * c), bg.eq(b * G8)]
        in_beats, out_beats = bg + ((b * ac) >> 3), ac * G8
        drive_cfg_error(m, self.cfg_error, checks + [
            (b > B, ErrorCode.TILE),
            (ac >= self.ac_limit, ErrorCode.TILE),
            (bg > FE, ErrorCode.FACTOR_WORDS),
            shift_check,
        ])
        m.d.comb += [self.in_beats.eq(in_beats[:32]), self.out_beats.eq(out_beats[:32])]
        # Derived sizes, registered (the configuration is stable from START on; the first use is
        # in the cycle after START). Meaningful for accepted configurations only.
        bm1 = Signal(range(B))
        gm1 = Signal(13)
        tm1 = Signal(28)                        # tiles - 1: a*C - 1
        m.d.sync += [bm1.eq(b - 1), gm1.eq(G8 - 1), tm1.eq((ac >> 4) - 1)]

        # ---------------------------------------------------------------- buffers
        m.submodules.gmem = gmem = Memory(shape=OUTS * CODE_BITS, depth=FE, init=[])
        g_w = gmem.write_port()
        g_r = gmem.read_port()
        m.submodules.tile = tmem = Memory(shape=LANES * DATA_BITS, depth=2 * B, init=[])
        t_w = tmem.write_port(granularity=STREAM_WORDS * DATA_BITS)
        t_r = tmem.read_port()

        busy = self.busy
        full = Signal(2)                        # tile bank holds a complete tile

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

        # G beats arrive in (b, group) order; entry address group*b + b.
        gw_g = Signal(13)
        gw_b = Signal(range(B))
        gw_addr = Signal(16)
        m.d.comb += [
            g_w.addr.eq(gw_addr),
            g_w.data.eq(payload_codes(self.s.payload)),
            g_w.en.eq(g_fire),
        ]
        with m.If(g_fire):
            with m.If(gw_g == gm1):
                m.d.sync += [gw_g.eq(0), gw_b.eq(gw_b + 1), gw_addr.eq(gw_b + 1)]
                with m.If(gw_b == bm1):
                    m.d.sync += [g_phase.eq(0), z_phase.eq(1)]
            with m.Else():
                m.d.sync += [gw_g.eq(gw_g + 1), gw_addr.eq(gw_addr + b)]

        # Z beats arrive per tile in (b, half) order.
        tw_half = Signal()
        tw_k = Signal(range(B))
        loaded = Signal(28)
        m.d.comb += [
            t_w.addr.eq(Mux(lbank, tw_k + B, tw_k)),
            t_w.data.eq(Cat(self.s.payload, self.s.payload)),
            t_w.en.eq(Mux(z_fire, Mux(tw_half, 0b10, 0b01), 0)),
        ]
        with m.If(z_fire):
            m.d.sync += tw_half.eq(~tw_half)
            with m.If(tw_half):
                with m.If(tw_k == bm1):
                    m.d.sync += [tw_k.eq(0), lbank.eq(~lbank), loaded.eq(loaded + 1)]
                    with m.If(lbank):
                        m.d.sync += full[1].eq(1)
                    with m.Else():
                        m.d.sync += full[0].eq(1)
                    with m.If(loaded == tm1):
                        m.d.sync += z_phase.eq(0)
                with m.Else():
                    m.d.sync += tw_k.eq(tw_k + 1)

        # ---------------------------------------------------------------- MAC issue
        out = OutputStage(m, self, self.acc_bits, p, self.OUT_DEPTH, "out", registered=True)
        pending = Signal(range(8 * OUTS * 2 * 4))       # output beats issued, not yet sent
        drain_left = Signal(range(2 * OUTS + 1))        # beats left in the shadow bank
        # Flags of the MAC pipeline (below): stage k holds a group's last b while sk_last.
        s_last = [Signal(name=f"s{k}_holds_last") for k in range(1, 5)]
        s5_load = Signal()
        cbank = Signal()
        cc_b = Signal(range(B))
        cc_g = Signal(13)
        g_c = Signal(range(FE))
        computed = Signal(28)
        comp_done = Signal()
        last_b = Signal()
        avail = Signal()
        shadow_ok = Signal()
        issue = Signal()
        m.d.comb += [
            last_b.eq(cc_b == bm1),
            # Entry cc_b is in the bank: the bank is full, or it is the one loading and the entry
            # is complete (the MAC loop chases the loader through a tile it is waiting for).
            avail.eq(Mux(cbank, full[1], full[0]) | ((lbank == cbank) & (cc_b < tw_k))),
            shadow_ok.eq(~Cat(*s_last).any() & ~s5_load &
                         (drain_left <= self.DRAIN_SLACK) & (out.free >= drain_left)),
            issue.eq(busy & ~comp_done & avail & (~last_b | shadow_ok)),
            t_r.addr.eq(Mux(cbank, cc_b + B, cc_b)),
            g_r.addr.eq(g_c),
        ]
        with m.If(issue):
            with m.If(last_b):
                m.d.sync += cc_b.eq(0)
                with m.If(cc_g == gm1):
                    m.d.sync += [cc_g.eq(0), g_c.eq(0), cbank.eq(~cbank), computed.eq(computed + 1)]
                    with m.If(cbank):
                        m.d.sync += full[1].eq(0)
                    with m.Else():
                        m.d.sync += full[0].eq(0)
                    with m.If(computed == tm1):
                        m.d.sync += comp_done.eq(1)
                with m.Else():
                    m.d.sync += [cc_g.eq(cc_g + 1), g_c.eq(g_c + 1)]
            with m.Else():
                m.d.sync += [cc_b.eq(cc_b + 1), g_c.eq(g_c + 1)]

        # ---------------------------------------------------------------- MAC pipeline
        # Flags (valid, first b, last b) of stage k: the cycle in which stage k's data is valid.
        flags = [(issue, cc_b == 0, last_b)]
        for k in range(1, 5):
            f = (Signal(name=f"s{k}_v"), Signal(name=f"s{k}_first"), Signal(name=f"s{k}_last"))
            m.d.sync += [x.eq(y) for x, y in zip(f, flags[-1])]
            m.d.comb += s_last[k - 1].eq(f[0] & f[2])
            flags.append(f)
        # Stage 1 -> 2: the buffers' outputs, registered (DSP A/B registers): 16 z words, and
        # the codes of each pair of d's packed into one operand.
        z_lanes = words(t_r.data, LANES, DATA_BITS)
        g_codes = words(g_r.data, OUTS, CODE_BITS)
        z_r = [Signal(signed(DATA_BITS), name=f"z_{lane}") for lane in range(LANES)]
        packed = [Signal(signed(PACK_BITS), name=f"gpack_{j}") for j in range(OUTS // 2)]
        m.d.sync += [zr.eq(z) for zr, z in zip(z_r, z_lanes)]
        m.d.sync += [packed[j].eq(pack_codes(g_codes[2 * j], g_codes[2 * j + 1]))
                     for j in range(OUTS // 2)]
        # Stage 2 -> 3 -> 4: 128 products (d-major, lane-minor) as 64 wide products, one DSP each:
        # z * (g0 + g1 * 2**20) + bias, with M and P registers.
        wide = {}
        for j in range(OUTS // 2):
            for lane in range(LANES):
                m_r = Signal(signed(PACKED_PRODUCT_BITS), name=f"mul_{j}_{lane}")
                p_r = Signal(signed(PACKED_PRODUCT_BITS), name=f"wide_{j}_{lane}")
                m.d.sync += [m_r.eq(z_r[lane] * packed[j]), p_r.eq(m_r + PACK_BIAS)]
                wide[j, lane] = unpack_products(p_r)
        prods = [wide[j // 2, lane][j % 2] for j in range(OUTS) for lane in range(LANES)]
        # Stage 4 -> 5: accumulate over b.
        s4_v, s4_first, s4_last = flags[4]
        accs = []
        for i, prod in enumerate(prods):
            acc = Signal(signed(self.acc_bits), name=f"acc_{i // LANES}_{i % LANES}")
            with m.If(s4_v):
                m.d.sync += acc.eq(Mux(s4_first, 0, acc) + prod)
            accs.append(acc)
        m.d.sync += s5_load.eq(s4_v & s4_last)

        # ---------------------------------------------------------------- shadow bank, drain
        shadow = [Signal(signed(self.acc_bits), name=f"shadow_{i}") for i in range(len(accs))]
        drain_write = Signal()
        m.d.comb += [
            drain_write.eq((drain_left != 0) & (out.free != 0)),
            out.write.eq(drain_write),
        ]
        m.d.comb += [out.values[k].eq(shadow[k]) for k in range(STREAM_WORDS)]
        with m.If(drain_write):
            m.d.sync += [shadow[i].eq(shadow[i + STREAM_WORDS])
                         for i in range(len(shadow) - STREAM_WORDS)]
            m.d.sync += drain_left.eq(drain_left - 1)
        with m.If(s5_load):
            m.d.sync += [sh.eq(acc) for sh, acc in zip(shadow, accs)]
            m.d.sync += drain_left.eq(len(shadow) // STREAM_WORDS)
        m.d.comb += self.overrun.eq(s5_load & (drain_left != 0) &
                                    ~((drain_left == 1) & drain_write))
        m.d.sync += pending.eq(pending + Mux(issue & last_b, len(shadow) // STREAM_WORDS, 0)
                               - out.fire)

        # ---------------------------------------------------------------- start / busy
        with m.If(self.start):
            m.d.sync += [
                busy.eq(1), g_phase.eq(1), z_phase.eq(0), full.eq(0), lbank.eq(0), cbank.eq(0),
                gw_g.eq(0), gw_b.eq(0), gw_addr.eq(0), tw_half.eq(0), tw_k.eq(0), loaded.eq(0),
                cc_b.eq(0), cc_g.eq(0), g_c.eq(0), computed.eq(0), comp_done.eq(0),
            ]
        with m.Elif(busy & comp_done & ((pending == 0) | ((pending == 1) & out.fire))):
            m.d.sync += busy.eq(0)
        return m

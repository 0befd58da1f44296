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
  two products each, see :func:`~insitu.rtl.pe_common.pack_codes`) -> 128 accumulators (started
  at SHIFT's rounding term) -> shadow bank -> shift -> saturate into the output FIFO. The cycle
  that completes a group issues only when the shadow bank is sure to be drained by the time the
  new results reach it (at most ``DRAIN_SLACK`` beats left and room for them in the FIFO), so
  back-pressure on ``m`` only stalls issue. The issue's conditions (last b, last group, last
  tile, that shadow-bank check) are registers computed a cycle ahead.
* configuration: ``cfg_error``, ``in_beats``, ``out_beats`` are registers settled ``CFG_STAGES``
  cycles after a configuration change (``cfg_ready``); the products are LUT adder trees with two
  adder levels a cycle (no DSP).

One MAC cycle per clock in steady state as long as ``b >= 16`` (a group's 16 output beats drain
while the next group computes) and the input keeps up: a tile's ``2*b`` beats load during its
predecessor's ``G8*b`` MAC cycles, so ``d <= 8`` (one group) is bound by the input stream.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib.memory import Memory

from insitu.numerics import accumulator_bits

from insitu.accel.params import DEFAULT_PARAMS, STREAM_WORDS, AcceleratorParams
from .pe_common import (CODE_BITS, DATA_BITS, PACK_BIAS, PACK_BITS, PACKED_PRODUCT_BITS,
                        OutputStage, TileSequencer, check_params, common_cfg_errors, delayed, drive_cfg_error,
                        pack_codes, payload_codes, pipelined_product, unpack_products, words)
from .pe_interface import PE, settled
from insitu.accel.regmap import ErrorCode


class PE2(PE):
    """The PE2 contraction (see the module docstring)."""

    #: Output FIFO entries.
    OUT_DEPTH = 16
    #: Beats the shadow bank may still hold when a group's last MAC cycle issues: they drain in
    #: the cycles before the new results arrive (issue -> products -> accumulators -> shadow).
    DRAIN_SLACK = 6
    #: Registered cycles from a configuration change to its cfg_error / in_beats / out_beats.
    CFG_STAGES = 5

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
        # cfg_error, in_beats and out_beats are registers, settled CFG_STAGES cycles after a
        # configuration change (cfg_ready): as combinational products they were 16 ns (a DSP
        # chain) from SIZE_* to IN_BEATS. The products are adder trees in LUTs, two adder levels
        # a cycle (pe_common.pipelined_product); the stage of each signal is in its comment.
        # Beat counts must fit 32 bits (the top level's counters, an AXI DMA transfer). With
        # b <= pe2_b_max and b * ceil(d/8) <= factor_words / 8, bounding a * c does it without a
        # wide multiplier: see ac_limit.
        m.d.comb += self.cfg_ready.eq(settled(m, [a, b, c, d, self.shift], self.CFG_STAGES - 1))
        g8_1 = Signal(14)                                                      # 1: ceil(d/8)
        m.d.sync += g8_1.eq((d + 7) >> 3)
        ac2, n_ac = pipelined_product(m, c, a, 32, "ac")                       # 2
        bg3, n_bg = pipelined_product(m, b, g8_1, 30, "bg")                    # 3
        # in_beats = b*G8 + b*a*c/8, out_beats = a*c*G8, exact modulo 2**32 for every
        # configuration (the driver compares IN_BEATS with its stream, also for a refused one).
        bac4, n_bac = pipelined_product(m, ac2, b, 35, "bac")                  # 4
        out4, n_out = pipelined_product(m, ac2, g8_1, 32, "out")               # 4
        assert (n_ac, n_bg, n_bac, n_out) == (2, 2, 2, 2)
        in5 = Signal(32)                                                       # 5
        m.d.sync += in5.eq(delayed(m, bg3, 1, "bg") + bac4[3:])
        m.d.comb += [self.in_beats.eq(in5), self.out_beats.eq(out4)]
        checks, shift_check = common_cfg_errors(a, b, c, d, self.shift, p)
        flags1 = Signal(len(checks) + 2)        # 1: ZERO_SIZE, C_LANES, SHIFT, b > B
        m.d.sync += flags1.eq(Cat(*(cond for cond, _ in checks + [shift_check]), b > B))
        flags3 = delayed(m, flags1, 2, "flags")
        ac_big3 = Signal()                                                     # 3
        m.d.sync += ac_big3.eq(ac2 >= self.ac_limit)
        drive_cfg_error(m, self.cfg_error, [                                   # 4
            (flags3[0], checks[0][1]), (flags3[1], checks[1][1]),
            (flags3[3] | ac_big3, ErrorCode.TILE),
            (bg3 > FE, ErrorCode.FACTOR_WORDS),
            (flags3[2], shift_check[1]),
        ], domain="sync")
        # Derived sizes, registered from the pipeline (a START comes only once cfg_ready is high;
        # the first use is in the cycle after START). Meaningful for accepted configurations.
        bm1, bm2 = Signal(range(B)), Signal(range(B))
        gm1, gm2 = Signal(13), Signal(13)
        tm1, tm2 = Signal(28), Signal(28)       # tiles - 1, - 2: a*C - 1, - 2
        one_b, one_g, one_t = Signal(), Signal(), Signal()
        m.d.sync += [bm1.eq(b - 1), bm2.eq(b - 2), one_b.eq(b == 1),
                     gm1.eq(g8_1 - 1), gm2.eq(g8_1 - 2), one_g.eq(g8_1 == 1),
                     tm1.eq((ac2 >> 4) - 1), tm2.eq((ac2 >> 4) - 2), one_t.eq((ac2 >> 4) == 1)]

        # ---------------------------------------------------------------- buffers
        m.submodules.gmem = gmem = Memory(shape=OUTS * CODE_BITS, depth=FE, init=[])
        g_w = gmem.write_port()
        g_r = gmem.read_port()
        m.submodules.tile = tmem = Memory(shape=LANES * DATA_BITS, depth=2 * B, init=[])
        t_w = tmem.write_port(granularity=STREAM_WORDS * DATA_BITS)
        t_r = tmem.read_port()

        busy = self.busy

        # ---------------------------------------------------------------- input: G then Z
        m.submodules.tiles = tiles = TileSequencer(tile_count_bits=28)
        lbank, cbank = tiles.load_bank, tiles.compute_bank
        g_fire, z_fire = tiles.g_fire, tiles.z_fire
        m.d.comb += [tiles.start.eq(self.start), tiles.s_valid.eq(self.s.valid),
                     self.s.ready.eq(tiles.s_ready),
                     tiles.tiles_m1.eq(tm1), tiles.tiles_m2.eq(tm2), tiles.one_tile.eq(one_t)]

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
                m.d.comb += tiles.g_done.eq(gw_b == bm1)
            with m.Else():
                m.d.sync += [gw_g.eq(gw_g + 1), gw_addr.eq(gw_addr + b)]

        # Z beats arrive per tile in (b, half) order.
        tw_half = Signal()
        tw_k = Signal(range(B))
        m.d.comb += [
            t_w.addr.eq(Mux(lbank, tw_k + B, tw_k)),
            t_w.data.eq(Cat(self.s.payload, self.s.payload)),
            t_w.en.eq(Mux(z_fire, Mux(tw_half, 0b10, 0b01), 0)),
        ]
        with m.If(z_fire):
            m.d.sync += tw_half.eq(~tw_half)
            with m.If(tw_half):
                with m.If(tw_k == bm1):
                    m.d.sync += tw_k.eq(0)
                    m.d.comb += tiles.tile_loaded.eq(1)
                with m.Else():
                    m.d.sync += tw_k.eq(tw_k + 1)

        # ---------------------------------------------------------------- MAC issue
        out = OutputStage(m, self, self.acc_bits, p, self.OUT_DEPTH, "out", registered=True)
        pending = Signal(range(8 * OUTS * 2 * 4))       # output beats issued, not yet sent
        drain_left = Signal(range(2 * OUTS + 1))        # beats left in the shadow bank
        # Flags of the MAC pipeline (below): stage k holds a group's last b while sk_last.
        s_last = [Signal(name=f"s{k}_holds_last") for k in range(1, 5)]
        s5_load = Signal()
        cc_b = Signal(range(B))
        cc_g = Signal(13)
        g_c = Signal(range(FE))
        # Registered one cycle ahead (the issue logic was 9-10 LUT levels into pending and
        # comp_done): last_b = (cc_b == b-1), last_g = (cc_g == G8-1), the sequencer's
        # last_tile, and shadow_ok, the shadow bank's check for a group's last cycle (below).
        last_b, last_g = Signal(), Signal()
        avail = Signal()
        shadow_ok = Signal()
        issue = Signal()
        m.d.comb += [
            # Entry cc_b is in the bank: the bank is full, or it is the one loading and the entry
            # is complete (the MAC loop chases the loader through a tile it is waiting for).
            avail.eq(tiles.compute_full | ((lbank == cbank) & (cc_b < tw_k))),
            issue.eq(busy & ~tiles.done & avail & (~last_b | shadow_ok)),
            t_r.addr.eq(Mux(cbank, cc_b + B, cc_b)),
            g_r.addr.eq(g_c),
        ]
        with m.If(issue):
            with m.If(last_b):
                m.d.sync += [cc_b.eq(0), last_b.eq(one_b)]
                with m.If(last_g):
                    m.d.sync += [cc_g.eq(0), g_c.eq(0), last_g.eq(one_g)]
                    m.d.comb += tiles.tile_consumed.eq(1)
                with m.Else():
                    m.d.sync += [cc_g.eq(cc_g + 1), g_c.eq(g_c + 1), last_g.eq(cc_g == gm2)]
            with m.Else():
                m.d.sync += [cc_b.eq(cc_b + 1), g_c.eq(g_c + 1), last_b.eq(cc_b == bm2)]

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
        # The accumulators start at the rounding term (out.half; one bit wider for it).
        for i, prod in enumerate(prods):
            acc = Signal(signed(self.acc_bits + 1), name=f"acc_{i // LANES}_{i % LANES}")
            with m.If(s4_v):
                m.d.sync += acc.eq(Mux(s4_first, out.half, acc) + prod)
            accs.append(acc)
        m.d.sync += s5_load.eq(s4_v & s4_last)

        # ---------------------------------------------------------------- shadow bank, drain
        shadow = [Signal(signed(self.acc_bits + 1), name=f"shadow_{i}") for i in range(len(accs))]
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
        # shadow_ok of the next cycle, from this cycle's state: no group's last b in stages 1-4
        # nor loading the shadow bank then (both shift in from this cycle's issue and stages),
        # at most DRAIN_SLACK beats left in it and room for them in the FIFO. The drain takes
        # one beat off both sides of free >= drain_left and a beat sent on m adds one to free:
        # exactly the combinational check of the cycle after.
        drain_next = drain_left - drain_write
        m.d.sync += shadow_ok.eq(
            ~(issue & last_b) & ~Cat(*s_last).any() & ~s5_load &
            (drain_next <= self.DRAIN_SLACK) &
            ((out.free >= drain_left) | (out.fire & (out.free + 1 == drain_left))))
        # A group's beats count in pending a cycle after its last issue (added: the issue logic
        # was in front of pending's adder); the end of the op waits for added too.
        added = Signal()
        m.d.sync += added.eq(issue & last_b)
        m.d.sync += pending.eq(pending + Mux(added, len(shadow) // STREAM_WORDS, 0) - out.fire)

        # ---------------------------------------------------------------- start / busy
        with m.If(self.start):
            m.d.sync += [
                busy.eq(1),
                gw_g.eq(0), gw_b.eq(0), gw_addr.eq(0), tw_half.eq(0), tw_k.eq(0),
                cc_b.eq(0), cc_g.eq(0), g_c.eq(0),
                last_b.eq(one_b), last_g.eq(one_g),
            ]
        with m.Elif(busy & tiles.done & ~added & ((pending == 0) | ((pending == 1) & out.fire))):
            m.d.sync += busy.eq(0)
        return m

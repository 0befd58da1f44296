"""PE1: ``Z'(a,d) = sum_{b,c} Z(a,b,c) G(b,d,c)`` with 128 MACs on 64 DSPs (8 rows on a x 8
lanes on c x 2 d's).

Stream layouts are those of :mod:`insitu.tt.pe_stream` (in: ``G (b,d,c)`` then ``Z (a8,b,c)``;
out: ``(a8/8, d, 8)``). With ``C = c/16`` lane chunks and ``K = b*C`` entries of 16 words per row:

* **factor buffer**: ``G`` as entries of 2 d's x 8 lanes of codes (depth ``factor_words/16 + R``),
  stored in ``(d pair, b, chunk, half)`` order (address ``(d//2)*2K + 2*(b*C + chunk) + half``,
  32-bit slot ``d%2``) so that the MAC loop reads it sequentially;
* **tile buffers**: one memory per row of a group of 8 rows, one beat (8 lanes) per half-entry,
  two banks (ping-pong): group ``g+1`` loads while group ``g`` computes;
* **MAC loop** per group: for each pair of d's, for each half-entry ``e < 2K``: the 8 rows' half-entry
  ``e`` times the two d's codes: 64 DSPs, each ``z * (g_d0 + g_d1 * 2**20)`` (two MACs, see
  :func:`~insitu.rtl.pe_common.pack_codes`), 16 adder trees over 8 lanes, 16 accumulators; after
  ``2K`` cycles the pair's 16 results go to a hold register and leave as two output beats
  (8 x RoundShiftSaturate); the accumulators start at SHIFT's rounding term, so the rescaler
  only shifts (registered) and saturates;
* pipeline: issue (buffer addresses) -> buffer data -> DSP A/B registers -> M -> P -> 16 lane sums
  -> 16 accumulators (and the hold register) -> shift -> saturate into the output FIFO. A pair's
  last cycle issues only while the FIFO has room for every result still in flight (credits), so
  back-pressure on ``m`` only stalls issue. The issue's conditions (last half-entry, last pair,
  last group, the credit) are registers computed a cycle ahead.
* configuration: ``cfg_error``, ``in_beats``, ``out_beats`` are registers settled ``CFG_STAGES``
  cycles after a configuration change (``cfg_ready``); the beat counts are LUT adder trees with
  two adder levels a cycle (no DSP).

One MAC cycle per clock in steady state: loading a group (``16*K`` beats) overlaps the previous
group's ``2*ceil(d/2)*K`` MAC cycles (an odd d leaves the last pair's second half idle); there is
no dead cycle between pairs or groups.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib.memory import Memory

from insitu.numerics import accumulator_bits

from insitu.accel.params import DEFAULT_PARAMS, STREAM_WORDS, AcceleratorParams
from .pe_common import (CODE_BITS, DATA_BITS, PACK_BIAS, PACK_BITS, PACKED_PRODUCT_BITS,
                        OutputStage, TileSequencer, adder_tree, check_params, common_cfg_errors, delayed,
                        drive_cfg_error, lut_product, pack_codes, payload_codes,
                        pipelined_product, unpack_products, words)
from .pe_interface import PE, settled
from insitu.accel.regmap import ErrorCode


class PE1(PE):
    """The PE1 contraction (see the module docstring)."""

    #: Output FIFO entries (also the most results in flight: pipeline + FIFO).
    OUT_DEPTH = 16
    #: Registered cycles from a configuration change to its cfg_error / in_beats / out_beats.
    CFG_STAGES = 5

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
        HALF = STREAM_WORDS                     # lanes per half-entry (one beat)
        a, b, c, d = self.a, self.b, self.c, self.d

        # ---------------------------------------------------------------- configuration
        # cfg_error, in_beats and out_beats are registers, settled CFG_STAGES cycles after a
        # configuration change (cfg_ready): as combinational products they were 16 ns (a DSP
        # chain) from SIZE_* to IN_BEATS. The products are adder trees in LUTs, two adder levels
        # a cycle (pe_common.pipelined_product); the stage of each signal is in its comment.
        C = Signal(12)                          # lane chunks c/16
        m.d.comb += C.eq(c >> 4)
        m.d.comb += self.cfg_ready.eq(settled(m, [a, b, c, d, self.shift], self.CFG_STAGES - 1))
        groups1 = Signal(14)                    # 1: groups of 8 rows, ceil(a/8)
        x1 = Signal(17)                         # 1: d + 8*groups (< 2**17)
        m.d.sync += [groups1.eq((a + 7) >> 3), x1.eq(d + ((a + 7) & ~7))]
        # in_beats = b*c*(d + 8*groups) / 8, exact modulo 2**32 for every configuration (the
        # driver compares IN_BEATS with its stream, also for one the PE refuses).
        bc2, n_bc = pipelined_product(m, c, b, 32, "bc")                       # 2
        bcx5, n_in = pipelined_product(m, bc2, x1, 35, "in")                   # 5
        out3, n_out = pipelined_product(m, d, groups1, 30, "out")              # 3
        assert (n_bc, n_in, n_out) == (2, 3, 2)
        m.d.comb += [self.in_beats.eq(bcx5[3:]), self.out_beats.eq(out3)]
        # The checks: K = b*C entries per row. The priority order lets each product be small:
        # TILE sees b, C <= R through bits(R); FACTOR_WORDS comes after TILE, so K <= R there,
        # and d <= FE through bits(FE).
        rb, fb = R.bit_length(), FE.bit_length()
        checks, shift_check = common_cfg_errors(a, b, c, d, self.shift, p)
        flags1 = Signal(len(checks) + 1)        # 1: ZERO_SIZE, C_LANES, SHIFT
        tile1, d_big1 = Signal(), Signal()
        K1 = Signal(2 * rb)                     # 1
        m.d.sync += [flags1.eq(Cat(*(cond for cond, _ in checks + [shift_check]))),
                     tile1.eq((b > R) | (C > R)), d_big1.eq(d > FE),
                     K1.eq(lut_product(b[:rb], C[:rb]))]
        kd2 = Signal(rb + fb)                   # 2
        tile2 = Signal()
        flags2, d_big2 = delayed(m, flags1, 1, "flags"), delayed(m, d_big1, 1, "d_big")
        m.d.sync += [kd2.eq(lut_product(K1[:rb], d[:fb])), tile2.eq(tile1 | (K1 > R))]
        drive_cfg_error(m, self.cfg_error, [                                   # 3
            (flags2[0], checks[0][1]), (flags2[1], checks[1][1]),
            (tile2, ErrorCode.TILE),
            (d_big2 | (kd2 > FE), ErrorCode.FACTOR_WORDS),
            (flags2[2], shift_check[1]),
        ], domain="sync")
        # Derived sizes, registered from the pipeline (a START comes only once cfg_ready is high;
        # the first use is in the cycle after START). Meaningful for accepted configurations.
        E = Signal(range(2 * R + 1))            # half-entries (beats) per row: 2*b*C
        Em1, Em2 = Signal(range(2 * R)), Signal(range(2 * R))
        Cm1 = Signal(range(R))
        bm1, dm1, Pm1, Pm2, gm1, gm2 = (Signal(16), Signal(16), Signal(15), Signal(15),
                                        Signal(14), Signal(14))
        d_odd, one_pair, one_group = Signal(), Signal(), Signal()
        m.d.sync += [E.eq(K1 << 1), Em1.eq((K1 << 1) - 1), Em2.eq((K1 << 1) - 2), Cm1.eq(C - 1),
                     bm1.eq(b - 1), dm1.eq(d - 1), Pm1.eq((d - 1) >> 1), Pm2.eq(Pm1 - 1),
                     one_pair.eq(d <= 2), gm1.eq(groups1 - 1), gm2.eq(groups1 - 2),
                     one_group.eq(groups1 == 1), d_odd.eq(d[0])]

        # ---------------------------------------------------------------- buffers
        # Factor entry (pair p, half-entry e) at p*2K + e: slot s (32 bits) holds the 8 codes of
        # d = 2p + s for the lanes of e. An odd d leaves the last pair's slot 1 unused, so the
        # entries reach (d+1)*K <= FE + K: R entries of slack.
        m.submodules.gmem = gmem = Memory(shape=2 * HALF * CODE_BITS, depth=FE + R, init=[])
        g_w = gmem.write_port(granularity=HALF * CODE_BITS)
        g_r = gmem.read_port()
        # Row memories: one beat (8 lanes) per half-entry e = 2k + half, two banks of 2R.
        row_w, row_r = [], []
        for r in range(ROWS):
            mem = Memory(shape=HALF * DATA_BITS, depth=4 * R, init=[])
            m.submodules[f"row{r}"] = mem
            row_w.append(mem.write_port())
            row_r.append(mem.read_port())

        busy = self.busy

        # ---------------------------------------------------------------- input: G then Z
        # A tile is a group of 8 rows.
        m.submodules.tiles = tiles = TileSequencer(tile_count_bits=14)
        lbank, cbank = tiles.load_bank, tiles.compute_bank
        g_fire, z_fire = tiles.g_fire, tiles.z_fire
        m.d.comb += [tiles.start.eq(self.start), tiles.s_valid.eq(self.s.valid),
                     self.s.ready.eq(tiles.s_ready),
                     tiles.tiles_m1.eq(gm1), tiles.tiles_m2.eq(gm2), tiles.one_tile.eq(one_group)]

        # G beats arrive in (b, d, chunk, half) order: half-entry e = 2*(b*C + chunk) + half of
        # pair d//2, slot d%2.
        gw_half = Signal()
        gw_chunk = Signal(range(R))
        gw_d, gw_b = Signal(16), Signal(16)
        gw_e, gw_ebase = Signal(range(2 * R + 1)), Signal(range(2 * R + 1))
        gw_pbase = Signal(range(FE + R + 1))
        m.d.comb += [
            g_w.addr.eq(gw_pbase + gw_e),
            g_w.data.eq(Cat(payload_codes(self.s.payload), payload_codes(self.s.payload))),
            g_w.en.eq(Mux(g_fire, Mux(gw_d[0], 0b10, 0b01), 0)),
        ]
        with m.If(g_fire):
            m.d.sync += gw_half.eq(~gw_half)
            with m.If(gw_half & (gw_chunk == Cm1)):
                m.d.sync += gw_chunk.eq(0)
                with m.If(gw_d == dm1):
                    m.d.sync += [gw_d.eq(0), gw_b.eq(gw_b + 1), gw_pbase.eq(0),
                                 gw_ebase.eq(gw_ebase + (C << 1)), gw_e.eq(gw_ebase + (C << 1))]
                    m.d.comb += tiles.g_done.eq(gw_b == bm1)
                with m.Else():
                    m.d.sync += [gw_d.eq(gw_d + 1), gw_e.eq(gw_ebase)]
                    with m.If(gw_d[0]):
                        m.d.sync += gw_pbase.eq(gw_pbase + E)
            with m.Else():
                m.d.sync += gw_e.eq(gw_e + 1)
                with m.If(gw_half):
                    m.d.sync += gw_chunk.eq(gw_chunk + 1)

        # Z beats arrive per group in (row, k, half) order; row r goes to its own memory.
        tw_e = Signal(range(2 * R))
        tw_row = Signal(range(ROWS))
        for r in range(ROWS):
            m.d.comb += [
                row_w[r].addr.eq(Cat(tw_e, lbank) if (2 * R) & (2 * R - 1) == 0
                                 else Mux(lbank, tw_e + 2 * R, tw_e)),
                row_w[r].data.eq(self.s.payload),
                row_w[r].en.eq(z_fire & (tw_row == r)),
            ]
        with m.If(z_fire):
            with m.If(tw_e == Em1):
                m.d.sync += tw_e.eq(0)
                with m.If(tw_row == ROWS - 1):
                    m.d.sync += tw_row.eq(0)
                    m.d.comb += tiles.tile_loaded.eq(1)
                with m.Else():
                    m.d.sync += tw_row.eq(tw_row + 1)
            with m.Else():
                m.d.sync += tw_e.eq(tw_e + 1)

        # ---------------------------------------------------------------- MAC issue
        # Per group, per pair of d's, per half-entry e < 2K: 8 rows x 8 lanes x 2 d's.
        out = OutputStage(m, self, self.acc_bits, p, self.OUT_DEPTH, "out", registered=True)
        pending = Signal(range(self.OUT_DEPTH + 1))     # results issued, not yet sent on m
        e_c = Signal(range(2 * R))
        p_c = Signal(16)
        g_c = Signal(range(FE + R))
        # Registered one cycle ahead (the issue logic was 9-10 LUT levels into pending and
        # comp_done): last_e = (e_c == E-1), last_p = (p_c == P-1), the sequencer's last_tile,
        # and room = (pending <= OUT_DEPTH-2), the credit for a pair's two results.
        last_e, last_p = Signal(), Signal()
        room = Signal(init=1)
        issue = Signal()
        m.d.comb += [
            # A pair's last cycle issues only if the output has room for both its results.
            issue.eq(busy & ~tiles.done & tiles.compute_full & (~last_e | room)),
            g_r.addr.eq(g_c),
        ]
        for r in range(ROWS):
            m.d.comb += row_r[r].addr.eq(Cat(e_c, cbank) if (2 * R) & (2 * R - 1) == 0
                                         else Mux(cbank, e_c + 2 * R, e_c))
        with m.If(issue):
            m.d.sync += g_c.eq(g_c + 1)
            with m.If(last_e):
                m.d.sync += [e_c.eq(0), last_e.eq(0)]          # E >= 2
                with m.If(last_p):
                    m.d.sync += [p_c.eq(0), g_c.eq(0), last_p.eq(one_pair)]
                    m.d.comb += tiles.tile_consumed.eq(1)
                with m.Else():
                    m.d.sync += [p_c.eq(p_c + 1), last_p.eq(p_c == Pm2)]
            with m.Else():
                m.d.sync += [e_c.eq(e_c + 1), last_e.eq(e_c == Em2)]
        # results of this pair: 2, or 1 for the last pair of an odd d
        n_res = Signal(2)
        m.d.comb += n_res.eq(Mux(last_p & d_odd, 1, 2))

        # ---------------------------------------------------------------- MAC pipeline
        # Stage flags: valid, first half-entry, last half-entry, second result exists.
        def stage(prev):
            nxt = [Signal(name=f"{f.name}_n") for f in prev]
            m.d.sync += [n.eq(f) for n, f in zip(nxt, prev)]
            return nxt
        s1 = [Signal(name="s1_v"), Signal(name="s1_first"), Signal(name="s1_last"), Signal(name="s1_two")]
        m.d.sync += [s1[0].eq(issue), s1[1].eq(e_c == 0), s1[2].eq(last_e), s1[3].eq(n_res[1])]
        # Stage 1 -> 2: the buffers' outputs, registered (DSP A/B registers): z per (row, lane),
        # the two d's codes of each lane packed into one operand.
        g_codes = words(g_r.data, 2 * HALF, CODE_BITS)
        packed = []
        for lane in range(HALF):
            a_r = Signal(signed(PACK_BITS), name=f"gpack_{lane}")
            m.d.sync += a_r.eq(pack_codes(g_codes[lane], g_codes[HALF + lane]))
            packed.append(a_r)
        s2 = stage(s1)
        # Stage 2 -> 3 -> 4: one DSP per (row, lane): z * (g_d0 + g_d1 * 2**20), M and P registers.
        prods = [[[None] * HALF for _ in range(ROWS)] for _ in range(2)]
        for r in range(ROWS):
            z_lanes = words(row_r[r].data, HALF, DATA_BITS)
            for lane in range(HALF):
                z_r = Signal(signed(DATA_BITS), name=f"z_{r}_{lane}")
                m_r = Signal(signed(PACKED_PRODUCT_BITS), name=f"mul_{r}_{lane}")
                p_r = Signal(signed(PACKED_PRODUCT_BITS), name=f"wide_{r}_{lane}")
                m.d.sync += [z_r.eq(z_lanes[lane]), m_r.eq(z_r * packed[lane]),
                             p_r.eq(m_r + PACK_BIAS)]
                prods[0][r][lane], prods[1][r][lane] = unpack_products(p_r)
        s3 = stage(s2)
        s4 = stage(s3)
        # Stage 4 -> 5: lane sums per (d slot, row).
        sbits = accumulator_bits(DATA_BITS, CODE_BITS, HALF)
        sums = [[None] * ROWS for _ in range(2)]
        for s in range(2):
            for r in range(ROWS):
                sm = Signal(signed(sbits), name=f"sum_{s}_{r}")
                m.d.sync += sm.eq(adder_tree(prods[s][r]))
                sums[s][r] = sm
        s5_v, s5_first, s5_last, s5_two = stage(s4)
        # Stage 5 -> 6: accumulate over the 2K half-entries of a row; a pair's final sums go
        # straight into a two-beat hold register as well (the accumulators move on to the next
        # pair), which shifts one beat a cycle into the rescalers (pairs are 2K >= 2 cycles apart).
        # The accumulators start at the rounding term (out.half; one bit wider for it).
        hold = [[Signal(signed(self.acc_bits + 1), name=f"hold_{s}_{r}") for r in range(ROWS)]
                for s in range(2)]
        hold_v = Signal(2)
        for s in range(2):
            for r in range(ROWS):
                acc = Signal(signed(self.acc_bits + 1), name=f"acc_{s}_{r}")
                acc_next = Signal(signed(self.acc_bits + 1), name=f"acc_next_{s}_{r}")
                m.d.comb += acc_next.eq(Mux(s5_first, out.half, acc) + sums[s][r])
                with m.If(s5_v):
                    m.d.sync += acc.eq(acc_next)
                with m.If(s5_v & s5_last):
                    m.d.sync += hold[s][r].eq(acc_next)
                with m.Elif(s == 0):
                    m.d.sync += hold[0][r].eq(hold[1][r])
        with m.If(s5_v & s5_last):
            m.d.sync += hold_v.eq(Cat(1, s5_two))
        with m.Else():
            m.d.sync += hold_v.eq(hold_v >> 1)
        # Stage 7: rescale the 8 results into one output beat (registered before the FIFO).
        m.d.comb += [out.values[r].eq(hold[0][r]) for r in range(ROWS)]
        m.d.comb += out.write.eq(hold_v[0])
        # Credits, off the issue path: the results of a pair's last cycle count a cycle late
        # (added), and room, the credit check of the next cycle, needs no term of this cycle's
        # issue: it matters only when the next cycle is a pair's last, and then this one issued
        # no pair's last (E >= 2), so its results add nothing in between.
        added = Signal(2)
        pending_next = Signal.like(pending)
        m.d.sync += added.eq(Mux(issue & last_e, n_res, 0))
        m.d.comb += pending_next.eq(pending + added - out.fire)
        m.d.sync += [pending.eq(pending_next), room.eq(pending_next <= self.OUT_DEPTH - 2)]

        # ---------------------------------------------------------------- start / busy
        with m.If(self.start):
            m.d.sync += [
                busy.eq(1),
                gw_half.eq(0), gw_chunk.eq(0), gw_d.eq(0), gw_b.eq(0), gw_e.eq(0),
                gw_ebase.eq(0), gw_pbase.eq(0),
                tw_e.eq(0), tw_row.eq(0),
                e_c.eq(0), p_c.eq(0), g_c.eq(0), added.eq(0),
                last_e.eq(0), last_p.eq(one_pair),
            ]
        with m.Elif(busy & tiles.done & (added == 0) &
                    ((pending == 0) | ((pending == 1) & out.fire))):
            m.d.sync += busy.eq(0)
        return m

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

The parts, each an Amaranth component: :class:`PE1Config` (the configuration results and the
derived sizes), :class:`PE1Loader` (G into the factor buffer, Z groups into the tile buffers, the
banks through a :class:`~insitu.rtl.pe_common.TileSequencer`), :class:`PE1Issue` (the MAC loop's
counters, the output credit and ``busy``), :class:`PE1MacArray` (the 64 DSPs, lane sums,
accumulators and the two-beat hold register) and :class:`~insitu.rtl.pe_common.OutputStage`
(rescale into the output FIFO); :class:`PE1` only connects them.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from insitu.numerics import accumulator_bits

from insitu.accel.params import DEFAULT_PARAMS, STREAM_BITS, STREAM_WORDS, AcceleratorParams
from insitu.accel.regmap import ErrorCode
from .pe_common import (CODE_BITS, DATA_BITS, OutputStage, TileSequencer, adder_tree,
                        check_params, common_cfg_errors, config_ports, delayed, drive_cfg_error,
                        lut_product, packed_multiply, packed_operand, payload_codes,
                        pipelined_product, words)
from .pe_interface import PE, settled

#: Lanes of a half-entry (one beat).
HALF = STREAM_WORDS
#: Bits of the group count ceil(a/8) and of the tile counters.
GROUP_BITS = 14


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
        p, R, FE = self.params, self.row_entries, self.factor_entries
        m.submodules.config = config = PE1Config(p, self.CFG_STAGES)
        m.d.comb += [getattr(config, n).eq(getattr(self, n)) for n in ("a", "b", "c", "d", "shift")]
        m.d.comb += [getattr(self, n).eq(getattr(config, n))
                     for n in ("cfg_ready", "cfg_error", "in_beats", "out_beats")]
        sizes = config.sizes

        m.submodules.loader = loader = PE1Loader(p)
        wiring.connect(m, wiring.flipped(self.s), loader.s)
        m.d.comb += [loader.start.eq(self.start), loader.sizes.eq(sizes)]

        out = OutputStage.attach(m, self, self.acc_bits, p, self.OUT_DEPTH)

        m.submodules.mac_loop = issue = PE1Issue(R, FE, self.OUT_DEPTH)
        m.d.comb += [
            issue.start.eq(self.start), self.busy.eq(issue.busy),
            issue.em2.eq(sizes.Em2), issue.pm2.eq(sizes.Pm2),
            issue.one_pair.eq(sizes.one_pair), issue.d_odd.eq(sizes.d_odd),
            issue.done.eq(loader.done), issue.compute_full.eq(loader.compute_full),
            loader.tile_consumed.eq(issue.tile_consumed),
            loader.g_rd_addr.eq(issue.g_rd_addr), loader.z_rd_entry.eq(issue.z_rd_entry),
            issue.out_fire.eq(out.fire),
        ]

        m.submodules.macs = macs = PE1MacArray(self.rows, self.acc_bits)
        m.d.comb += [
            macs.issue.eq(issue.issue), macs.first.eq(issue.first), macs.last.eq(issue.last),
            macs.two.eq(issue.two),
            macs.g_data.eq(loader.g_rd_data), macs.z_data.eq(loader.z_rd_data),
            macs.half.eq(out.half),
            out.values.eq(macs.values), out.write.eq(macs.write),
        ]
        return m


def pe1_sizes(params: AcceleratorParams) -> data.StructLayout:
    """The sizes PE1's datapath counts with, derived from the held configuration (registers;
    meaningful for an accepted configuration): K = b*C entries of a row (C = c/16 chunks), E =
    2K half-entries (beats), P = ceil(d/2) pairs of d's, groups = ceil(a/8)."""
    R = params.pe1_row_entries
    return data.StructLayout({
        "E": range(2 * R + 1), "Em1": range(2 * R), "Em2": range(2 * R), "Cm1": range(R),
        "C2": 13,                                       # 2C, from the held c (not a register)
        "bm1": 16, "dm1": 16, "Pm1": 15, "Pm2": 15, "gm1": GROUP_BITS, "gm2": GROUP_BITS,
        "d_odd": 1, "one_pair": 1, "one_group": 1,
    })


class PE1Config(wiring.Component):
    """PE1's configuration results, ``cfg_error``, ``in_beats`` and ``out_beats``, registered
    ``stages`` cycles after a configuration change (``cfg_ready``), and the derived sizes the
    loader and the issue logic count with (``sizes``, :func:`pe1_sizes`).

    As combinational products the beat counts were 16 ns (a DSP chain) from SIZE_* to IN_BEATS:
    they are adder trees in LUTs here, two adder levels a cycle
    (:func:`~insitu.rtl.pe_common.pipelined_product`), exact modulo 2**32 for every
    configuration, refused ones included (the driver compares IN_BEATS with its stream). The
    checks' priority order bounds their products' operands, so they are small LUT products.

    Separate from the datapath: it reads only the held configuration and is a pipeline of its
    own; the sizes are registered from it (a START comes only once ``cfg_ready`` is high, and
    their first use is in the cycle after START).
    """

    def __init__(self, params: AcceleratorParams, stages: int):
        self.params, self.stages = params, stages
        super().__init__(config_ports(pe1_sizes(params)))

    def elaborate(self, platform):
        m = Module()
        p = self.params
        R, FE = p.pe1_row_entries, p.factor_words // p.c_lanes
        a, b, c, d = self.a, self.b, self.c, self.d
        # The stage of each signal (cycles after the configuration) is in its comment.
        C = Signal(12)                          # lane chunks c/16
        m.d.comb += C.eq(c >> 4)
        m.d.comb += self.cfg_ready.eq(settled(m, [a, b, c, d, self.shift], self.stages - 1))
        groups1 = Signal(GROUP_BITS)            # 1: groups of 8 rows, ceil(a/8)
        x1 = Signal(17)                         # 1: d + 8*groups (< 2**17)
        m.d.sync += [groups1.eq((a + 7) >> 3), x1.eq(d + ((a + 7) & ~7))]
        # in_beats = b*c*(d + 8*groups) / 8, out_beats = d*groups.
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
        # The derived sizes (2 cycles after the configuration; E, Em1, Em2 from K1).
        s = self.sizes
        m.d.comb += s.C2.eq(C << 1)
        m.d.sync += [s.E.eq(K1 << 1), s.Em1.eq((K1 << 1) - 1), s.Em2.eq((K1 << 1) - 2),
                     s.Cm1.eq(C - 1), s.bm1.eq(b - 1), s.dm1.eq(d - 1), s.Pm1.eq((d - 1) >> 1),
                     s.Pm2.eq(s.Pm1 - 1), s.one_pair.eq(d <= 2), s.gm1.eq(groups1 - 1),
                     s.gm2.eq(groups1 - 2), s.one_group.eq(groups1 == 1), s.d_odd.eq(d[0])]
        return m


class PE1Loader(wiring.Component):
    """PE1's input side: the stream ``s`` (G, then Z in groups of 8 rows) into its buffers.

    * the factor buffer holds G as entries of 2 d's x 8 lanes of codes: the entry of pair p and
      half-entry e is at ``p*2K + e``, its 32-bit slot s holding the codes of ``d = 2p + s``, so
      that the MAC loop reads it sequentially. An odd d leaves the last pair's slot 1 unused, so
      the entries reach ``(d+1)*K <= FE + K``: R entries of slack;
    * the tile buffers are one memory per row of a group, one beat (8 lanes) per half-entry
      ``e = 2k + half``, two banks of 2R (ping-pong): group g+1 loads while group g computes.
      A :class:`~insitu.rtl.pe_common.TileSequencer` (a tile is a group) keeps the banks.

    Separate from the MAC side: the two meet only at the buffers' read ports (``g_rd_addr``,
    ``z_rd_entry`` in the bank being computed; the data a cycle later) and at the banks
    (``compute_full``, ``tile_consumed``, ``done``).
    """

    def __init__(self, params: AcceleratorParams):
        self.params = params
        R, FE = params.pe1_row_entries, params.factor_words // params.c_lanes
        super().__init__({
            "start": In(1),
            "s": In(stream.Signature(STREAM_BITS)),
            "sizes": In(pe1_sizes(params)),
            "g_rd_addr": In(range(FE + R)),
            "g_rd_data": Out(2 * HALF * CODE_BITS),
            "z_rd_entry": In(range(2 * R)),              # half-entry, in the compute bank
            "z_rd_data": Out(data.ArrayLayout(HALF * DATA_BITS, params.pe_rows)),
            "compute_full": Out(1),
            "tile_consumed": In(1),
            "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p, sz = self.params, self.sizes
        ROWS, R, FE = p.pe_rows, p.pe1_row_entries, p.factor_words // p.c_lanes
        payload = self.s.payload
        m.submodules.gmem = gmem = Memory(shape=2 * HALF * CODE_BITS, depth=FE + R, init=[])
        g_w = gmem.write_port(granularity=HALF * CODE_BITS)
        g_r = gmem.read_port()
        row_w, row_r = [], []
        for r in range(ROWS):
            mem = Memory(shape=HALF * DATA_BITS, depth=4 * R, init=[])
            m.submodules[f"row{r}"] = mem
            row_w.append(mem.write_port())
            row_r.append(mem.read_port())

        m.submodules.tiles = tiles = TileSequencer(tile_count_bits=GROUP_BITS)
        lbank, cbank = tiles.load_bank, tiles.compute_bank
        g_fire, z_fire = tiles.g_fire, tiles.z_fire
        m.d.comb += [tiles.start.eq(self.start), tiles.s_valid.eq(self.s.valid),
                     self.s.ready.eq(tiles.s_ready), tiles.tiles_m1.eq(sz.gm1),
                     tiles.tiles_m2.eq(sz.gm2), tiles.one_tile.eq(sz.one_group),
                     self.compute_full.eq(tiles.compute_full), self.done.eq(tiles.done),
                     tiles.tile_consumed.eq(self.tile_consumed)]

        def bank_addr(entry, bank):
            return (Cat(entry, bank) if (2 * R) & (2 * R - 1) == 0
                    else Mux(bank, entry + 2 * R, entry))

        m.d.comb += [g_r.addr.eq(self.g_rd_addr), self.g_rd_data.eq(g_r.data)]
        for r in range(ROWS):
            m.d.comb += [row_r[r].addr.eq(bank_addr(self.z_rd_entry, cbank)),
                         self.z_rd_data[r].eq(row_r[r].data)]

        # G beats arrive in (b, d, chunk, half) order: half-entry e = 2*(b*C + chunk) + half of
        # pair d//2, slot d%2.
        gw_half = Signal()
        gw_chunk = Signal(range(R))
        gw_d, gw_b = Signal(16), Signal(16)
        gw_e, gw_ebase = Signal(range(2 * R + 1)), Signal(range(2 * R + 1))
        gw_pbase = Signal(range(FE + R + 1))
        m.d.comb += [
            g_w.addr.eq(gw_pbase + gw_e),
            g_w.data.eq(Cat(payload_codes(payload), payload_codes(payload))),
            g_w.en.eq(Mux(g_fire, Mux(gw_d[0], 0b10, 0b01), 0)),
        ]
        with m.If(g_fire):
            m.d.sync += gw_half.eq(~gw_half)
            with m.If(gw_half & (gw_chunk == sz.Cm1)):
                m.d.sync += gw_chunk.eq(0)
                with m.If(gw_d == sz.dm1):
                    m.d.sync += [gw_d.eq(0), gw_b.eq(gw_b + 1), gw_pbase.eq(0),
                                 gw_ebase.eq(gw_ebase + sz.C2), gw_e.eq(gw_ebase + sz.C2)]
                    m.d.comb += tiles.g_done.eq(gw_b == sz.bm1)
                with m.Else():
                    m.d.sync += [gw_d.eq(gw_d + 1), gw_e.eq(gw_ebase)]
                    with m.If(gw_d[0]):
                        m.d.sync += gw_pbase.eq(gw_pbase + sz.E)
            with m.Else():
                m.d.sync += gw_e.eq(gw_e + 1)
                with m.If(gw_half):
                    m.d.sync += gw_chunk.eq(gw_chunk + 1)

        # Z beats arrive per group in (row, k, half) order; row r goes to its own memory.
        tw_e = Signal(range(2 * R))
        tw_row = Signal(range(ROWS))
        for r in range(ROWS):
            m.d.comb += [row_w[r].addr.eq(bank_addr(tw_e, lbank)), row_w[r].data.eq(payload),
                         row_w[r].en.eq(z_fire & (tw_row == r))]
        with m.If(z_fire):
            with m.If(tw_e == sz.Em1):
                m.d.sync += tw_e.eq(0)
                with m.If(tw_row == ROWS - 1):
                    m.d.sync += tw_row.eq(0)
                    m.d.comb += tiles.tile_loaded.eq(1)
                with m.Else():
                    m.d.sync += tw_row.eq(tw_row + 1)
            with m.Else():
                m.d.sync += tw_e.eq(tw_e + 1)

        with m.If(self.start):
            m.d.sync += [gw_half.eq(0), gw_chunk.eq(0), gw_d.eq(0), gw_b.eq(0), gw_e.eq(0),
                         gw_ebase.eq(0), gw_pbase.eq(0), tw_e.eq(0), tw_row.eq(0)]
        return m


class PE1Issue(wiring.Component):
    """PE1's MAC loop: per group, per pair of d's, per half-entry ``e < 2K`` one MAC cycle (the
    buffers' read addresses, ``issue`` and the flags that go down the pipeline with it), the
    output credit, and ``busy``.

    A pair's last cycle issues only if the output has room for both its results: ``pending``
    counts the results issued and not yet sent on ``m``. The issue's conditions are registers
    computed a cycle ahead (the issue logic was 9-10 LUT levels into pending): ``last_e`` (e ==
    E-1), ``last_p`` (pair == P-1) and ``room`` (pending <= OUT_DEPTH-2); the group's end comes
    from the loader's sequencer (``done``).

    Separate from the MAC array: this is the control, the array only follows its flags.
    """

    def __init__(self, row_entries: int, factor_entries: int, out_depth: int):
        R, FE = row_entries, factor_entries
        self.row_entries, self.out_depth = row_entries, out_depth
        super().__init__({
            "start": In(1),
            "busy": Out(1),
            "em2": In(range(2 * R)),                 # E - 2, P - 2, P == 1, d odd (sizes)
            "pm2": In(15),
            "one_pair": In(1),
            "d_odd": In(1),
            "done": In(1),                           # every group has been consumed
            "compute_full": In(1),                   # the compute bank holds a group
            "tile_consumed": Out(1),
            "out_fire": In(1),                       # an output beat is sent on m
            "g_rd_addr": Out(range(FE + R)),
            "z_rd_entry": Out(range(2 * R)),
            "issue": Out(1),                         # a MAC cycle, and its flags:
            "first": Out(1),                         # the pair's first half-entry
            "last": Out(1),                          # the pair's last half-entry
            "two": Out(1),                           # the pair has a second result (d slot 1)
        })

    def elaborate(self, platform):
        m = Module()
        R, DEPTH = self.row_entries, self.out_depth
        busy, issue = self.busy, self.issue
        pending = Signal(range(DEPTH + 1))      # results issued, not yet sent on m
        e_c = Signal(range(2 * R))
        p_c = Signal(16)
        g_c = Signal.like(self.g_rd_addr)
        last_e, last_p = Signal(), Signal()
        room = Signal(init=1)
        m.d.comb += [
            issue.eq(busy & ~self.done & self.compute_full & (~last_e | room)),
            self.g_rd_addr.eq(g_c), self.z_rd_entry.eq(e_c),
            self.first.eq(e_c == 0), self.last.eq(last_e),
        ]
        with m.If(issue):
            m.d.sync += g_c.eq(g_c + 1)
            with m.If(last_e):
                m.d.sync += [e_c.eq(0), last_e.eq(0)]          # E >= 2
                with m.If(last_p):
                    m.d.sync += [p_c.eq(0), g_c.eq(0), last_p.eq(self.one_pair)]
                    m.d.comb += self.tile_consumed.eq(1)
                with m.Else():
                    m.d.sync += [p_c.eq(p_c + 1), last_p.eq(p_c == self.pm2)]
            with m.Else():
                m.d.sync += [e_c.eq(e_c + 1), last_e.eq(e_c == self.em2)]
        # results of this pair: 2, or 1 for the last pair of an odd d
        n_res = Signal(2)
        m.d.comb += [n_res.eq(Mux(last_p & self.d_odd, 1, 2)), self.two.eq(n_res[1])]
        # Credits, off the issue path: the results of a pair's last cycle count a cycle late
        # (added), and room, the credit check of the next cycle, needs no term of this cycle's
        # issue: it matters only when the next cycle is a pair's last, and then this one issued
        # no pair's last (E >= 2), so its results add nothing in between.
        added = Signal(2)
        pending_next = Signal.like(pending)
        m.d.sync += added.eq(Mux(issue & last_e, n_res, 0))
        m.d.comb += pending_next.eq(pending + added - self.out_fire)
        m.d.sync += [pending.eq(pending_next), room.eq(pending_next <= DEPTH - 2)]

        with m.If(self.start):
            m.d.sync += [busy.eq(1), e_c.eq(0), p_c.eq(0), g_c.eq(0), added.eq(0),
                         last_e.eq(0), last_p.eq(self.one_pair)]
        with m.Elif(busy & self.done & (added == 0) &
                    ((pending == 0) | ((pending == 1) & self.out_fire))):
            m.d.sync += busy.eq(0)
        return m


class PE1MacArray(wiring.Component):
    """PE1's 128 MACs on 64 DSPs: per MAC cycle, the 8 rows' half-entry (8 lanes each) times the
    codes of a pair of d's, summed over the lanes and accumulated over the pair's 2K
    half-entries; a pair's 16 results then leave as two beats (``values``, ``write``).

    Pipeline after ``issue`` (the buffers' data arrive in the cycle after it): stage 1 -> 2 the
    data registered (DSP A/B registers: z per (row, lane), the two d's codes of each lane packed
    into one operand, :func:`~insitu.rtl.pe_common.pack_codes`); 2 -> 3 -> 4 one DSP per (row,
    lane) with M and P registers; 4 -> 5 the lane sums per (d slot, row); 5 -> 6 the
    accumulators, which start at ``half`` (SHIFT's rounding term; one bit wider for it). A
    pair's final sums also go into a two-beat hold register (the accumulators move on to the
    next pair), which shifts one beat a cycle into the output stage (pairs are 2K >= 2 cycles
    apart).

    Separate from the issue logic: it has no control of its own, only the flags that travel
    with each MAC cycle (``first``, ``last``, ``two``).
    """

    def __init__(self, rows: int, acc_bits: int):
        self.rows, self.acc_bits = rows, acc_bits
        super().__init__({
            "issue": In(1),
            "first": In(1),
            "last": In(1),
            "two": In(1),
            "g_data": In(2 * HALF * CODE_BITS),          # a cycle after issue
            "z_data": In(data.ArrayLayout(HALF * DATA_BITS, rows)),
            "half": In(acc_bits + 1),
            "values": Out(data.ArrayLayout(signed(acc_bits + 1), rows)),
            "write": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        ROWS, acc_bits = self.rows, self.acc_bits

        def stage(prev):
            nxt = [Signal(name=f"{f.name}_n") for f in prev]
            m.d.sync += [n.eq(f) for n, f in zip(nxt, prev)]
            return nxt
        # Stage flags: valid, first half-entry, last half-entry, second result exists.
        s1 = [Signal(name="s1_v"), Signal(name="s1_first"), Signal(name="s1_last"),
              Signal(name="s1_two")]
        m.d.sync += [s1[0].eq(self.issue), s1[1].eq(self.first), s1[2].eq(self.last),
                     s1[3].eq(self.two)]
        # Stage 1 -> 2: the buffers' outputs registered.
        g_codes = words(self.g_data, 2 * HALF, CODE_BITS)
        packed = [packed_operand(m, g_codes[lane], g_codes[HALF + lane], f"gpack_{lane}")
                  for lane in range(HALF)]
        s2 = stage(s1)
        # Stage 2 -> 3 -> 4: one DSP per (row, lane): z * (g_d0 + g_d1 * 2**20).
        prods = [[[None] * HALF for _ in range(ROWS)] for _ in range(2)]
        for r in range(ROWS):
            z_lanes = words(self.z_data[r], HALF, DATA_BITS)
            for lane in range(HALF):
                z_r = Signal(signed(DATA_BITS), name=f"z_{r}_{lane}")
                m.d.sync += z_r.eq(z_lanes[lane])
                prods[0][r][lane], prods[1][r][lane] = packed_multiply(
                    m, z_r, packed[lane], f"{r}_{lane}")
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
        # Stage 5 -> 6: accumulate over the 2K half-entries; the hold register.
        hold = [[Signal(signed(acc_bits + 1), name=f"hold_{s}_{r}") for r in range(ROWS)]
                for s in range(2)]
        hold_v = Signal(2)
        for s in range(2):
            for r in range(ROWS):
                acc = Signal(signed(acc_bits + 1), name=f"acc_{s}_{r}")
                acc_next = Signal(signed(acc_bits + 1), name=f"acc_next_{s}_{r}")
                m.d.comb += acc_next.eq(Mux(s5_first, self.half, acc) + sums[s][r])
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
        # Stage 6 -> 7: one beat a cycle into the output stage.
        m.d.comb += [self.values[r].eq(hold[0][r]) for r in range(ROWS)]
        m.d.comb += self.write.eq(hold_v[0])
        return m

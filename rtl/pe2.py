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

The parts, each an Amaranth component: :class:`PE2Config` (the configuration results and the
derived sizes), :class:`PE2Loader` (G into the factor buffer, Z tiles into the tile buffer's
banks through a :class:`~insitu.rtl.pe_common.TileSequencer`), :class:`PE2Issue` (the MAC loop's
counters, ``pending`` and ``busy``), :class:`PE2MacArray` (the 64 DSPs and 128 accumulators),
:class:`PE2Shadow` (the shadow bank, its drain and the check a group's last cycle waits for)
and :class:`~insitu.rtl.pe_common.OutputStage` (rescale into the output FIFO); :class:`PE2`
only connects them.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.memory import Memory
from amaranth.lib.wiring import In, Out

from insitu.numerics import accumulator_bits

from insitu.accel.params import (DEFAULT_PARAMS, SIZE_BITS, STREAM_BITS, STREAM_WORDS,
                                 AcceleratorParams)
from insitu.accel.regmap import ErrorCode
from .pe_common import (CODE_BITS, DATA_BITS, OutputStage, TileSequencer, check_params,
                        common_cfg_errors, config_ports, delayed, drive_cfg_error,
                        packed_multiply, packed_operand, payload_codes, pipelined_product, words)
from .pe_interface import PE, settled

#: Bits of the group count ceil(d/8) and of the tile count a*C.
GROUP_BITS, TILE_BITS = 13, 28
#: Pipeline stages from issue to the accumulators (stage k's flags: the cycle its data is valid).
MAC_STAGES = 4


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
        m.submodules.config = config = PE2Config(p, self.CFG_STAGES, self.ac_limit)
        m.d.comb += [getattr(config, n).eq(getattr(self, n)) for n in ("a", "b", "c", "d", "shift")]
        m.d.comb += [getattr(self, n).eq(getattr(config, n))
                     for n in ("cfg_ready", "cfg_error", "in_beats", "out_beats")]
        sizes = config.sizes

        m.submodules.loader = loader = PE2Loader(p)
        wiring.connect(m, wiring.flipped(self.s), loader.s)
        m.d.comb += [loader.start.eq(self.start), loader.b.eq(self.b), loader.sizes.eq(sizes)]

        out = OutputStage.attach(m, self, self.acc_bits, p, self.OUT_DEPTH)

        m.submodules.mac_loop = issue = PE2Issue(p, self.b_max, self.factor_entries)
        m.d.comb += [
            issue.start.eq(self.start), self.busy.eq(issue.busy),
            issue.bm2.eq(sizes.bm2), issue.one_b.eq(sizes.one_b),
            issue.gm2.eq(sizes.gm2), issue.one_g.eq(sizes.one_g),
            issue.done.eq(loader.done), issue.avail.eq(loader.avail),
            loader.tile_consumed.eq(issue.tile_consumed),
            loader.g_rd_addr.eq(issue.g_rd_addr), loader.t_rd_entry.eq(issue.t_rd_entry),
            issue.out_fire.eq(out.fire),
        ]

        m.submodules.macs = macs = PE2MacArray(self.outs, self.lanes, self.acc_bits)
        m.d.comb += [
            macs.issue.eq(issue.issue), macs.first.eq(issue.first), macs.last.eq(issue.last),
            macs.g_data.eq(loader.g_rd_data), macs.z_data.eq(loader.t_rd_data),
            macs.half.eq(out.half),
        ]

        m.submodules.shadow = shadow = PE2Shadow(self.outs * self.lanes, self.acc_bits,
                                                 self.OUT_DEPTH, self.DRAIN_SLACK)
        m.d.comb += [
            shadow.accs.eq(macs.accs), shadow.load.eq(macs.load),
            shadow.stage_last.eq(macs.stage_last),
            shadow.issue.eq(issue.issue), shadow.last.eq(issue.last),
            shadow.out_free.eq(out.free), shadow.out_fire.eq(out.fire),
            issue.shadow_ok.eq(shadow.shadow_ok),
            out.values.eq(shadow.values), out.write.eq(shadow.write),
            self.overrun.eq(shadow.overrun),
        ]
        return m


def pe2_sizes(params: AcceleratorParams) -> data.StructLayout:
    """The sizes PE2's datapath counts with, derived from the held configuration (registers;
    meaningful for an accepted configuration): b entries, G8 = ceil(d/8) groups of 8 d's, a*C
    tiles (C = c/16 chunks); each less one and two, and whether it is one."""
    B = params.pe2_b_max
    return data.StructLayout({
        "bm1": range(B), "bm2": range(B), "gm1": GROUP_BITS, "gm2": GROUP_BITS,
        "tm1": TILE_BITS, "tm2": TILE_BITS, "one_b": 1, "one_g": 1, "one_t": 1,
    })


class PE2Config(wiring.Component):
    """PE2's configuration results, ``cfg_error``, ``in_beats`` and ``out_beats``, registered
    ``stages`` cycles after a configuration change (``cfg_ready``), and the derived sizes the
    loader and the issue logic count with (``sizes``, :func:`pe2_sizes`).

    As combinational products the beat counts were 16 ns (a DSP chain) from SIZE_* to IN_BEATS:
    they are adder trees in LUTs here, two adder levels a cycle
    (:func:`~insitu.rtl.pe_common.pipelined_product`), exact modulo 2**32 for every
    configuration (the driver compares IN_BEATS with its stream, also for a refused one). Beat
    counts must fit 32 bits (the top level's counters, an AXI DMA transfer): with
    ``b <= pe2_b_max`` and ``b * ceil(d/8) <= factor_words / 8``, bounding ``a * c`` by
    ``ac_limit`` does it without a wide multiplier.

    Separate from the datapath: it reads only the held configuration and is a pipeline of its
    own; the sizes are registered from it (a START comes only once ``cfg_ready`` is high, and
    their first use is in the cycle after START).
    """

    def __init__(self, params: AcceleratorParams, stages: int, ac_limit: int):
        self.params, self.stages, self.ac_limit = params, stages, ac_limit
        super().__init__(config_ports(pe2_sizes(params)))

    def elaborate(self, platform):
        m = Module()
        p = self.params
        B, FE = p.pe2_b_max, p.factor_words // p.pe_rows
        a, b, c, d = self.a, self.b, self.c, self.d
        # The stage of each signal (cycles after the configuration) is in its comment.
        m.d.comb += self.cfg_ready.eq(settled(m, [a, b, c, d, self.shift], self.stages - 1))
        g8_1 = Signal(14)                                                      # 1: ceil(d/8)
        m.d.sync += g8_1.eq((d + 7) >> 3)
        ac2, n_ac = pipelined_product(m, c, a, 32, "ac")                       # 2
        bg3, n_bg = pipelined_product(m, b, g8_1, 30, "bg")                    # 3
        # in_beats = b*G8 + b*a*c/8, out_beats = a*c*G8.
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
        # The derived sizes (2 cycles after the configuration: the tiles from ac2).
        s = self.sizes
        m.d.sync += [s.bm1.eq(b - 1), s.bm2.eq(b - 2), s.one_b.eq(b == 1),
                     s.gm1.eq(g8_1 - 1), s.gm2.eq(g8_1 - 2), s.one_g.eq(g8_1 == 1),
                     s.tm1.eq((ac2 >> 4) - 1), s.tm2.eq((ac2 >> 4) - 2),
                     s.one_t.eq((ac2 >> 4) == 1)]
        return m


class PE2Loader(wiring.Component):
    """PE2's input side: the stream ``s`` (G, then Z tile by tile) into its buffers.

    * the factor buffer holds entries of 8 codes x 4 bits (one beat each), stored in
      ``(group, b)`` order (address ``g*b + b``) so that the MAC loop reads it sequentially;
    * the tile buffer holds a tile, ``(a, chunk)``: ``b`` entries of 16 words (two beats an
      entry), in two banks (ping-pong) kept by a :class:`~insitu.rtl.pe_common.TileSequencer`:
      the next tile loads while the current one computes.

    Separate from the MAC side: the two meet only at the buffers' read ports (``g_rd_addr``,
    ``t_rd_entry`` in the bank being computed; the data a cycle later), at the banks
    (``tile_consumed``, ``done``) and at ``avail``: entry ``t_rd_entry`` is in the bank, because
    the bank is full or because it is the one loading and the entry is complete (the MAC loop
    chases the loader through a tile it is waiting for).
    """

    def __init__(self, params: AcceleratorParams):
        self.params = params
        B, FE = params.pe2_b_max, params.factor_words // params.pe_rows
        super().__init__({
            "start": In(1),
            "s": In(stream.Signature(STREAM_BITS)),
            "b": In(SIZE_BITS),
            "sizes": In(pe2_sizes(params)),
            "g_rd_addr": In(range(FE)),
            "g_rd_data": Out(params.pe_rows * CODE_BITS),
            "t_rd_entry": In(range(B)),                  # entry, in the compute bank
            "t_rd_data": Out(params.c_lanes * DATA_BITS),
            "avail": Out(1),
            "tile_consumed": In(1),
            "done": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        p, sz = self.params, self.sizes
        B, FE = p.pe2_b_max, p.factor_words // p.pe_rows
        payload = self.s.payload
        m.submodules.gmem = gmem = Memory(shape=p.pe_rows * CODE_BITS, depth=FE, init=[])
        g_w = gmem.write_port()
        g_r = gmem.read_port()
        m.submodules.tile = tmem = Memory(shape=p.c_lanes * DATA_BITS, depth=2 * B, init=[])
        t_w = tmem.write_port(granularity=STREAM_WORDS * DATA_BITS)
        t_r = tmem.read_port()

        m.submodules.tiles = tiles = TileSequencer(tile_count_bits=TILE_BITS)
        lbank, cbank = tiles.load_bank, tiles.compute_bank
        g_fire, z_fire = tiles.g_fire, tiles.z_fire
        m.d.comb += [tiles.start.eq(self.start), tiles.s_valid.eq(self.s.valid),
                     self.s.ready.eq(tiles.s_ready), tiles.tiles_m1.eq(sz.tm1),
                     tiles.tiles_m2.eq(sz.tm2), tiles.one_tile.eq(sz.one_t),
                     self.done.eq(tiles.done), tiles.tile_consumed.eq(self.tile_consumed)]

        # G beats arrive in (b, group) order; entry address group*b + b.
        gw_g = Signal(GROUP_BITS)
        gw_b = Signal(range(B))
        gw_addr = Signal(16)
        m.d.comb += [g_w.addr.eq(gw_addr), g_w.data.eq(payload_codes(payload)),
                     g_w.en.eq(g_fire)]
        with m.If(g_fire):
            with m.If(gw_g == sz.gm1):
                m.d.sync += [gw_g.eq(0), gw_b.eq(gw_b + 1), gw_addr.eq(gw_b + 1)]
                m.d.comb += tiles.g_done.eq(gw_b == sz.bm1)
            with m.Else():
                m.d.sync += [gw_g.eq(gw_g + 1), gw_addr.eq(gw_addr + self.b)]

        # Z beats arrive per tile in (b, half) order.
        tw_half = Signal()
        tw_k = Signal(range(B))
        m.d.comb += [
            t_w.addr.eq(Mux(lbank, tw_k + B, tw_k)),
            t_w.data.eq(Cat(payload, payload)),
            t_w.en.eq(Mux(z_fire, Mux(tw_half, 0b10, 0b01), 0)),
        ]
        with m.If(z_fire):
            m.d.sync += tw_half.eq(~tw_half)
            with m.If(tw_half):
                with m.If(tw_k == sz.bm1):
                    m.d.sync += tw_k.eq(0)
                    m.d.comb += tiles.tile_loaded.eq(1)
                with m.Else():
                    m.d.sync += tw_k.eq(tw_k + 1)

        cc_b = self.t_rd_entry
        m.d.comb += [
            self.avail.eq(tiles.compute_full | ((lbank == cbank) & (cc_b < tw_k))),
            t_r.addr.eq(Mux(cbank, cc_b + B, cc_b)), self.t_rd_data.eq(t_r.data),
            g_r.addr.eq(self.g_rd_addr), self.g_rd_data.eq(g_r.data),
        ]
        with m.If(self.start):
            m.d.sync += [gw_g.eq(0), gw_b.eq(0), gw_addr.eq(0), tw_half.eq(0), tw_k.eq(0)]
        return m


class PE2Issue(wiring.Component):
    """PE2's MAC loop: per tile, per group g of 8 d's, per b one MAC cycle (the buffers' read
    addresses, ``issue`` and the flags that go down the pipeline with it), ``pending`` (output
    beats issued, not yet sent) and ``busy``.

    The cycle that completes a group issues only when the shadow bank is sure to be drained by
    the time the new results reach it (``shadow_ok``, from :class:`PE2Shadow`). The issue's
    conditions are registers computed a cycle ahead (the issue logic was 9-10 LUT levels into
    pending): ``last_b`` (b index == b-1), ``last_g`` (group == G8-1) and ``shadow_ok``; the
    tile's end comes from the loader's sequencer (``done``).

    Separate from the MAC array and the shadow bank: this is the control, they only follow
    its flags.
    """

    def __init__(self, params: AcceleratorParams, b_max: int, factor_entries: int):
        #: Output beats of a group: 8 d's x 16 lanes.
        self.group_beats = params.pe_rows * params.c_lanes // STREAM_WORDS
        super().__init__({
            "start": In(1),
            "busy": Out(1),
            "bm2": In(range(b_max)),                 # b - 2, b == 1, G8 - 2, G8 == 1 (sizes)
            "one_b": In(1),
            "gm2": In(GROUP_BITS),
            "one_g": In(1),
            "avail": In(1),                          # entry t_rd_entry is loaded
            "done": In(1),                           # every tile has been consumed
            "tile_consumed": Out(1),
            "shadow_ok": In(1),                      # a group's last cycle may issue
            "out_fire": In(1),                       # an output beat is sent on m
            "g_rd_addr": Out(range(factor_entries)),
            "t_rd_entry": Out(range(b_max)),
            "issue": Out(1),                         # a MAC cycle, and its flags:
            "first": Out(1),                         # the group's first b
            "last": Out(1),                          # the group's last b
        })

    def elaborate(self, platform):
        m = Module()
        busy, issue = self.busy, self.issue
        pending = Signal(range(8 * self.group_beats * 4))   # output beats issued, not yet sent
        cc_b = Signal.like(self.t_rd_entry)
        cc_g = Signal(GROUP_BITS)
        g_c = Signal.like(self.g_rd_addr)
        last_b, last_g = Signal(), Signal()
        m.d.comb += [
            issue.eq(busy & ~self.done & self.avail & (~last_b | self.shadow_ok)),
            self.t_rd_entry.eq(cc_b), self.g_rd_addr.eq(g_c),
            self.first.eq(cc_b == 0), self.last.eq(last_b),
        ]
        with m.If(issue):
            with m.If(last_b):
                m.d.sync += [cc_b.eq(0), last_b.eq(self.one_b)]
                with m.If(last_g):
                    m.d.sync += [cc_g.eq(0), g_c.eq(0), last_g.eq(self.one_g)]
                    m.d.comb += self.tile_consumed.eq(1)
                with m.Else():
                    m.d.sync += [cc_g.eq(cc_g + 1), g_c.eq(g_c + 1), last_g.eq(cc_g == self.gm2)]
            with m.Else():
                m.d.sync += [cc_b.eq(cc_b + 1), g_c.eq(g_c + 1), last_b.eq(cc_b == self.bm2)]
        # A group's beats count in pending a cycle after its last issue (added: the issue logic
        # was in front of pending's adder); the end of the op waits for added too.
        added = Signal()
        m.d.sync += added.eq(issue & last_b)
        m.d.sync += pending.eq(pending + Mux(added, self.group_beats, 0) - self.out_fire)

        with m.If(self.start):
            m.d.sync += [busy.eq(1), cc_b.eq(0), cc_g.eq(0), g_c.eq(0),
                         last_b.eq(self.one_b), last_g.eq(self.one_g)]
        with m.Elif(busy & self.done & ~added &
                    ((pending == 0) | ((pending == 1) & self.out_fire))):
            m.d.sync += busy.eq(0)
        return m


class PE2MacArray(wiring.Component):
    """PE2's 128 MACs on 64 DSPs: per MAC cycle, one tile entry (16 lanes) times the codes of a
    group's 8 d's, accumulated over b into 128 accumulators (d-major, lane-minor).

    Pipeline after ``issue`` (the buffers' data arrive in the cycle after it): stage 1 -> 2 the
    data registered (DSP A/B registers: 16 z words, the codes of each pair of d's packed into one
    operand, :func:`~insitu.rtl.pe_common.pack_codes`); 2 -> 3 -> 4 one DSP per (pair, lane)
    with M and P registers; 4 -> 5 the accumulators, which start at ``half`` (SHIFT's rounding
    term; one bit wider for it). ``load``: the accumulators hold a group's results (they go to
    the shadow bank in this cycle's edge); ``stage_last``: stage k (1-4) holds a group's last b.

    Separate from the issue logic: it has no control of its own, only the flags that travel
    with each MAC cycle (``first``, ``last``).
    """

    def __init__(self, outs: int, lanes: int, acc_bits: int):
        self.outs, self.lanes, self.acc_bits = outs, lanes, acc_bits
        super().__init__({
            "issue": In(1),
            "first": In(1),
            "last": In(1),
            "g_data": In(outs * CODE_BITS),              # a cycle after issue
            "z_data": In(lanes * DATA_BITS),
            "half": In(acc_bits + 1),
            "accs": Out(data.ArrayLayout(signed(acc_bits + 1), outs * lanes)),
            "load": Out(1),
            "stage_last": Out(MAC_STAGES),
        })

    def elaborate(self, platform):
        m = Module()
        OUTS, LANES = self.outs, self.lanes
        # Flags (valid, first b, last b) of stage k: the cycle in which stage k's data is valid.
        flags = [(self.issue, self.first, self.last)]
        for k in range(1, MAC_STAGES + 1):
            f = (Signal(name=f"s{k}_v"), Signal(name=f"s{k}_first"), Signal(name=f"s{k}_last"))
            m.d.sync += [x.eq(y) for x, y in zip(f, flags[-1])]
            m.d.comb += self.stage_last[k - 1].eq(f[0] & f[2])
            flags.append(f)
        # Stage 1 -> 2: the buffers' outputs registered.
        z_lanes = words(self.z_data, LANES, DATA_BITS)
        g_codes = words(self.g_data, OUTS, CODE_BITS)
        z_r = [Signal(signed(DATA_BITS), name=f"z_{lane}") for lane in range(LANES)]
        m.d.sync += [zr.eq(z) for zr, z in zip(z_r, z_lanes)]
        packed = [packed_operand(m, g_codes[2 * j], g_codes[2 * j + 1], f"gpack_{j}")
                  for j in range(OUTS // 2)]
        # Stage 2 -> 3 -> 4: 128 products as 64 wide products, one DSP each.
        wide = {(j, lane): packed_multiply(m, z_r[lane], packed[j], f"{j}_{lane}")
                for j in range(OUTS // 2) for lane in range(LANES)}
        prods = [wide[j // 2, lane][j % 2] for j in range(OUTS) for lane in range(LANES)]
        # Stage 4 -> 5: accumulate over b.
        s4_v, s4_first, s4_last = flags[MAC_STAGES]
        for i, prod in enumerate(prods):
            acc = Signal(signed(self.acc_bits + 1), name=f"acc_{i // LANES}_{i % LANES}")
            with m.If(s4_v):
                m.d.sync += acc.eq(Mux(s4_first, self.half, acc) + prod)
            m.d.comb += self.accs[i].eq(acc)
        load = Signal(name="s5_load")
        m.d.sync += load.eq(s4_v & s4_last)
        m.d.comb += self.load.eq(load)
        return m


class PE2Shadow(wiring.Component):
    """PE2's shadow bank: a group's 128 results (``accs`` when ``load``) drain from it into the
    output stage, one beat (8 results) a cycle, d then lane, while the next group accumulates.

    ``shadow_ok`` is the issue's check for a group's last cycle, registered a cycle ahead: no
    group's last b in the MAC pipeline (``stage_last``, nor this cycle's ``issue`` of a ``last``)
    nor loading the shadow bank, at most ``slack`` beats left in it and room for them in the
    output FIFO (``out_free``). The drain takes one beat off both sides of ``free >=
    drain_left`` and a beat sent on m adds one to free: exactly the combinational check of the
    cycle after. ``overrun`` (simulation check): the bank would be overwritten before it drained.

    Separate from the MAC array: it is the hand-over between the accumulators and the output,
    and the one place that knows how far the drain is.
    """

    def __init__(self, n: int, acc_bits: int, out_depth: int, slack: int):
        self.n, self.acc_bits, self.slack = n, acc_bits, slack
        super().__init__({
            "accs": In(data.ArrayLayout(signed(acc_bits + 1), n)),
            "load": In(1),
            "stage_last": In(MAC_STAGES),
            "issue": In(1),
            "last": In(1),
            "out_free": In(range(out_depth + 1)),
            "out_fire": In(1),
            "values": Out(data.ArrayLayout(signed(acc_bits + 1), STREAM_WORDS)),
            "write": Out(1),
            "shadow_ok": Out(1),
            "overrun": Out(1),
        })

    def elaborate(self, platform):
        m = Module()
        N, W = self.n, STREAM_WORDS
        shadow = [Signal(signed(self.acc_bits + 1), name=f"shadow_{i}") for i in range(N)]
        drain_left = Signal(range(N // W + 1))          # beats left in the shadow bank
        # drain_left != 0 as a register kept in step with it: the drain's write enable is two
        # flip-flops through one gate, not a compare in front of the FIFO's credit arithmetic.
        has_drain = Signal()
        drain_write = Signal()
        free, fire = self.out_free, self.out_fire
        m.d.comb += [drain_write.eq(has_drain & (free != 0)),
                     self.write.eq(drain_write)]
        m.d.comb += [self.values[k].eq(shadow[k]) for k in range(W)]
        with m.If(drain_write):
            m.d.sync += [shadow[i].eq(shadow[i + W]) for i in range(N - W)]
            m.d.sync += drain_left.eq(drain_left - 1)
        with m.If(self.load):
            m.d.sync += [sh.eq(self.accs[i]) for i, sh in enumerate(shadow)]
            m.d.sync += drain_left.eq(N // W)
        m.d.comb += self.overrun.eq(self.load & (drain_left != 0) &
                                    ~((drain_left == 1) & drain_write))
        drain_next = drain_left - drain_write
        m.d.sync += has_drain.eq(self.load | (drain_next != 0))
        shadow_ok = Signal(name="shadow_ok")
        m.d.sync += shadow_ok.eq(
            ~(self.issue & self.last) & ~self.stage_last.any() & ~self.load &
            (drain_next <= self.slack) &
            ((free >= drain_left) | (fire & (free + 1 == drain_left))))
        m.d.comb += self.shadow_ok.eq(shadow_ok)
        return m

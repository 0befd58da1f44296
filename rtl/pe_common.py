"""Pieces the TT contraction PEs (:mod:`insitu.rtl.pe1`, :mod:`insitu.rtl.pe2`) share.

* word / lane slicing of the 128-bit stream payload and of the wide buffer entries;
* the packed multiply: two 4-bit codes in one DSP operand (:func:`pack_codes`,
  :func:`packed_operand`) and the DSP's registered product split in two (:func:`packed_multiply`,
  :func:`unpack_products`);
* :class:`OutputStage`: a bank of :class:`~insitu.rtl.requantize.RoundShiftSaturate` feeding an
  output FIFO (registered output, ``SyncFIFOBuffered``) that drives the ``m`` stream;
* the configuration pipelines' pieces (:func:`pipelined_product`, :func:`lut_product`,
  :func:`delayed`);
* the configuration checks both PEs make (zero sizes, 16 lanes, SHIFT range);
* :class:`TileSequencer`: G first, then Z tiles into two ping-pong banks (load while computing).

Both PEs issue a MAC cycle only when the output side is sure to take every result that can still
be in flight (credits), so a full output never needs to stall the MAC pipeline itself.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Module, Mux, Signal, Value, signed
from amaranth.lib import data, stream, wiring
from amaranth.lib.fifo import SyncFIFOBuffered
from amaranth.lib.wiring import In, Out

from insitu.numerics import TT_FACTOR_BITS, TT_PE_DATA_BITS, product_bits

from insitu.accel.params import SIZE_BITS, STREAM_BITS, STREAM_WORDS, WORD_BITS, AcceleratorParams
from insitu.accel.regmap import ErrorCode
from .pe_interface import BEATS_BITS, ERROR_BITS, SHIFT_BITS
from .requantize import RoundShiftSaturate

#: Bits of one factor code inside the factor buffers (the low 4 bits of a stream word).
CODE_BITS = TT_FACTOR_BITS
DATA_BITS = TT_PE_DATA_BITS


def check_params(params: AcceleratorParams, who: str) -> None:
    """The PEs are built for 8 rows (one output beat of 8 words) and 16 lanes (two beats)."""
    if params.pe_rows != STREAM_WORDS or params.c_lanes != 2 * STREAM_WORDS:
        raise ValueError(f"{who}: generated for pe_rows == {STREAM_WORDS} and c_lanes == "
                         f"{2 * STREAM_WORDS}, got {params.pe_rows} and {params.c_lanes}")


def words(value: Value, n: int, width: int = WORD_BITS) -> list[Value]:
    """The ``n`` ``width``-bit fields of ``value``, field 0 in the low bits, as signed values."""
    return [value[k * width:(k + 1) * width].as_signed() for k in range(n)]


def payload_codes(payload: Value) -> Value:
    """The low 4 bits of each of the 8 words of a beat: 8 packed factor codes (32 bits)."""
    return Cat(*(payload[k * WORD_BITS:k * WORD_BITS + CODE_BITS] for k in range(STREAM_WORDS)))


#: Two-codes-per-DSP packing (PE1, PE2): a 16-bit word times ``g0 + g1 * 2**PACK_SHIFT`` is both
#: products in one multiply; ``|z * g0| <= 2**18`` fits the low ``PACK_SHIFT`` bits.
PACK_SHIFT = product_bits(DATA_BITS, CODE_BITS)
#: Width of the packed operand (a DSP48's 25-bit A port) and of the wide product.
PACK_BITS = PACK_SHIFT + CODE_BITS + 1
PACKED_PRODUCT_BITS = PACK_BITS + DATA_BITS
#: Added to every wide product (in the DSP's post-adder): the low product then never borrows from
#: the high one, so the high product is a plain slice (no correction adder in the fabric).
PACK_BIAS = 1 << (PACK_SHIFT - 1)


def pack_codes(g0: Value, g1: Value) -> Value:
    """``g0 + g1 * 2**PACK_SHIFT`` as a signed ``PACK_BITS`` value without a wide adder: the low
    field is g0 sign-extended, the high field ``g1 - (g0 < 0)`` (g0's sign extension adds
    ``2**PACK_SHIFT`` when g0 is negative)."""
    g0, g1 = g0.as_signed(), g1.as_signed()
    high = (g1 - g0[-1])[:CODE_BITS + 1]
    return Cat(g0, g0[-1].replicate(PACK_SHIFT - len(g0)), high).as_signed()


def unpack_products(w: Value) -> tuple[Value, Value]:
    """``(z*g0, z*g1)`` from ``w = z * pack_codes(g0, g1) + PACK_BIAS`` (each ``PACK_SHIFT`` bits,
    signed): the low field minus the bias is its top bit flipped; the bias keeps the low field
    non-negative, so the high field is exactly ``z*g1``."""
    low = Cat(w[:PACK_SHIFT - 1], ~w[PACK_SHIFT - 1]).as_signed()
    high = w[PACK_SHIFT:2 * PACK_SHIFT].as_signed()
    return low, high


def packed_operand(m: Module, g0: Value, g1: Value, name: str) -> Signal:
    """``pack_codes(g0, g1)`` registered (a DSP's A register): one operand for two d's."""
    reg = Signal(signed(PACK_BITS), name=name)
    m.d.sync += reg.eq(pack_codes(g0, g1))
    return reg


def packed_multiply(m: Module, z: Value, packed: Value, suffix: str) -> tuple[Value, Value]:
    """One DSP of PE1 / PE2: ``z * packed`` (both registered by the caller: the A/B registers)
    into its M register (``mul_<suffix>``), ``+ PACK_BIAS`` into its P register
    (``wide_<suffix>``); returns the two products, ``unpack_products`` of P."""
    m_r = Signal(signed(PACKED_PRODUCT_BITS), name=f"mul_{suffix}")
    p_r = Signal(signed(PACKED_PRODUCT_BITS), name=f"wide_{suffix}")
    m.d.sync += [m_r.eq(z * packed), p_r.eq(m_r + PACK_BIAS)]
    return unpack_products(p_r)


def adder_tree(terms: list[Value]) -> Value:
    """Balanced sum of ``terms`` (Amaranth widens each addition by one bit: no overflow)."""
    while len(terms) > 1:
        terms = [terms[i] + terms[i + 1] if i + 1 < len(terms) else terms[i]
                 for i in range(0, len(terms), 2)]
    return terms[0]


def pipelined_product(m: Module, x: Value, y: Value, width: int, name: str,
                      levels: int = 2) -> tuple[Signal, int]:
    """The low ``width`` bits of ``x * y`` (unsigned) in LUTs, ``cycles`` clock edges after ``x``
    and ``y``: an adder tree over y's partial products with a register after every ``levels``
    adder levels (a carry chain and a LUT each), where a combinational 16 x 16 product is ~16 ns
    on xc7. Returns ``(result, cycles)``; the registers have no reset (configuration only).
    Each register is as wide as its partial sum can be (at most ``width`` bits), so no stage
    depends on synthesis finding its known-zero top bits (Yosys' ``wreduce`` does not always
    see them through an adder chain); ``result`` may be narrower than ``width``."""
    terms = [Mux(y[i], x.shift_left(i), 0)[:width] for i in range(min(len(y), width))]
    cycles = level = 0
    while True:
        if len(terms) > 1:
            terms = [(terms[i] + terms[i + 1])[:width] if i + 1 < len(terms) else terms[i]
                     for i in range(0, len(terms), 2)]
            level += 1
        if len(terms) == 1 or level == levels:
            regs = [Signal(len(t), name=f"{name}_p{cycles}_{i}", reset_less=True)
                    for i, t in enumerate(terms)]
            m.d.sync += [r.eq(t) for r, t in zip(regs, terms)]
            terms, level, cycles = regs, 0, cycles + 1
            if len(terms) == 1:
                return terms[0], cycles


def delayed(m: Module, value: Value, cycles: int, name: str) -> Value:
    """``value`` through ``cycles`` registers without reset (a configuration pipeline)."""
    for i in range(cycles):
        reg = Signal(value.shape(), name=f"{name}_d{i + 1}", reset_less=True)
        m.d.sync += reg.eq(value)
        value = reg
    return value


def lut_product(x: Value, y: Value) -> Value:
    """``x * y`` (unsigned) as shifted adds: Yosys maps a ``*`` of more than 8 result bits to a
    DSP; for the small size products (a few bits each) LUTs are cheaper than a DSP."""
    return adder_tree([Mux(y[i], x << i, 0) for i in range(len(y))])


def common_cfg_errors(a, b, c, d, shift, params: AcceleratorParams):
    """The checks both PEs share, in priority order: ``(condition, ErrorCode)`` pairs."""
    return [
        ((a == 0) | (b == 0) | (c == 0) | (d == 0), ErrorCode.ZERO_SIZE),
        (c[:4] != 0, ErrorCode.C_LANES),
    ], ((shift < params.shift_min) | (shift > params.shift_max), ErrorCode.SHIFT)


def config_ports(sizes: data.StructLayout) -> dict:
    """The ports of PE1's and PE2's configuration component: the held configuration in; out
    ``cfg_ready``, the configuration's results and the derived ``sizes`` the datapath counts with."""
    return {
        "a": In(SIZE_BITS), "b": In(SIZE_BITS), "c": In(SIZE_BITS), "d": In(SIZE_BITS),
        "shift": In(signed(SHIFT_BITS)),
        "cfg_ready": Out(1),
        "cfg_error": Out(ERROR_BITS),
        "in_beats": Out(BEATS_BITS),
        "out_beats": Out(BEATS_BITS),
        "sizes": Out(sizes),
    }


def drive_cfg_error(m: Module, cfg_error: Signal, checks, domain: str = "comb") -> None:
    """``cfg_error`` = the code of the first failing check, 0 when all pass (combinational, or
    registered with ``domain="sync"``)."""
    first = True
    for cond, code in checks:
        ctx = m.If(cond) if first else m.Elif(cond)
        with ctx:
            m.d[domain] += cfg_error.eq(code)
        first = False
    if domain != "comb":
        with m.Else():
            m.d[domain] += cfg_error.eq(ErrorCode.NONE)


class OutputStage(wiring.Component):
    """The output side of PE1 and PE2: ``STREAM_WORDS`` rescalers
    (:class:`~insitu.rtl.requantize.RoundShiftSaturate`, ``stages=1``, ``prerounded``) feeding a
    ``depth``-beat output FIFO (``SyncFIFOBuffered``, registered output) that drives ``m``.

    ``values`` (8 signed accumulators of ``acc_bits + 1`` bits) are rescaled by ``shift`` and
    written when ``write`` is high; the PE guarantees room (``free``: the entries it may still
    write). The shift is registered inside the rescalers and then saturated into the FIFO's write
    port one cycle later (its write enable follows). The PE starts its accumulators at ``half``,
    the rounding term of ``shift`` (a register), so ``values`` already hold it and the rescaler
    has no wide add before its barrel shifter (accumulator -> add -> shift was 8.3 ns on
    xc7z020). ``free`` counts the beat in flight as written; ``fire``: a beat is accepted on
    ``m`` this cycle.

    Rescaler k's decode of ``shift`` passes ``FIRST_TAP + k`` registers instead of one
    (``shift_delay``): identical decode registers are merged into one per bit by synthesis,
    which then drives all 8 barrel shifters (in the whole accelerator those of every PE that
    rescales by SHIFT: ~1,100 loads a bit); on a chain each shifter has a tap of its own. Tap 1,
    the plain ``stages=1`` register, is left to the other PEs' rescalers. The delays change no
    output: ``shift`` is a configuration, unchanged from 5 cycles before ``start`` (``cfg_ready``)
    until ``busy`` falls, and the first beat reaches the rescalers 10 or more cycles after
    ``start`` (PE2: a G beat, a Z entry, the 4 MAC stages and the shadow bank; PE1: a whole
    group first), so any tap up to 15 holds the op's shift whenever a beat passes.

    Separate from the PEs because it is the same in both: the PE's MAC side only decides which
    8 results leave when, under the credit that ``free`` (PE2) or its own count (PE1) gives it.
    """

    #: The shift decode delay of rescaler 0 (rescaler k: ``FIRST_TAP + k``).
    FIRST_TAP = 2
    #: The deepest tap that still holds the op's shift when PE2's first beat arrives (above).
    LAST_SAFE_TAP = 15

    def __init__(self, acc_bits: int, params: AcceleratorParams, depth: int):
        assert self.FIRST_TAP + STREAM_WORDS - 1 <= self.LAST_SAFE_TAP
        self.acc_bits, self.params, self.depth = acc_bits, params, depth
        in_bits = acc_bits + 1
        super().__init__({
            "shift": In(signed(SHIFT_BITS)),
            "half": Out(in_bits),
            "values": In(data.ArrayLayout(signed(in_bits), STREAM_WORDS)),
            "write": In(1),
            "m": Out(stream.Signature(STREAM_BITS)),
            "free": Out(range(depth + 1), init=depth),
            "fire": Out(1),
        })

    @classmethod
    def attach(cls, m: Module, pe, acc_bits: int, params: AcceleratorParams, depth: int) -> "OutputStage":
        """A PE's output stage as its submodule ``out``: it drives the PE's ``m`` and rescales
        by the PE's ``shift``; the PE connects ``values``, ``write`` and ``half``."""
        m.submodules.out = out = cls(acc_bits, params, depth)
        wiring.connect(m, out.m, wiring.flipped(pe.m))
        m.d.comb += out.shift.eq(pe.shift)
        return out

    def elaborate(self, platform):
        m = Module()
        p = self.params
        in_bits = self.acc_bits + 1
        m.submodules.fifo = fifo = SyncFIFOBuffered(width=STREAM_BITS, depth=self.depth)
        # The accumulators' initial value: the rounding term of ``shift`` (a configuration).
        half = Signal(in_bits, name="half", reset_less=True)
        m.d.sync += half.eq(RoundShiftSaturate.half_of(self.shift, self.acc_bits, p.shift_max))
        m.d.comb += self.half.eq(half)
        outs = []
        for k in range(STREAM_WORDS):
            rss = RoundShiftSaturate(in_bits, WORD_BITS, p.shift_max, p.shift_min, stages=1,
                                     prerounded=True, shift_delay=self.FIRST_TAP + k)
            m.submodules[f"rss{k}"] = rss
            m.d.comb += [rss.data_in.eq(self.values[k]), rss.shift.eq(self.shift)]
            outs.append(rss.data_out)
        # The rescalers hold the beat for a cycle; its write enable follows it.
        w_en = Signal(name="wen")
        m.d.sync += w_en.eq(self.write)
        m.d.comb += [
            fifo.w_data.eq(Cat(*outs)),
            fifo.w_en.eq(w_en),
            self.m.payload.eq(fifo.r_data),
            self.m.valid.eq(fifo.r_rdy),
            fifo.r_en.eq(self.m.ready),
            self.fire.eq(self.m.valid & self.m.ready),
        ]
        # Entries that can still be written (a SyncFIFOBuffered of depth >= 3 accepts a write
        # whenever its level is below its depth; a registered beat in flight counts as written).
        # A register, not depth - level - inflight: the FIFO's level (its r_rdy plus the inner
        # level) was several LUT and carry levels in front of the PEs' credit checks. free
        # follows the same count: a write takes an entry, a beat sent on m gives one back.
        m.d.sync += self.free.eq(self.free - self.write + self.fire)
        return m


class TileSequencer(wiring.Component):
    """The order of work PE1 and PE2 share: the factor G first, then tiles of Z into two banks
    (ping-pong). A bank is full from its tile's last beat until the MAC loop has consumed that
    tile; Z beats are taken only while the bank being loaded is not full, so the next tile loads
    while the current one computes.

    Separate from the PEs because only the tile shapes differ between them: the PE tells this
    sequencer when G has ended (``g_done``), a tile has loaded (``tile_loaded``) or been consumed
    (``tile_consumed``); the sequencer keeps the banks, counts the tiles at both ends and says when
    the last one has been consumed (``done``). ``last_tile`` (the tile being consumed is the op's
    last) is registered a tile ahead, from ``tiles_m2`` and ``one_tile``, so the PE's issue logic
    has no compare in front of it.
    """

    def __init__(self, tile_count_bits: int):
        super().__init__({
            "start": In(1),
            "s_valid": In(1),
            "s_ready": Out(1),
            "g_done": In(1),                     # with a G beat taken: it was G's last
            "tile_loaded": In(1),                # with a Z beat taken: it completes the tile
            "tile_consumed": In(1),              # the MAC loop issued the tile's last cycle
            "tiles_m1": In(tile_count_bits),     # tiles - 1, tiles - 2, tiles == 1 (held sizes)
            "tiles_m2": In(tile_count_bits),
            "one_tile": In(1),
            "g_fire": Out(1),                    # a G beat is taken
            "z_fire": Out(1),                    # a Z beat is taken
            "load_bank": Out(1),
            "compute_bank": Out(1),
            "full": Out(2),
            "compute_full": Out(1),              # the compute bank holds a complete tile
            "last_tile": Out(1),
            "done": Out(1),                      # every tile has been consumed
        })

    def elaborate(self, platform):
        m = Module()
        bits = len(self.tiles_m1)
        g_phase, z_phase = Signal(), Signal()
        lbank, cbank, full = self.load_bank, self.compute_bank, self.full
        loaded, computed = Signal(bits), Signal(bits)
        z_ready = Signal()
        m.d.comb += [
            z_ready.eq(z_phase & ~Mux(lbank, full[1], full[0])),
            self.s_ready.eq(g_phase | z_ready),
            self.g_fire.eq(self.s_valid & g_phase),
            self.z_fire.eq(self.s_valid & z_ready),
            self.compute_full.eq(Mux(cbank, full[1], full[0])),
        ]
        with m.If(self.g_done):
            m.d.sync += [g_phase.eq(0), z_phase.eq(1)]
        with m.If(self.tile_loaded):
            m.d.sync += [lbank.eq(~lbank), loaded.eq(loaded + 1)]
            with m.If(lbank):
                m.d.sync += full[1].eq(1)
            with m.Else():
                m.d.sync += full[0].eq(1)
            with m.If(loaded == self.tiles_m1):
                m.d.sync += z_phase.eq(0)
        # After the load side: a bank loaded and consumed in one cycle ends empty.
        with m.If(self.tile_consumed):
            m.d.sync += [cbank.eq(~cbank), computed.eq(computed + 1),
                         self.last_tile.eq(computed == self.tiles_m2)]
            with m.If(cbank):
                m.d.sync += full[1].eq(0)
            with m.Else():
                m.d.sync += full[0].eq(0)
            with m.If(self.last_tile):
                m.d.sync += self.done.eq(1)
        with m.If(self.start):
            m.d.sync += [g_phase.eq(1), z_phase.eq(0), full.eq(0), lbank.eq(0), cbank.eq(0),
                         loaded.eq(0), computed.eq(0), self.done.eq(0),
                         self.last_tile.eq(self.one_tile)]
        return m

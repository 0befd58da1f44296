"""The arithmetic every computing op of the LRT PE (:mod:`insitu.rtl.pe_lrt`) shares: eight
multiplier lanes, their sum and its rounding shift."""

from __future__ import annotations

from amaranth.hdl import Module, Signal, signed, unsigned
from amaranth.lib import data, wiring
from amaranth.lib.wiring import In, Out

from insitu.numerics import LRT_PE_WORD_BITS, LRT_RECIP_BITS, accumulator_bits

from insitu.accel.params import AcceleratorParams
from .requantize import RoundShiftSaturate


class LrtLanes(wiring.Component):
    """Stages S2 to S6 of the LRT pipeline: the operands ``a`` (a word or a 32-bit ``u_k``) and
    ``b`` (a word or the 17-bit LRT_RECIP) registered into two multipliers per lane (S2: operand
    and product registers, DSP friendly; S3 their sum, the lane's product), the lanes' sum with
    the rounding term (S4), the rounding shift by ``shift`` (S5) and the saturation into ``y``
    (S6, 18 bits: the MGS step
    ``round(c Q, 14)`` must not saturate before ``x - y`` does).

    Separate because it is the one datapath the ops share: each op only chooses the operands
    (the PE's S1 muxes) and what to do with ``y`` (or, for LRT_UPDATE's ``u_k``, with the
    products).
    """

    def __init__(self, params: AcceleratorParams, lanes: int, a_bits: int):
        self.params, self.lanes = params, lanes
        b_bits = LRT_RECIP_BITS + 1
        #: The exact sum: at most ``lanes`` products of an ``a`` and a word.
        self.sum_bits = accumulator_bits(a_bits, LRT_PE_WORD_BITS, lanes)
        super().__init__({
            "a": In(data.ArrayLayout(signed(a_bits), lanes)),
            "b": In(data.ArrayLayout(signed(b_bits), lanes)),
            "shift": In(range(params.shift_min, params.shift_max + 1)),     # static in an op
            "products": Out(data.ArrayLayout(signed(a_bits + b_bits), lanes)),
            "y": Out(signed(LRT_PE_WORD_BITS + 2)),
        })

    def elaborate(self, platform):
        m = Module()
        P, L, sum_bits = self.params, self.lanes, self.sum_bits
        a_shape, b_shape = self.a.shape().elem_shape, self.b.shape().elem_shape
        # S2-S3: a 32-bit ``a`` times ``b`` is two multiplies of one DSP each (DSP48E1 25 x 18,
        # DSP48E2 27 x 18): the low half of ``a`` (unsigned) and the high half (signed), each
        # with registered operands and product (S2); their sum is a stage of its own (S3). As one
        # 32 x 18 multiply, the partial products' adder ran behind unregistered DSP48E2s (Yosys
        # keeps their registers outside) and was the long path on xczu3eg.
        half_bits = a_shape.width // 2
        opa_lo = [Signal(unsigned(half_bits), name=f"opa_lo{k}", reset_less=True) for k in range(L)]
        opa_hi = [Signal(signed(a_shape.width - half_bits), name=f"opa_hi{k}", reset_less=True)
                  for k in range(L)]
        opb = [Signal(b_shape, name=f"opb{k}", reset_less=True) for k in range(L)]
        prod_lo = [Signal(signed(half_bits + 1 + b_shape.width), name=f"prod_lo{k}", reset_less=True)
                   for k in range(L)]
        prod_hi = [Signal(signed(a_shape.width - half_bits + b_shape.width), name=f"prod_hi{k}",
                          reset_less=True) for k in range(L)]
        prod = [Signal(self.products.shape().elem_shape, name=f"prod{k}", reset_less=True)
                for k in range(L)]
        m.d.sync += [opa_lo[k].eq(self.a[k][:half_bits]) for k in range(L)]
        m.d.sync += [opa_hi[k].eq(self.a[k][half_bits:]) for k in range(L)]
        m.d.sync += [opb[k].eq(self.b[k]) for k in range(L)]
        m.d.sync += [prod_lo[k].eq(opa_lo[k] * opb[k]) for k in range(L)]
        m.d.sync += [prod_hi[k].eq(opa_hi[k] * opb[k]) for k in range(L)]
        m.d.sync += [prod[k].eq((prod_hi[k] << half_bits) + prod_lo[k]) for k in range(L)]
        m.d.comb += [self.products[k].eq(prod[k]) for k in range(L)]

        # S4: the adder tree.
        # The rounding term rides in the tree (prerounded), so that the rescale only shifts.
        rshift = Signal(range(P.shift_min, P.shift_max + 1), reset_less=True)
        # Written every cycle from rshift and read only by total (itself reset-less, gated by
        # the valid bits): no reset, so aresetn does not drive its 52 resets.
        half = Signal(signed(sum_bits + 1), reset_less=True)
        m.d.sync += half.eq(RoundShiftSaturate.half_of(rshift, sum_bits, P.shift_max))
        total = Signal(signed(sum_bits + 1), reset_less=True)
        m.d.sync += total.eq(sum(prod) + half)

        # S5-S6: rescale (round half up: S5 the rounding shift, S6 the saturation into y).
        m.submodules.rescale = rescale = RoundShiftSaturate(
            sum_bits + 1, LRT_PE_WORD_BITS + 2, P.shift_max, P.shift_min, stages=1,
            prerounded=True)
        y = Signal(signed(LRT_PE_WORD_BITS + 2), reset_less=True)
        m.d.sync += [rshift.eq(self.shift), y.eq(rescale.data_out)]
        m.d.comb += [rescale.data_in.eq(total), rescale.shift.eq(rshift), self.y.eq(y)]
        return m

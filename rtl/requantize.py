"""The output stage every PE shares: rounding right shift and saturation, as the spec defines it.

``data_out = saturate(round_half_up(data_in * 2**-shift))`` to ``out_width`` signed bits, where the
rounding is ``(v + 2**(shift-1)) >> shift`` (ties toward +infinity) -- exactly
:func:`insitu.numerics.shift_round` followed by :func:`insitu.numerics.saturate`. A negative shift
(``min_shift < 0``) is an exact left shift before saturation, as
:meth:`insitu.numerics.FixedPoint.requantize` does. Combinational by default (``stages=0``); with
``stages=1`` the rounded and shifted value is registered before the saturation (one cycle of
latency) and so is the decode of ``shift``, which must then be set a cycle before the data (it is
a configuration): this cuts its logic depth for a 100 MHz clock. With ``prerounded=True`` the
caller has already added the rounding term (:meth:`RoundShiftSaturate.half_of`, e.g. as the initial
value of an accumulator), and the rescaler only shifts and saturates: no wide add on its path.
With ``shift_delay = n`` (``stages=1`` only) the decode of ``shift`` passes ``n`` registers, so
``shift`` must be set ``n`` cycles before the data; see :class:`RoundShiftSaturate`.
"""

from __future__ import annotations

from amaranth.hdl import Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from insitu.numerics import code_range


class RoundShiftSaturate(wiring.Component):
    """Rescale a wide signed accumulator by a run-time power of two into a narrow signed code.

    Parameters are generate-time bounds: ``in_width`` (accumulator), ``out_width`` (result code),
    ``max_shift`` (largest right shift the ``shift`` port accepts) and ``min_shift`` (<= 0: the
    largest left shift, negated). ``stages``: 0 (combinational) or 1 (a register in the ``sync``
    domain between the shift and the saturation: ``data_out`` one cycle after ``data_in``, with
    the ``shift`` of the cycle before). ``prerounded``: ``data_in`` is ``v + half_of(shift)``
    (``v`` within ``in_width - 1`` signed bits) and the output is that of ``v``.

    ``shift_delay`` (``stages=1`` only, default 1): the registers that hold the decode of
    ``shift`` (``right``; ``left`` and ``is_left`` with ``min_shift < 0``) are a chain of
    ``shift_delay`` registers, and ``data_out`` is that of the ``shift`` of ``shift_delay``
    cycles before ``data_in``'s. This is for rescalers that share one configuration ``shift``:
    Yosys merges identical flip-flops (same D, clock and enable; ``opt_merge``, even with a
    ``keep`` attribute), so their control registers become one per bit that drives every
    rescaler's barrel shifter (in the whole accelerator ~1,100 loads on each ``right`` bit, a
    net the timing model charges for its fan-out). Rescalers given different delays share one
    chain, each taking its own tap.
    """

    def __init__(self, in_width: int, out_width: int, max_shift: int, min_shift: int = 0,
                 stages: int = 0, prerounded: bool = False, shift_delay: int = 1):
        self.prerounded = prerounded
        if stages not in (0, 1):
            raise ValueError(f"RoundShiftSaturate: stages must be 0 or 1, got {stages}")
        if shift_delay < 1 or (shift_delay > 1 and stages != 1):
            raise ValueError(f"RoundShiftSaturate: shift_delay must be 1, or more with stages=1, "
                             f"got {shift_delay} with stages={stages}")
        self.stages, self.shift_delay = stages, shift_delay
        if not (1 <= out_width <= in_width) or max_shift < 0 or min_shift > 0:
            raise ValueError(f"RoundShiftSaturate: need 1 <= out_width <= in_width, max_shift >= 0 and "
                             f"min_shift <= 0, got in={in_width} out={out_width} "
                             f"shifts=[{min_shift}, {max_shift}]")
        self.in_width, self.out_width = in_width, out_width
        self.min_shift, self.max_shift = min_shift, max_shift
        super().__init__({
            "data_in": In(signed(in_width)),
            "shift": In(range(min_shift, max_shift + 1)),
            "data_out": Out(signed(out_width)),
        })

    @staticmethod
    def half_of(shift, value_bits: int, max_shift: int):
        """The rounding term ``2**(shift-1)`` (0 when ``shift <= 0``) that a ``prerounded`` caller
        adds to a value of ``value_bits`` signed bits, capped at ``2**(value_bits-1)``: beyond,
        ``v + 2**(shift-1)`` and ``v + 2**(value_bits-1)`` both shift to 0 (the sum lies in
        ``[0, 2**shift)``). The sum then fits ``value_bits + 1`` signed bits."""
        top = min(max_shift, value_bits)
        capped = Mux(shift > top, top, shift)[:max(1, top.bit_length())]
        return Mux(shift > 0, (Const(1, top + 1) << capped) >> 1, 0)

    def elaborate(self, platform):
        m = Module()

        def control(value, name):
            # With a pipeline stage, what the shift decodes to is registered too: the shift is a
            # configuration (held), and its decode stays off the data path.
            # (shift_delay > 1: a chain, the last register named as with one.)
            if not self.stages:
                return value
            for i in range(self.shift_delay, 0, -1):
                reg = Signal(value.shape(), name=name if i == 1 else f"{name}_t{i}",
                             reset_less=True)
                m.d.sync += reg.eq(value)
                value = reg
            return value

        right = control(Mux(self.shift > 0, self.shift, 0)[:max(1, self.max_shift.bit_length())],
                        "right")
        # Half an output LSB, 2**(shift-1), or 0 when shift <= 0; one extra bit for the carry.
        # Staged, it is decoded from `shift` itself (not from the registered `right`), so that it
        # is registered in the same cycle as `right`.
        half = control(Mux(self.shift > 0, (Const(1, self.max_shift + 1) << right) >> 1, 0)
                       if not self.stages else
                       Mux(self.shift > 0, (Const(1, self.max_shift + 1) << self.shift[:len(right)]) >> 1, 0),
                       "half")
        rounded = (self.data_in if self.prerounded else self.data_in + half) >> right
        if self.min_shift < 0:
            # A left shift by out_width or more saturates every nonzero value: cap it there.
            cap = min(-self.min_shift, self.out_width)
            left = Mux(self.shift < 0, -self.shift, 0)
            left = control(Mux(left > cap, cap, left)[:cap.bit_length()], "left")
            is_left = control(self.shift < 0, "is_left")
            rounded = Mux(is_left, self.data_in << left, rounded)
        if self.stages:
            # A datapath register: no reset needed (the PEs qualify it with their valid bits).
            staged = Signal(rounded.shape(), reset_less=True)
            m.d.sync += staged.eq(rounded)
            rounded = staged
        lo, hi = code_range(self.out_width, signed=True)
        with m.If(rounded > hi):
            m.d.comb += self.data_out.eq(hi)
        with m.Elif(rounded < lo):
            m.d.comb += self.data_out.eq(lo)
        with m.Else():
            m.d.comb += self.data_out.eq(rounded)
        return m

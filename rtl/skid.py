"""A skid buffer for a PE's input stream: both sides of it are registers.

A PE whose ``s.ready`` is decoded from its state machine puts that decode on the top level's
paths (the beat counters, the TLAST checks, ERROR and the per-PE resets all follow the
handshake), and the stream's data on the PE's own. Behind :class:`InputSkid` the top sees
``ready`` as two flip-flops through one gate, and the PE takes ``o`` (valid and payload from
flip-flops) as it took the stream, one cycle later: a beat the PE cannot take at once waits in the
skid register, which drops ``ready`` for the next cycle, so the stream runs at one beat a cycle.

``ready`` is also held low once the op's ``beats`` have been accepted (counted from ``start``),
so the buffer never takes a beat the op does not consume.
"""

from __future__ import annotations

from amaranth.hdl import Module, Mux, Signal
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from .pe_interface import BEATS_BITS

__all__ = ["InputSkid"]


class InputSkid(wiring.Component):
    """``i`` from the top level, ``o`` to the PE's datapath; ``start`` and ``beats`` (the op's
    input beats, held from ``start``) bound what ``i`` accepts."""

    def __init__(self, width: int):
        super().__init__({
            "i": In(stream.Signature(width)),
            "o": Out(stream.Signature(width)),
            "start": In(1),
            "beats": In(BEATS_BITS),
        })

    def elaborate(self, platform):
        m = Module()
        parked = Signal()                        # the skid register holds a beat
        skid = Signal.like(self.i.payload, reset_less=True)
        out_valid = Signal()
        out_data = Signal.like(self.i.payload, reset_less=True)
        want = Signal()                          # beats of the op still to accept
        left = Signal(BEATS_BITS)
        accept = Signal()
        m.d.comb += [
            self.i.ready.eq(want & ~parked),
            accept.eq(self.i.valid & self.i.ready),
            self.o.valid.eq(out_valid),
            self.o.payload.eq(out_data),
        ]
        with m.If(~out_valid | self.o.ready):     # the output register moves on
            m.d.sync += [out_valid.eq(parked | accept),
                         out_data.eq(Mux(parked, skid, self.i.payload)), parked.eq(0)]
        with m.Elif(accept):                      # ... or the beat waits in the skid register
            m.d.sync += [skid.eq(self.i.payload), parked.eq(1)]
        with m.If(self.start):
            m.d.sync += [want.eq(self.beats != 0), left.eq(self.beats), parked.eq(0),
                         out_valid.eq(0)]
        with m.Elif(accept):
            m.d.sync += [left.eq(left - 1), want.eq(left != 1)]
        return m

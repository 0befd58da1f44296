"""The interface every processing element presents to the top level (:mod:`insitu.rtl.top`).

The top level owns the control plane: it latches the configuration registers at START, asks the
selected PE whether the configuration is valid (``cfg_error``), pulses ``start``, routes the AXI
streams to the PE, counts beats and cycles, and on ABORT (or an input stream that ends early)
holds the PE in reset for a cycle. A PE therefore only does its datapath:

* ``op``, ``a``, ``b``, ``c``, ``d`` (16-bit sizes), ``shift`` (signed): configuration, held
  stable by the top from ``start`` until ``busy`` falls;
* ``cfg_error``: from the configuration, 0 or an :class:`~insitu.accel.regmap.ErrorCode`; the top
  never starts a PE whose ``cfg_error`` is not 0;
* ``in_beats`` / ``out_beats``: the number of 128-bit beats the configured op consumes from ``s``
  and produces on ``m`` (the top latches them at launch for TLAST, and shows them as the DMA
  sizes);
* ``cfg_ready``: high when ``cfg_error``, ``in_beats`` and ``out_beats`` are those of the present
  configuration. A PE may compute them over a few registered cycles (PE3 divides, the LRT PE
  multiplies): it drops ``cfg_ready`` the cycle its configuration changes and raises it once they
  are settled; the top checks and launches only then. Undriven (a combinational PE), it is 1;
* ``start``: a one-cycle pulse; ``busy`` is high from the next cycle until the PE has consumed all
  its input and its last output beat has been accepted on ``m``;
* ``s`` / ``m``: ``amaranth.lib.stream`` interfaces with a 128-bit payload of eight 16-bit words,
  word ``k`` in bits ``[16k+15 : 16k]``, two's complement. Either side may stall at any time.

The stream layouts of the TT PEs are defined by the golden model, :mod:`insitu.tt.pe_stream`.
"""

from __future__ import annotations

from amaranth.hdl import Cat, Signal, signed
from amaranth.lib import stream, wiring
from amaranth.lib.wiring import In, Out

from insitu.accel.params import SIZE_BITS, STREAM_BITS

#: Width of the cfg_error port (ErrorCode values).
ERROR_BITS = 8
#: Width of the in_beats / out_beats ports.
BEATS_BITS = 32
#: Width of the SHIFT configuration (signed).
SHIFT_BITS = 8


def pe_members(extra: dict | None = None) -> dict:
    """Signature members of a PE; ``extra`` adds PE-specific ports (the LRT PE's registers)."""
    members = {
        "op": In(8),
        "a": In(SIZE_BITS),
        "b": In(SIZE_BITS),
        "c": In(SIZE_BITS),
        "d": In(SIZE_BITS),
        "shift": In(signed(SHIFT_BITS)),
        "cfg_error": Out(ERROR_BITS),
        "in_beats": Out(BEATS_BITS),
        "out_beats": Out(BEATS_BITS),
        "cfg_ready": Out(1, init=1),
        "start": In(1),
        "busy": Out(1),
        "s": In(stream.Signature(STREAM_BITS)),
        "m": Out(stream.Signature(STREAM_BITS)),
    }
    members.update(extra or {})
    return members


def settled(m, config, stages: int):
    """``cfg_ready`` of a PE whose configuration results come ``stages`` registered cycles after
    ``config`` (a list of its configuration inputs): high once ``config`` has held still for
    ``stages`` cycles, low from the cycle it changes."""
    now = Cat(*config)
    last = Signal(len(now), reset_less=True)
    age = Signal(range(stages + 1))
    ready = Signal()
    changed = now != last
    m.d.sync += last.eq(now)
    with m.If(changed):
        m.d.sync += age.eq(0)
    with m.Elif(age != stages):
        m.d.sync += age.eq(age + 1)
    # The age counts registered cycles since the change; `changed` covers the cycle of one.
    m.d.comb += ready.eq(~changed & (age == stages))
    return ready


class PE(wiring.Component):
    """Base class of the PEs: the common signature plus ``extra`` ports."""

    def __init__(self, extra: dict | None = None):
        super().__init__(pe_members(extra))

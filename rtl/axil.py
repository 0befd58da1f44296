"""The accelerator's AXI4-Lite register file, generated from the register map (:mod:`.regmap`).

:class:`AXILiteRegisters` is an AXI4-Lite slave with one port per register of
:data:`~insitu.accel.regmap.REGISTERS`, named after the register in lower case:

* ``rw``: ``Out(width)``, the stored value (signed where the map says so); byte strobes honoured;
* ``ro``: ``In(width)``, the value the hardware drives, sampled when the read is accepted. ID,
  VERSION and the ``CAP_*`` registers (``param``) are constants of this component: no port;
* ``wo``: ``Out(width)``, high for exactly one cycle after a write, and only in the bits written
  with 1 (in the byte lanes whose strobe was set); reads return 0.

Reads of a signed register return its value sign-extended to 32 bits. An address that names no
register reads 0 and ignores writes; every response is OKAY (on a Zynq an error response would be
a bus fault in the driver's process). Address bits [1:0] are ignored.

Bus behaviour: the write address and the write data are accepted independently, in either order
or in the same cycle, each held until the other arrives; the register is updated one cycle after
both are held, and BVALID rises with the update (a read issued after BVALID sees the new value).
There is one outstanding write and one outstanding read: AWREADY/WREADY stay low until BREADY
takes the response, ARREADY stays low until RREADY takes the data. BVALID and RVALID, once high,
hold until accepted; RDATA is registered and stable meanwhile. Both channels run concurrently.
All state is in the ``sync`` domain (synchronous reset: the top maps ``aresetn`` onto it).
"""

from __future__ import annotations

from amaranth.hdl import Cat, Const, Module, Mux, Signal, signed
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out

from insitu.accel.params import DEFAULT_PARAMS, AcceleratorParams
from insitu.accel.regmap import ADDR_BITS, REGISTERS, Register, reset_value

#: Width of the AXI4-Lite data bus.
DATA_BITS = 32
#: Responses (BRESP / RRESP).
RESP_OKAY = 0


class AXILiteBusSignature(wiring.Signature):
    """An AXI4-Lite bus seen from the master (Amaranth's convention, as for ``stream.Signature``):
    ``Out`` members are driven by the master (AWADDR, AWVALID, WDATA, WSTRB, WVALID, BREADY,
    ARADDR, ARVALID, RREADY), ``In`` members by the slave.

    A slave has the member ``"bus": In(AXILiteSignature)``; a top level with its own slave port
    forwards it to the register file with ``wiring.connect(m, wiring.flipped(self.s_axi), regs.bus)``.
    """

    def __init__(self, addr_bits: int = ADDR_BITS, data_bits: int = DATA_BITS):
        if addr_bits < 3 or data_bits != 32:
            raise ValueError(f"AXILiteBusSignature: need addr_bits >= 3 and data_bits == 32, "
                             f"got {addr_bits}, {data_bits}")
        self.addr_bits, self.data_bits = addr_bits, data_bits
        super().__init__({
            "awaddr": Out(addr_bits),
            "awvalid": Out(1),
            "awready": In(1),
            "wdata": Out(data_bits),
            "wstrb": Out(data_bits // 8),
            "wvalid": Out(1),
            "wready": In(1),
            "bresp": In(2),
            "bvalid": In(1),
            "bready": Out(1),
            "araddr": Out(addr_bits),
            "arvalid": Out(1),
            "arready": In(1),
            "rdata": In(data_bits),
            "rresp": In(2),
            "rvalid": In(1),
            "rready": Out(1),
        })

    def __eq__(self, other):
        return (isinstance(other, AXILiteBusSignature) and other.addr_bits == self.addr_bits
                and other.data_bits == self.data_bits)

    def __hash__(self):
        return hash((AXILiteBusSignature, self.addr_bits, self.data_bits))

    def __repr__(self):
        return f"AXILiteBusSignature({self.addr_bits}, {self.data_bits})"


#: The accelerator's AXI4-Lite bus (ADDR_BITS address bits, 32 data bits), master's view.
AXILiteSignature = AXILiteBusSignature()


def is_constant(reg: Register) -> bool:
    """Whether the register file drives ``reg`` itself (ID, VERSION, the CAP_* parameters)."""
    return reg.access == "ro" and (reg.param is not None or reg.name in ("ID", "VERSION"))


def port_name(reg: Register) -> str:
    return reg.name.lower()


def _shape(reg: Register):
    return signed(reg.width) if reg.signed else reg.width


def register_members(registers=REGISTERS) -> dict:
    """The per-register ports of :class:`AXILiteRegisters` (a top level can forward them)."""
    members = {}
    for reg in registers:
        if is_constant(reg):
            continue
        members[port_name(reg)] = (In if reg.access == "ro" else Out)(_shape(reg))
    return members


class AXILiteRegisters(wiring.Component):
    """AXI4-Lite slave ``bus`` over the registers of ``registers`` (see the module docstring)."""

    def __init__(self, registers=REGISTERS, params: AcceleratorParams = DEFAULT_PARAMS):
        registers = tuple(registers)
        names = [port_name(r) for r in registers]
        if "bus" in names or len(set(names)) != len(names):
            raise ValueError("AXILiteRegisters: register names must be unique and not 'bus'")
        for reg in registers:
            if is_constant(reg):
                value = reset_value(reg, params)
                if not 0 <= value < (1 << reg.width):
                    raise ValueError(f"AXILiteRegisters: constant {reg.name} = {value} does not fit "
                                     f"its {reg.width} bits")
        self.registers = registers
        self.params = params
        super().__init__({"bus": In(AXILiteSignature), **register_members(registers)})

    def elaborate(self, platform):
        m = Module()
        bus = self.bus
        lanes = DATA_BITS // 8

        # ---- write channel: AW and W held independently, the write done once both are held.
        aw_held = Signal()
        aw_addr = Signal(ADDR_BITS - 2)
        w_held = Signal()
        w_data = Signal(DATA_BITS)
        w_strb = Signal(lanes)
        bvalid = Signal()
        m.d.comb += [
            bus.awready.eq(~aw_held & ~bvalid),
            bus.wready.eq(~w_held & ~bvalid),
            bus.bvalid.eq(bvalid),
            bus.bresp.eq(RESP_OKAY),
        ]
        with m.If(bus.awvalid & bus.awready):
            m.d.sync += [aw_held.eq(1), aw_addr.eq(bus.awaddr[2:])]
        with m.If(bus.wvalid & bus.wready):
            m.d.sync += [w_held.eq(1), w_data.eq(bus.wdata), w_strb.eq(bus.wstrb)]
        do_write = Signal()
        m.d.comb += do_write.eq(aw_held & w_held)
        with m.If(do_write):
            m.d.sync += [aw_held.eq(0), w_held.eq(0), bvalid.eq(1)]
        with m.Elif(bvalid & bus.bready):
            m.d.sync += bvalid.eq(0)

        # Bits of each lane to take from the write data.
        byte_mask = Cat(*(w_strb[i].replicate(8) for i in range(lanes)))

        for reg in self.registers:
            if reg.access == "ro":
                continue
            port = getattr(self, port_name(reg))
            hit = do_write & (aw_addr == reg.offset >> 2)
            if reg.access == "rw":
                old = port.as_unsigned()
                merged = ((w_data & byte_mask) | (old & ~byte_mask[:reg.width]))[:reg.width]
                with m.If(hit):
                    m.d.sync += port.eq(merged)
            else:                                         # wo: a one-cycle pulse per bit written 1
                m.d.sync += port.eq(Mux(hit, (w_data & byte_mask)[:reg.width], 0))

        # ---- read channel: RDATA registered when AR is accepted, held until R is taken.
        rvalid = Signal()
        rdata = Signal(DATA_BITS)
        m.d.comb += [
            bus.arready.eq(~rvalid),
            bus.rvalid.eq(rvalid),
            bus.rdata.eq(rdata),
            bus.rresp.eq(RESP_OKAY),
        ]
        with m.If(bus.arvalid & bus.arready):
            m.d.sync += rvalid.eq(1)
            with m.Switch(bus.araddr[2:]):
                for reg in self.registers:
                    with m.Case(reg.offset >> 2):
                        m.d.sync += rdata.eq(self._read_value(reg))
                with m.Default():
                    m.d.sync += rdata.eq(0)
        with m.Elif(rvalid & bus.rready):
            m.d.sync += rvalid.eq(0)
        return m

    def _read_value(self, reg: Register):
        if is_constant(reg):
            return Const(reset_value(reg, self.params), 32)
        if reg.access == "wo":
            return Const(0, 32)
        # A signed register's value is sign-extended to 32 bits by the assignment.
        return getattr(self, port_name(reg))

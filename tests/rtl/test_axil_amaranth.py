"""The AXI4-Lite register file against the register map, in Amaranth's simulator.

A cycle-accurate master drives AW and W with independent delays (AW first, W first, together) and
holds BREADY/RREADY low for a while; a monitor checks the slave's obligations every cycle (BVALID
and RVALID hold until taken, RDATA is stable meanwhile, one outstanding transaction per channel)
and records the cycles where a write-only register pulses.
"""

import random

import pytest
from amaranth.hdl import Shape
from amaranth.lib import wiring
from amaranth.lib.wiring import In, Out
from amaranth.sim import Simulator

from insitu.accel import regmap
from insitu.rtl.axil import (AXILiteBusSignature, AXILiteRegisters, AXILiteSignature, is_constant,
                             port_name)
from insitu.accel.params import DEFAULT_PARAMS, AcceleratorParams
from insitu.accel.regmap import ADDR_BITS, REGISTERS

pytestmark = pytest.mark.rtl

RW = [r for r in REGISTERS if r.access == "rw"]
RO_PORTS = [r for r in REGISTERS if r.access == "ro" and not is_constant(r)]
CONSTANTS = [r for r in REGISTERS if is_constant(r)]
WO = [r for r in REGISTERS if r.access == "wo"]
USED = {r.offset for r in REGISTERS}
UNKNOWN = [a for a in range(0, 1 << ADDR_BITS, 4) if a not in USED]


def lane_mask(strb: int) -> int:
    return sum(0xFF << (8 * i) for i in range(4) if strb >> i & 1)


def to_signed(value: int, width: int) -> int:
    value &= (1 << width) - 1
    return value - (1 << width) if value >> (width - 1) else value


def read_value(reg, stored: int) -> int:
    """What a 32-bit read returns for a register holding ``stored`` (signed: sign-extended)."""
    if reg.signed:
        return to_signed(stored, reg.width) & 0xFFFFFFFF
    return stored & ((1 << reg.width) - 1)


class Master:
    """A cycle-level AXI4-Lite master for async testbenches."""

    def __init__(self, dut):
        self.dut, self.bus = dut, dut.bus

    async def write(self, ctx, addr, data, strb=0xF, aw_delay=0, w_delay=0, b_delay=0):
        bus = self.bus
        ctx.set(bus.awaddr, addr)
        ctx.set(bus.wdata, data)
        ctx.set(bus.wstrb, strb)
        aw_done = w_done = False
        cycle = 0
        while not (aw_done and w_done):
            ctx.set(bus.awvalid, not aw_done and cycle >= aw_delay)
            ctx.set(bus.wvalid, not w_done and cycle >= w_delay)
            aw_fire = ctx.get(bus.awvalid) and ctx.get(bus.awready)
            w_fire = ctx.get(bus.wvalid) and ctx.get(bus.wready)
            await ctx.tick()
            aw_done, w_done = aw_done or aw_fire, w_done or w_fire
            cycle += 1
            assert cycle < 100, "write address/data never accepted"
        ctx.set(bus.awvalid, 0)
        ctx.set(bus.wvalid, 0)
        # The response, with BREADY held low for b_delay cycles after BVALID.
        waited = 0
        while not ctx.get(bus.bvalid):
            await ctx.tick()
            waited += 1
            assert waited < 100, "no write response"
        for _ in range(b_delay):
            await ctx.tick()
        assert ctx.get(bus.bvalid) and ctx.get(bus.bresp) == 0
        ctx.set(bus.bready, 1)
        await ctx.tick()
        ctx.set(bus.bready, 0)

    async def read(self, ctx, addr, r_delay=0):
        bus = self.bus
        ctx.set(bus.araddr, addr)
        ctx.set(bus.arvalid, 1)
        cycle = 0
        while True:
            fire = ctx.get(bus.arready)
            await ctx.tick()
            cycle += 1
            assert cycle < 100, "read address never accepted"
            if fire:
                break
        ctx.set(bus.arvalid, 0)
        while not ctx.get(bus.rvalid):
            await ctx.tick()
            cycle += 1
            assert cycle < 200, "no read data"
        for _ in range(r_delay):
            await ctx.tick()
        assert ctx.get(bus.rvalid) and ctx.get(bus.rresp) == 0
        data = ctx.get(bus.rdata)
        ctx.set(bus.rready, 1)
        await ctx.tick()
        ctx.set(bus.rready, 0)
        return data


def simulate(dut, body):
    """Run ``body(ctx, master)`` with the protocol monitor; returns the wo pulses seen.

    ``pulses`` maps a wo register name to a list of (cycle, value) for each cycle it was nonzero.
    """
    bus = dut.bus
    pulses = {r.name: [] for r in WO}
    errors = []

    async def monitor(ctx):
        prev = None
        cycle = 0
        wo_ports = [getattr(dut, port_name(r)) for r in WO]
        async for _, _, *values in ctx.tick().sample(
                bus.bvalid, bus.bready, bus.rvalid, bus.rready, bus.rdata,
                bus.awready, bus.wready, bus.arready, *wo_ports):
            bvalid, _, rvalid, _, rdata, awready, wready, arready = values[:8]
            for reg, value in zip(WO, values[8:]):
                if value:
                    pulses[reg.name].append((cycle, value))
            if prev is not None:
                p_bvalid, p_bready, p_rvalid, p_rready, p_rdata = prev[:5]
                if p_bvalid and not p_bready and not bvalid:
                    errors.append(f"cycle {cycle}: BVALID dropped before BREADY")
                if p_rvalid and not p_rready and (not rvalid or rdata != p_rdata):
                    errors.append(f"cycle {cycle}: RVALID/RDATA changed before RREADY")
            if bvalid and (awready or wready):
                errors.append(f"cycle {cycle}: a second write accepted while a response is pending")
            if rvalid and arready:
                errors.append(f"cycle {cycle}: a second read accepted while data is pending")
            prev = values
            cycle += 1

    async def testbench(ctx):
        await body(ctx, Master(dut))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_process(monitor)
    sim.add_testbench(testbench)
    sim.run()
    assert not errors, errors[:5]
    return pulses


def test_signature_members_and_ports():
    dut = AXILiteRegisters()
    members = dict(AXILiteSignature.members)
    assert set(members) == {"awaddr", "awvalid", "awready", "wdata", "wstrb", "wvalid", "wready",
                            "bresp", "bvalid", "bready", "araddr", "arvalid", "arready", "rdata",
                            "rresp", "rvalid", "rready"}
    assert Shape.cast(members["awaddr"].shape).width == ADDR_BITS
    assert Shape.cast(members["wstrb"].shape).width == 4
    # The master's view: the master drives VALIDs, addresses, data and BREADY/RREADY.
    driven_by_master = {"awaddr", "awvalid", "wdata", "wstrb", "wvalid", "bready", "araddr",
                        "arvalid", "rready"}
    assert {n for n, m in members.items() if m.flow == Out} == driven_by_master
    assert AXILiteSignature == AXILiteBusSignature() and AXILiteSignature != AXILiteBusSignature(16)
    # One port per register except the constants; directions from the access kind.
    ports = dict(dut.signature.members)
    bus = ports.pop("bus")
    assert bus.flow == In and bus.signature == AXILiteSignature.flip()
    assert wiring.flipped(dut.bus).signature == AXILiteSignature
    assert set(ports) == {port_name(r) for r in REGISTERS if not is_constant(r)}
    for reg in REGISTERS:
        if is_constant(reg):
            continue
        member = ports[port_name(reg)]
        assert member.flow == (In if reg.access == "ro" else Out)
        shape = Shape.cast(member.shape)
        assert shape.width == reg.width and shape.signed == reg.signed
    assert regmap.register("SHIFT").signed and dut.shift.shape().signed


def test_reset_values_constants_and_unknown_addresses():
    params = AcceleratorParams(factor_words=2048, pe2_b_max=77, lrt_cells_max=999)
    dut = AXILiteRegisters(params=params)
    seen = {}

    async def body(ctx, master):
        for reg in REGISTERS:
            seen[reg.name] = await master.read(ctx, reg.offset)
        for addr in UNKNOWN[:40] + UNKNOWN[-5:]:
            seen[addr] = await master.read(ctx, addr)

    simulate(dut, body)
    assert seen["ID"] == regmap.ID_VALUE and seen["VERSION"] == regmap.VERSION
    for reg in REGISTERS:
        assert seen[reg.name] == regmap.reset_value(reg, params), reg.name
    assert seen["CAP_FACTOR_WORDS"] == 2048 and seen["CAP_PE2_B_MAX"] == 77
    assert seen["CAP_LRT_CELLS_MAX"] == 999
    assert seen["CAP_PE3_B_MAX"] == DEFAULT_PARAMS.pe3_b_max
    assert all(seen[a] == 0 for a in UNKNOWN[:40] + UNKNOWN[-5:])


@pytest.mark.parametrize("seed", range(3))
def test_rw_registers_random_values_strobes_and_orders(seed):
    rng = random.Random(seed)
    dut = AXILiteRegisters()
    model = {r.name: 0 for r in RW}
    checks = []

    async def body(ctx, master):
        for i in range(60):
            reg = rng.choice(RW)
            data = rng.getrandbits(32)
            strb = 0xF if i % 4 == 0 else rng.getrandbits(4)
            # AW first, W first, together, with B back-pressure.
            order = i % 3
            aw_delay = (0, rng.randint(1, 4), 0)[order]
            w_delay = (rng.randint(1, 4), 0, 0)[order]
            await master.write(ctx, reg.offset | rng.randint(0, 3), data, strb, aw_delay, w_delay,
                               b_delay=rng.randint(0, 3))
            mask = lane_mask(strb) & ((1 << reg.width) - 1)
            model[reg.name] = (model[reg.name] & ~mask) | (data & mask)
            port_value = ctx.get(getattr(dut, port_name(reg)))
            expect_port = (to_signed(model[reg.name], reg.width) if reg.signed
                           else model[reg.name])
            checks.append((reg.name, "port", port_value, expect_port))
            check = rng.choice(RW)
            got = await master.read(ctx, check.offset, r_delay=rng.randint(0, 3))
            checks.append((check.name, "read", got, read_value(check, model[check.name])))
        for reg in RW:
            got = await master.read(ctx, reg.offset)
            checks.append((reg.name, "final", got, read_value(reg, model[reg.name])))

    simulate(dut, body)
    bad = [c for c in checks if c[2] != c[3]]
    assert not bad, bad[:5]


def test_signed_register_reads_sign_extended():
    dut = AXILiteRegisters()
    shift = regmap.register("SHIFT")
    got = {}

    async def body(ctx, master):
        for value in (0xFF, 0x80, 0x7F, 0xFFFFFFF0):
            await master.write(ctx, shift.offset, value)
            got[value] = (await master.read(ctx, shift.offset), ctx.get(dut.shift))

    simulate(dut, body)
    assert got[0xFF] == (0xFFFFFFFF, -1)
    assert got[0x80] == (0xFFFFFF80, -128)
    assert got[0x7F] == (0x7F, 127)
    assert got[0xFFFFFFF0] == (0xFFFFFFF0, -16)


def test_ro_registers_read_their_inputs_and_ignore_writes():
    rng = random.Random(7)
    dut = AXILiteRegisters()
    checks = []

    async def body(ctx, master):
        for _ in range(3):
            values = {r.name: rng.getrandbits(r.width) for r in RO_PORTS}
            for reg in RO_PORTS:
                ctx.set(getattr(dut, port_name(reg)), values[reg.name])
            for reg in RO_PORTS + CONSTANTS:
                await master.write(ctx, reg.offset, rng.getrandbits(32))
            for reg in RO_PORTS:
                checks.append((reg.name, await master.read(ctx, reg.offset), values[reg.name]))
            for reg in CONSTANTS:
                checks.append((reg.name, await master.read(ctx, reg.offset),
                               regmap.reset_value(reg)))

    simulate(dut, body)
    bad = [c for c in checks if c[1] != c[2]]
    assert not bad, bad[:5]


def test_wo_pulses_one_cycle_only_where_ones_are_written():
    dut = AXILiteRegisters()
    ctrl = regmap.register("CTRL")
    writes = [(0b01, 0xF), (0b10, 0xF), (0b11, 0xF), (0b00, 0xF), (0b11, 0x0), (0b11, 0x1),
              (0xFFFFFFFF, 0xE)]
    reads = []
    marks = []

    async def body(ctx, master):
        for i, (data, strb) in enumerate(writes):
            await master.write(ctx, ctrl.offset, data, strb, aw_delay=i % 2, w_delay=(i + 1) % 2,
                               b_delay=i % 3)
            marks.append(len(marks))
            # Idle a few cycles so that a stuck pulse would show.
            for _ in range(3):
                await ctx.tick()
            reads.append(await master.read(ctx, ctrl.offset))
        # Writes elsewhere never pulse CTRL.
        await master.write(ctx, regmap.OFFSETS["OP"], 3)
        await master.write(ctx, 0xFFC, 3)

    pulses = simulate(dut, body)["CTRL"]
    expected = [(data & lane_mask(strb)) & 0b11 for data, strb in writes]
    assert [v for _, v in pulses] == [e for e in expected if e]
    cycles = [c for c, _ in pulses]
    assert len(set(cycles)) == len(cycles)
    assert reads == [0] * len(writes)


def test_write_and_read_channels_run_concurrently():
    """A read issued while a write waits for its data completes, and sees the old value."""
    dut = AXILiteRegisters()
    op = regmap.register("OP")
    got = {}

    async def body(ctx, master):
        bus = dut.bus
        await master.write(ctx, op.offset, 0x11)
        # AW for a new value without W: the write is held, the read goes through.
        ctx.set(bus.awaddr, op.offset)
        ctx.set(bus.awvalid, 1)
        await ctx.tick()
        ctx.set(bus.awvalid, 0)
        assert not ctx.get(bus.awready)           # one outstanding write
        got["during"] = await master.read(ctx, op.offset)
        ctx.set(bus.wdata, 0x22)
        ctx.set(bus.wstrb, 0xF)
        ctx.set(bus.wvalid, 1)
        await ctx.tick()
        ctx.set(bus.wvalid, 0)
        while not ctx.get(bus.bvalid):
            await ctx.tick()
        ctx.set(bus.bready, 1)
        await ctx.tick()
        ctx.set(bus.bready, 0)
        got["after"] = await master.read(ctx, op.offset)

    simulate(dut, body)
    assert got == {"during": 0x11, "after": 0x22}


def test_bad_register_lists_are_refused():
    with pytest.raises(ValueError, match="unique"):
        AXILiteRegisters(registers=REGISTERS + (REGISTERS[2],))
    too_big = AcceleratorParams(factor_words=128 * (1 << 25))
    with pytest.raises(ValueError, match="does not fit"):
        AXILiteRegisters(params=too_big)

"""The shared PE output stage against the spec, in Amaranth's simulator (random widths and values)."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from insitu import numerics as nx
from insitu.rtl.requantize import RoundShiftSaturate

pytestmark = pytest.mark.rtl


@pytest.mark.parametrize("seed", range(6))
def test_round_shift_saturate_matches_the_spec(seed):
    rng = np.random.default_rng(seed)
    out_width = int(rng.integers(4, 17))
    in_width = out_width + int(rng.integers(0, 20))
    max_shift = int(rng.integers(0, in_width))
    min_shift = -int(rng.integers(0, 20)) if seed % 2 else 0
    dut = RoundShiftSaturate(in_width, out_width, max_shift, min_shift)
    values = rng.integers(-(1 << (in_width - 1)), 1 << (in_width - 1), size=200)
    edges = [-(1 << (in_width - 1)), (1 << (in_width - 1)) - 1, 0, -1, 1]
    shifts = rng.integers(min_shift, max_shift + 1, size=len(values) + len(edges))
    cases = list(zip([*values.tolist(), *edges], shifts.tolist()))
    # The spec's requantize: a rounding right shift, or an exact left shift, then saturation.
    spec = nx.FixedPoint(out_width, 0)
    expected = [int(spec.requantize(np.int64(v), s)) for v, s in cases]
    got = []

    async def testbench(ctx):
        for v, s in cases:
            ctx.set(dut.data_in, v)
            ctx.set(dut.shift, s)
            got.append(ctx.get(dut.data_out))

    sim = Simulator(dut)
    sim.add_testbench(testbench)
    sim.run()
    assert got == expected


def test_one_stage_pipeline_matches_the_spec_a_cycle_later():
    rng = np.random.default_rng(11)
    dut = RoundShiftSaturate(40, 16, 63, -16, stages=1)
    values = [*rng.integers(-(1 << 39), 1 << 39, size=100).tolist(), -(1 << 39), (1 << 39) - 1, 0, -1]
    shifts = rng.integers(-16, 64, size=len(values)).tolist()
    spec = nx.FixedPoint(16, 0)
    got = []

    async def testbench(ctx):
        for v, s in zip(values, shifts):
            ctx.set(dut.shift, s)            # a configuration: set a cycle before the data
            await ctx.tick()
            ctx.set(dut.data_in, v)
            await ctx.tick()
            got.append(ctx.get(dut.data_out))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert got == [int(spec.requantize(np.int64(v), s)) for v, s in zip(values, shifts)]
    with pytest.raises(ValueError, match="stages"):
        RoundShiftSaturate(8, 4, 2, stages=2)


@pytest.mark.parametrize("delay", [1, 2, 5])
@pytest.mark.parametrize("prerounded", [False, True])
def test_shift_delay_takes_the_shift_of_that_many_cycles_before(delay, prerounded):
    """shift_delay = n: data_in of cycle t leaves (a cycle later) rescaled by the shift of cycle
    t - n, with shift and data changing every cycle; prerounded: data_in holds v + half_of(shift)
    of that shift."""
    rng = np.random.default_rng(20 + delay)
    dut = RoundShiftSaturate(40, 16, 63, -16, stages=1, prerounded=prerounded, shift_delay=delay)
    n = 120
    shifts = rng.integers(-16, 64, size=n).tolist()
    values = rng.integers(-(1 << 38), 1 << 38, size=n).tolist()
    spec = nx.FixedPoint(16, 0)

    def half(s):
        return (1 << (min(s, 39) - 1)) if s > 0 else 0

    got, want = [], []

    async def testbench(ctx):
        for t in range(n):
            ctx.set(dut.shift, shifts[t])
            s = shifts[t - delay] if t >= delay else None
            v = values[t]
            ctx.set(dut.data_in, v + half(s) if prerounded and s is not None and s > 0 else v)
            await ctx.tick()
            if s is not None:
                got.append(ctx.get(dut.data_out))
                want.append(int(spec.requantize(np.int64(v), s)))

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    assert got == want
    with pytest.raises(ValueError, match="shift_delay"):
        RoundShiftSaturate(8, 4, 2, shift_delay=2)
    with pytest.raises(ValueError, match="shift_delay"):
        RoundShiftSaturate(8, 4, 2, stages=1, shift_delay=0)


def test_bad_widths_are_refused():
    with pytest.raises(ValueError, match="out_width"):
        RoundShiftSaturate(8, 16, 2)

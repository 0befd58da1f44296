"""The Amaranth-simulator harness of the PE1/PE2 tests: ops back to back on a PE, with random
input gaps and output stalls, checked against the golden stream model."""

import numpy as np
from amaranth.sim import Simulator

from insitu.accel.stream import beats, words_of
from insitu.tt.pe_stream import PEConfig, reference_stream_out, stream_in


def z_operand(cfg, rng, extremes=0.1):
    """Z over the full 16-bit range with a share of its two extremes."""
    z = rng.integers(-(1 << 15), 1 << 15, size=(cfg.a, cfg.b, cfg.c))
    flat = z.reshape(-1)
    n = int(flat.size * extremes)
    flat[rng.integers(0, flat.size, size=n)] = rng.choice([-(1 << 15), (1 << 15) - 1], size=n)
    return z


def simulate(dut, ops, seed=0, p_gap=0.0, p_stall=0.0):
    """Run ``ops`` (``(cfg, lhs, rhs)``) back to back on ``dut``; per op: output words, cycles
    from START to ``busy`` falling."""
    rng = np.random.default_rng(seed)
    results = []

    async def testbench(ctx):
        for cfg, lhs, rhs in ops:
            ins = beats(stream_in(cfg, lhs, rhs))
            for name in ("a", "b", "c", "d", "shift"):
                ctx.set(getattr(dut, name), getattr(cfg, name))
            ctx.set(dut.op, cfg.op)
            await ctx.tick()
            # The top level starts a PE only once its configuration results have settled.
            for _ in range(getattr(dut, "CFG_STAGES", 1)):
                if ctx.get(dut.cfg_ready):
                    break
                await ctx.tick()
            assert ctx.get(dut.cfg_ready)
            assert ctx.get(dut.cfg_error) == 0
            assert ctx.get(dut.in_beats) == cfg.in_beats() == len(ins)
            assert ctx.get(dut.out_beats) == cfg.out_beats()
            assert not ctx.get(dut.busy) and not ctx.get(dut.s.ready) and not ctx.get(dut.m.valid)
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            out, taken, cycles = [], 0, 0
            limit = 40 * (cfg.in_beats() + cfg.out_beats() + cfg.macs() // 128) + 200
            while True:
                assert ctx.get(dut.busy), "busy must be high from the cycle after START"
                valid = taken < len(ins) and rng.random() >= p_gap
                ctx.set(dut.s.valid, valid)
                if valid:
                    ctx.set(dut.s.payload, ins[taken])
                ready = bool(rng.random() >= p_stall)
                ctx.set(dut.m.ready, ready)
                fired_in = valid and ctx.get(dut.s.ready)
                if ready and ctx.get(dut.m.valid):
                    out.append(ctx.get(dut.m.payload))
                if hasattr(dut, "overrun"):                 # PE2's shadow-bank check
                    assert not ctx.get(dut.overrun), "shadow bank overwritten before it drained"
                await ctx.tick()
                cycles += 1
                taken += fired_in
                if not ctx.get(dut.busy):
                    break
                assert cycles < limit, f"{cfg}: no end after {cycles} cycles"
            assert taken == len(ins), f"{cfg}: busy fell with {len(ins) - taken} input beats left"
            ctx.set(dut.s.valid, 0)
            results.append({"words": words_of(out), "cycles": cycles})

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return results


def check(dut, ops, **kw):
    results = simulate(dut, ops, **kw)
    for (cfg, lhs, rhs), res in zip(ops, results):
        np.testing.assert_array_equal(res["words"], reference_stream_out(cfg, lhs, rhs), err_msg=str(cfg))
    return results


def check_shift_swings(dut, kind, shapes, operands):
    """The rescalers' shift decodes are register chains (one tap per rescaler, up to 9 deep):
    the smallest ops of ``kind`` (``shapes``, ``(a, b, c, d)`` in turn, the first beat reaching
    the rescalers soonest after START) back to back, each with a SHIFT far from the one before,
    set as late as the PE allows (cfg_ready). ``operands(cfg, rng, extremes)``: the PE's."""
    rng = np.random.default_rng(21)
    ops = []
    for i, shift in enumerate([0, 40, -16, 63, 1, 30, -3, 12, 50]):
        cfg = PEConfig(kind, *shapes[i % len(shapes)], shift)
        ops.append((cfg, *operands(cfg, rng, extremes=0.5)))
    check(dut, ops, seed=6)


def check_configurations(dut, cases, expected, seed=0):
    """Drive each configuration ``(a, b, c, d, shift)`` of ``cases`` in turn on an idle ``dut``
    with a clock, as the driver's register writes would, and check ``cfg_ready``: low from the
    cycle a configuration changes, high exactly ``dut.CFG_STAGES`` cycles after it, and whenever
    it is high, ``cfg_error`` / ``in_beats`` / ``out_beats`` are those of the present
    configuration (``expected(a, b, c, d, shift)`` gives them). Some configurations are replaced
    before they settle (a write in the middle of the pipeline)."""
    rng = np.random.default_rng(seed)
    stages = dut.CFG_STAGES
    prev = None

    async def testbench(ctx):
        nonlocal prev
        for case in cases:
            for name, value in zip(("a", "b", "c", "d", "shift"), case):
                ctx.set(getattr(dut, name), value)
            want = expected(*case)
            if case != prev:
                assert not ctx.get(dut.cfg_ready), f"{case}: ready in the cycle it changed"
            hold = stages + 1 if rng.random() < 0.8 else int(rng.integers(1, stages))
            for cycle in range(hold):
                if ctx.get(dut.cfg_ready):
                    got = (ctx.get(dut.cfg_error), ctx.get(dut.in_beats), ctx.get(dut.out_beats))
                    assert got == want, f"{case}, {cycle} cycles after the change"
                if cycle == stages and case != prev:
                    assert ctx.get(dut.cfg_ready), f"{case}: not ready after {stages} cycles"
                await ctx.tick()
            prev = case

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()

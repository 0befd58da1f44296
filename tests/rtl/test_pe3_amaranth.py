"""PE3 (outer products) against the golden stream model, in Amaranth's simulator, generated with
one or two batch entries a MAC step (``AcceleratorParams.pe3_batch_lanes``): the same streams and
output words either way, only the cycles differ."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from insitu.accel.params import DEFAULT_PARAMS, AcceleratorParams
from insitu.rtl.pe3 import CFG_STAGES, PE3
from insitu.accel.regmap import ErrorCode
from insitu.accel.stream import beats, words_of
from insitu.tt.pe_stream import PEConfig, estimated_cycles, psg_config, reference_stream_out, stream_in

pytestmark = pytest.mark.rtl

LO, HI = -(1 << 15), (1 << 15) - 1
#: pe3_batch_lanes the tests generate PE3 with.
LANES = pytest.mark.parametrize("lanes", [1, 2])


def _pe3(lanes=1, **params):
    return AcceleratorParams(pe3_batch_lanes=lanes, **params)


def _codes(rng, shape):
    """Random 16-bit codes with the extremes well represented."""
    x = rng.integers(LO, HI + 1, size=shape)
    pick = rng.random(shape)
    x = np.where(pick < 0.1, LO, x)
    x = np.where((pick >= 0.1) & (pick < 0.2), HI, x)
    return np.where((pick >= 0.2) & (pick < 0.25), 0, x)


def _operands(rng, cfg):
    return _codes(rng, (cfg.a, cfg.b)), _codes(rng, (cfg.a // cfg.d, cfg.b, 16))


async def settle(ctx, dut):
    """Wait for cfg_ready (the registered configuration results), at most CFG_STAGES + 1 cycles
    after a configuration change."""
    for _ in range(CFG_STAGES + 2):
        await ctx.tick()
        if ctx.get(dut.cfg_ready):
            return
    raise AssertionError("cfg_ready never rose")


def simulate(dut, jobs, rng=None, gap=0.0, stall=0.0, max_cycles=200_000, status=None,
             stream=stream_in):
    """Run ``jobs`` [(cfg, dy, x)] one after another on ``dut``; returns [(out_words, cycles)].

    ``gap``: probability of an idle cycle before each input beat; ``stall``: probability that
    ``m.ready`` is low in a cycle. ``cycles``: cycles ``busy`` is high after ``start``. A cfg
    with ``tau`` (PE3_PSG) sets ``psg_tau``; ``status`` (a list) receives ``(psg_predicted,
    psg_max)`` after each job. ``stream(cfg, dy, x)`` gives a job's input words.
    """
    rng = rng or np.random.default_rng(0)
    results = []
    state = {"job": None}

    async def control(ctx):
        for cfg, dy, x in jobs:
            ctx.set(dut.a, cfg.a)
            ctx.set(dut.b, cfg.b)
            ctx.set(dut.c, cfg.c)
            ctx.set(dut.d, cfg.d)
            ctx.set(dut.shift, cfg.shift)
            ctx.set(dut.op, cfg.op)
            if hasattr(cfg, "tau"):
                ctx.set(dut.psg_tau, cfg.tau)
            await settle(ctx, dut)
            assert ctx.get(dut.cfg_error) == 0
            assert ctx.get(dut.in_beats) == cfg.in_beats()
            assert ctx.get(dut.out_beats) == cfg.out_beats()
            job = {"in": beats(stream(cfg, dy, x)), "n_out": cfg.out_beats(), "out": [],
                   "done": False}
            state["job"] = job
            ctx.set(dut.start, 1)
            await ctx.tick()
            ctx.set(dut.start, 0)
            cycles = 0
            while ctx.get(dut.busy):
                await ctx.tick()
                cycles += 1
                assert cycles < max_cycles, "PE3 hangs"
            # busy falls after the last handshake; let the consumer record it.
            for _ in range(2):
                if len(job["out"]) == job["n_out"]:
                    break
                await ctx.tick()
            assert len(job["out"]) == job["n_out"]
            assert not ctx.get(dut.s.ready)
            job["done"] = True
            results.append((words_of(job["out"]), cycles))
            if status is not None:
                status.append((ctx.get(dut.psg_predicted), ctx.get(dut.psg_max)))
            state["job"] = None
            await ctx.tick()

    async def producer(ctx):
        for _ in jobs:
            while state["job"] is None:
                await ctx.tick()
            job = state["job"]
            for beat in job["in"]:
                while gap and rng.random() < gap:
                    await ctx.tick()
                ctx.set(dut.s.payload, beat)
                ctx.set(dut.s.valid, 1)
                await ctx.tick().until(dut.s.ready)
                ctx.set(dut.s.valid, 0)
            while not job["done"]:
                await ctx.tick()

    async def consumer(ctx):
        for _ in jobs:
            while state["job"] is None:
                await ctx.tick()
            job = state["job"]
            while not job["done"]:
                ready = not (stall and rng.random() < stall)
                ctx.set(dut.m.ready, ready)
                _, _, valid, payload = await ctx.tick().sample(dut.m.valid, dut.m.payload)
                if ready and valid:
                    assert len(job["out"]) < job["n_out"], "PE3 sent too many beats"
                    job["out"].append(payload)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(control)
    sim.add_testbench(producer)
    sim.add_testbench(consumer)
    sim.run()
    return results


def _check(dut, shapes, rng, **kwargs):
    jobs = []
    for a, b, d in shapes:
        cfg = PEConfig("PE3", a, b, 16, d, int(rng.integers(-16, 41)))
        jobs.append((cfg, *_operands(rng, cfg)))
    results = simulate(dut, jobs, rng, **kwargs)
    for (cfg, dy, x), (out, _) in zip(jobs, results):
        np.testing.assert_array_equal(out, reference_stream_out(cfg, dy, x), err_msg=str(cfg))


@LANES
def test_random_shapes_with_gaps_and_backpressure(lanes):
    rng = np.random.default_rng(1234)
    # Edge shapes (b = 1, b below / across / at a beat, d = 1, b = b_max), then random ones; one
    # DUT runs them back to back (state is re-initialised by each start).
    shapes = [(4, 1, 1), (6, 5, 3), (3, 8, 3), (4, 13, 2), (2, 17, 1), (4, 2, 4), (2, 20, 2)]
    for _ in range(5):
        d = int(rng.integers(1, 5))
        shapes.append((d * int(rng.integers(1, 4)), int(rng.integers(1, 21)), d))
    # Small generate-time bounds (b_max not a power of 2) keep the simulation quick.
    _check(PE3(_pe3(lanes, pe3_b_max=20)), shapes, rng, gap=0.3, stall=0.3)


@LANES
def test_tiny_fifos_under_heavy_stalls(lanes):
    """FIFOs at their minimum depths: the loader waits on the dY FIFO within a block (d rows of
    dY do not fit) and rows wait for output room; nothing is lost or duplicated."""
    rng = np.random.default_rng(99)
    dut = PE3(_pe3(lanes, pe3_b_max=16), dy_fifo_beats=2, out_fifo_beats=4)
    _check(dut, [(12, 3, 6), (8, 16, 4), (5, 1, 5), (6, 9, 1)], rng, gap=0.5, stall=0.6)


@LANES
def test_back_to_back_short_rows(lanes):
    """Always-valid / always-ready streams with b = 1..3: rows start every cycle or two, so the
    output stage (two beats a row) is what limits the rows."""
    rng = np.random.default_rng(5)
    _check(PE3(_pe3(lanes, pe3_b_max=16)), [(32, 1, 16), (16, 2, 8), (16, 3, 16), (16, 5, 4)], rng)


def test_fifo_depths_are_checked():
    with pytest.raises(ValueError, match="out_fifo_beats"):
        PE3(out_fifo_beats=2)


@LANES
def test_extreme_shifts_and_full_scale_sums(lanes):
    """Sums that reach the accumulator's extremes (every product -2^15 * -2^15, 32 terms; 31 with
    the pair's second entry masked)."""
    rng = np.random.default_rng(7)
    jobs = []
    for shift, b in ((-16, 32), (0, 31), (1, 32), (15, 31), (40, 32), (63, 31)):
        cfg = PEConfig("PE3", 2, b, 16, 1, shift)
        dy, x = _operands(rng, cfg)
        dy[0] = LO
        x[0] = LO
        jobs.append((cfg, dy, x))
    dut = PE3(_pe3(lanes, pe3_b_max=32))
    results = simulate(dut, jobs, rng, gap=0.1, stall=0.1)
    for (cfg, dy, x), (out, _) in zip(jobs, results):
        np.testing.assert_array_equal(out, reference_stream_out(cfg, dy, x), err_msg=str(cfg))


def _utilization(a, b, d, rng, lanes=1):
    cfg = PEConfig("PE3", a, b, 16, d, 8)
    dy, x = _operands(rng, cfg)
    [(out, cycles)] = simulate(PE3(_pe3(lanes)), [(cfg, dy, x)], rng)
    np.testing.assert_array_equal(out, reference_stream_out(cfg, dy, x))
    return cfg.macs() / (16 * lanes * cycles)


@LANES
def test_throughput_on_the_network_shape(lanes):
    """(a, 64, 16, 16) with always-valid / always-ready streams: one MAC step (16 lanes x
    pe3_batch_lanes entries) a clock."""
    util = _utilization(64, 64, 16, np.random.default_rng(3), lanes)
    assert util >= 0.9, util


@LANES
@pytest.mark.parametrize("kind", ["PE3", "PE3_PSG"])
def test_steady_state_row_takes_ceil_b_over_lanes_cycles(lanes, kind):
    """Always-valid / always-ready streams: each row more costs ceil(b / pe3_batch_lanes)
    cycles (b even and odd), and the cycle model (estimated_cycles) agrees within 2 %."""
    rng = np.random.default_rng(11)
    params = _pe3(lanes, pe3_b_max=64)
    for b in (64, 13):
        jobs = []
        for a in (32, 64):
            cfg = PEConfig("PE3", a, b, 16, 16, 8) if kind == "PE3" else psg_config(a, b, 16, 8, 1)
            jobs.append((cfg, *_operands(rng, cfg)))
        results = simulate(PE3(params), jobs, rng)
        for (cfg, dy, x), (out, cycles) in zip(jobs, results):
            np.testing.assert_array_equal(out, reference_stream_out(cfg, dy, x))
            assert abs(estimated_cycles(cfg, params) / cycles - 1) < 0.02, (cfg, cycles)
        (_, short), (_, long) = results
        assert long - short == 32 * -(-b // lanes), (b, short, long)


def _junk_padding(rng):
    """stream_in, with random nonzero words in each dY row's padding (the PE must ignore them)."""
    def stream(cfg, dy, x):
        words = stream_in(cfg, dy, x).copy()
        b8 = -(-cfg.b // 8) * 8
        block = cfg.b * 16 + cfg.d * b8
        for t in range(cfg.a // cfg.d):
            for r in range(cfg.d):
                at = t * block + cfg.b * 16 + r * b8
                words[at + cfg.b:at + b8] = rng.integers(1, 1 << 15, size=b8 - cfg.b)
        return words
    return stream


@LANES
def test_odd_b_ignores_stale_x_and_stream_padding(lanes):
    """Odd b after even b on one PE: the last step's second entry (pe3_batch_lanes = 2) is a stale
    X entry of the previous op and, here, nonzero junk in the dY padding; its products are masked,
    so the outputs equal the golden model's (which never reads the padding)."""
    rng = np.random.default_rng(21)
    jobs = []
    for a, b, d in ((4, 8, 2), (4, 7, 2), (6, 10, 3), (6, 5, 3), (3, 1, 1)):
        cfg = PEConfig("PE3", a, b, 16, d, 0)
        jobs.append((cfg, *_operands(rng, cfg)))
    results = simulate(PE3(_pe3(lanes, pe3_b_max=16)), jobs, rng, stream=_junk_padding(rng))
    for (cfg, dy, x), (out, _) in zip(jobs, results):
        np.testing.assert_array_equal(out, reference_stream_out(cfg, dy, x), err_msg=str(cfg))


def _error(dut, a, b, c, d, shift=0, op=3, tau=1):
    out = {}

    async def tb(ctx):
        for name, v in zip("abcd", (a, b, c, d)):
            ctx.set(getattr(dut, name), v)
        ctx.set(dut.shift, shift)
        ctx.set(dut.op, op)
        ctx.set(dut.psg_tau, tau)
        await settle(ctx, dut)
        out["error"] = ctx.get(dut.cfg_error)
        out["in"] = ctx.get(dut.in_beats)
        out["out"] = ctx.get(dut.out_beats)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return out


@LANES
def test_configuration_errors_and_beat_counts(lanes):
    p = DEFAULT_PARAMS
    dut = PE3(_pe3(lanes))
    cases = [
        ((0, 64, 16, 16), ErrorCode.ZERO_SIZE), ((16, 0, 16, 16), ErrorCode.ZERO_SIZE),
        ((16, 64, 0, 16), ErrorCode.ZERO_SIZE), ((16, 64, 16, 0), ErrorCode.ZERO_SIZE),
        ((16, 64, 32, 16), ErrorCode.C_LANES), ((16, 64, 8, 16), ErrorCode.C_LANES),
        ((17, 64, 16, 16), ErrorCode.BLOCK), ((16, 64, 16, 3), ErrorCode.BLOCK),
        ((16, p.pe3_b_max + 1, 16, 16), ErrorCode.TILE), ((16, 65535, 16, 1), ErrorCode.TILE),
        ((16, 64, 16, 16, p.shift_min - 1), ErrorCode.SHIFT),
        ((16, 64, 16, 16, p.shift_max + 1), ErrorCode.SHIFT),
        ((16, 64, 16, 16, -128), ErrorCode.SHIFT), ((16, 64, 16, 16, 127), ErrorCode.SHIFT),
        # priority: the first failing check names the error
        ((0, 64, 32, 16, 100), ErrorCode.ZERO_SIZE), ((17, 999, 32, 16), ErrorCode.C_LANES),
        ((17, 999, 16, 16, 100), ErrorCode.BLOCK), ((16, 999, 16, 16, 100), ErrorCode.TILE),
    ]
    for args, code in cases:
        assert _error(dut, *args)["error"] == code, args
    bmax = p.pe3_b_max
    for a, b, d, shift in [(28672, 64, 16, 0), (512, 64, 16, p.shift_min), (65535, bmax, 1, p.shift_max),
                           (65535, bmax, 65535, 5), (30, 5, 3, -3), (1, 1, 1, 0),
                           (65280, bmax - 1, 255, 63)]:
        cfg = PEConfig("PE3", a, b, 16, d, shift)
        got = _error(dut, a, b, 16, d, shift)
        assert got == {"error": 0, "in": cfg.in_beats(), "out": cfg.out_beats()}, cfg
    # An invalid configuration whose beat count passes 2^32 is truncated, not wrapped into a crash.
    big = _error(dut, 65535, 65535, 16, 1)
    assert big["error"] == ErrorCode.TILE and 0 <= big["in"] < 1 << 32


@LANES
def test_converts_to_verilog(lanes):
    from amaranth.back import verilog

    text = verilog.convert(PE3(_pe3(lanes)), name="pe3")
    assert "module pe3" in text

"""The LRT PE's input skid buffer (rtl/skid.py) in Amaranth's simulator: every beat of an op
comes out once, in order, under random valid and ready; TREADY is never high once the op's beats
are in; a beat goes straight through when the consumer is ready (one cycle of latency)."""

import numpy as np
import pytest
from amaranth.sim import Simulator

from insitu.rtl.skid import InputSkid

pytestmark = pytest.mark.rtl


def _run(seed: int, beats: int, p_valid: float, p_ready: float, cycles: int = 400):
    rng = np.random.default_rng(seed)
    dut = InputSkid(16)
    words = rng.integers(0, 1 << 16, size=beats).tolist()
    got, ready_after_last = [], []

    async def testbench(ctx):
        ctx.set(dut.beats, beats)
        ctx.set(dut.start, 1)
        await ctx.tick()
        ctx.set(dut.start, 0)
        sent = 0
        for _ in range(cycles):
            valid = sent < len(words) + 2 and rng.random() < p_valid   # offers beats past the op's
            ctx.set(dut.i.valid, valid)
            ctx.set(dut.i.payload, words[sent] if sent < len(words) else 0xDEAD)
            ctx.set(dut.o.ready, rng.random() < p_ready)
            if sent >= len(words):
                ready_after_last.append(ctx.get(dut.i.ready))
            if ctx.get(dut.o.valid) and ctx.get(dut.o.ready):
                got.append(ctx.get(dut.o.payload))
            if valid and ctx.get(dut.i.ready):
                sent += 1
            await ctx.tick()

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(testbench)
    sim.run()
    return words, got, ready_after_last


@pytest.mark.parametrize("seed", range(6))
def test_every_beat_once_in_order_and_none_beyond_the_op(seed):
    rng = np.random.default_rng(100 + seed)
    beats = int(rng.integers(1, 40))
    words, got, ready_after_last = _run(seed, beats, p_valid=rng.uniform(0.3, 1), p_ready=rng.uniform(0.3, 1))
    assert got == words
    assert not any(ready_after_last), "TREADY high after the op's last beat"


def test_a_ready_consumer_takes_a_beat_a_cycle():
    words, got, _ = _run(0, 30, p_valid=1.0, p_ready=1.0, cycles=32)
    assert got == words          # 30 beats in 32 cycles: one a cycle, one cycle late

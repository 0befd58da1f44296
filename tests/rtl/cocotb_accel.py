"""cocotb tests of the accelerator top level (Verilog in Icarus), run by test_accel_cocotb.py.

Every PE op goes through the AXI-Lite registers and the AXI streams as the board driver drives
them, against the golden model of :mod:`insitu.tt.pe_stream`.
"""

from __future__ import annotations

import os
import random

import numpy as np

import cocotb
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiStreamFrame

from insitu.rtl.cocotb_bench import STATUS_BUSY, STATUS_DONE, AccelBench, words_to_bytes
from insitu.rtl.params import DEFAULT_PARAMS as P
from insitu.rtl.regmap import ID_VALUE, OFFSETS, REGISTERS, VERSION, ErrorCode, Op, reset_value
from insitu.tt import pe_stream as ps

SEED = int(os.environ.get("INSITU_SEED", "1"))


def random_codes(rng: np.random.Generator, shape, bits: int) -> np.ndarray:
    """Uniform codes with the extremes mixed in."""
    lo, hi = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    x = rng.integers(lo, hi + 1, size=shape)
    flat = x.reshape(-1)
    k = max(1, flat.size // 20)
    flat[rng.integers(0, flat.size, k)] = rng.choice([lo, hi, 0, -1], k)
    return x


def random_op(rng: np.random.Generator, kind: str):
    """A random small op of ``kind`` with operands; the shift keeps outputs partly unsaturated."""
    if kind == "PE1":
        a, b, c, d = int(rng.integers(1, 20)), int(rng.integers(1, 3)), 16 * int(rng.integers(1, 3)), int(rng.integers(1, 10))
        lhs, rhs = random_codes(rng, (a, b, c), 16), random_codes(rng, (b, d, c), 4)
    elif kind == "PE2":
        a, b, c, d = int(rng.integers(1, 3)), int(rng.integers(1, 20)), 16 * int(rng.integers(1, 3)), int(rng.integers(1, 18))
        lhs, rhs = random_codes(rng, (a, b, c), 16), random_codes(rng, (b, d), 4)
    else:
        d = int(rng.integers(1, 4))
        a, b, c = d * int(rng.integers(1, 4)), int(rng.integers(1, 20)), 16
        lhs, rhs = random_codes(rng, (a, b), 16), random_codes(rng, (a // d, b, 16), 16)
    probe = ps.PEConfig(kind, a, b, c, d)
    peak = int(np.abs(ps.sums(probe, lhs, rhs)).max())
    shift = int(np.clip(peak.bit_length() - 15 + rng.integers(-3, 4), P.shift_min, P.shift_max))
    return ps.PEConfig(kind, a, b, c, d, shift), lhs, rhs


async def check_random_ops(dut, kind: str, count: int):
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    rng = np.random.default_rng(SEED)
    for k in range(count):
        tb.backpressure(input_idle=[0.0, 0.3][k % 2], output_stall=[0.0, 0.4, 0.2][k % 3])
        cfg, lhs, rhs = random_op(rng, kind)
        words_in = ps.stream_in(cfg, lhs, rhs)
        expected = ps.reference_stream_out(cfg, lhs, rhs)
        out, cycles = await tb.run_op(cfg, words_in, expect_out_words=len(expected))
        assert np.array_equal(out, expected), f"{cfg}: {np.flatnonzero(out != expected)[:8]} differ"
        assert cycles > 0
        dut._log.info("%s ok in %d cycles", cfg, cycles)


@cocotb.test()
async def pe1_random(dut):
    await check_random_ops(dut, "PE1", 6)


@cocotb.test()
async def pe2_random(dut):
    await check_random_ops(dut, "PE2", 6)


@cocotb.test()
async def pe3_random(dut):
    await check_random_ops(dut, "PE3", 6)


@cocotb.test()
async def registers(dut):
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    assert await tb.read("ID") == ID_VALUE
    assert await tb.read("VERSION") == VERSION
    for reg in REGISTERS:
        if reg.access == "ro" and (reg.param or reg.name in ("ID", "VERSION")):
            assert await tb.read(reg.name) == reset_value(reg), reg.name
    rng = random.Random(SEED)
    for reg in REGISTERS:
        if reg.access != "rw":
            continue
        value = rng.getrandbits(reg.width)
        await tb.write(reg.name, value)
        assert await tb.read(reg.name) & ((1 << reg.width) - 1) == value, reg.name
    # Unknown addresses read 0 and ignore writes; the map is unchanged by them.
    used = set(OFFSETS.values())
    unknown = [a for a in range(0, 0x100, 4) if a not in used][:6] + [0xFFC]
    before = {r.name: await tb.read(r.name) for r in REGISTERS if r.access == "rw"}
    for address in unknown:
        await tb.write_addr(address, 0xFFFFFFFF)
        assert await tb.read_addr(address) == 0, hex(address)
    assert {r.name: await tb.read(r.name) for r in REGISTERS if r.access == "rw"} == before
    assert await tb.read("CTRL") == 0


@cocotb.test()
async def bad_configurations(dut):
    """Each refused configuration sets ERROR with its code, returns to idle, and a good op runs."""
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    f = P.factor_words
    cases = [
        (dict(op=0x7F, a=1, b=1, c=16, d=1), ErrorCode.BAD_OP),
        (dict(op=Op.PE1, a=0, b=1, c=16, d=1), ErrorCode.ZERO_SIZE),     # a zero-length stream
        (dict(op=Op.PE2, a=1, b=1, c=16, d=0), ErrorCode.ZERO_SIZE),
        (dict(op=Op.PE1, a=8, b=1, c=24, d=1), ErrorCode.C_LANES),
        (dict(op=Op.PE3, a=4, b=2, c=32, d=1), ErrorCode.C_LANES),
        (dict(op=Op.PE1, a=8, b=P.pe1_row_entries + 1, c=16, d=1), ErrorCode.TILE),
        (dict(op=Op.PE1, a=8, b=1, c=16, d=f // 16 + 1), ErrorCode.FACTOR_WORDS),
        (dict(op=Op.PE2, a=1, b=P.pe2_b_max + 1, c=16, d=1), ErrorCode.TILE),
        (dict(op=Op.PE2, a=1, b=8, c=16, d=f // 8 + 1), ErrorCode.FACTOR_WORDS),
        (dict(op=Op.PE3, a=5, b=2, c=16, d=2), ErrorCode.BLOCK),
        (dict(op=Op.PE3, a=2, b=P.pe3_b_max + 1, c=16, d=1), ErrorCode.TILE),
        (dict(op=Op.PE1, a=8, b=1, c=16, d=1, shift=P.shift_max + 1), ErrorCode.SHIFT),
        (dict(op=Op.PE2, a=1, b=1, c=16, d=1, shift=P.shift_min - 1), ErrorCode.SHIFT),
    ]
    for config, code in cases:
        await tb.configure(**config)
        await tb.start_op()
        await tb.expect_error(code)
        assert not await tb.read("STATUS") & STATUS_BUSY
    rng = np.random.default_rng(SEED)
    cfg, lhs, rhs = random_op(rng, "PE1")
    out, _ = await tb.run_op(cfg, ps.stream_in(cfg, lhs, rhs))
    assert np.array_equal(out, ps.reference_stream_out(cfg, lhs, rhs))


async def _begin_op(tb, kind: str, seed: int):
    rng = np.random.default_rng(seed)
    while True:
        cfg, lhs, rhs = random_op(rng, kind)
        if cfg.in_beats() >= 8:
            break
    await tb.configure(cfg.op, cfg.a, cfg.b, cfg.c, cfg.d, cfg.shift)
    return cfg, lhs, rhs


@cocotb.test()
async def start_while_busy_is_ignored(dut):
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    tb.backpressure(input_idle=0.5)
    cfg, lhs, rhs = await _begin_op(tb, "PE2", SEED)
    await tb.start_op()
    receive = cocotb.start_soon(tb.sink.recv())
    send = cocotb.start_soon(tb.source.send(AxiStreamFrame(words_to_bytes(ps.stream_in(cfg, lhs, rhs)))))
    await ClockCycles(dut.aclk, 5)
    assert await tb.read("STATUS") & STATUS_BUSY
    await tb.write("SIZE_A", cfg.a + 1)         # a configuration change while busy does not reach the PE
    await tb.start_op()                         # ignored
    await send
    out = await receive
    assert await tb.wait_idle() == STATUS_DONE
    got = ps.from_words(np.frombuffer(bytes(out.tdata), dtype="<u2").astype(np.int64))
    assert np.array_equal(got, ps.reference_stream_out(cfg, lhs, rhs))


@cocotb.test()
async def abort_and_short_stream(dut):
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    for kind in ("PE1", "PE2", "PE3"):
        # The output is held back (TREADY low) while ops are cut short: no partial frame.
        tb.sink.pause = True
        # ABORT in the middle of an op.
        cfg, lhs, rhs = await _begin_op(tb, kind, SEED + 1)
        await tb.start_op()
        words = ps.stream_in(cfg, lhs, rhs)
        # Two beats without TLAST: every PE takes them into an empty buffer.
        await tb.push_words(words[:16])
        await ClockCycles(dut.aclk, 20)
        await tb.write("CTRL", 2)
        await tb.expect_error(ErrorCode.ABORTED)
        # An input stream whose TLAST comes early.
        cfg, lhs, rhs = await _begin_op(tb, kind, SEED + 2)
        await tb.start_op()
        words = ps.stream_in(cfg, lhs, rhs)
        await tb.push_words(words[:8], last=True)
        await tb.expect_error(ErrorCode.STREAM_SHORT)
        tb.sink.pause = False
        # The accelerator still works.
        cfg, lhs, rhs = await _begin_op(tb, kind, SEED + 3)
        out, _ = await tb.run_op(cfg, ps.stream_in(cfg, lhs, rhs))
        assert np.array_equal(out, ps.reference_stream_out(cfg, lhs, rhs)), kind


@cocotb.test()
async def reset_in_the_middle_of_an_op(dut):
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    for kind in ("PE1", "PE2", "PE3"):
        cfg, lhs, rhs = await _begin_op(tb, kind, SEED + 4)
        await tb.start_op()
        words = ps.stream_in(cfg, lhs, rhs)
        send = cocotb.start_soon(tb.source.send(AxiStreamFrame(words_to_bytes(words))))
        await ClockCycles(dut.aclk, 10 + len(words) // 16)
        await tb.reset()
        send.cancel()
        tb.source.clear()
        tb.sink.clear()
        await ClockCycles(dut.aclk, 2)
        assert await tb.read("STATUS") == 0
        for reg in REGISTERS:
            assert await tb.read(reg.name) == reset_value(reg), reg.name
        cfg, lhs, rhs = await _begin_op(tb, kind, SEED + 5)
        out, _ = await tb.run_op(cfg, ps.stream_in(cfg, lhs, rhs))
        assert np.array_equal(out, ps.reference_stream_out(cfg, lhs, rhs)), kind

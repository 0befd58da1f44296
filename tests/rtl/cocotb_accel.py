"""cocotb tests of the accelerator top level (its Verilog in Verilator or Icarus), run by test_accel_cocotb.py.

Every PE op goes through the AXI-Lite registers and the AXI streams as the board driver drives
them, against the golden models of :mod:`insitu.tt.pe_stream` (PE1-PE3, PE3_PSG with its
PSG_PREDICTED / PSG_MAX registers) and :mod:`insitu.lrt.pe_ops` (the LRT PE).
"""

from __future__ import annotations

import os
import random

import numpy as np

import cocotb
from cocotb.triggers import ClockCycles
from cocotbext.axi import AxiStreamFrame

from insitu.lrt.pe_ops import LRTPEModel, append_reciprocal
from insitu.rtl.cocotb_bench import (STATUS_BUSY, STATUS_DONE, STATUS_ERROR, AccelBench,
                                     words_to_bytes)
from insitu.accel.params import DEFAULT_PARAMS as P
from insitu.accel.stream import from_words
from insitu.accel.regmap import ID_VALUE, OFFSETS, REGISTERS, VERSION, ErrorCode, Op, reset_value
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
        # PE3_PSG takes the low byte of an X word: 8-bit codes, and now and then any 16 bits.
        x_bits = 8 if kind == "PE3_PSG" and rng.random() < 0.7 else 16
        lhs, rhs = random_codes(rng, (a, b), 16), random_codes(rng, (a // d, b, 16), x_bits)
    if kind == "PE3_PSG":
        peak = ps.psg_run(ps.psg_config(a, b, d), lhs, rhs).peak
        # tau: 1, the peak itself, above it, or a fraction of it (E2-Train's beta * max)
        tau = int(rng.choice([1, peak, peak + 1, max(1, int(peak * rng.uniform(0.02, 0.5)))]))
        shift = int(np.clip(peak.bit_length() - 15 + rng.integers(-3, 4), P.shift_min, P.shift_max))
        return ps.psg_config(a, b, d, shift, tau), lhs, rhs
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
        if kind == "PE3_PSG":
            run = ps.psg_run(cfg, lhs, rhs)
            got = (await tb.read("PSG_PREDICTED"), await tb.read("PSG_MAX"))
            assert got == (run.predicted_count, run.peak), f"{cfg}: PSG registers {got}"
        # No op can beat its streams (one beat per cycle each way).
        assert cycles >= max(cfg.in_beats(), cfg.out_beats())
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
async def pe3_psg_random(dut):
    await check_random_ops(dut, "PE3_PSG", 6)


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
        (dict(op=Op.PE3_PSG, a=4, b=2, c=16, d=2), ErrorCode.PSG_TAU),        # PSG_TAU = 0
        (dict(op=Op.PE3_PSG, a=4, b=2, c=32, d=1), ErrorCode.C_LANES),
        (dict(op=Op.PE3_PSG, a=5, b=2, c=16, d=2), ErrorCode.BLOCK),
        (dict(op=Op.PE3_PSG, a=2, b=P.pe3_b_max + 1, c=16, d=1), ErrorCode.TILE),
        (dict(op=Op.PE3_PSG, a=2, b=2, c=16, d=1, shift=P.shift_max + 1), ErrorCode.SHIFT),
    ]
    assert await tb.read("PSG_TAU") == 0                 # its reset value: refused by PE3_PSG
    for config, code in cases:
        await tb.configure(**config)
        await tb.start_op()
        await tb.expect_error(code)
        assert not await tb.read("STATUS") & STATUS_BUSY
    rng = np.random.default_rng(SEED)
    cfg, lhs, rhs = random_op(rng, "PE1")
    out, _ = await tb.run_op(cfg, ps.stream_in(cfg, lhs, rhs))
    assert np.array_equal(out, ps.reference_stream_out(cfg, lhs, rhs))
    # PSG_TAU is the only new check: with it >= 1 the same sizes run
    cfg, lhs, rhs = random_op(rng, "PE3_PSG")
    out, _ = await tb.run_op(cfg, ps.stream_in(cfg, lhs, rhs))
    assert np.array_equal(out, ps.reference_stream_out(cfg, lhs, rhs))


async def _begin_op(tb, kind: str, seed: int):
    rng = np.random.default_rng(seed)
    while True:
        cfg, lhs, rhs = random_op(rng, kind)
        if cfg.in_beats() >= 8:
            break
    await tb.configure(cfg.op, cfg.a, cfg.b, cfg.c, cfg.d, cfg.shift)
    if kind == "PE3_PSG":
        await tb.write("PSG_TAU", cfg.tau)
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
    got = from_words(np.frombuffer(bytes(out.tdata), dtype="<u2").astype(np.int64))
    assert np.array_equal(got, ps.reference_stream_out(cfg, lhs, rhs))


@cocotb.test()
async def abort_and_short_stream(dut):
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    for kind in ("PE1", "PE2", "PE3", "PE3_PSG"):
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
        if kind == "PE3_PSG":
            run = ps.psg_run(cfg, lhs, rhs)
            assert (await tb.read("PSG_PREDICTED"), await tb.read("PSG_MAX")) == \
                (run.predicted_count, run.peak)


async def _lrt_norm_state(tb) -> int:
    """Load a basis and project: leaves a known NORM2 in the LRT PE; returns it."""
    rows = 8
    basis = np.zeros(rows * 8, np.int64)
    basis[0] = 1 << 14
    await tb.run_lrt_op(Op.LRT_LOAD_BASIS, basis, side=0, rows_l=rows, cols=1)
    await tb.run_lrt_op(Op.LRT_PROJECT, np.arange(1, rows + 1), side=0, rows_l=rows, cols=1)
    norm2 = await tb.read("LRT_NORM2_LO")
    assert norm2 == sum(k * k for k in range(2, rows + 1))
    return norm2


@cocotb.test()
async def stream_errors_reset_only_the_running_pe(dut):
    """A stream longer than IN_BEATS (no TLAST on the last beat), ABORT and a short stream on an
    LRT op; a failed TT op leaves the LRT PE's state alone; ABORT while idle is ignored."""
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    norm2 = await _lrt_norm_state(tb)
    tb.sink.pause = True                     # no partial output frame reaches the sink
    rng = np.random.default_rng(SEED)
    cfg = ps.PEConfig("PE3", 1, 8, 16, 1, 0)          # 17 beats in, 2 out: fits the PE's FIFOs
    lhs, rhs = random_codes(rng, (1, 8), 16), random_codes(rng, (1, 8, 16), 16)
    await tb.configure(cfg.op, cfg.a, cfg.b, cfg.c, cfg.d, cfg.shift)
    await tb.start_op()
    await tb.push_words(ps.stream_in(cfg, lhs, rhs), last=False)
    await tb.expect_error(ErrorCode.STREAM_LONG)
    cfg2, lhs2, rhs2 = await _begin_op(tb, "PE1", SEED + 6)
    await tb.start_op()
    await tb.push_words(ps.stream_in(cfg2, lhs2, rhs2)[:16])
    await tb.write("CTRL", 2)
    await tb.expect_error(ErrorCode.ABORTED)
    assert await tb.read("LRT_NORM2_LO") == norm2          # the LRT PE was not reset
    await tb.write("CTRL", 2)                               # ABORT while idle: nothing happens
    await ClockCycles(dut.aclk, 4)
    assert await tb.read("STATUS") == STATUS_ERROR and await tb.read("ERROR_CODE") == ErrorCode.ABORTED
    for last, code in ((False, ErrorCode.ABORTED), (True, ErrorCode.STREAM_SHORT)):
        await tb.configure_lrt(Op.LRT_LOAD_BASIS, 0, side=1, rows_r=16, cols=1)
        await tb.start_op()
        await tb.push_words(np.zeros(16, np.int64), last=last)
        if not last:
            await ClockCycles(dut.aclk, 10)
            await tb.write("CTRL", 2)
        await tb.expect_error(code)
    tb.sink.pause = False
    for kind in ("PE3", "PE1"):
        cfg, lhs, rhs = await _begin_op(tb, kind, SEED + 7)
        out, _ = await tb.run_op(cfg, ps.stream_in(cfg, lhs, rhs))
        assert np.array_equal(out, ps.reference_stream_out(cfg, lhs, rhs)), kind
    assert await _lrt_norm_state(tb) == norm2


@cocotb.test()
async def reset_in_the_middle_of_an_op(dut):
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    await _lrt_norm_state(tb)            # LRT result registers hold something before the reset
    for kind in ("PE1", "PE2", "PE3", "PE3_PSG"):
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


# ------------------------------------------------------------------------------ the LRT PE
#
# The LRT PE through the top level, against its golden model (insitu.lrt.pe_ops.LRTPEModel): every
# op's streams, IN_BEATS / OUT_BEATS, and the LRT_NORM2 / LRT_WRITES_* registers after every op.

LRT_RESULT_REGISTERS = ("LRT_NORM2_LO", "LRT_NORM2_HI", "LRT_WRITES_MAX", "LRT_WRITES_TOTAL")
#: CYCLES counts the top's CHECK (two cycles: its verdict is registered) and START states and the
#: cycle the PE drops busy, on top of the PE's own busy cycles (LRTPEModel.cycles).
LRT_TOP_CYCLES = 4


def lrt_codes(rng: np.random.Generator, shape, scale: float = 1.0, bits: int = 16) -> np.ndarray:
    """Normal codes of ``bits`` bits, ``scale`` of full scale (saturating at the extremes)."""
    hi = (1 << (bits - 1)) - 1
    return np.clip(np.round(rng.standard_normal(shape) * scale * hi), -hi - 1, hi).astype(np.int64)


def lrt_stream(rng: np.random.Generator, values) -> np.ndarray:
    """``values`` padded to whole beats with random words: the PE must ignore the padding."""
    v = np.asarray(values, dtype=np.int64).ravel()
    return np.concatenate([v, rng.integers(-(1 << 15), 1 << 15, -v.size % ps.STREAM_WORDS)])


def lrt_basis(rng: np.random.Generator, rows: int, kind: str) -> np.ndarray:
    """A ``rows × lrt_cols_max`` basis of Q1.14 codes: orthonormal columns (as SKS keeps them),
    small normal codes, or uniform codes with the extremes mixed in (MGS saturates)."""
    q = P.lrt_cols_max
    if kind == "orthonormal":
        k = min(rows, q)
        Q = np.zeros((rows, q))
        Q[:, :k] = np.linalg.qr(rng.standard_normal((rows, k)))[0]
        return np.clip(np.round(Q * (1 << 14)), -(1 << 15), (1 << 15) - 1).astype(np.int64)
    if kind == "normal":
        return lrt_codes(rng, (rows, q), scale=0.3)
    return random_codes(rng, (rows, q), 16)


class LRTCheck:
    """Runs LRT ops on the accelerator (through the bench) and on the golden model, compares."""

    def __init__(self, dut, tb: AccelBench, rng: np.random.Generator):
        self.dut, self.tb, self.rng = dut, tb, rng
        self.model = LRTPEModel(P)
        self.ran: list[str] = []
        self.cell_writes = 0            # cells LRT_UPDATE changed, over all ops

    def registers(self) -> dict:
        """The model's registers as run_lrt_op keyword arguments."""
        m = self.model
        return dict(shift=m.shift, side=m.side, rows_l=m.rows_l, rows_r=m.rows_r, cols=m.cols,
                    recip=m.recip)

    async def results(self) -> dict:
        return {name: await self.tb.read(name) for name in LRT_RESULT_REGISTERS}

    def expected_results(self) -> dict:
        m = self.model
        return {"LRT_NORM2_LO": m.norm2 & 0xFFFFFFFF, "LRT_NORM2_HI": m.norm2 >> 32,
                "LRT_WRITES_MAX": m.writes_max, "LRT_WRITES_TOTAL": m.writes_total}

    async def run(self, op: Op, values=None, *, busy: bool | None = None, **regs) -> np.ndarray:
        """Set ``regs`` (model attributes), run ``op`` with ``values`` (unpadded; padded here with
        random words) on both, compare the output stream and the result registers. ``busy``:
        random input idle cycles and output stalls (default: at random); without them the input
        is queued before START and CYCLES must be the PE's cycle count (lrt_pe_cycles) plus
        LRT_TOP_CYCLES exactly; with them, at least that."""
        model, rng, tb = self.model, self.rng, self.tb
        model.configure(**regs)
        assert model.cfg_error(op) == ErrorCode.NONE, (op.name, self.registers())
        words = lrt_stream(rng, values) if values is not None else None
        in_beats, out_beats = model.in_beats(op), model.out_beats(op)
        total_before = model.writes_total
        expected = model.execute(op, words)
        if op == Op.LRT_UPDATE:
            self.cell_writes += model.writes_total - total_before
        if busy is None:
            busy = rng.random() < 0.6
        if busy:
            tb.backpressure(input_idle=float(rng.choice([0.0, 0.3, 0.6])),
                            output_stall=float(rng.choice([0.0, 0.3, 0.6])))
        else:
            tb.backpressure()
        out, cycles = await tb.run_lrt_op(op, words, in_beats=in_beats, out_beats=out_beats,
                                          input_first=not busy, **self.registers())
        self.ran.append(op.name)
        what = f"{op.name} {self.registers()}"
        mask = 0xFFFF if op == Op.LRT_READ_COUNTS else -1      # unsigned counters
        differ = np.flatnonzero((out & mask) != (expected & mask))
        assert differ.size == 0, f"{what}: words {differ[:8]} differ: {out[differ[:8]]}, " \
                                 f"expected {expected[differ[:8]]}"
        got, want = await self.results(), self.expected_results()
        assert got == want, f"{what}: registers {got}, expected {want}"
        pe_cycles = model.cycles(op) + LRT_TOP_CYCLES
        if busy:
            assert cycles >= pe_cycles, f"{what}: CYCLES {cycles} < {pe_cycles}"
        else:
            assert cycles == pe_cycles, f"{what}: CYCLES {cycles}, expected {pe_cycles}"
        self.dut._log.info("%s ok in %d cycles", what, cycles)
        return out


async def lrt_sequence(lrt: LRTCheck, n_ops: int):
    """Both bases and the weights loaded with random codes, then a random sequence of about
    ``n_ops`` LRT ops with random registers, then everything the PE holds read back."""
    model, rng = lrt.model, lrt.rng
    # The largest sizes of the sequence: everything the ops may read is loaded first (so that the
    # RTL's memories and the model agree whatever ran before in the simulator).
    m0, n0 = int(rng.integers(5, 41)), int(rng.integers(5, 41))
    model.configure(rows_l=m0, rows_r=n0, cols=int(rng.integers(0, P.lrt_cols_max)))
    for side in (0, 1):
        kind = str(rng.choice(["orthonormal", "normal", "uniform"], p=[0.5, 0.3, 0.2]))
        await lrt.run(Op.LRT_LOAD_BASIS, lrt_basis(rng, n0 if side else m0, kind), side=side)
    await lrt.run(Op.LRT_LOAD_WEIGHTS, lrt_codes(rng, m0 * n0, scale=float(rng.choice([0.02, 0.5]))))
    for side in (1, 0) if n0 > m0 else (0, 1):          # the residual of the larger side first
        await lrt.run(Op.LRT_PROJECT, lrt_codes(rng, n0 if side else m0, scale=0.3), side=side)

    kinds = ["project", "reproject", "append", "rotate", "update", "read", "sizes", "sks"]
    ops = 0
    while ops < n_ops:
        kind = str(rng.choice(kinds, p=[.17, .08, .1, .12, .2, .17, .08, .08]))
        regs = dict(side=int(rng.integers(0, 2)))
        if rng.random() < 0.3:
            regs["cols"] = int(rng.integers(0, P.lrt_cols_max))
        model.configure(**regs)
        rows, r = model.rows, model.cols
        if kind == "project":
            x = lrt_codes(rng, rows, scale=float(rng.choice([0.05, 0.3, 1.0])))
            await lrt.run(Op.LRT_PROJECT, x)
        elif kind == "reproject":
            await lrt.run(Op.LRT_REPROJECT)
        elif kind == "append":
            shift = int(rng.integers(P.shift_min, P.shift_max + 1)) if rng.random() < 0.3 \
                else int(rng.integers(8, 24))
            await lrt.run(Op.LRT_APPEND, recip=int(rng.integers(0, 1 << 16)), shift=shift)
        elif kind == "rotate":
            M = lrt_codes(rng, (r + 1, r), scale=float(rng.choice([0.2, 0.6])))
            await lrt.run(Op.LRT_ROTATE, M)
        elif kind == "update":
            # Steps of a few weight LSBs: Q ~ 2**13, s ~ 2**(e-1), r terms; now and then any SHIFT.
            e = int(rng.integers(4, 16))
            shift = 26 + e - int(rng.integers(0, 5)) if rng.random() < 0.85 else \
                int(rng.integers(P.shift_min, P.shift_max + 1))
            await lrt.run(Op.LRT_UPDATE, lrt_codes(rng, r, scale=2.0 ** (e - 16)), shift=shift)
        elif kind == "read":
            await lrt.run(Op(rng.choice([Op.LRT_READ_BASIS, Op.LRT_READ_WEIGHTS, Op.LRT_READ_COUNTS])))
        elif kind == "sizes":
            # Smaller sizes (the weights are re-read as an m × n matrix of the loaded cells).
            model.configure(rows_l=int(rng.integers(1, m0 + 1)), rows_r=int(rng.integers(1, n0 + 1)))
            continue
        else:
            # One SKS step on a side: project, reproject, append the normalized residual (LRT_RECIP
            # and SHIFT from LRT_NORM2, as the processor computes them), rotate by q × r of an
            # orthogonal matrix.
            r = int(rng.integers(0, P.lrt_cols_max - 1))
            model.configure(cols=r)
            await lrt.run(Op.LRT_PROJECT, lrt_codes(rng, rows, scale=0.3))
            await lrt.run(Op.LRT_REPROJECT)
            recip, shift = append_reciprocal(model.norm2)
            if P.shift_min <= shift <= P.shift_max:
                await lrt.run(Op.LRT_APPEND, recip=recip, shift=shift)
            M = np.linalg.qr(rng.standard_normal((r + 2, r + 2)))[0][:, :r + 1]
            await lrt.run(Op.LRT_ROTATE, np.round(M * (1 << 14)).astype(np.int64), cols=r + 1)
            ops += 3
        ops += 1
    # Everything the PE holds, read back.
    model.configure(rows_l=m0, rows_r=n0)
    for side in (0, 1):
        await lrt.run(Op.LRT_READ_BASIS, side=side)
    await lrt.run(Op.LRT_READ_WEIGHTS)
    await lrt.run(Op.LRT_READ_COUNTS)


@cocotb.test()
async def lrt_random_sequence(dut):
    """Two random LRT op sequences (random sizes, sides, ranks, reciprocals, shifts, codes; random
    input idle cycles and output stalls), each op checked against the golden model."""
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    lrt = LRTCheck(dut, tb, np.random.default_rng(SEED + 100))
    for _ in range(2):
        await lrt_sequence(lrt, 25)
    dut._log.info("LRT ops run: %s", ", ".join(lrt.ran))
    assert {"LRT_PROJECT", "LRT_REPROJECT", "LRT_APPEND", "LRT_ROTATE", "LRT_UPDATE"} <= set(lrt.ran)
    assert lrt.cell_writes > 0


@cocotb.test()
async def lrt_bad_configurations(dut):
    """Every cfg_error of the LRT PE that the registers can reach gives STATUS.ERROR with its
    ERROR_CODE (the golden model agrees), changes no state, and good LRT ops run afterwards."""
    tb = AccelBench(dut, seed=SEED)
    await tb.start()
    rng = np.random.default_rng(SEED + 200)
    lrt = LRTCheck(dut, tb, rng)
    model = lrt.model
    R, C, Q = P.lrt_rows_max, P.lrt_cells_max, P.lrt_cols_max
    # Some state, so that a refused op that changed anything would show.
    m0, n0, r0 = 6, 11, 3
    model.configure(rows_l=m0, rows_r=n0, cols=r0)
    for side in (0, 1):
        await lrt.run(Op.LRT_LOAD_BASIS, lrt_basis(rng, model.rows_r if side else m0, "normal"),
                      side=side)
    await lrt.run(Op.LRT_LOAD_WEIGHTS, lrt_codes(rng, m0 * n0, scale=0.5))
    await lrt.run(Op.LRT_UPDATE, lrt_codes(rng, r0, scale=2.0 ** -4), shift=32)
    await lrt.run(Op.LRT_PROJECT, lrt_codes(rng, n0, scale=0.3), side=1)
    assert model.norm2 and model.writes_total
    good = dict(side=0, rows_l=m0, rows_r=n0, cols=r0, recip=0x9000, shift=12)

    basis_ops = [Op.LRT_LOAD_BASIS, Op.LRT_READ_BASIS, Op.LRT_PROJECT, Op.LRT_REPROJECT,
                 Op.LRT_APPEND, Op.LRT_ROTATE]
    cols_ops = [Op.LRT_PROJECT, Op.LRT_REPROJECT, Op.LRT_APPEND, Op.LRT_ROTATE, Op.LRT_UPDATE]
    cells_ops = [Op.LRT_UPDATE, Op.LRT_LOAD_WEIGHTS, Op.LRT_READ_WEIGHTS, Op.LRT_READ_COUNTS]
    cases = [(15, {}, ErrorCode.BAD_OP), (26, {}, ErrorCode.BAD_OP)]     # either side of the range
    for op in basis_ops:
        cases += [(op, dict(side=0, rows_l=0), ErrorCode.ZERO_SIZE),
                  (op, dict(side=1, rows_r=0), ErrorCode.ZERO_SIZE),
                  (op, dict(side=0, rows_l=R + 1), ErrorCode.LRT_SIZE),
                  (op, dict(side=1, rows_r=0xFFFF), ErrorCode.LRT_SIZE)]
    for op in cells_ops:
        cases += [(op, dict(rows_l=0), ErrorCode.ZERO_SIZE),
                  (op, dict(rows_r=0, side=1), ErrorCode.ZERO_SIZE),
                  (op, dict(rows_l=R + 1, rows_r=1), ErrorCode.LRT_SIZE),
                  (op, dict(rows_l=1, rows_r=R + 1), ErrorCode.LRT_SIZE),
                  (op, dict(rows_l=R, rows_r=C // R + 1), ErrorCode.LRT_SIZE)]    # m·n > cells
    for op in cols_ops:
        cases += [(op, dict(cols=Q), ErrorCode.LRT_SIZE), (op, dict(cols=0xFF), ErrorCode.LRT_SIZE)]
    for op in (Op.LRT_APPEND, Op.LRT_UPDATE):
        cases += [(op, dict(shift=s), ErrorCode.SHIFT)
                  for s in (P.shift_min - 1, P.shift_max + 1, -128, 127)]
    # The order of the checks: ZERO_SIZE before LRT_SIZE before SHIFT.
    cases += [(Op.LRT_UPDATE, dict(rows_l=0, rows_r=R + 1, cols=Q, shift=127), ErrorCode.ZERO_SIZE),
              (Op.LRT_APPEND, dict(side=1, rows_r=R + 1, shift=-128), ErrorCode.LRT_SIZE),
              (Op.LRT_APPEND, dict(cols=Q, shift=-128), ErrorCode.LRT_SIZE)]
    seen = set()
    for op, regs, code in cases:
        model.configure(**{**good, **regs})
        assert model.cfg_error(op) == code, (op, regs, model.cfg_error(op), code)
        await tb.configure_lrt(op, **lrt.registers())
        await tb.start_op()
        await tb.expect_error(code)
        assert await lrt.results() == lrt.expected_results(), (op, regs)
        seen.add(code)
    assert seen == {ErrorCode.BAD_OP, ErrorCode.ZERO_SIZE, ErrorCode.LRT_SIZE, ErrorCode.SHIFT}
    # The configurations an op does not check are no error for it: run them.
    model.configure(**good)
    await lrt.run(Op.LRT_READ_BASIS, side=0, cols=Q, shift=-128)            # cols, SHIFT unused
    await lrt.run(Op.LRT_READ_WEIGHTS, cols=0xFF, shift=127)
    await lrt.run(Op.LRT_LOAD_BASIS, lrt_basis(rng, m0, "orthonormal"), side=0, rows_r=0)
    await lrt.run(Op.LRT_PROJECT, lrt_codes(rng, m0, scale=0.3), cols=r0, shift=P.shift_max + 1)
    await lrt.run(Op.LRT_REPROJECT, side=1, rows_l=R + 1, rows_r=n0)
    # Nothing was changed by the refused ops: read back everything, and a few good ops.
    model.configure(**good)
    for side in (0, 1):
        await lrt.run(Op.LRT_READ_BASIS, side=side)
    await lrt.run(Op.LRT_READ_WEIGHTS)
    await lrt.run(Op.LRT_READ_COUNTS)
    await lrt.run(Op.LRT_APPEND, side=1)
    await lrt.run(Op.LRT_UPDATE, lrt_codes(rng, r0, scale=2.0 ** -4), shift=31)
    await lrt.run(Op.LRT_READ_COUNTS)
    # And a PE op still runs after them.
    cfg, lhs, rhs = random_op(np.random.default_rng(SEED), "PE2")
    tb.backpressure()
    out, _ = await tb.run_op(cfg, ps.stream_in(cfg, lhs, rhs))
    assert np.array_equal(out, ps.reference_stream_out(cfg, lhs, rhs))

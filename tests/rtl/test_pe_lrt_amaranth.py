"""The LRT PE in Amaranth's simulator against its golden model (insitu.lrt.pe_ops), word for word.

Random op sequences on random small sizes and codes, with random gaps on the input stream and
random back-pressure on the output stream; every cfg_error; the cycle counts of LRTPEModel.cycles.
"""

import numpy as np
import pytest
from amaranth.back import verilog
from amaranth.sim import Simulator

from insitu.accel.stream import beats, pad_words, words_of
from insitu.lrt.pe_ops import LRTPEModel
from insitu.accel.params import DEFAULT_PARAMS, AcceleratorParams
from insitu.rtl.pe_lrt import PELRT
from insitu.accel.regmap import ErrorCode, Op

pytestmark = pytest.mark.rtl

#: Small memories keep the simulation fast (the counter clear walks all of lrt_cells_max).
PARAMS = AcceleratorParams(lrt_rows_max=24, lrt_cols_max=8, lrt_cells_max=160)
_REGS = ("side", "rows_l", "rows_r", "cols", "recip", "shift")


def _codes(rng, shape, bits=16, scale=1.0):
    hi = (1 << (bits - 1)) - 1
    return np.clip(np.round(rng.standard_normal(shape) * scale * hi), -hi - 1, hi).astype(np.int64)


def _stream(rng, values):
    """``values`` padded to whole beats with random words: the PE must ignore padding."""
    v = np.asarray(values, dtype=np.int64).ravel()
    return np.concatenate([v, _codes(rng, -v.size % 8)])


async def _configure(ctx, dut, model, op):
    """Set the configuration; cfg_error / in_beats / out_beats are registered: two cycles later
    they are right, and cfg_ready rises within three."""
    ctx.set(dut.op, int(op))
    for name in _REGS:
        ctx.set(getattr(dut, name), getattr(model, name))
    await ctx.tick()
    for _ in range(3):
        if ctx.get(dut.cfg_ready):
            break
        await ctx.tick()
    assert ctx.get(dut.cfg_ready)


async def _run(ctx, dut, model, op, words=None, *, rng, gaps=0.0, stalls=0.0, check_cycles=False):
    """Run one op on the DUT and on the model; compare streams, registers and (optionally) cycles."""
    await _configure(ctx, dut, model, op)
    code = model.cfg_error(op)
    assert ctx.get(dut.cfg_error) == code, (Op(op).name, code)
    assert ctx.get(dut.in_beats) == model.in_beats(op), Op(op).name
    assert ctx.get(dut.out_beats) == model.out_beats(op), Op(op).name
    if code:
        return None
    expected = model.execute(op, words)
    sent = beats(np.asarray(words if words is not None else [], dtype=np.int64))
    extra = int(rng.integers(0, 1 << 62))         # a beat past the op's last one: never taken
    ctx.set(dut.start, 1)
    await ctx.tick()
    ctx.set(dut.start, 0)
    got, k, n_cycles = [], 0, 0
    while True:
        assert ctx.get(dut.busy) or n_cycles, "busy must rise the cycle after start"
        if not ctx.get(dut.busy):
            break
        offer = rng.random() >= gaps
        ctx.set(dut.s.valid, offer)
        ctx.set(dut.s.payload, sent[k] if k < len(sent) else extra)
        ready = rng.random() >= stalls
        ctx.set(dut.m.ready, ready)
        s_ready, m_valid = ctx.get(dut.s.ready), ctx.get(dut.m.valid)
        payload = ctx.get(dut.m.payload)
        await ctx.tick()
        n_cycles += 1
        assert n_cycles < 20000, f"{Op(op).name} does not finish"
        if offer and s_ready:
            assert k < len(sent), f"{Op(op).name} took a beat past its {len(sent)}"
            k += 1
        if m_valid and ready:
            got.append(payload)
    ctx.set(dut.s.valid, 0)
    assert k == len(sent), f"{Op(op).name}: took {k} of {len(sent)} beats"
    out = words_of(got) if got else np.zeros(0, np.int64)
    mask = 0xFFFF if op == Op.LRT_READ_COUNTS else -1
    np.testing.assert_array_equal(out & mask, expected & mask, err_msg=Op(op).name)
    assert ctx.get(dut.norm2) == model.norm2
    assert ctx.get(dut.writes_total) == model.writes_total
    assert ctx.get(dut.writes_max) == model.writes_max
    if check_cycles:
        want = model.cycles(op)
        assert n_cycles == want, f"{Op(op).name}: {n_cycles} cycles, the formula says {want}"
    return out


def _sizes(rng, p):
    m = int(rng.integers(1, p.lrt_rows_max + 1))
    n = int(rng.integers(1, min(p.lrt_rows_max, p.lrt_cells_max // m) + 1))
    return m, n


def _sequence_test(seed, n_ops, params=PARAMS):
    rng = np.random.default_rng(seed)
    dut = PELRT(params)
    model = LRTPEModel(params)
    q_max = params.lrt_cols_max
    ran = []

    async def tb(ctx):
        async def run(op, words=None):
            timing = rng.random() < 0.3
            gaps = 0.0 if timing else float(rng.choice([0.0, 0.3, 0.7]))
            stalls = 0.0 if timing else float(rng.choice([0.0, 0.3, 0.7]))
            ran.append(Op(op).name)
            return await _run(ctx, dut, model, op, words, rng=rng, gaps=gaps, stalls=stalls,
                              check_cycles=timing)

        def new_sizes():
            m, n = _sizes(rng, params)
            model.configure(rows_l=m, rows_r=n, cols=int(rng.integers(0, q_max)))

        new_sizes()
        for side in (0, 1):
            model.configure(side=side)
            await run(Op.LRT_LOAD_BASIS, _stream(rng, _codes(rng, (model.rows, q_max), scale=0.3)))
        w_scale = float(rng.choice([0.01, 0.5]))
        await run(Op.LRT_LOAD_WEIGHTS, _stream(rng, _codes(rng, model.rows_l * model.rows_r, scale=w_scale)))
        for _ in range(n_ops):
            kind = rng.choice(["project", "reproject", "append", "rotate", "update", "read", "sizes",
                               "load"], p=[.2, .08, .1, .14, .2, .12, .08, .08])
            model.configure(side=int(rng.integers(0, 2)))
            r = model.cols
            if kind == "project":
                x = _codes(rng, model.rows, scale=float(rng.choice([0.05, 0.3, 1.0])))
                await run(Op.LRT_PROJECT, _stream(rng, x))
            elif kind == "reproject":
                await run(Op.LRT_REPROJECT)
            elif kind == "append":
                shift = int(rng.integers(params.shift_min, params.shift_max + 1)) if rng.random() < 0.3 \
                    else int(rng.integers(8, 24))
                model.configure(recip=int(rng.integers(0, 1 << 16)), shift=shift)
                await run(Op.LRT_APPEND)
            elif kind == "rotate":
                M = _codes(rng, (r + 1, r), scale=float(rng.choice([0.2, 0.6])))
                await run(Op.LRT_ROTATE, _stream(rng, M))
            elif kind == "update":
                # Steps of a few weight LSBs: Q ~ 2**13, s ~ 2**(e-1), r terms.
                e = int(rng.integers(4, 16))
                shift = 26 + e - int(rng.integers(0, 5)) if rng.random() < 0.9 else \
                    int(rng.integers(params.shift_min, params.shift_max + 1))
                model.configure(shift=shift)
                await run(Op.LRT_UPDATE, _stream(rng, _codes(rng, r, scale=2.0 ** (e - 16))))
            elif kind == "read":
                await run(rng.choice([Op.LRT_READ_BASIS, Op.LRT_READ_WEIGHTS, Op.LRT_READ_COUNTS]))
            elif kind == "sizes":
                new_sizes()
            else:
                if rng.random() < 0.5:
                    await run(Op.LRT_LOAD_BASIS, _stream(rng, _codes(rng, (model.rows, q_max), scale=0.5)))
                else:
                    await run(Op.LRT_LOAD_WEIGHTS,
                              _stream(rng, _codes(rng, model.rows_l * model.rows_r, scale=0.3)))
        # Everything the PE holds, read back.
        for side in (0, 1):
            model.configure(side=side)
            await run(Op.LRT_READ_BASIS)
        await run(Op.LRT_READ_WEIGHTS)
        await run(Op.LRT_READ_COUNTS)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()
    return ran, model


@pytest.mark.parametrize("seed", range(5))
def test_random_op_sequences_match_the_golden_model(seed):
    ran, _ = _sequence_test(seed, n_ops=40)
    assert {"LRT_PROJECT", "LRT_UPDATE", "LRT_ROTATE"} <= set(ran)


def test_full_rank_on_the_largest_sizes_with_cycle_counts():
    """Full rank (r = 7) on the largest basis and weight matrix of the memories, saturating codes,
    no stalls: every op's cycle count against LRTPEModel.cycles."""
    params = PARAMS
    rng = np.random.default_rng(11)
    dut = PELRT(params)
    model = LRTPEModel(params)
    m, n = params.lrt_rows_max, params.lrt_cells_max // params.lrt_rows_max

    async def tb(ctx):
        async def run(op, words=None, **kw):
            return await _run(ctx, dut, model, op, words, rng=rng, **kw)
        model.configure(rows_l=m, rows_r=n, cols=params.lrt_cols_max - 1)
        for side in (0, 1):
            model.configure(side=side)
            Q, x = _codes(rng, (model.rows, 8)), _codes(rng, model.rows)
            await run(Op.LRT_LOAD_BASIS, _stream(rng, Q), check_cycles=True)
            await run(Op.LRT_PROJECT, _stream(rng, x), check_cycles=True)
            await run(Op.LRT_REPROJECT, check_cycles=True)
            model.configure(recip=0xFFFF, shift=params.shift_min)      # saturating column
            await run(Op.LRT_APPEND, check_cycles=True)
            await run(Op.LRT_ROTATE, _stream(rng, _codes(rng, (8, 7))), check_cycles=True)
            model.configure(cols=2)              # M entries of the last rotation are stale now
            await run(Op.LRT_ROTATE, _stream(rng, _codes(rng, (3, 2))), check_cycles=True)
            model.configure(cols=params.lrt_cols_max - 1)
        await run(Op.LRT_LOAD_WEIGHTS, _stream(rng, _codes(rng, m * n, scale=0.5)), check_cycles=True)
        s = _stream(rng, _codes(rng, 7, scale=0.01))
        model.configure(shift=30)
        await run(Op.LRT_UPDATE, s, check_cycles=True)
        assert model.writes_total > 0
        model.configure(cols=0)                  # r = 0: no s beat, no step, no write
        await run(Op.LRT_UPDATE, check_cycles=True)
        await run(Op.LRT_READ_COUNTS, check_cycles=True)
        await run(Op.LRT_READ_WEIGHTS, check_cycles=True)
        await run(Op.LRT_READ_WEIGHTS, stalls=0.5, gaps=0.5)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


def test_write_counters_saturate_in_hardware():
    """2**16 updates are too slow to simulate: preload the counter memory and the totals."""
    params = PARAMS
    rng = np.random.default_rng(5)
    dut = PELRT(params)
    model = LRTPEModel(params)
    model.configure(rows_l=2, rows_r=3, cols=1, shift=0)
    ones = np.zeros((8, 8), np.int64)
    ones[:, 0] = 1

    async def tb(ctx):
        async def run(op, words=None):
            return await _run(ctx, dut, model, op, words, rng=rng)
        for side in (0, 1):
            model.configure(side=side)
            await run(Op.LRT_LOAD_BASIS, pad_words(ones[:model.rows]))
        await run(Op.LRT_LOAD_WEIGHTS, pad_words([100, -100, 0, 5, 6, 7]))
        # Counters one below saturation, in both.
        model.counts[:6] = 65534
        ctx.set(dut._cnt_mem.data[0], [65534] * 6 + [0, 0])
        for _ in range(3):
            await run(Op.LRT_UPDATE, pad_words([1]))
            await run(Op.LRT_READ_COUNTS)
        assert (model.counts[:6] == 65535).all() and model.writes_max == 65535

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


@pytest.mark.parametrize("params", [PARAMS, DEFAULT_PARAMS], ids=["small", "default"])
def test_every_cfg_error_and_stream_size(params):
    rng = np.random.default_rng(2)
    dut = PELRT(params)
    model = LRTPEModel(params)
    R, C, Q = params.lrt_rows_max, params.lrt_cells_max, params.lrt_cols_max
    cases = []
    # Every error, for every op it applies to.
    for op in list(range(16)) + [26, 100, 255]:
        cases.append((op, dict(rows_l=1, rows_r=1), ErrorCode.BAD_OP))
    for op in range(16, 26):
        cases.append((op, dict(side=0, rows_l=0, rows_r=0), ErrorCode.ZERO_SIZE))
        cases.append((op, dict(side=1, rows_l=R + 1, rows_r=R + 1), ErrorCode.LRT_SIZE))
        cases.append((op, dict(side=1, rows_l=1, rows_r=1, cols=Q), ErrorCode.LRT_SIZE
                      if op in (18, 19, 20, 21, 22) else ErrorCode.NONE))
        cases.append((op, dict(rows_l=R, rows_r=C // R + 1),
                      ErrorCode.LRT_SIZE if op >= 22 else ErrorCode.NONE))
        for shift in (params.shift_min - 1, params.shift_max + 1, -128, 127):
            cases.append((op, dict(rows_l=2, rows_r=2, shift=shift), ErrorCode.SHIFT
                          if op in (20, 22) else ErrorCode.NONE))
    # And random configurations, valid or not.
    for _ in range(300):
        regs = dict(side=int(rng.integers(0, 2)),
                    rows_l=int(rng.choice([0, 1, R, R + 1, rng.integers(0, 1 << 16)])),
                    rows_r=int(rng.choice([0, 1, rng.integers(1, R + 1), rng.integers(0, 1 << 16)])),
                    cols=int(rng.choice([0, Q - 1, Q, rng.integers(0, 256)])),
                    shift=int(rng.integers(-128, 128)))
        cases.append((int(rng.integers(14, 28)), regs, None))

    async def tb(ctx):
        for op, regs, want in cases:
            model.configure(**{"side": 0, "rows_l": 1, "rows_r": 1, "cols": 0, "shift": 0, **regs})
            if want is not None:
                assert model.cfg_error(op) == want, (op, regs)
            await _configure(ctx, dut, model, op)
            assert ctx.get(dut.cfg_error) == model.cfg_error(op), (op, regs)
            if not model.cfg_error(op):
                assert ctx.get(dut.in_beats) == model.in_beats(op), (op, regs)
                assert ctx.get(dut.out_beats) == model.out_beats(op), (op, regs)

    sim = Simulator(dut)
    sim.add_clock(1e-8)
    sim.add_testbench(tb)
    sim.run()


def test_verilog_conversion():
    text = verilog.convert(PELRT(), name="pe_lrt")
    assert "module pe_lrt" in text


def test_unsupported_columns_are_refused():
    with pytest.raises(ValueError, match="lrt_cols_max"):
        PELRT(AcceleratorParams(lrt_cols_max=4))

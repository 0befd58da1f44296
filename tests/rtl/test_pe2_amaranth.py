"""PE2 in Amaranth's simulator against the golden stream model (:mod:`insitu.tt.pe_stream`).

Random small shapes and codes (Z over the full 16-bit range with its extremes, G over the full
4-bit range, random SHIFT), random gaps on the input and back-pressure on the output; the
configuration checks; the beat counts; one MAC cycle per clock in steady state; Verilog.
"""

import numpy as np
import pytest
from amaranth.back import verilog

from insitu.accel.params import AcceleratorParams
from insitu.rtl.pe2 import PE2
from insitu.accel.regmap import ErrorCode
from insitu.tt.pe_stream import PEConfig

from pe_sim import check, check_configurations, check_shift_swings, z_operand  # the test folder is on sys.path (no __init__.py)

pytestmark = pytest.mark.rtl

SMALL = AcceleratorParams(factor_words=128, pe1_row_entries=6, pe2_b_max=12, shift_min=-4,
                          shift_max=20)


def operands(cfg, rng, extremes=0.1):
    return z_operand(cfg, rng, extremes), rng.integers(-8, 8, size=(cfg.b, cfg.d))


def random_config(rng, params):
    while True:
        b = int(rng.integers(1, min(params.pe2_b_max, 24) + 1))
        d = int(rng.integers(1, 20))
        if b * -(-d // 8) * 8 <= params.factor_words:
            break
    shift = int(rng.integers(max(params.shift_min, -16), min(params.shift_max, 40) + 1))
    return PEConfig("PE2", int(rng.integers(1, 4)), b, 16 * int(rng.integers(1, 3)), d, shift)


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_under_gaps_and_back_pressure(seed):
    rng = np.random.default_rng(seed)
    p_gap, p_stall = [(0.0, 0.0), (0.3, 0.0), (0.0, 0.6), (0.5, 0.5)][seed]
    ops = []
    for _ in range(5):
        cfg = random_config(rng, PE2().params)
        ops.append((cfg, *operands(cfg, rng)))
    check(PE2(), ops, seed=seed, p_gap=p_gap, p_stall=p_stall)


def test_small_b_and_tight_output():
    """b below the 16 output beats of a group (the drain, not the MACs, sets the pace) and an
    output that stalls often."""
    rng = np.random.default_rng(11)
    ops = []
    for a, b, c, d, shift in [(3, 1, 16, 24, 2), (2, 2, 32, 9, 0), (2, 5, 16, 17, 7), (1, 15, 32, 16, 5)]:
        cfg = PEConfig("PE2", a, b, c, d, shift)
        ops.append((cfg, *operands(cfg, rng)))
    check(PE2(), ops, seed=2, p_gap=0.1, p_stall=0.7)


def test_small_generated_bounds():
    """Another generation (b up to 12, factor buffer of 16 entries) at its limits, back to back."""
    rng = np.random.default_rng(7)
    ops = []
    for a, b, c, d, shift in [(3, 12, 16, 8, 20), (2, 8, 32, 16, -4), (2, 1, 16, 128, 3)]:
        cfg = PEConfig("PE2", a, b, c, d, shift)
        ops.append((cfg, *operands(cfg, rng)))
    check(PE2(SMALL), ops, seed=1, p_gap=0.2, p_stall=0.3)


def test_accumulator_at_its_limit():
    """b = pe2_b_max with every product at the same extreme: no overflow."""
    b = PE2().params.pe2_b_max
    z = np.full((1, b, 16), -(1 << 15))
    z[0, :, 1] = (1 << 15) - 1
    z[0, ::2, 2] = (1 << 15) - 1
    g = np.full((b, 3), -8)
    g[:, 1] = 7
    # The accumulators start at the rounding term of SHIFT (capped at the accumulator's width):
    # shifts around the largest sums' bits and the accumulator's width, the largest, a left one.
    acc_bits = PE2().acc_bits
    ops = [(PEConfig("PE2", 1, b, 16, 3, shift), z, g)
           for shift in (14, 26, 27, 28, 30, acc_bits - 1, acc_bits, acc_bits + 1, 63, -16)]
    check(PE2(), ops)


def extreme_pairs_operands(a, d):
    """Each DSP multiplies one Z word by the codes of two d's packed 20 bits apart. Every pair of
    codes (d even, d odd) from -8..7 x -8..7 meets Z words at both extremes and of both signs
    (negative low products borrow from the high one): consecutive b's hold (x, -x) or
    (-32768, 32767) with equal codes, so every output is a small exact sum (SHIFT 0) in which an
    error of 1 in any product shows."""
    combos = [(x, y) for x in range(-8, 8) for y in range(-8, 8)]
    b = 2 * len(combos) // 4
    cfg = PEConfig("PE2", a, b, 16, d, 0)
    g = np.zeros((b, 8), dtype=np.int64)
    for i in range(b // 2):
        for pair in range(4):
            g[2 * i:2 * i + 2, 2 * pair:2 * pair + 2] = combos[4 * i + pair]
    g = g[:, :d]
    lanes = [(-(1 << 15), (1 << 15) - 1), ((1 << 15) - 1, -(1 << 15)), (-(1 << 15) + 1, (1 << 15) - 1),
             (-1, 1), (1, -1), (-2, 1), (12345, -12345), (3, -3)]
    z = np.zeros((a, b, 16), dtype=np.int64)
    for r in range(a):
        for lane in range(16):
            x, y = lanes[(r + lane) % len(lanes)]
            z[r, 0::2, lane], z[r, 1::2, lane] = x, y
    return cfg, z, g


def test_packed_products_at_extreme_codes():
    ops = [extreme_pairs_operands(2, 8), extreme_pairs_operands(1, 7)]
    for cfg, z, g in ops:     # the sums stay far from saturation: any error would show
        assert np.abs(np.einsum("abc,bd->adc", z, g)).max() < 1 << 14
    check(PE2(), ops, seed=5, p_gap=0.1, p_stall=0.2)


def expected_error(cfg, params):
    a, b, c, d, shift = cfg.a, cfg.b, cfg.c, cfg.d, cfg.shift
    if 0 in (a, b, c, d):
        return ErrorCode.ZERO_SIZE
    if c % 16:
        return ErrorCode.C_LANES
    if b > params.pe2_b_max or a * c >= (1 << 32) // (params.factor_words // 8):
        return ErrorCode.TILE
    if b * (-(-d // 8) * 8) > params.factor_words:
        return ErrorCode.FACTOR_WORDS
    if not params.shift_min <= shift <= params.shift_max:
        return ErrorCode.SHIFT
    return ErrorCode.NONE


def test_cfg_error_and_beat_counts():
    params = PE2().params
    cases = [
        (0, 1, 16, 1, 0), (1, 0, 16, 1, 0), (1, 1, 0, 1, 0), (1, 1, 16, 0, 0),       # ZERO_SIZE
        (1, 1, 8, 1, 0), (3, 2, 24, 5, 0), (1, 1, 1000, 1, 0),                      # C_LANES
        (1, 513, 16, 1, 0), (1, 65535, 16, 1, 0),                                   # TILE
        (1, 512, 16, 9, 0), (1, 1, 16, 4097, 0), (1, 100, 16, 41, 0), (9, 1, 16, 65535, 0),
        (1, 1, 16, 1, -17), (1, 1, 16, 1, 64), (1, 1, 16, 1, -128), (1, 1, 16, 1, 127),  # SHIFT
        (1, 512, 16, 8, -16), (1, 1, 16, 4096, 63), (65535, 28, 16, 16, 0),          # accepted
        (1, 28, 16384, 16, 5), (64, 112, 128, 4, 0), (0, 0, 8, 0, 99),
        (65535, 512, 65520, 8, 0), (65535, 1, 65520, 16, 0),                        # TILE: a*c
        (128, 512, 65520, 8, 0), (129, 512, 65520, 8, 0),        # a*c just below / above 2**23
    ]
    rng = np.random.default_rng(3)
    for _ in range(60):
        cases.append(tuple(int(rng.integers(0, hi)) for hi in (3000, 600, 1100, 80)) +
                     (int(rng.integers(-128, 128)),))
    # Single fields changed one after another, as the driver writes them.
    cases += [(3, 1, 16, 1, 0), (900, 1, 16, 1, 0), (900, 4, 16, 1, 0), (900, 4, 48, 1, 0),
              (900, 4, 48, 7, 0), (900, 4, 48, 7, 99), (900, 4, 48, 7, 2), (1, 4, 48, 7, 2)]
    seen = set()

    def expected(a, b, c, d, shift):
        cfg = PEConfig("PE2", a, b, c, d, shift)
        want = expected_error(cfg, params)
        seen.add(want)
        if want == ErrorCode.NONE:          # accepted ops count their beats exactly
            assert max(cfg.in_beats(), cfg.out_beats()) < 1 << 32, cfg
        return want, cfg.in_beats() % (1 << 32), cfg.out_beats() % (1 << 32)

    check_configurations(PE2(), cases, expected)
    assert seen == {ErrorCode.NONE, ErrorCode.ZERO_SIZE, ErrorCode.C_LANES, ErrorCode.TILE,
                    ErrorCode.FACTOR_WORDS, ErrorCode.SHIFT}


@pytest.mark.parametrize("b, c, d", [(32, 16, 32), (28, 64, 16), (17, 16, 16)])
def test_steady_state_is_one_mac_cycle_per_clock(b, c, d):
    """With the streams always ready, each further (a, chunk) tile costs exactly its
    b*ceil(d/8) MAC cycles once loading keeps up (d >= 16: 2*b beats per tile), and the whole op
    costs about the G load + the MAC cycles + a short tail (the MAC loop chases the first
    tile's load)."""
    rng = np.random.default_rng(b * c * d)
    ops = []
    for a in (1, 3):
        cfg = PEConfig("PE2", a, b, c, d, 9)
        ops.append((cfg, *operands(cfg, rng)))
    first, second = check(PE2(), ops)
    per_tile = b * -(-d // 8)
    assert second["cycles"] - first["cycles"] == 2 * (c // 16) * per_tile
    cfg = ops[0][0]
    assert first["cycles"] <= cfg.macs() // 128 + b * -(-d // 8) + 2 * b + 24


def test_input_bound_when_d_fits_one_group():
    """d <= 8: a tile's 2*b beats take longer than its b MAC cycles: the input stream sets the
    pace (one beat per cycle, no bubble)."""
    rng = np.random.default_rng(5)
    ops = []
    for a in (1, 3):
        cfg = PEConfig("PE2", a, 20, 32, 4, 3)
        ops.append((cfg, *operands(cfg, rng)))
    first, second = check(PE2(), ops)
    assert second["cycles"] - first["cycles"] == ops[1][0].in_beats() - ops[0][0].in_beats()


def test_shift_changed_just_before_the_fastest_ops():
    check_shift_swings(PE2(), "PE2", [(1, 1, 16, 1), (1, 1, 16, 8), (1, 2, 16, 3)], operands)


def test_converts_to_verilog():
    text = verilog.convert(PE2(), name="pe2")
    assert "module pe2" in text


def test_bad_generation_parameters_are_refused():
    with pytest.raises(ValueError, match="c_lanes"):
        PE2(AcceleratorParams(c_lanes=8))

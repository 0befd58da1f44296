"""PE1 in Amaranth's simulator against the golden stream model (:mod:`insitu.tt.pe_stream`).

Random small shapes and codes (Z over the full 16-bit range with its extremes, G over the full
4-bit range, random SHIFT), random gaps on the input and back-pressure on the output; the
configuration checks; the beat counts; one MAC cycle per clock in steady state; Verilog.
"""

import numpy as np
import pytest
from amaranth.back import verilog

from insitu.accel.params import DEFAULT_PARAMS, AcceleratorParams
from insitu.rtl.pe1 import PE1
from insitu.accel.regmap import ErrorCode
from insitu.tt.pe_stream import PEConfig

from pe_sim import check, check_configurations, check_shift_swings, z_operand  # the test folder is on sys.path (no __init__.py)

pytestmark = pytest.mark.rtl

SMALL = AcceleratorParams(factor_words=256, pe1_row_entries=6, pe2_b_max=12, shift_min=-4,
                          shift_max=20)


def operands(cfg, rng, extremes=0.1):
    return z_operand(cfg, rng, extremes), rng.integers(-8, 8, size=(cfg.b, cfg.d, cfg.c))


def random_config(rng, params, a_max=26):
    chunks_max = params.pe1_row_entries
    while True:
        b = int(rng.integers(1, 4))
        C = int(rng.integers(1, min(4, chunks_max) + 1))
        d = int(rng.integers(1, 11))
        if b * C <= chunks_max and b * d * C <= params.factor_words // 16:
            break
    shift = int(rng.integers(max(params.shift_min, -16), min(params.shift_max, 40) + 1))
    return PEConfig("PE1", int(rng.integers(1, a_max)), b, 16 * C, d, shift)


@pytest.mark.parametrize("seed", range(4))
def test_random_shapes_under_gaps_and_back_pressure(seed):
    rng = np.random.default_rng(seed)
    p_gap, p_stall = [(0.0, 0.0), (0.3, 0.0), (0.0, 0.6), (0.5, 0.5)][seed]
    ops = []
    for _ in range(5):
        cfg = random_config(rng, PE1().params)
        ops.append((cfg, *operands(cfg, rng)))
    check(PE1(), ops, seed=seed, p_gap=p_gap, p_stall=p_stall)


def test_back_pressure_with_a_result_every_cycle():
    """b*c/16 = 1: the MACs finish a result every cycle while the output mostly stalls; results
    in flight must never overflow the output FIFO."""
    rng = np.random.default_rng(12)
    ops = []
    for a, b, c, d, shift in [(20, 1, 16, 12, 3), (9, 2, 16, 5, 0), (16, 1, 16, 1, 1)]:
        cfg = PEConfig("PE1", a, b, c, d, shift)
        ops.append((cfg, *operands(cfg, rng)))
    check(PE1(), ops, seed=4, p_gap=0.0, p_stall=0.75)


def test_small_generated_bounds():
    """Another generation (tile depth 6, not a power of 2; factor buffer of 16 entries) at its
    limits, back to back."""
    rng = np.random.default_rng(7)
    shapes = [(9, 3, 32, 2, 20), (16, 1, 96, 2, -4), (5, 2, 48, 2, 3), (12, 1, 16, 16, 0)]
    ops = []
    for a, b, c, d, shift in shapes:
        cfg = PEConfig("PE1", a, b, c, d, shift)
        ops.append((cfg, *operands(cfg, rng)))
    check(PE1(SMALL), ops, seed=1, p_gap=0.2, p_stall=0.3)


def test_accumulator_at_its_limit():
    """b*c/16 = pe1_row_entries with every product at the same extreme: no overflow."""
    entries = DEFAULT_PARAMS.pe1_row_entries
    cfg = PEConfig("PE1", 8, 1, 16 * entries, 1, 13)
    z = np.full((8, 1, cfg.c), -(1 << 15))
    z[1] = (1 << 15) - 1
    z[2, 0, ::2] = (1 << 15) - 1
    g = np.full((1, 1, cfg.c), -8)
    # The accumulators start at the rounding term of SHIFT (capped at the accumulator's width):
    # shifts around the largest sums' bits and the accumulator's width, the largest, a left one.
    acc_bits = PE1().acc_bits
    ops = [(cfg, z, g)] + [(PEConfig("PE1", 8, 1, 16 * entries, 1, shift), z, g)
                           for shift in (26, 27, 28, acc_bits - 1, acc_bits, acc_bits + 1, 63, -16)]
    check(PE1(), ops)


def extreme_pairs_operands(a, b, d):
    """Each DSP multiplies one Z word by the codes of two d's packed 20 bits apart. Every pair of
    codes (d even, d odd) from -8..7 x -8..7 meets Z words at both extremes and of both signs
    (negative low products borrow from the high one): Z comes in lane pairs (x, -x) or
    (-32768, 32767) with equal codes in the pair, so every output is a small exact sum
    (SHIFT 0) in which an error of 1 in any product shows."""
    cfg = PEConfig("PE1", a, b, 16, d, 0)
    combos = [(x, y) for x in range(-8, 8) for y in range(-8, 8)]
    g = np.zeros((b, d, 16), dtype=np.int64)
    i = 0
    for pair in range(d // 2):
        for bb in range(b):
            for j in range(8):
                x, y = combos[i % len(combos)]
                g[bb, 2 * pair, 2 * j:2 * j + 2] = x
                g[bb, 2 * pair + 1, 2 * j:2 * j + 2] = y
                i += 1
    if d % 2:
        g[:, d - 1, 0::2] = g[:, d - 1, 1::2] = np.arange(-8, 8, 2)
    lanes = [(-(1 << 15), (1 << 15) - 1), ((1 << 15) - 1, -(1 << 15)), (-(1 << 15) + 1, (1 << 15) - 1),
             (-1, 1), (1, -1), (-2, 1), (12345, -12345), (3, -3)]
    z = np.zeros((a, b, 16), dtype=np.int64)
    for r in range(a):
        x, y = lanes[r % len(lanes)]
        z[r, :, 0::2], z[r, :, 1::2] = x, y
    return cfg, z, g


def test_packed_products_at_extreme_codes():
    ops = [extreme_pairs_operands(8, 16, 4), extreme_pairs_operands(8, 16, 3),
           extreme_pairs_operands(16, 1, 2)]
    for cfg, z, g in ops:     # the sums stay far from saturation: any error would show
        assert np.abs(np.einsum("abc,bdc->ad", z, g)).max() < 1 << 14
    check(PE1(), ops, seed=5, p_gap=0.1, p_stall=0.2)


def expected_error(cfg, params):
    a, b, c, d, shift = cfg.a, cfg.b, cfg.c, cfg.d, cfg.shift
    if 0 in (a, b, c, d):
        return ErrorCode.ZERO_SIZE
    if c % 16:
        return ErrorCode.C_LANES
    if b * c // 16 > params.pe1_row_entries:
        return ErrorCode.TILE
    if b * d * c // 16 > params.factor_words // 16:
        return ErrorCode.FACTOR_WORDS
    if not params.shift_min <= shift <= params.shift_max:
        return ErrorCode.SHIFT
    return ErrorCode.NONE


def test_cfg_error_and_beat_counts():
    params = PE1().params
    cases = [
        (0, 1, 16, 1, 0), (1, 0, 16, 1, 0), (1, 1, 0, 1, 0), (1, 1, 16, 0, 0),       # ZERO_SIZE
        (1, 1, 8, 1, 0), (3, 2, 24, 5, 0), (1, 1, 1000, 1, 0),                      # C_LANES
        (1, 65, 16, 1, 0), (1, 1, 16 * 65, 1, 0), (9, 5, 16 * 13, 1, 0),            # TILE
        (1, 1, 16, 257, 0), (1, 16, 64, 5, 0), (1, 64, 16, 5, 0),                   # FACTOR_WORDS
        (1, 1, 16, 1, -17), (1, 1, 16, 1, 64), (1, 1, 16, 1, -128), (1, 1, 16, 1, 127),  # SHIFT
        (1, 1, 16, 256, -16), (1, 1, 16, 256, 63), (65535, 64, 16, 4, 0),           # accepted
        (65535, 1, 1024, 4, 5), (8, 16, 64, 4, 0), (0, 0, 8, 0, 99), (1, 1, 16, 65535, 0),
        (65535, 65535, 65520, 65535, 0),
    ]
    rng = np.random.default_rng(3)
    for _ in range(60):
        cases.append(tuple(int(rng.integers(0, hi)) for hi in (3000, 70, 1100, 300)) +
                     (int(rng.integers(-128, 128)),))
    # Single fields changed one after another, as the driver writes them.
    cases += [(3, 1, 16, 1, 0), (900, 1, 16, 1, 0), (900, 4, 16, 1, 0), (900, 4, 48, 1, 0),
              (900, 4, 48, 7, 0), (900, 4, 48, 7, 99), (900, 4, 48, 7, 2), (1, 4, 48, 7, 2)]
    seen = set()

    def expected(a, b, c, d, shift):
        cfg = PEConfig("PE1", a, b, c, d, shift)
        want = expected_error(cfg, params)
        seen.add(want)
        return want, cfg.in_beats() % (1 << 32), cfg.out_beats() % (1 << 32)

    check_configurations(PE1(), cases, expected)
    assert seen == {ErrorCode.NONE, ErrorCode.ZERO_SIZE, ErrorCode.C_LANES, ErrorCode.TILE,
                    ErrorCode.FACTOR_WORDS, ErrorCode.SHIFT}


@pytest.mark.parametrize("b, c, d", [(1, 16, 64), (1, 64, 16), (2, 32, 16), (1, 16, 17), (2, 32, 17)])
def test_steady_state_is_one_mac_cycle_per_clock(b, c, d):
    """With the streams always ready, each further group of 8 rows costs exactly its MAC cycles,
    b*c/16 * d rounded up to even (each DSP computes a pair of d's: an odd d leaves the last
    pair half used), when that exceeds the group's load (loading overlaps computing; no dead cycle
    between pairs or groups), and the whole op costs the G load + one group load + the MAC cycles
    + a short pipeline tail."""
    rng = np.random.default_rng(b * c * d)
    ops = []
    for a in (16, 40):
        cfg = PEConfig("PE1", a, b, c, d, 9)
        ops.append((cfg, *operands(cfg, rng)))
    first, second = check(PE1(), ops)
    K = b * c // 16
    d2 = d + d % 2
    assert second["cycles"] - first["cycles"] == 3 * K * max(d2, 16)
    cfg = ops[0][0]
    ideal = cfg.macs() // 128 * d2 // d
    assert first["cycles"] <= ideal + b * d * c // 8 + 16 * K + 12


def test_shift_changed_just_before_the_fastest_ops():
    check_shift_swings(PE1(), "PE1", [(1, 1, 16, 1), (8, 1, 16, 2), (3, 1, 16, 3)], operands)


def test_converts_to_verilog():
    text = verilog.convert(PE1(), name="pe1")
    assert "module pe1" in text


def test_bad_generation_parameters_are_refused():
    with pytest.raises(ValueError, match="pe_rows"):
        PE1(AcceleratorParams(pe_rows=4))

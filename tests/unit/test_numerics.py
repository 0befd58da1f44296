"""Property tests of the fixed-point spec (insitu.numerics)."""

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from insitu import numerics as nx
from insitu.numerics import FixedPoint

pytestmark = pytest.mark.unit


@st.composite
def formats(draw, max_bits=24):
    bits = draw(st.integers(1, max_bits))
    signed = draw(st.booleans())
    midrise = signed and draw(st.booleans())
    frac = draw(st.integers(-6, 30))
    return FixedPoint(bits, frac, signed=signed, midrise=midrise, name="t")


def codes_of(fmt, n=64, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(fmt.qmin, fmt.qmax + 1, size=n)


# -- the named formats of the papers ---------------------------------------------------------------

def test_lrt_formats_match_the_paper():
    assert (nx.LRT_WEIGHT.bits, nx.LRT_WEIGHT.lsb) == (8, 2 / 256)
    assert (nx.LRT_WEIGHT.min_value, nx.LRT_WEIGHT.max_value) == (-1.0, 1 - 2 / 256)
    assert (nx.LRT_BIAS.bits, nx.LRT_BIAS.lsb, nx.LRT_BIAS.min_value) == (16, 16 / 2**16, -8.0)
    assert not nx.LRT_ACTIVATION.signed
    assert (nx.LRT_ACTIVATION.min_value, nx.LRT_ACTIVATION.max_value) == (0.0, 2 - 2 / 256)
    assert (nx.LRT_GRADIENT.bits, nx.LRT_GRADIENT.lsb) == (8, 2 / 256)


def test_one_and_two_bit_weights_are_mid_rise():
    one, two = nx.lrt_weight_format(1), nx.lrt_weight_format(2)
    assert one.midrise and two.midrise and not nx.lrt_weight_format(3).midrise
    assert one.to_float([one.qmin, one.qmax]).tolist() == [-0.5, 0.5]
    assert two.to_float(np.arange(two.qmin, two.qmax + 1)).tolist() == [-0.75, -0.25, 0.25, 0.75]
    # No zero level: a small value goes to the nearest of +-LSB/2.
    assert one.quantize([-0.01, 0.01, -3, 3]).tolist() == [-0.5, 0.5, -0.5, 0.5]


def test_from_range_rejects_a_step_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="not a power of two"):
        FixedPoint.from_range(8, -1, 2)
    with pytest.raises(ValueError, match="symmetric"):
        FixedPoint.from_range(8, -1, 3)


def test_ties_go_toward_plus_infinity():
    fmt = FixedPoint(8, 0)
    assert fmt.quantize_code([0.5, 1.5, -0.5, -1.5, 2.5]).tolist() == [1, 2, 0, -1, 3]
    assert nx.shift_round([1, 3, -1, -3, 5], 1).tolist() == [1, 2, 0, -1, 3]


def test_a_value_just_below_a_tie_rounds_down():
    below = np.nextafter(0.5, 0)                      # 0.49999999999999994
    assert nx.round_half_up([below, -np.nextafter(0.5, 1), 2.0**52 + 1]).tolist() == [0, -1, 2**52 + 1]
    assert FixedPoint(8, 0).quantize_code(below) == 0
    assert nx.requantize_float(1, below) == 0


def test_no_silent_int64_overflow():
    # A huge left shift saturates instead of wrapping; a huge right shift gives 0.
    assert nx.INT8.requantize(2**40, -30) == 127 and nx.INT8.requantize(-(2**40), -30) == -128
    assert nx.INT8.requantize(2**61, 70) == 0
    assert nx.requantize_float(1000, 1e20) == 127
    with pytest.raises(ValueError, match="shift must be in"):
        nx.RequantScale.from_float(2.0**-50)
    with pytest.raises(ValueError, match="overflow"):
        nx.requantize_fixed(2**50, nx.RequantScale.from_float(0.5))
    with pytest.raises(ValueError, match="overflow"):
        nx.shift_round(2**61, -2)
    with pytest.raises(ValueError, match="NaN"):
        nx.requantize_float(1, float("nan"))


def test_nan_is_refused():
    with pytest.raises(ValueError, match="NaN"):
        nx.LRT_WEIGHT.quantize_code([0.0, float("nan")])


# -- properties of every format ------------------------------------------------------------------

@given(formats())
def test_round_trip_code_float_code(fmt):
    codes = np.concatenate([codes_of(fmt), [fmt.qmin, fmt.qmax]])
    assert np.array_equal(fmt.quantize_code(fmt.to_float(codes)), codes)


@given(formats(), st.lists(st.floats(-1e6, 1e6, allow_nan=False), min_size=1, max_size=40))
def test_quantize_is_idempotent_monotone_and_saturating(fmt, values):
    x = np.sort(np.array(values))
    q = fmt.quantize_code(x)
    assert np.all(np.diff(q) >= 0), "monotone"
    assert q.min() >= fmt.qmin and q.max() <= fmt.qmax, "saturated into range"
    assert np.array_equal(fmt.quantize_code(fmt.to_float(q)), q), "idempotent"
    inside = (x >= fmt.min_value) & (x <= fmt.max_value)
    err = np.abs(fmt.to_float(q) - x)
    assert np.all(err[inside] <= fmt.lsb / 2), "nearest level inside the range"
    assert np.all(q[x > fmt.max_value] == fmt.qmax) and np.all(q[x < fmt.min_value] == fmt.qmin)


@given(formats(max_bits=20), st.integers(-40, 70), st.integers(0, 2**31 - 1))
def test_integer_requantize_equals_the_float_view(fmt, extra, seed):
    """Accumulator codes of scale 2**-from_frac -> format: integer shift == float quantizer."""
    from_frac = fmt.frac + extra
    acc = np.random.default_rng(seed).integers(-(2**40), 2**40, size=64)
    real = np.ldexp(acc.astype(np.float64), -from_frac)   # exact: |acc| < 2**53
    assert np.array_equal(fmt.requantize(acc, from_frac), fmt.quantize_code(real))


@given(st.integers(-(2**50), 2**50), st.integers(0, 40))
def test_shift_round_is_floor_of_half_up_exactly(v, shift):
    expected = math.floor(Fraction(v, 2**shift) + Fraction(1, 2))
    assert int(nx.shift_round(v, shift)) == expected


# -- accumulator widths ----------------------------------------------------------------------------

@pytest.mark.parametrize("a_signed,b_signed", [(True, True), (True, False), (False, False)])
@pytest.mark.parametrize("a_bits,b_bits", [(8, 8), (16, 4), (1, 3), (4, 1)])
def test_product_width_is_exact(a_bits, b_bits, a_signed, b_signed):
    a_lo, a_hi = nx.FixedPoint(a_bits, 0, signed=a_signed).qmin, nx.FixedPoint(a_bits, 0, signed=a_signed).qmax
    b_lo, b_hi = nx.FixedPoint(b_bits, 0, signed=b_signed).qmin, nx.FixedPoint(b_bits, 0, signed=b_signed).qmax
    products = [a * b for a in (a_lo, a_hi) for b in (b_lo, b_hi)]
    width = nx.product_bits(a_bits, b_bits, a_signed, b_signed)
    assert all(-(2 ** (width - 1)) <= p <= 2 ** (width - 1) - 1 for p in products)
    assert not all(-(2 ** (width - 2)) <= p <= 2 ** (width - 2) - 1 for p in products)   # tight


@pytest.mark.parametrize("a_bits,b_bits", [(16, 4), (8, 8), (4, 4), (16, 16)])
@pytest.mark.parametrize("terms", [1, 2, 16, 128, 1000])
def test_accumulator_width_holds_the_worst_case_and_is_tight(a_bits, b_bits, terms):
    width = nx.accumulator_bits(a_bits, b_bits, terms)
    worst = terms * (-(2 ** (a_bits - 1))) * (-(2 ** (b_bits - 1)))   # largest positive sum
    most_negative = terms * (-(2 ** (a_bits - 1))) * (2 ** (b_bits - 1) - 1)
    lo, hi = -(2 ** (width - 1)), 2 ** (width - 1) - 1
    assert lo <= most_negative and worst <= hi
    if terms & (terms - 1) == 0:                                          # powers of two: no slack
        assert worst > 2 ** (width - 2) - 1


# -- dynamic formats ----------------------------------------------------------------------------------

@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=50), st.integers(4, 16))
# Ties: max|x| exactly half an LSB above the largest code (Hypothesis found 7.5 in 4 bits), on
# either sign, and a value just below a tie, which keeps the finer format.
@example(values=[7.5], bits=4)
@example(values=[-7.5, 1.0], bits=4)
@example(values=[7.499999999999999], bits=4)
@example(values=[32767.5 / 8], bits=16)
def test_max_abs_format_never_saturates_and_is_the_finest(values, bits):
    x = np.array(values)
    assume(np.max(np.abs(x)) > 1e-300)
    fmt = nx.max_abs_format(x, bits)
    codes = fmt.quantize_code(x)
    # Nothing saturates: every code is x's nearest (ties up), none clipped, so within half an LSB.
    assert np.array_equal(codes, nx.round_half_up(np.ldexp(x, fmt.frac)))
    assert np.all(np.abs(fmt.to_float(codes) - x) <= fmt.lsb / 2)
    # The finest: one step finer, max|x| (the range is symmetric) rounds past the largest code.
    # At a tie (7.5 in 4 bits at frac 0) the clipped code is half an LSB off too, but it is clipped.
    peak = float(np.max(np.abs(x)))
    assert nx.round_half_up(math.ldexp(peak, fmt.frac + 1)) > (1 << (bits - 1)) - 1


def test_max_abs_format_of_zeros_and_non_finite():
    assert nx.max_abs_format(np.zeros(3), 16).frac == 15
    with pytest.raises(ValueError, match="non-finite"):
        nx.max_abs_format([1.0, np.inf])


@given(st.floats(1e-6, 1e6), st.integers(0, 2**31 - 1))
def test_autoscale_brings_mean_abs_into_the_band(magnitude, seed):
    x = np.random.default_rng(seed).normal(size=200) * magnitude
    scale = nx.AutoScale(bits=16, frac=15, target=nx.TT_MEAN_ABS_TARGET)
    scale.observe(x)
    lo, hi = nx.TT_MEAN_ABS_TARGET
    assert lo <= scale.normalized_mean_abs(x) <= hi
    # A tensor that is already inside the band does not move the scale.
    before = scale.frac
    assert scale.observe(x) == before


# -- int8 real quantized graphs (tiny training, eq. 1) ---------------------------------------------

@given(st.floats(2.0**-45, 0.99), st.integers(0, 2**31 - 1))
def test_fixed_and_float_requantization_agree_exactly(scale, seed):
    rq = nx.RequantScale.from_float(scale)
    assert abs(float(rq) - scale) <= scale * 2.0 ** -(rq.bits - 1)
    acc = np.random.default_rng(seed).integers(-(2**31), 2**31, size=256)
    assert np.array_equal(nx.requantize_fixed(acc, rq), nx.requantize_float(acc, float(rq)))


def test_int8_graph_layer_end_to_end():
    """y = cast2int8(s * (W x + b)) with int8 W, x and int32 b: exact against a float reference."""
    rng = np.random.default_rng(1)
    w = rng.integers(-128, 128, size=(5, 7))
    x = rng.integers(-128, 128, size=7)
    b = rng.integers(-(2**20), 2**20, size=5)
    acc = w @ x + b
    rq = nx.RequantScale.from_float(0.0123)
    y = nx.requantize_fixed(acc, rq)
    expected = np.clip(np.floor(acc * float(rq) + 0.5), -128, 127)
    assert np.array_equal(y, expected) and y.min() >= -128 and y.max() <= 127


def test_per_channel_requantization_equals_one_channel_at_a_time():
    rng = np.random.default_rng(3)
    scales = [nx.RequantScale.from_float(float(s)) for s in rng.uniform(1e-5, 0.5, size=6)]
    acc = rng.integers(-(2**24), 2**24, size=(9, 6))
    together = nx.requantize_fixed(acc, scales)
    for c, scale in enumerate(scales):
        assert np.array_equal(together[:, c], nx.requantize_fixed(acc[:, c], scale))
    assert np.array_equal(together, nx.requantize_float(acc, [float(s) for s in scales]))


def test_requant_scale_rejects_bad_scales():
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="positive finite"):
            nx.RequantScale.from_float(bad)


def test_msb_code_takes_the_top_bits_rounded_and_saturated():
    # 127/16 rounds to 8, saturated to 4 bits; -8/16 is a tie (up: 0); -9/16 rounds to -1.
    assert nx.msb_code([127, -128, 16, -1, -8, -9, 23, 24], bits=8, keep=4).tolist() == [7, -8, 1, 0, 0, -1, 1, 2]
    assert nx.msb_code([5, -5], bits=8, keep=8).tolist() == [5, -5]
    with pytest.raises(ValueError):
        nx.msb_code([1], bits=8, keep=9)


def _msb(code: int, shift: int, keep: int) -> int:
    """Round half up by 2**shift, saturate to ``keep`` signed bits (Python integers)."""
    value = math.floor(Fraction(code, 1 << shift) + Fraction(1, 2))
    return max(-(1 << (keep - 1)), min((1 << (keep - 1)) - 1, value))


@given(st.integers(1, 40), st.integers(1, 6), st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_psg_weight_gradient_is_the_integer_sum_of_products(k, n_out, n_in, seed):
    rng = np.random.default_rng(seed)
    dy = rng.integers(-(1 << 15), 1 << 15, size=(k, n_out))
    x = rng.integers(-128, 128, size=(k, n_in))
    g_full, g_msb = nx.psg_weight_gradient(dy, x)
    for o in range(n_out):
        for i in range(n_in):
            assert g_full[o, i] == sum(int(dy[s, o]) * int(x[s, i]) for s in range(k))
            assert g_msb[o, i] == sum(_msb(int(dy[s, o]), 6, 10) * _msb(int(x[s, i]), 4, 4) for s in range(k))


def test_psg_weight_gradient_refuses_codes_out_of_range_and_bad_shapes():
    with pytest.raises(ValueError, match="8-bit"):
        nx.psg_weight_gradient(np.zeros((2, 1)), np.array([[128], [0]]))
    with pytest.raises(ValueError, match="16-bit"):
        nx.psg_weight_gradient(np.array([[1 << 15], [0]]), np.zeros((2, 1)))
    with pytest.raises(ValueError, match="need dy"):
        nx.psg_weight_gradient(np.zeros((3, 1)), np.zeros((2, 1)))


def test_psg_threshold_and_sign_follow_eq_2():
    g_msb = np.array([[-100, 40, 4, 0]])
    g_full = np.array([[-1, 1, -5, 7]])
    tau = nx.psg_threshold(g_msb, 0.05)
    assert tau == 5                                  # ceil(0.05 * 100)
    sign, predicted = nx.psg_sign(g_full, g_msb, tau)
    assert predicted.tolist() == [[True, True, False, False]]
    assert sign.tolist() == [[-1, 1, -1, 1]]         # the last two fall back to sgn(g_full)
    # A zero predictor never decides, even when the whole layer's predictor is zero.
    assert nx.psg_threshold(np.zeros((2, 2)), 0.5) == 1
    for beta in (0.0, 1.0, -0.1, 2.0):
        with pytest.raises(ValueError, match=r"beta must be in \(0, 1\)"):
            nx.psg_threshold(g_msb, beta)

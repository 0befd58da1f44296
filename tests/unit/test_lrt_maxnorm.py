"""Gradient max-norming (insitu.lrt.maxnorm, SKS paper appendix D)."""

import math

import numpy as np
import pytest

from insitu.lrt.maxnorm import MaxNorm

pytestmark = pytest.mark.unit


def test_a_hand_computed_sequence():
    norm = MaxNorm(beta=0.5, eps=0.1)
    # k=1: x_max = 2.1, x_mv = 0.5*0.1 + 0.5*2.1 = 1.1, debiased 1.1/0.5 = 2.2 > x_max.
    np.testing.assert_allclose(norm(np.array([1.0, -2.0])), [1 / 2.2, -2 / 2.2], rtol=1e-12)
    assert (norm.k, norm.x_mv) == (1, pytest.approx(1.1))
    # k=2: x_max = 0.6, x_mv = 0.55 + 0.3 = 0.85, debiased 0.85/0.75 > x_max: the average wins.
    np.testing.assert_allclose(norm(np.array([0.5])), [0.5 / (0.85 / 0.75)], rtol=1e-12)
    # k=3: x_max = 4.1, x_mv = 0.425 + 2.05 = 2.475, debiased 2.475/0.875 < x_max: the max wins.
    np.testing.assert_allclose(norm(np.array([[4.0, 0.0]])), [[4 / 4.1, 0.0]], rtol=1e-12)
    assert (norm.k, norm.x_mv) == (3, pytest.approx(2.475))


def test_peek_returns_the_same_value_without_changing_state():
    norm = MaxNorm()
    rng = np.random.default_rng(0)
    for _ in range(5):
        norm(rng.normal(size=10))
    before = norm.state_dict()
    x = rng.normal(size=10)
    peeked = norm.peek(x)
    assert norm.state_dict() == before
    np.testing.assert_array_equal(norm(x), peeked)
    assert norm.state_dict() != before


def test_output_max_is_below_one_and_shape_is_kept():
    norm = MaxNorm()
    rng = np.random.default_rng(1)
    for i in range(300):
        x = rng.normal(size=(4, 3)) * 10.0 ** rng.uniform(-6, 3)
        out = norm(x)
        assert out.shape == x.shape
        assert np.max(np.abs(out)) < 1.0
        # The sign and relative sizes are kept: a positive rescale.
        np.testing.assert_allclose(out * np.max(np.abs(x)) / np.max(np.abs(out)), x, rtol=1e-9)


def test_quiet_periods_are_not_amplified_after_loud_samples():
    norm = MaxNorm()
    rng = np.random.default_rng(2)
    for _ in range(2000):
        norm(rng.normal(size=50))                 # loud: max |x| around 2-3
    quiet = 1e-3 * rng.normal(size=50)
    out = norm(quiet)
    # Per-sample max-norm would blow this noise up to 1; the moving average keeps it near 1e-3.
    assert np.max(np.abs(out)) < 0.01
    # A loud sample after the quiet one still comes out at full scale (about 1).
    assert np.max(np.abs(norm(3 * rng.normal(size=50)))) > 0.5


def test_state_dict_round_trip_continues_identically():
    a = MaxNorm(beta=0.9, eps=1e-3)
    rng = np.random.default_rng(3)
    xs = [rng.normal(size=8) for _ in range(20)]
    for x in xs[:10]:
        a(x)
    b = MaxNorm(beta=0.9, eps=1e-3)
    b.load_state_dict({k: np.asarray(v) if k == "k" else v for k, v in a.state_dict().items()})
    for x in xs[10:]:
        np.testing.assert_array_equal(a(x), b(x))
    with pytest.raises(ValueError, match="beta"):
        MaxNorm(beta=0.99).load_state_dict(a.state_dict())
    with pytest.raises(ValueError, match="missing"):
        b.load_state_dict({"k": 1})
    with pytest.raises(ValueError, match="x_mv"):
        b.load_state_dict({"k": 1, "x_mv": -1.0})
    with pytest.raises(ValueError, match="k must"):
        b.load_state_dict({"k": -2, "x_mv": 1.0})


@pytest.mark.parametrize("kwargs, arg", [
    ({"beta": 0.0}, "beta"), ({"beta": 1.0}, "beta"), ({"beta": math.nan}, "beta"),
    ({"eps": 0.0}, "eps"), ({"eps": -1e-4}, "eps"), ({"eps": math.inf}, "eps"),
])
def test_bad_parameters_are_refused(kwargs, arg):
    with pytest.raises(ValueError, match=arg):
        MaxNorm(**kwargs)


@pytest.mark.parametrize("bad", [np.array([1.0, np.nan]), np.array([np.inf]), np.array([])])
def test_non_finite_or_empty_input_is_refused_without_changing_state(bad):
    norm = MaxNorm()
    with pytest.raises(ValueError):
        norm(bad)
    with pytest.raises(ValueError):
        norm.peek(bad)
    assert (norm.k, norm.x_mv) == (0, 1e-4)

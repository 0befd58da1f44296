"""The rank-adaptive prior of the TT paper: eq. 2 (value), its core gradient, eq. 4 (lambda), pruning."""

import numpy as np
import pytest

from insitu.nn.gradcheck import numerical_gradient, relative_error
from insitu.tt.prior import (prior_grads, prior_value, ranks_to_keep, slice_size, slice_sq_norms,
                             update_lambdas)

pytestmark = pytest.mark.unit


def _cores(seed=0, shapes=((1, 2, 3, 4), (4, 3, 2, 3), (3, 2, 2, 1))):
    """Three cores of one TT matrix with ranks 1-4-3-1; slices of different sizes and scales."""
    rng = np.random.default_rng(seed)
    cores = [rng.standard_normal(s) for s in shapes]
    cores[1][..., 0] *= 5.0                      # one strong and one weak slice: unequal lambdas
    cores[1][..., 2] *= 0.1
    return cores


def test_slice_norms_and_sizes_follow_the_definitions():
    core = _cores()[1]
    np.testing.assert_allclose(slice_sq_norms(core), [np.sum(core[..., r] ** 2) for r in range(3)])
    assert slice_size(core) == 4 * 3 * 2


def test_update_lambdas_is_eq_4_for_all_but_the_last_core():
    cores = _cores()
    lambdas = update_lambdas(cores)
    assert len(lambdas) == len(cores) - 1
    for core, lam in zip(cores, lambdas):
        r_prev, j, i, r = core.shape
        expected = [2.0 / (1 + r_prev * j * i) * np.sum(core[..., k] ** 2) for k in range(r)]
        np.testing.assert_allclose(lam, expected, rtol=1e-12)


def test_prior_value_is_eq_2():
    cores = _cores()
    lambdas = [np.full(c.shape[3], 0.7) for c in cores[:-1]]
    expected = sum(np.sum(c[..., r] ** 2) / 0.7 + (1 + slice_size(c)) / 2 * np.log(0.7)
                   for c in cores[:-1] for r in range(c.shape[3]))
    assert prior_value(cores, lambdas) == pytest.approx(expected, rel=1e-12)


@pytest.mark.parametrize("factor", [0.5, 0.9, 0.99, 1.01, 1.1, 2.0])
def test_eq_4_minimizes_eq_2_in_every_lambda(factor):
    cores = _cores()
    best = update_lambdas(cores)
    g_best = prior_value(cores, best)
    for n, lam in enumerate(best):
        for r in range(lam.size):
            moved = [v.copy() for v in best]
            moved[n][r] *= factor
            assert prior_value(cores, moved) > g_best, (n, r, factor)


def test_eq_4_is_a_stationary_point_of_eq_2():
    cores = _cores(seed=3)
    best = update_lambdas(cores)
    for n, lam in enumerate(best):
        for r in range(lam.size):
            h = 1e-6 * lam[r]
            up, down = [v.copy() for v in best], [v.copy() for v in best]
            up[n][r] += h
            down[n][r] -= h
            slope = (prior_value(cores, up) - prior_value(cores, down)) / (2 * h)
            # d g / d lambda = -||G||^2 / lambda^2 + (1 + size) / (2 lambda), scaled by lambda: O(size).
            assert abs(slope * lam[r]) < 1e-5 * slice_size(cores[n])


def test_prior_grads_match_finite_differences_with_lambdas_fixed():
    cores = _cores(seed=1)
    # Lambdas held fixed, deliberately not at their eq. 4 values.
    lambdas = [l * s for l, s in zip(update_lambdas(cores), (1.7, 0.6))]
    grads = prior_grads(cores, lambdas)
    assert [g.shape for g in grads] == [c.shape for c in cores]
    for n, core in enumerate(cores):
        num = numerical_gradient(lambda: prior_value(cores, lambdas), core)
        assert relative_error(grads[n], num) < 1e-6, n
    # Closed form: 2 G[..., r] / lambda(r).
    np.testing.assert_allclose(grads[0], 2 * cores[0] / lambdas[0], rtol=1e-12)


def test_last_core_gets_zero_prior_gradient():
    cores = _cores()
    grads = prior_grads(cores, update_lambdas(cores))
    assert grads[-1].shape == cores[-1].shape
    assert not np.any(grads[-1])
    assert np.any(grads[0]) and np.any(grads[1])          # the other cores do get one


def test_all_zero_slice_has_finite_prior_and_zero_gradient():
    cores = _cores()
    cores[0][..., 1] = 0.0
    lambdas = update_lambdas(cores)
    assert lambdas[0][1] == 0.0
    assert np.isfinite(prior_value(cores, lambdas))
    grads = prior_grads(cores, lambdas)
    assert np.all(np.isfinite(grads[0])) and not np.any(grads[0][..., 1])


def test_ranks_to_keep_keeps_slices_at_or_above_threshold_times_max():
    lam = np.array([1.0, 0.005, 0.5, 0.01, 0.0099])
    np.testing.assert_array_equal(ranks_to_keep(lam, 0.01), [0, 2, 3])
    np.testing.assert_array_equal(ranks_to_keep(lam, 0.0), [0, 1, 2, 3, 4])
    np.testing.assert_array_equal(ranks_to_keep(lam, 0.6), [0])
    np.testing.assert_array_equal(ranks_to_keep(lam * 1e-20, 0.01), [0, 2, 3])   # relative, not absolute


def test_ranks_to_keep_always_keeps_at_least_one():
    assert list(ranks_to_keep(np.array([0.3, 0.2, 0.9]), 0.999)) == [2]
    assert list(ranks_to_keep(np.array([0.5]), 0.5)) == [0]
    assert ranks_to_keep(np.zeros(3), 0.5).size >= 1          # all slices gone: keep one anyway
    assert ranks_to_keep(np.array([np.nan, np.nan]), 0.5).size == 1


@pytest.mark.parametrize("threshold", [-0.1, 1.0, 1.5, float("nan")])
def test_ranks_to_keep_rejects_thresholds_outside_0_1(threshold):
    with pytest.raises(ValueError, match="threshold"):
        ranks_to_keep(np.array([1.0, 0.5]), threshold)

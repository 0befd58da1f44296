"""The streaming Kronecker-sum estimator: exactness, unbiasedness, orthonormality, bad input."""

import numpy as np
import pytest

from insitu.lrt.sks import KroneckerSum, core_rotation, mgs_project, svd


def _low_rank_pairs(rng, n, m, rank, count):
    A, B = rng.standard_normal((n, rank)), rng.standard_normal((m, rank))
    return [(A @ rng.standard_normal(rank), B @ rng.standard_normal(rank)) for _ in range(count)]


def _truncated_svd(x, r):
    u, s, vt = np.linalg.svd(x)
    return (u[:, :r] * s[:r]) @ vt[:r]


@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("n,m,r,k", [(20, 15, 4, 4), (9, 30, 2, 1), (50, 50, 8, 5), (6, 5, 1, 1)])
def test_exact_when_the_sum_has_rank_at_most_r(unbiased, n, m, r, k):
    rng = np.random.default_rng(n * m + r)
    ks = KroneckerSum(n, m, r, unbiased=unbiased, seed=k)
    total = np.zeros((n, m))
    for dz, a in _low_rank_pairs(rng, n, m, k, 40):
        ks.add(dz, a)
        total += np.outer(dz, a)
    L, R = ks.factors()
    assert L.shape == (n, r) and R.shape == (m, r)
    np.testing.assert_allclose(L @ R.T, total, atol=1e-9 * np.abs(total).max())


def test_unbiased_monte_carlo_mean_converges_to_the_sum():
    rng = np.random.default_rng(7)
    n, m, r, trials = 12, 10, 3, 3000
    pairs = [(rng.standard_normal(n), rng.standard_normal(m)) for _ in range(8)]   # rank 8 > r
    total = sum(np.outer(dz, a) for dz, a in pairs)
    draws = np.empty((trials, n, m))
    for seed in range(trials):
        ks = KroneckerSum(n, m, r, seed=seed)
        for dz, a in pairs:
            ks.add(dz, a)
        draws[seed] = ks.estimate()
    mean, stderr = draws.mean(0), draws.std(0) / np.sqrt(trials)
    # Each estimate has a large error (rank 3 of a rank-8 sum); the mean's error is the standard
    # error: within 4.5 of them everywhere (a biased estimator fails this by far, see below).
    assert np.abs(draws[0] - total).max() > 0.5
    z = np.abs(mean - total) / stderr
    assert z.max() < 4.5, z.max()
    # The same check catches the biased estimator.
    biased = KroneckerSum(n, m, r, unbiased=False, seed=0)
    for dz, a in pairs:
        biased.add(dz, a)
    assert (np.abs(biased.estimate() - total) / stderr).max() > 20


def test_biased_option_is_the_truncated_svd_of_its_input_at_every_step():
    rng = np.random.default_rng(3)
    n, m, r = 16, 11, 3
    ks = KroneckerSum(n, m, r, unbiased=False, seed=0)
    previous = np.zeros((n, m))
    for step in range(25):
        dz, a = rng.standard_normal(n), rng.standard_normal(m)
        ks.add(dz, a)
        expected = _truncated_svd(previous + np.outer(dz, a), r)
        np.testing.assert_allclose(ks.estimate(), expected, atol=1e-10, err_msg=f"step {step}")
        previous = ks.estimate()
    # with r+1 pairs in all it is the truncated SVD of the whole sum
    ks.reset()
    pairs = [(rng.standard_normal(n), rng.standard_normal(m)) for _ in range(r + 1)]
    for dz, a in pairs:
        ks.add(dz, a)
    total = sum(np.outer(dz, a) for dz, a in pairs)
    np.testing.assert_allclose(ks.estimate(), _truncated_svd(total, r), atol=1e-10)


def test_bases_stay_orthonormal_over_1e5_updates():
    rng = np.random.default_rng(11)
    ks = KroneckerSum(64, 48, 4, seed=3)
    dz = rng.standard_normal((100_000, 64))
    a = rng.standard_normal((100_000, 48))
    dz[::7] *= 1e-9                                   # tiny samples
    a[1::5] = rng.standard_normal(48) * 1e-3          # a recurring direction (nearly in the span)
    ks.add_many(dz, a)
    assert ks.pairs_added == 100_000
    for Q in ks.bases:
        assert np.abs(Q.T @ Q - np.eye(4)).max() < 1e-9
    assert np.all(ks.cx >= 0)


def test_add_many_equals_repeated_add_and_reset_forgets():
    rng = np.random.default_rng(5)
    dz, a = rng.standard_normal((30, 9)), rng.standard_normal((30, 7))
    one, many = KroneckerSum(9, 7, 2, seed=4), KroneckerSum(9, 7, 2, seed=4)
    for i in range(30):
        one.add(dz[i], a[i])
    many.add_many(dz, a)
    np.testing.assert_allclose(one.estimate(), many.estimate(), atol=1e-12)
    many.reset()
    assert np.all(many.estimate() == 0)
    many.add(dz[0], a[0])
    np.testing.assert_allclose(many.estimate(), np.outer(dz[0], a[0]), atol=1e-12)


def test_zero_pairs_change_nothing():
    ks = KroneckerSum(5, 4, 2, seed=0)
    ks.add(np.ones(5), np.ones(4))
    before = ks.estimate()
    ks.add(np.zeros(5), np.arange(4.0))
    ks.add(np.arange(5.0), np.zeros(4))
    np.testing.assert_array_equal(ks.estimate(), before)
    assert ks.counts.tolist() == [1, 0, 2]


def test_kappa_skip_drops_samples_that_add_only_a_tiny_new_direction():
    rng = np.random.default_rng(0)
    u, v = rng.standard_normal(8), rng.standard_normal(6)
    ks = KroneckerSum(8, 6, 2, seed=0, kappa_th=100.0)
    ks.add(u, v)
    ks.add(1e-3 * rng.standard_normal(8), 1e-3 * rng.standard_normal(6))    # 1e-6 vs |u||v|
    assert ks.pairs_skipped == 1
    np.testing.assert_allclose(ks.estimate(), np.outer(u, v), atol=1e-12)
    # a threshold above the ratio keeps the pair, and it is in the estimate
    dz, a = 1e-3 * rng.standard_normal(8), 1e-3 * rng.standard_normal(6)
    lenient = KroneckerSum(8, 6, 2, seed=0, kappa_th=1e9)
    lenient.add(u, v)
    lenient.add(dz, a)
    assert lenient.pairs_skipped == 0
    np.testing.assert_allclose(lenient.estimate(), np.outer(u, v) + np.outer(dz, a), atol=1e-12)


def test_factor_quantization_is_16_bit_with_a_dynamic_scale():
    rng = np.random.default_rng(2)
    ks = KroneckerSum(10, 8, 3, seed=1, factor_bits=16)
    ks.add_many(rng.standard_normal((20, 10)) * 50, rng.standard_normal((20, 8)))
    L, R = ks.factors()
    for f in (L, R):
        peak = np.abs(f).max()
        lsb = 2.0 ** (np.floor(np.log2(peak)) + 1 - 15)
        np.testing.assert_array_equal(f / lsb, np.round(f / lsb))     # on the grid
    exact = KroneckerSum(10, 8, 3, seed=1)
    exact.load_state_dict(ks.state_dict())
    np.testing.assert_allclose(L @ R.T, exact.estimate(), rtol=0, atol=1e-3 * np.abs(exact.estimate()).max())


def test_vector_and_core_halves_reproduce_one_update():
    """The split the LRT PE relies on: MGS projections, then the q x q core, then rotations."""
    rng = np.random.default_rng(9)
    ks = KroneckerSum(7, 6, 2, unbiased=False, seed=0)
    ks.add_many(rng.standard_normal((5, 7)), rng.standard_normal((5, 6)))
    before = ks.estimate()
    dz, a = rng.standard_normal(7), rng.standard_normal(6)
    QL, QR, cL, cR = ks.QL.copy(), ks.QR.copy(), np.zeros(3), np.zeros(3)
    mgs_project(QL, dz, 2, cL)
    mgs_project(QR, a, 2, cR)
    np.testing.assert_allclose(QL @ cL, dz, atol=1e-12)      # dz lies in the extended basis
    ML, MR, cx = core_rotation(cL, cR, ks.cx.copy(), np.ones(3), False)
    manual = (QL @ ML) * cx @ (QR @ MR).T
    np.testing.assert_allclose(manual, _truncated_svd(before + np.outer(dz, a), 2), atol=1e-10)


@pytest.mark.parametrize("args,match", [
    ((5, 4, 4), "rank must be < min"),
    ((5, 4, 0), "rank must be an integer"),
    ((0, 4, 1), "n_out must be"),
    ((5, 4.5, 1), "n_in must be"),
])
def test_bad_shapes_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        KroneckerSum(*args)


def test_bad_input_names_the_argument_and_never_enters_the_bases():
    ks = KroneckerSum(5, 4, 2, seed=0)
    ks.add(np.ones(5), np.ones(4))
    state = ks.state_dict()
    with pytest.raises(ValueError, match="dz must have 5"):
        ks.add(np.ones(6), np.ones(4))
    with pytest.raises(ValueError, match="a must have 4"):
        ks.add(np.ones(5), np.ones(3))
    with pytest.raises(ValueError, match="dz contains NaN"):
        ks.add(np.array([1, np.nan, 0, 0, 0.0]), np.ones(4))
    with pytest.raises(ValueError, match="a contains NaN or inf"):
        ks.add_many(np.ones((2, 5)), np.array([[1, 1, 1, 1.0], [np.inf, 0, 0, 0]]))
    with pytest.raises(ValueError, match="3 pairs but a has 2"):
        ks.add_many(np.ones((3, 5)), np.ones((2, 4)))
    np.testing.assert_array_equal(ks.QL, state["QL"])
    np.testing.assert_array_equal(ks.cx, state["cx"])
    assert np.isfinite(ks.estimate()).all()


def test_unbiased_core_step_averages_to_c_over_all_sign_patterns():
    """The estimator's expectation over its 2**q random sign vectors is exactly C."""
    import itertools
    rng = np.random.default_rng(4)
    q = 5
    for _ in range(3):
        cL, cR = rng.standard_normal(q), rng.standard_normal(q)
        cx = np.sort(rng.random(q - 1))[::-1] * 3
        C = np.outer(cL, cR) + np.diag(np.append(cx, 0.0))
        mean = np.zeros((q, q))
        for signs in itertools.product((-1.0, 1.0), repeat=q):
            ML, MR, new_cx = core_rotation(cL, cR, cx, np.array(signs), True)
            mean += (ML * new_cx) @ MR.T
        np.testing.assert_allclose(mean / 2 ** q, C, atol=1e-12)


def test_huge_inputs_and_bad_states_are_refused():
    ks = KroneckerSum(5, 4, 2, seed=0)
    with pytest.raises(ValueError, match="a has values above"):
        ks.add(np.ones(5), np.full(4, 1e200))
    state = ks.state_dict()
    state["cx"] = np.array([1.0, np.nan])
    with pytest.raises(ValueError, match="cx contains NaN"):
        ks.load_state_dict(state)
    state["cx"] = np.array([1.0, -1.0])
    with pytest.raises(ValueError, match="negative weights"):
        ks.load_state_dict(state)


def test_jacobi_svd_is_an_svd_with_sorted_values_a_fixed_sign_and_a_complete_u():
    """sks.svd (plain loops, so that numba and NumPy round alike) against LAPACK's values, on the
    cores C = c_L c_Rᵀ + diag(c_x, 0) of q = 2..17: full, rank-deficient, rank 1, repeated values,
    huge and tiny scales; and on zero and exactly rank-deficient matrices."""
    rng = np.random.default_rng(8)
    cases = [np.zeros((3, 3)), np.outer([1.0, 2.0, 0.0, 0.0], [0.0, 1.0, 0.0, 3.0])]
    for q in range(2, 18):
        for trial in range(4):
            scale = 10.0 ** rng.uniform(-60, 60)
            cx = np.sort(rng.random(q - 1))[::-1] * scale
            if trial == 1:
                cx[q // 2:] = 0.0          # rank-deficient
            elif trial == 2:
                cx[:] = 0.0                # rank 1
            elif trial == 3:
                cx[:] = cx[0]              # repeated singular values
            cases.append(scale * np.outer(rng.standard_normal(q), rng.standard_normal(q))
                         + np.diag(np.append(cx, 0.0)))
    for C in cases:
        q = C.shape[0]
        U, s, V = svd(C)
        ref = np.linalg.svd(C, compute_uv=False)
        scale = max(ref[0], 1e-300)
        assert np.all(np.diff(s) <= 0) and np.all(s >= 0)
        np.testing.assert_allclose(s, ref, rtol=0, atol=1e-14 * q * scale)
        np.testing.assert_allclose((U * s) @ V.T, C, rtol=0, atol=1e-14 * q * scale)
        for M in (U, V):
            np.testing.assert_allclose(M.T @ M, np.eye(q), rtol=0, atol=1e-14 * q)
        biggest = np.abs(V).argmax(axis=0)
        assert np.all(V[biggest, np.arange(q)] > 0)

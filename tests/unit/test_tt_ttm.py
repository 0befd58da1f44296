"""The TT-matrix layer (insitu.tt.TTMatrix): the dense matrix, forward/backward, factor gradients,
initialisation and bad input.

The dense matrix is checked against two references that share no code with the package: tensorly's
TT-matrix reconstruction and a brute-force element-by-element product of core slices.
"""

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from insitu.tt import TTMatrix

pytestmark = pytest.mark.unit

tl_ttm = pytest.importorskip("tensorly.tt_matrix")

# (in_modes, out_modes, ranks) as TTMatrix takes them.
CONFIGS = [
    pytest.param((5,), (3,), 1, id="d1"),
    pytest.param((6,), (4,), [], id="d1-no-internal-ranks"),
    pytest.param((4, 3), (2, 5), 3, id="d2"),
    pytest.param((2, 3, 4), (3, 2, 2), (2, 3), id="d3-nonuniform"),
    pytest.param((2, 2, 3, 2), (3, 1, 2, 2), (1, 2, 3, 4, 1), id="d4-all-ranks"),
    pytest.param((3, 4, 5), (2, 3, 4), (4, 1), id="d3-internal-rank-1"),
    pytest.param((1, 3, 1), (2, 1, 1), (2, 2), id="modes-of-size-1"),
    pytest.param((1, 1), (1, 1), 3, id="1x1"),
    pytest.param((7, 4, 2, 16), (4, 4, 2, 16), 16, id="paper-layer1"),
    pytest.param((32, 16), (1, 16), 16, id="paper-layer2"),
]

SMALL_CONFIGS = [p for p in CONFIGS if "paper" not in p.id]


def _random_cores(ttm, seed):
    """Replace the He-initialised cores by unit Gaussians (elements of order 1 for every shape)."""
    rng = np.random.default_rng(seed)
    return TTMatrix(ttm.in_modes, ttm.out_modes, ttm.ranks,
                    cores=[rng.standard_normal(c.shape) for c in ttm.cores])


def _elementwise_full(cores):
    """W(j_1..j_d, i_1..i_d) = G_1[:, j_1, i_1, :] @ ... @ G_d[:, j_d, i_d, :], row-major rows/cols."""
    out_modes = [c.shape[1] for c in cores]
    in_modes = [c.shape[2] for c in cores]
    w = np.empty((math.prod(out_modes), math.prod(in_modes)))
    for row, j in enumerate(itertools.product(*map(range, out_modes))):
        for col, i in enumerate(itertools.product(*map(range, in_modes))):
            m = np.eye(1)
            for n, core in enumerate(cores):
                m = m @ core[:, j[n], i[n], :]
            w[row, col] = m[0, 0]
    return w


def _tensorly_full(cores):
    """tensorly's TT-matrix cores are (R_{k-1}, left_k, right_k, R_k) and its matrix has the left
    modes as rows: our (R, J, I, R) layout with J the rows maps onto it without a transpose."""
    w = np.asarray(tl_ttm.tt_matrix_to_matrix([np.asarray(c) for c in cores]))
    # cross-check the tensor form too: shape (J_1..J_d, I_1..I_d)
    t = np.asarray(tl_ttm.tt_matrix_to_tensor([np.asarray(c) for c in cores]))
    assert t.shape == (*[c.shape[1] for c in cores], *[c.shape[2] for c in cores])
    np.testing.assert_allclose(t.reshape(w.shape), w)
    return w


# -------------------------------------------------------------------------------- the dense matrix

def test_tensorly_convention_on_a_hand_computed_example():
    # One mode pair per core, rank 1: W = kron(A, B) for G_1 = A, G_2 = B.
    a = np.arange(6.0).reshape(2, 3) + 1
    b = np.arange(4.0).reshape(1, 4) - 2
    cores = [a.reshape(1, 2, 3, 1), b.reshape(1, 1, 4, 1)]
    np.testing.assert_allclose(_tensorly_full(cores), np.kron(a, b))
    np.testing.assert_allclose(TTMatrix((3, 4), (2, 1), 1, cores=cores).full(), np.kron(a, b))


@pytest.mark.parametrize("in_modes,out_modes,ranks", CONFIGS)
def test_full_matches_tensorly(in_modes, out_modes, ranks):
    ttm = _random_cores(TTMatrix(in_modes, out_modes, ranks, seed=0), seed=1)
    w = ttm.full()
    assert w.shape == ttm.shape == (math.prod(out_modes), math.prod(in_modes))
    np.testing.assert_allclose(w, _tensorly_full(ttm.cores), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("in_modes,out_modes,ranks", SMALL_CONFIGS)
def test_full_matches_elementwise_definition(in_modes, out_modes, ranks):
    ttm = _random_cores(TTMatrix(in_modes, out_modes, ranks, seed=0), seed=2)
    np.testing.assert_allclose(ttm.full(), _elementwise_full(ttm.cores), rtol=1e-12, atol=1e-12)


def test_rank_forms_and_properties():
    in_modes, out_modes = (2, 3, 4), (3, 2, 2)
    for ranks in (3, (3, 3), [1, 3, 3, 1]):
        ttm = TTMatrix(in_modes, out_modes, ranks, seed=0)
        assert ttm.ranks == (1, 3, 3, 1)
        assert ttm.d == 3
        assert ttm.shape == (12, 24)
        assert [c.shape for c in ttm.cores] == [(1, 3, 2, 3), (3, 2, 3, 3), (3, 2, 4, 1)]
        assert ttm.parameter_count == 18 + 54 + 24
    assert TTMatrix((5,), (3,), 7, seed=0).ranks == (1, 1)
    r = repr(TTMatrix(in_modes, out_modes, (2, 5), seed=0))
    assert "[2, 3, 4]" in r and "[1, 2, 5, 1]" in r


def test_seed_is_reproducible_and_cores_are_copied():
    a, b = TTMatrix((4, 3), (2, 5), 3, seed=5), TTMatrix((4, 3), (2, 5), 3, seed=5)
    np.testing.assert_array_equal(a.full(), b.full())
    assert not np.array_equal(a.full(), TTMatrix((4, 3), (2, 5), 3, seed=6).full())
    cores = [c.copy() for c in a.cores]
    c = TTMatrix((4, 3), (2, 5), 3, cores=cores)
    cores[0][...] = 0                         # the layer keeps its own float64 copies
    np.testing.assert_array_equal(c.full(), a.full())
    assert all(core.dtype == np.float64 for core in c.cores)


# -------------------------------------------------------------------------------- forward / backward

@pytest.mark.parametrize("in_modes,out_modes,ranks", CONFIGS)
@pytest.mark.parametrize("batch", [1, 3])
def test_forward_and_input_gradient_match_the_dense_matrix(in_modes, out_modes, ranks, batch):
    ttm = _random_cores(TTMatrix(in_modes, out_modes, ranks, seed=0), seed=3)
    rng = np.random.default_rng(4)
    w = _tensorly_full(ttm.cores)
    x = rng.standard_normal((batch, w.shape[1]))
    dy = rng.standard_normal((batch, w.shape[0]))
    y = ttm.forward(x)
    assert y.shape == (batch, w.shape[0])
    np.testing.assert_allclose(y, x @ w.T, rtol=1e-9, atol=1e-9 * np.abs(x @ w.T).max())
    dx = ttm.backward_input(dy)
    assert dx.shape == (batch, w.shape[1])
    np.testing.assert_allclose(dx, dy @ w, rtol=1e-9, atol=1e-9 * np.abs(dy @ w).max())


@st.composite
def layouts(draw, max_d=4, max_mode=4, max_rank=4):
    d = draw(st.integers(1, max_d))
    in_modes = tuple(draw(st.lists(st.integers(1, max_mode), min_size=d, max_size=d)))
    out_modes = tuple(draw(st.lists(st.integers(1, max_mode), min_size=d, max_size=d)))
    ranks = tuple(draw(st.lists(st.integers(1, max_rank), min_size=d - 1, max_size=d - 1)))
    return in_modes, out_modes, ranks


@settings(max_examples=40, deadline=None)
@given(layouts(), st.integers(1, 4), st.integers(0, 2**31 - 1))
def test_random_layouts_forward_backward_and_grads(layout, batch, seed):
    in_modes, out_modes, ranks = layout
    rng = np.random.default_rng(seed)
    ttm = TTMatrix(in_modes, out_modes, ranks, seed=seed)
    ttm = TTMatrix(in_modes, out_modes, ranks, cores=[rng.standard_normal(c.shape) for c in ttm.cores])
    assert ttm.ranks == (1, *ranks, 1)
    w = _tensorly_full(ttm.cores)
    np.testing.assert_allclose(ttm.full(), w, rtol=1e-10, atol=1e-10)
    x = rng.standard_normal((batch, w.shape[1]))
    dy = rng.standard_normal((batch, w.shape[0]))
    scale = 1e-9 * (1 + np.abs(w).sum())
    np.testing.assert_allclose(ttm.forward(x), x @ w.T, rtol=1e-9, atol=scale)
    np.testing.assert_allclose(ttm.backward_input(dy), dy @ w, rtol=1e-9, atol=scale)
    full, direct = ttm.factor_grads(x, dy, "full"), ttm.factor_grads(x, dy, "direct")
    for n, (g_full, g_direct) in enumerate(zip(full, direct)):
        assert g_full.shape == g_direct.shape == ttm.cores[n].shape
        np.testing.assert_allclose(g_full, g_direct, rtol=1e-8,
                                   atol=1e-9 * (1 + np.abs(g_direct).max()), err_msg=f"core {n + 1}")


# -------------------------------------------------------------------------------- factor gradients

def _objective(cores, x, dy):
    """f = sum(dY * (X W^T)) through the dense matrix (independent of the schedule)."""
    return float(np.sum(dy * (x @ _tensorly_full(cores).T)))


# The paper's first layer is left out of the "direct" comparison: see
# test_direct_grads_use_a_cheap_contraction_order (a contraction-order bug makes it take minutes).
@pytest.mark.parametrize("in_modes,out_modes,ranks", CONFIGS)
def test_factor_grads_full_direct_and_linearity(in_modes, out_modes, ranks):
    ttm = _random_cores(TTMatrix(in_modes, out_modes, ranks, seed=0), seed=5)
    rng = np.random.default_rng(6)
    batch = 3
    x = rng.standard_normal((batch, ttm.shape[1]))
    dy = rng.standard_normal((batch, ttm.shape[0]))
    full = ttm.factor_grads(x, dy)                       # "full" is the default
    with_direct = (in_modes, out_modes) != ((7, 4, 2, 16), (4, 4, 2, 16))
    direct = ttm.factor_grads(x, dy, method="direct") if with_direct else full
    assert len(full) == len(direct) == ttm.d
    f0 = _objective(ttm.cores, x, dy)
    for n in range(ttm.d):
        assert full[n].shape == direct[n].shape == ttm.cores[n].shape
        np.testing.assert_allclose(full[n], direct[n], rtol=1e-8, atol=1e-9 * np.abs(direct[n]).max())
        # f is linear in core n: f(G_n + E) - f(G_n) = <E, df/dG_n> exactly, for any E.
        for trial in range(2):
            e = rng.standard_normal(ttm.cores[n].shape)
            cores = [c + e if k == n else c for k, c in enumerate(ttm.cores)]
            delta = _objective(cores, x, dy) - f0
            predicted = float(np.sum(e * full[n]))
            tol = 1e-8 * (abs(f0) + abs(delta) + np.abs(e).sum() * np.abs(full[n]).max() + 1)
            assert abs(delta - predicted) <= tol, (n, trial, delta, predicted)


def test_direct_grads_use_a_cheap_contraction_order(monkeypatch):
    # Checks the contraction order numpy would use (np.einsum_path, cheap) before running each
    # contraction, so the test fails fast instead of spending minutes in the naive one.
    real_einsum = np.einsum
    flops = []

    def guarded(*operands, **kwargs):
        info = np.einsum_path(*operands, optimize=kwargs.get("optimize", False))[1]
        count = float(info.split("Optimized FLOP count:")[1].split()[0])
        flops.append(count)
        assert count < 1e8, f"einsum {operands[0]} would take {count:.3g} FLOPs"
        return real_einsum(*operands, **kwargs)

    ttm = TTMatrix((7, 4, 2, 16), (4, 4, 2, 16), 16, seed=0)
    rng = np.random.default_rng(10)
    x, dy = rng.standard_normal((3, 896)), rng.standard_normal((3, 512))
    full = ttm.factor_grads(x, dy, "full")
    monkeypatch.setattr(np, "einsum", guarded)
    direct = ttm.factor_grads(x, dy, "direct")
    monkeypatch.undo()
    assert len(flops) == 4
    for g_full, g_direct in zip(full, direct):
        np.testing.assert_allclose(g_full, g_direct, rtol=1e-8, atol=1e-9 * np.abs(g_direct).max())


def test_factor_grads_central_difference_on_single_elements():
    ttm = _random_cores(TTMatrix((2, 3, 2), (3, 2, 2), (2, 3), seed=0), seed=7)
    rng = np.random.default_rng(8)
    x, dy = rng.standard_normal((4, ttm.shape[1])), rng.standard_normal((4, ttm.shape[0]))
    grads = ttm.factor_grads(x, dy, "full")
    h = 1e-3
    for n, core in enumerate(ttm.cores):
        for idx in [tuple(rng.integers(0, s) for s in core.shape) for _ in range(4)]:
            plus = [c.copy() for c in ttm.cores]
            minus = [c.copy() for c in ttm.cores]
            plus[n][idx] += h
            minus[n][idx] -= h
            numeric = (_objective(plus, x, dy) - _objective(minus, x, dy)) / (2 * h)
            assert numeric == pytest.approx(grads[n][idx], rel=1e-7, abs=1e-8)


def test_factor_grads_of_a_rank_one_outer_product():
    # d = 1: the only core's gradient is dY^T X itself, as (1, J, I, 1).
    ttm = TTMatrix((5,), (3,), 1, seed=1)
    rng = np.random.default_rng(9)
    x, dy = rng.standard_normal((6, 5)), rng.standard_normal((6, 3))
    for method in ("full", "direct"):
        (g,) = ttm.factor_grads(x, dy, method)
        np.testing.assert_allclose(g, (dy.T @ x).reshape(1, 3, 5, 1), rtol=1e-12)


# -------------------------------------------------------------------------------- initialisation

def test_he_initialisation_variance():
    # Var(W) = 2 / I for the dense matrix, whatever the layout (the paper's first layer: 512 x 896).
    variances, means = [], []
    for seed in range(4):
        w = TTMatrix((7, 4, 2, 16), (4, 4, 2, 16), 16, seed=seed).full()
        variances.append(w.var())
        means.append(w.mean())
    target = 2.0 / 896
    assert np.mean(variances) == pytest.approx(target, rel=0.25)
    assert all(0.5 * target < v < 2.0 * target for v in variances)
    assert abs(np.mean(means)) < 0.1 * math.sqrt(target)


@pytest.mark.parametrize("in_modes,out_modes,ranks", [((32, 16), (1, 16), 16), ((8, 8, 8), (4, 4, 4), (4, 6))])
def test_he_initialisation_other_layouts(in_modes, out_modes, ranks):
    target = 2.0 / math.prod(in_modes)
    v = np.mean([TTMatrix(in_modes, out_modes, ranks, seed=s).full().var() for s in range(4)])
    assert v == pytest.approx(target, rel=0.3)


# -------------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("in_modes,out_modes,ranks,match", [
    ((2, 3), (2,), 2, "same number of modes"),
    ((2, 0), (2, 2), 2, r"in_modes must be a non-empty list of integers >= 1"),
    ((2, 2), (2, -1), 2, r"out_modes must be a non-empty list of integers >= 1"),
    ((), (), 1, r"in_modes must be a non-empty"),
    ((2.0, 2), (2, 2), 2, r"in_modes must be"),
    ((True, 2), (2, 2), 2, r"in_modes must be"),
    ((2, 3), (2, 3), 0, r"TT ranks must be integers >= 1"),
    ((2, 3, 4), (2, 3, 4), (2, -1), r"TT ranks must be integers >= 1"),
    ((2, 3, 4), (2, 3, 4), (2, 2.5), r"TT ranks must be integers >= 1"),
    ((2, 3, 4), (2, 3, 4), (2, 2, 2), r"ranks must be an int, 2 internal ranks or 4 ranks"),
    ((2, 3), (2, 3), (1, 2, 2, 1), r"ranks must be an int, 1 internal ranks or 3 ranks"),
    ((2, 3), (2, 3), (2, 2, 1), r"boundary TT ranks R_0 and R_d must be 1"),
    ((2, 3), (2, 3), (1, 2, 3), r"boundary TT ranks R_0 and R_d must be 1"),
])
def test_bad_modes_and_ranks(in_modes, out_modes, ranks, match):
    with pytest.raises(ValueError, match=match):
        TTMatrix(in_modes, out_modes, ranks, seed=0)


def _cores(shapes):
    return [np.ones(s) for s in shapes]


@pytest.mark.parametrize("shapes,match", [
    ([(1, 2, 3, 2)], r"expected 2 cores for 2 modes, got 1"),
    ([(1, 2, 3, 2), (2, 4, 5, 1), (1, 1, 1, 1)], r"expected 2 cores for 2 modes, got 3"),
    ([(1, 3, 2, 2), (2, 4, 5, 1)], r"core 1 has shape \(1, 3, 2, 2\); expected \(R_0, 2, 3, R_1\)"),
    ([(1, 2, 3, 2), (2, 4, 4, 1)], r"core 2 has shape .*expected \(R_1, 4, 5, R_2\)"),
    ([(2, 3, 2), (2, 4, 5, 1)], r"core 1 has shape \(2, 3, 2\)"),
    ([(1, 2, 3, 2), (3, 4, 5, 1)], r"core 2 starts with rank 3 but core 1 ends with rank 2"),
    ([(2, 2, 3, 2), (2, 4, 5, 1)], r"first core must start and the last core end with rank 1"),
    ([(1, 2, 3, 2), (2, 4, 5, 2)], r"first core must start and the last core end with rank 1"),
])
def test_bad_cores(shapes, match):
    with pytest.raises(ValueError, match=match):
        TTMatrix((3, 5), (2, 4), 2, cores=_cores(shapes))


def test_bad_batches_and_method():
    ttm = TTMatrix((2, 3), (4, 1), 2, seed=0)        # W is 4 x 6
    with pytest.raises(ValueError, match=r"X must be \(batch, 6\); got shape \(2, 5\)"):
        ttm.forward(np.zeros((2, 5)))
    with pytest.raises(ValueError, match=r"X must be \(batch, 6\); got shape \(6,\)"):
        ttm.forward(np.zeros(6))
    with pytest.raises(ValueError, match=r"dY must be \(batch, 4\); got shape \(3, 6\)"):
        ttm.backward_input(np.zeros((3, 6)))
    with pytest.raises(ValueError, match=r"X must be \(batch, 6\)"):
        ttm.factor_grads(np.zeros((2, 4)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"dY must be \(batch, 4\)"):
        ttm.factor_grads(np.zeros((2, 6)), np.zeros((2, 6)))
    with pytest.raises(ValueError, match=r"X has 3 samples but dY has 2"):
        ttm.factor_grads(np.zeros((3, 6)), np.zeros((2, 4)))
    with pytest.raises(ValueError, match=r"X has 3 samples but dY has 2"):
        ttm.factor_grads(np.zeros((3, 6)), np.zeros((2, 4)), "direct")
    with pytest.raises(ValueError, match=r"method must be 'full' or 'direct', got 'svd'"):
        ttm.factor_grads(np.zeros((2, 6)), np.zeros((2, 4)), "svd")


def test_non_int_scalar_rank_is_a_value_error():
    with pytest.raises(ValueError, match=r"ranks must be integers >= 1, got 2.0"):
        TTMatrix((2, 3), (2, 3), 2.0, seed=0)


def test_numpy_integer_rank_is_a_rank():
    assert TTMatrix((2, 3), (2, 3), np.int64(2), seed=0).ranks == (1, 2, 1)


def test_cores_must_match_the_ranks_given():
    cores = [np.ones((1, 2, 2, 3)), np.ones((3, 3, 3, 1))]
    with pytest.raises(ValueError, match=r"the cores have ranks \[1, 3, 1\] but ranks=\[1, 2, 1\]"):
        TTMatrix((2, 3), (2, 3), 2, cores=cores)

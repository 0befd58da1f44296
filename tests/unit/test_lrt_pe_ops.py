"""The LRT PE's golden model against direct integer computations, and the float SKS it stands for."""

import math

import numpy as np
import pytest

from insitu import numerics as nx
from insitu.accel.stream import pad_words
from insitu.lrt.pe_ops import LRTConfigError, LRTPEModel, append_reciprocal
from insitu.lrt.sks import mgs_project, rotate
from insitu.accel.params import AcceleratorParams
from insitu.accel.regmap import ErrorCode, Op

SMALL = AcceleratorParams(lrt_rows_max=64, lrt_cols_max=8, lrt_cells_max=1024)


# ----------------------------------------------------------------------------- direct references
# Plain Python integers, one element at a time: the op definitions as the issue states them.

def _rnd(v: int, s: int) -> int:
    return v << -s if s <= 0 else (v + (1 << (s - 1))) >> s


def _sat(v: int, bits: int) -> int:
    return max(-(1 << (bits - 1)), min((1 << (bits - 1)) - 1, v))


def _mgs(Q, x, r):
    x = [int(v) for v in x]
    c = []
    for j in range(r):
        cj = _sat(_rnd(sum(int(Q[i][j]) * x[i] for i in range(len(x))), 14), 16)
        x = [_sat(x[i] - _rnd(cj * int(Q[i][j]), 14), 16) for i in range(len(x))]
        c.append(cj)
    return c, x, sum(v * v for v in x)


def _model(rng, params=SMALL, m=None, n=None, r=None):
    pe = LRTPEModel(params)
    m = m or int(rng.integers(1, params.lrt_rows_max + 1))
    n = n or int(rng.integers(1, min(params.lrt_rows_max, params.lrt_cells_max // m) + 1))
    r = int(rng.integers(0, params.lrt_cols_max)) if r is None else r
    pe.configure(rows_l=m, rows_r=n, cols=r)
    return pe


def _codes(rng, shape, bits=16, scale=1.0):
    lo, hi = nx.code_range(bits)
    return np.clip(np.round(rng.standard_normal(shape) * scale * hi), lo, hi).astype(np.int64)


def _load_random_bases(pe, rng, scale=0.3):
    q = pe.params.lrt_cols_max
    for side, rows in ((0, pe.rows_l), (1, pe.rows_r)):
        pe.configure(side=side)
        pe.load_basis(pad_words(_codes(rng, (rows, q), scale=scale)))


# ----------------------------------------------------------------------------- op by op

@pytest.mark.parametrize("seed", range(4))
def test_load_and_read_basis_round_trip(seed):
    rng = np.random.default_rng(seed)
    pe = _model(rng)
    for side, rows in ((0, pe.rows_l), (1, pe.rows_r)):
        pe.configure(side=side)
        Q = _codes(rng, (rows, pe.params.lrt_cols_max))
        pe.load_basis(pad_words(Q))
        out = pe.read_basis()
        assert out.size == pe.out_words(Op.LRT_READ_BASIS) and out.size % 8 == 0
        np.testing.assert_array_equal(out[:Q.size].reshape(Q.shape), Q)
        np.testing.assert_array_equal(out[Q.size:], 0)
        np.testing.assert_array_equal(pe.basis(side)[:rows], Q)


@pytest.mark.parametrize("seed", range(8))
def test_project_and_reproject_are_the_mgs_pass(seed):
    rng = np.random.default_rng(seed)
    pe = _model(rng)
    _load_random_bases(pe, rng, scale=float(rng.choice([0.1, 0.4, 1.0])))
    pe.configure(side=int(rng.integers(0, 2)))
    rows, r = pe.rows, pe.cols
    x = _codes(rng, rows, scale=float(rng.choice([0.05, 0.3, 1.0])))
    Q = pe.basis()[:rows]
    c, res, norm2 = _mgs(Q, x, r)
    out = pe.project(pad_words(x))
    assert out.size == -(-r // 8) * 8
    assert out[:r].tolist() == c and not out[r:].any()
    assert pe.residual[:rows].tolist() == res and pe.norm2 == norm2
    # The second pass runs on the residual held on chip.
    c2, res2, norm2b = _mgs(Q, res, r)
    assert pe.reproject()[:r].tolist() == c2
    assert pe.residual[:rows].tolist() == res2 and pe.norm2 == norm2b


def test_project_saturates_the_residual_and_the_projection():
    pe = LRTPEModel(SMALL).configure(rows_l=4, cols=2)
    lo, hi = nx.code_range(16)
    Q = np.zeros((4, 8), np.int64)
    Q[:, 0] = hi                  # |column| ~ 4: the projection overflows 16 bits
    Q[:, 1] = [lo, hi, lo, hi]
    pe.load_basis(pad_words(Q))
    x = np.array([hi, hi, hi, lo], np.int64)
    c, res, norm2 = _mgs(Q, x, 2)
    assert c[0] == hi                                  # saturated projection
    out = pe.project(pad_words(x))
    assert out[:2].tolist() == c and pe.residual[:4].tolist() == res and pe.norm2 == norm2
    assert min(res) == lo or max(res) == hi            # a saturated residual word


@pytest.mark.parametrize("seed", range(6))
def test_append_writes_column_r(seed):
    rng = np.random.default_rng(seed)
    pe = _model(rng, r=int(rng.integers(0, 8)))
    _load_random_bases(pe, rng)
    pe.configure(side=int(rng.integers(0, 2)))
    rows, r = pe.rows, pe.cols
    pe.project(pad_words(_codes(rng, rows, scale=0.3)))
    before = pe.basis().copy()
    shift = int(rng.integers(SMALL.shift_min, SMALL.shift_max + 1)) if seed % 2 else 16
    recip = int(rng.integers(0, 1 << 16))
    pe.configure(recip=recip, shift=shift)
    pe.append()
    want = [_sat(_rnd(int(v) * recip, shift), 16) for v in pe.residual[:rows]]
    assert pe.basis()[:rows, r].tolist() == want
    # Nothing else changes.
    after = pe.basis().copy()
    after[:rows, r] = before[:rows, r]
    np.testing.assert_array_equal(after, before)


@pytest.mark.parametrize("seed", range(6))
def test_rotate_multiplies_q_by_m_row_by_row(seed):
    rng = np.random.default_rng(seed)
    pe = _model(rng)
    _load_random_bases(pe, rng, scale=1.0)
    pe.configure(side=int(rng.integers(0, 2)))
    rows, r = pe.rows, pe.cols
    M = _codes(rng, (r + 1, r), scale=float(rng.choice([0.3, 1.0])))
    before = pe.basis().copy()
    pe.rotate(pad_words(M))
    Q = pe.basis()
    for i in range(rows):
        for j in range(r):
            want = _sat(_rnd(sum(int(before[i, k]) * int(M[k, j]) for k in range(r + 1)), 14), 16)
            assert Q[i, j] == want
    np.testing.assert_array_equal(Q[:, r:], before[:, r:])
    np.testing.assert_array_equal(Q[rows:], before[rows:])


def _update_reference(pe, s, shift):
    """W, counts, total, max after LRT_UPDATE, cell by cell with Python integers."""
    m, n, r = pe.rows_l, pe.rows_r, pe.cols
    W, counts = pe.W.tolist(), pe.counts.tolist()
    total, top = pe.writes_total, pe.writes_max
    for i in range(m):
        for j in range(n):
            acc = sum(int(pe.QL[i, k]) * int(s[k]) * int(pe.QR[j, k]) for k in range(r))
            new = _sat(W[i * n + j] - _rnd(acc, shift), 8)
            if new != W[i * n + j]:
                W[i * n + j] = new
                counts[i * n + j] = min(counts[i * n + j] + 1, 65535)
                total = min(total + 1, (1 << 32) - 1)
                top = max(top, counts[i * n + j])
    return W, counts, total, top


@pytest.mark.parametrize("seed", range(10))
def test_update_writes_only_changed_cells_and_counts_them(seed):
    rng = np.random.default_rng(seed)
    pe = _model(rng, SMALL, m=int(rng.integers(1, 33)), n=int(rng.integers(1, 33)),
                r=int(rng.integers(1, 8)))
    _load_random_bases(pe, rng, scale=float(rng.choice([0.1, 0.5])))
    cells = pe.rows_l * pe.rows_r
    pe.load_weights(pad_words(_codes(rng, cells, bits=8, scale=0.4)))
    for step in range(3):
        s = _codes(rng, pe.cols, scale=float(rng.choice([0.01, 0.1, 1.0])))
        shift = int(rng.choice([int(rng.integers(SMALL.shift_min, SMALL.shift_max + 1)), 30, 34, 38]))
        pe.configure(shift=shift)
        W, counts, total, top = _update_reference(pe, s, shift)
        before = pe.W.copy()
        pe.update(pad_words(s))
        assert pe.W.tolist() == W and pe.counts.tolist() == counts
        assert (pe.writes_total, pe.writes_max) == (total, top)
        changed = before != pe.W
        assert int(changed.sum()) <= pe.writes_total
        assert not changed[cells:].any()


def test_update_counters_and_total_saturate():
    rng = np.random.default_rng(3)
    pe = LRTPEModel(SMALL).configure(rows_l=3, rows_r=5, cols=1, shift=0)
    Q = np.zeros((8, 8), np.int64)
    Q[:, 0] = 1
    for side, rows in ((0, 3), (1, 5)):
        pe.configure(side=side)
        pe.load_basis(pad_words(Q[:rows]))
    pe.load_weights(pad_words(_codes(rng, 15, bits=8, scale=0.1)))
    pe.counts[:15] = 65534
    pe.writes_total = (1 << 32) - 3
    step = pad_words([1])                   # Δ = 1 everywhere: every cell moves down by one
    pe.update(step)
    assert (pe.counts[:15] == 65535).all() and pe.writes_total == (1 << 32) - 1
    assert pe.writes_max == 65535
    pe.update(step)
    assert (pe.counts[:15] == 65535).all() and pe.writes_total == (1 << 32) - 1
    # Cells saturated at the bottom of the weight range are no longer written.
    pe.W[:15] = nx.LRT_WEIGHT.qmin
    pe.counts[:15] = 7
    pe.update(step)
    assert (pe.counts[:15] == 7).all() and (pe.W[:15] == nx.LRT_WEIGHT.qmin).all()


def test_update_with_a_left_shift_saturates_the_step():
    pe = LRTPEModel(SMALL).configure(rows_l=2, rows_r=2, cols=1, shift=SMALL.shift_min)
    hi = nx.code_range(16)[1]
    for side in (0, 1):
        pe.configure(side=side)
        pe.load_basis(pad_words(np.full((2, 8), hi)))
    pe.load_weights(pad_words([5, -5, 0, 127]))
    W, counts, _, _ = _update_reference(pe, [hi], SMALL.shift_min)
    pe.update(pad_words([hi]))
    assert pe.W.tolist() == W and W[:4] == [-128] * 4 and pe.counts.tolist() == counts


def test_load_weights_saturates_codes_and_clears_counters():
    rng = np.random.default_rng(5)
    pe = LRTPEModel(SMALL).configure(rows_l=5, rows_r=7)
    pe.counts[:] = 9
    pe.writes_total, pe.writes_max = 11, 9
    words = _codes(rng, 35)
    pe.load_weights(pad_words(words))
    assert pe.W[:35].tolist() == [_sat(int(v), 8) for v in words]
    assert not pe.counts.any() and pe.writes_total == 0 and pe.writes_max == 0
    out = pe.read_weights()
    assert out.size == 40 and out[:35].tolist() == pe.W[:35].tolist() and not out[35:].any()
    np.testing.assert_array_equal(pe.weights(), pe.W[:35].reshape(5, 7))
    counts = pe.read_counts()
    assert counts.size == 40 and not counts.any()


# ----------------------------------------------------------------------------- the contract

def test_cfg_errors():
    p = SMALL
    pe = LRTPEModel(p).configure(rows_l=4, rows_r=6, cols=3, shift=0)
    for op in Op:
        want = ErrorCode.NONE if op.name.startswith("LRT_") else ErrorCode.BAD_OP
        assert pe.cfg_error(op) == want, op
    assert pe.cfg_error(0) == ErrorCode.BAD_OP and pe.cfg_error(26) == ErrorCode.BAD_OP
    # The side's rows: 0 and beyond the memory.
    pe.configure(side=1, rows_r=0)
    assert pe.cfg_error(Op.LRT_PROJECT) == ErrorCode.ZERO_SIZE
    assert pe.cfg_error(Op.LRT_UPDATE) == ErrorCode.ZERO_SIZE
    pe.configure(side=0)
    assert pe.cfg_error(Op.LRT_PROJECT) == ErrorCode.NONE           # Q_L is fine
    assert pe.cfg_error(Op.LRT_READ_WEIGHTS) == ErrorCode.ZERO_SIZE
    pe.configure(rows_r=p.lrt_rows_max + 1)
    assert pe.cfg_error(Op.LRT_UPDATE) == ErrorCode.LRT_SIZE
    pe.configure(side=1)
    assert pe.cfg_error(Op.LRT_LOAD_BASIS) == ErrorCode.LRT_SIZE
    # Columns: q = r + 1 beyond the memory, for every op that uses r.
    pe.configure(rows_r=6, cols=p.lrt_cols_max)
    for op in (Op.LRT_PROJECT, Op.LRT_REPROJECT, Op.LRT_APPEND, Op.LRT_ROTATE, Op.LRT_UPDATE):
        assert pe.cfg_error(op) == ErrorCode.LRT_SIZE, op
    for op in (Op.LRT_LOAD_BASIS, Op.LRT_READ_BASIS, Op.LRT_LOAD_WEIGHTS):
        assert pe.cfg_error(op) == ErrorCode.NONE, op
    # Cells beyond the weight memory.
    pe.configure(cols=1, rows_l=p.lrt_rows_max, rows_r=p.lrt_cells_max // p.lrt_rows_max + 1)
    for op in (Op.LRT_UPDATE, Op.LRT_LOAD_WEIGHTS, Op.LRT_READ_WEIGHTS, Op.LRT_READ_COUNTS):
        assert pe.cfg_error(op) == ErrorCode.LRT_SIZE, op
    assert pe.cfg_error(Op.LRT_PROJECT) == ErrorCode.NONE
    # SHIFT, for the ops that use it.
    pe.configure(rows_r=2)
    for shift in (p.shift_min - 1, p.shift_max + 1):
        pe.configure(shift=shift)
        assert pe.cfg_error(Op.LRT_APPEND) == ErrorCode.SHIFT
        assert pe.cfg_error(Op.LRT_UPDATE) == ErrorCode.SHIFT
        assert pe.cfg_error(Op.LRT_PROJECT) == ErrorCode.NONE
    # A refused op raises and leaves the state alone.
    pe.configure(shift=p.shift_max + 1)
    with pytest.raises(LRTConfigError) as err:
        pe.append()
    assert err.value.code == ErrorCode.SHIFT


def test_stream_sizes_and_bad_streams():
    pe = LRTPEModel(SMALL).configure(rows_l=13, rows_r=3, cols=5, side=0)
    assert [pe.in_beats(op) for op in Op if op >= 16] == [13, 0, 2, 0, 0, 4, 1, 5, 0, 0]
    assert [pe.out_beats(op) for op in Op if op >= 16] == [0, 13, 1, 1, 0, 0, 0, 0, 5, 5]
    with pytest.raises(ValueError, match="must hold 16 words"):
        pe.project(np.zeros(8, np.int64))
    with pytest.raises(ValueError, match="16-bit"):
        pe.project(np.full(16, 1 << 15))
    with pytest.raises(ValueError, match="no register"):
        pe.configure(rows=3)
    with pytest.raises(ValueError, match="LRT_COLS|cols"):
        pe.configure(cols=256)
    with pytest.raises(ValueError, match="shift"):
        pe.configure(shift=128)


def test_append_reciprocal():
    for norm2 in [1, 2, 3, 4, 1000, 2**20, 2**20 - 1, 2**38, 123456789]:
        recip, shift = append_reciprocal(norm2)
        assert 1 << 15 <= recip < 1 << 16 and SMALL.shift_min <= shift <= SMALL.shift_max
        assert math.isclose(recip * 2.0**-shift, 2**14 / math.sqrt(norm2), rel_tol=2**-15)
    assert append_reciprocal(0) == (0, 0)


# ----------------------------------------------------------------------------- tracking the float SKS

def _orthonormal(rng, n, q):
    g, _ = np.linalg.qr(rng.standard_normal((n, q)))
    return g


@pytest.mark.parametrize("seed", range(6))
def test_fixed_point_tracks_the_float_mgs_and_rotation(seed):
    """PROJECT + REPROJECT + APPEND, then ROTATE, against sks.mgs_project / sks.rotate.

    Tolerance 2**-10 (16 LSBs of the Q1.14 basis): projections and residual norm within
    2**-10 |x|, the appended column and the rotated basis within 2**-10 per entry, the rotated
    basis orthonormal within 2**-10. (Worst seen over 200 seeds: 2**-12.4 |x|, 2**-13.1 |x|,
    2**-11.7, 2**-12.2, 2**-12.1.)
    """
    rng = np.random.default_rng(seed)
    n = int(rng.choice([16, 64, 200, 256]))
    r = int(rng.integers(1, 8))
    q = r + 1
    params = AcceleratorParams(lrt_rows_max=256, lrt_cols_max=8, lrt_cells_max=256)
    pe = LRTPEModel(params).configure(rows_l=n, cols=r, side=0)
    Qf = np.zeros((n, 8))
    Qf[:, :q] = _orthonormal(rng, n, q)
    Qc = nx.LRT_BASIS.quantize_code(Qf)
    pe.load_basis(pad_words(Qc))
    Qf = nx.LRT_BASIS.to_float(Qc)          # the float algorithm starts from the same basis
    # A sample partly in the span, at a 16-bit scale that leaves headroom.
    xf = Qf[:, :r] @ rng.standard_normal(r) + 0.5 * rng.standard_normal(n)
    xc = nx.FixedPoint(16, 0).quantize_code(xf / np.abs(xf).max() * 2**13)
    norm_x = float(np.linalg.norm(xc))
    c_fix = pe.project(pad_words(xc))[:r].astype(float)
    c_fix += pe.reproject()[:r]
    Qfloat = Qf[:, :q].copy()
    c_float = np.zeros(q)
    norm = mgs_project(Qfloat, xc.astype(float), r, c_float)
    assert np.abs(c_fix - c_float[:r]).max() <= 2**-10 * norm_x
    assert abs(math.sqrt(pe.norm2) - norm) <= 2**-10 * norm_x
    recip, shift = append_reciprocal(pe.norm2)
    pe.configure(recip=recip, shift=shift)
    pe.append()
    new_col = nx.LRT_BASIS.to_float(pe.basis()[:n, r])
    assert np.abs(new_col - Qfloat[:, r]).max() <= 2**-10
    # Rotation by the first r columns of a random q x q orthogonal matrix.
    Mf = _orthonormal(rng, q, q)[:, :r]
    Mc = nx.LRT_BASIS.quantize_code(Mf)
    pe.rotate(pad_words(Mc))
    rotate(Qfloat, nx.LRT_BASIS.to_float(Mc))
    Qrot = nx.LRT_BASIS.to_float(pe.basis()[:n, :r])
    assert np.abs(Qrot - Qfloat[:, :r]).max() <= 2**-10
    assert np.abs(Qrot.T @ Qrot - np.eye(r)).max() <= 2**-10

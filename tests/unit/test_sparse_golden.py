"""The golden model of the MCU kernels (insitu.sparse.golden) against straightforward references of
the ABI's formulas, its arena interpreter, and the 32-bit arithmetic of the firmware's rounding."""

import math
import re
from fractions import Fraction

import numpy as np
import pytest

from insitu import numerics as nx
from insitu.sparse import abi, golden
from insitu.resources import package_dir

pytestmark = pytest.mark.unit

FIRMWARE = package_dir("firmware")


# --------------------------------------------------------------------------- references

def rq_ref(v: int, m: int, sh: int) -> int:
    """round(v * m / 2**sh), ties toward +inf, from exact rationals (no shifts)."""
    return math.floor(Fraction(int(v) * int(m), 2 ** int(sh)) + Fraction(1, 2))


def clamp(v, lo, hi):
    return max(lo, min(hi, v))


def sat(v, bits):
    return clamp(v, -(1 << (bits - 1)), (1 << (bits - 1)) - 1)


def x_at(x, c, iy, ix):
    """x[c, iy, ix] with zero padding outside the map."""
    return int(x[c, iy, ix]) if 0 <= iy < x.shape[1] and 0 <= ix < x.shape[2] else 0


def conv_fwd_ref(x, w, b, m, sh, s, pad, groups, lo, hi):
    C, H, W = x.shape
    O, Cg, K, _ = w.shape
    OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
    y = np.zeros((O, OH, OW), np.int64)
    for o in range(O):
        g = o // (O // groups)
        for oy in range(OH):
            for ox in range(OW):
                acc = int(b[o])
                for c in range(Cg):
                    for ky in range(K):
                        for kx in range(K):
                            acc += int(w[o, c, ky, kx]) * x_at(x, g * Cg + c, oy * s + ky - pad, ox * s + kx - pad)
                y[o, oy, ox] = clamp(rq_ref(acc, m[o], sh[o]), lo, hi)
    return y


def conv_bwd_x_ref(gy, w, shape, s, pad, groups, m, sh):
    C, H, W = shape
    O, Cg, K, _ = w.shape
    acc = np.zeros(shape, dtype=object)
    for o in range(O):
        g = o // (O // groups)
        for oy in range(gy.shape[1]):
            for ox in range(gy.shape[2]):
                for c in range(Cg):
                    for ky in range(K):
                        for kx in range(K):
                            iy, ix = oy * s + ky - pad, ox * s + kx - pad
                            if 0 <= iy < H and 0 <= ix < W:
                                acc[g * Cg + c, iy, ix] += int(w[o, c, ky, kx]) * int(gy[o, oy, ox])
    return np.vectorize(lambda v: sat(rq_ref(v, m, sh), 16))(acc).astype(np.int64)


def conv_grad_w_ref(gy, x, idx, K, s, pad, groups):
    C = x.shape[0]
    O, OH, OW = gy.shape
    Cg = C // groups
    G = np.zeros((len(idx), Cg, K, K), np.int64)
    for j, o in enumerate(idx):
        g = o // (O // groups)
        for c in range(Cg):
            for ky in range(K):
                for kx in range(K):
                    G[j, c, ky, kx] = sum(int(gy[o, oy, ox]) * x_at(x, g * Cg + c, oy * s + ky - pad, ox * s + kx - pad)
                                          for oy in range(OH) for ox in range(OW))
    return G


# --------------------------------------------------------------------------- random cases

def random_geometry(rng, kind):
    C, O = int(rng.integers(1, 5)), int(rng.integers(1, 5))
    H, W = (int(v) for v in rng.integers(1, 8, 2))
    K, s, pad, groups = int(rng.choice([1, 2, 3])), int(rng.integers(1, 3)), int(rng.integers(0, 3)), 1
    if kind == "pointwise":
        K, s, pad = 1, 1, 0
    elif kind == "dense":
        K, s, pad, H, W = 1, 1, 0, 1, 1
    elif kind == "depthwise":
        groups, O, K = C, C * int(rng.choice([1, 2])), 3
    elif kind == "grouped":
        groups = 2
        C, O = 2 * C, 2 * O
    H, W = max(H, K - 2 * pad), max(W, K - 2 * pad)
    return C, H, W, O, K, s, pad, groups


def random_scale(rng, n, typical, out_bits=8):
    """Usually realistic multipliers with shifts that bring ``typical * m`` to a quarter of an
    ``out_bits`` range (results spread over it); otherwise the domain's edges."""
    if rng.random() < 0.6:
        sh = int(typical * (1 << 15)).bit_length() - (out_bits - 2) + rng.integers(-2, 3, n)
        return rng.integers(1 << 14, 1 << 15, n), np.clip(sh, 1, 62)
    return rng.choice([0, 1, 3, 1 << 14, (1 << 15) - 1], n), rng.choice([1, 2, 15, 16, 31, 32, 47, 62], n)


KINDS = ["full", "pointwise", "dense", "depthwise", "grouped"]


@pytest.mark.parametrize("kind", KINDS)
def test_conv_fwd_matches_the_formula(kind):
    rng = np.random.default_rng(KINDS.index(kind))
    for _ in range(12):
        C, H, W, O, K, s, pad, groups = random_geometry(rng, kind)
        x = rng.integers(-128, 128, (C, H, W))
        w = rng.choice([-128, 127, *rng.integers(-128, 128, 8)], (O, C // groups, K, K))
        typical = 74 * 74 * (C // groups * K * K) ** 0.5
        b = rng.integers(-int(2 * typical), int(2 * typical) + 1, O)
        m, sh = random_scale(rng, O, typical)
        lo, hi = sorted(int(v) for v in rng.integers(-128, 128, 2)) if rng.random() < 0.5 else (-128, 127)
        y = golden.conv_fwd(x, w, b, m, sh, s, pad, groups, lo, hi)
        assert y.dtype == np.int8
        np.testing.assert_array_equal(y, conv_fwd_ref(x, w, b, m, sh, s, pad, groups, lo, hi))


@pytest.mark.parametrize("kind", KINDS)
def test_a_batch_of_maps_is_its_samples_one_by_one(kind):
    """conv_fwd, add_fwd and gap_fwd take a leading batch axis (int8_forward's), with the
    per-sample results of the formula, as int8 of the batch's shape."""
    rng = np.random.default_rng(10 + KINDS.index(kind))
    for _ in range(6):
        C, H, W, O, K, s, pad, groups = random_geometry(rng, kind)
        N = int(rng.integers(0, 4))
        x = rng.integers(-128, 128, (N, C, H, W)).astype(np.int8)
        w = rng.integers(-128, 128, (O, C // groups, K, K)).astype(np.int8)
        typical = 74 * 74 * (C // groups * K * K) ** 0.5
        b = rng.integers(-int(2 * typical), int(2 * typical) + 1, O)
        m, sh = random_scale(rng, O, typical)
        y = golden.conv_fwd(x, w, b, m, sh, s, pad, groups, -100, 90)
        OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
        assert y.dtype == np.int8 and y.shape == (N, O, OH, OW) and y.flags.c_contiguous
        for n in range(N):
            np.testing.assert_array_equal(y[n], conv_fwd_ref(x[n], w, b, m, sh, s, pad, groups, -100, 90))
        (ma, mb), (sh2, _) = random_scale(rng, 2, 104)
        a = rng.integers(-128, 128, x.shape).astype(np.int8)
        np.testing.assert_array_equal(golden.add_fwd(x, a, ma, mb, sh2),
                                      [golden.add_fwd(x[n], a[n], ma, mb, sh2) for n in range(N)] or np.zeros(x.shape))
        (mg, _), (sg, _) = random_scale(rng, 2, 74 * (H * W) ** 0.5)
        pooled = golden.gap_fwd(x, mg, sg)
        assert pooled.dtype == np.int8 and pooled.shape == (N, C)
        for n in range(N):
            np.testing.assert_array_equal(pooled[n], [sat(rq_ref(int(x[n, c].sum()), mg, sg), 8) for c in range(C)])


def test_conv_sums_are_exact_beyond_float32():
    """conv_fwd sums its products with BLAS in floats; past 1023 products per output (sums
    beyond 2**24, where float32 loses the last bits) it must still give the exact integer."""
    C, K = 128, 3                                        # 1152 products per output
    x = np.full((C, K, K), -128, np.int8)
    w = np.full((1, C, K, K), -128, np.int8)
    x[5, 1, 1] = w[0, 5, 1, 1] = 127                     # sum = 1151 * 2**14 + 127**2, odd, > 2**24
    total = 1151 * 2**14 + 127**2
    for v in (5, -7, 100):
        y = golden.conv_fwd(x, w, [v - total], [1 << 14], [14])          # rq(acc) = acc
        assert y.tolist() == [[[v]]]
    # grouped (neither full nor depthwise) on the same path: two groups of 1152 products
    x2, w2 = np.concatenate([x, x]), np.concatenate([w, w])
    y = golden.conv_fwd(x2, w2, [3 - total, -2 - total], [1 << 14] * 2, [14] * 2, groups=2)
    assert y.reshape(-1).tolist() == [3, -2]


@pytest.mark.parametrize("kind", KINDS)
def test_conv_bwd_x_matches_the_formula(kind):
    rng = np.random.default_rng(10 + KINDS.index(kind))
    for _ in range(12):
        C, H, W, O, K, s, pad, groups = random_geometry(rng, kind)
        OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
        gy = rng.integers(-2**15, 2**15, (O, OH, OW))
        w = rng.integers(-128, 128, (O, C // groups, K, K))
        (m,), (sh,) = random_scale(rng, 1, 74 * 2**14 * (O // groups * K * K) ** 0.5, 16)
        gx = golden.conv_bwd_x(gy, w, (C, H, W), s, pad, groups, int(m), int(sh))
        assert gx.dtype == np.int16
        np.testing.assert_array_equal(gx, conv_bwd_x_ref(gy, w, (C, H, W), s, pad, groups, m, sh))


@pytest.mark.parametrize("kind", KINDS)
def test_weight_gradient_and_update_match_the_formula(kind):
    rng = np.random.default_rng(20 + KINDS.index(kind))
    for _ in range(12):
        C, H, W, O, K, s, pad, groups = random_geometry(rng, kind)
        OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
        gy = rng.integers(-2**15, 2**15, (O, OH, OW))
        x = rng.integers(-128, 128, (C, H, W))
        idx = rng.permutation(O)[:int(rng.integers(0, O + 1))]
        G = golden.conv_grad_w(gy, x, idx, K, s, pad, groups)
        assert G.dtype == np.int32
        ref = conv_grad_w_ref(gy, x, idx, K, s, pad, groups)
        np.testing.assert_array_equal(G, ref)
        w = rng.integers(-128, 128, ref.shape)
        um, ush = random_scale(rng, len(idx), 74 * 2**14 * (OH * OW) ** 0.5, 5 + nx.SR_BITS)
        step, salt = int(rng.integers(0, 2**32)), int(rng.integers(0, 100))
        new = golden.conv_upd_w(w, gy, x, idx, um, ush, s, pad, groups, step=step, salt=salt)
        row = ref[0].size if len(idx) else 0
        expect = [sat(int(wv) - sr_ref(g, um[j], ush[j], step, salt, j * row + i), 8)
                  for j in range(len(idx)) for i, (wv, g) in enumerate(zip(w[j].ravel(), ref[j].ravel()))]
        assert new.dtype == np.int8 and new.shape == ref.shape
        assert new.ravel().tolist() == expect


def test_apply_w_and_biases_match_the_formula():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n, row = int(rng.integers(1, 6)), int(rng.integers(1, 30))
        w, gw = rng.integers(-128, 128, (n, row)), rng.integers(-2**31, 2**31, (n, row))
        um, ush = random_scale(rng, n, 2**30, 5 + nx.SR_BITS)
        step, salt = int(rng.choice([0, 2**32 - 1, int(rng.integers(0, 2**32))])), int(rng.integers(0, 100))
        expect = [[sat(int(w[j, i]) - sr_ref(gw[j, i], um[j], ush[j], step, salt, j * row + i), 8)
                   for i in range(row)] for j in range(n)]
        np.testing.assert_array_equal(golden.apply_w(w, gw, um, ush, step=step, salt=salt), expect)
        O, HW = int(rng.integers(1, 10)), int(rng.integers(1, 50))
        gy = rng.integers(-2**15, 2**15, (O, HW))
        b = rng.choice([-2**31, 2**31 - 1, *rng.integers(-2**31, 2**31, 4)], O)
        um, ush = random_scale(rng, O, 2**14 * HW ** 0.5, 12)
        gb = [sum(int(v) for v in gy[o]) for o in range(O)]
        np.testing.assert_array_equal(golden.bias_grad(gy), gb)
        expect = [sat(int(b[o]) - rq_ref(gb[o], um[o], ush[o]), 32) for o in range(O)]
        np.testing.assert_array_equal(golden.bias_upd(b, gy, um, ush), expect)
        np.testing.assert_array_equal(golden.apply_b(b, gb, um, ush), expect)
        assert golden.apply_b(b, gb, um, ush).dtype == np.int32


def test_the_update_step_is_not_saturated_before_the_subtraction():
    # rq(2**30, 4, 1) = 2**31: b = 0 goes to -2**31 (a step clipped to int32 first would give -2**31 + 1).
    assert golden.apply_b([0], [2**30], [4], [1]).tolist() == [-2**31]
    assert golden.apply_b([2**31 - 1], [2**30], [4], [1]).tolist() == [-1]
    assert golden.apply_w([[127]], [[2**31 - 1]], [2**15 - 1], [1], step=0, salt=0).tolist() == [[-128]]


def sr_ref(g, m, sh, step, salt, e) -> int:
    """The stochastically rounded weight step of nx.SR_BITS, in Python ints."""
    M = 0xFFFFFFFF
    x = (step * nx.SR_K_STEP + salt * nx.SR_K_SALT + e) & M
    x ^= x >> 16
    x = (x * nx.SR_M1) & M
    x ^= x >> 15
    x = (x * nx.SR_M2) & M
    x ^= x >> 16
    return (rq_ref(g, m, sh) + (x >> (32 - nx.SR_BITS))) >> nx.SR_BITS


def test_stochastic_rounding_keeps_steps_smaller_than_half_a_code():
    # 0.3 codes per element: round-to-nearest would move no weight at all; the stochastic rounding
    # moves 30 % of them by one code, so the mean step is the exact one.
    n = 200_000
    w = np.zeros((1, n), np.int64)
    gw = np.full((1, n), 77)                          # rq(77, 1, 0) = 77 = 0.30 * 2**SR_BITS
    new = golden.apply_w(w, gw, [1 << 14], [14], step=5, salt=3)
    assert set(np.unique(new).tolist()) == {-1, 0}
    assert abs(-new.mean() - 77 / 2**nx.SR_BITS) < 0.005
    # negative steps too (floor of a negative sum), and the noise is uniform over its range
    new = golden.apply_w(w, -gw, [1 << 14], [14], step=6, salt=3)
    assert abs(new.mean() - 77 / 2**nx.SR_BITS) < 0.005
    counts = np.bincount(nx.sr_noise(7, 1, n), minlength=2**nx.SR_BITS)
    assert counts.size == 2**nx.SR_BITS and counts.min() > 0.8 * n / 2**nx.SR_BITS
    # a different step or layer (salt) draws different noise
    assert (nx.sr_noise(7, 1, 1000) != nx.sr_noise(8, 1, 1000)).mean() > 0.9
    assert (nx.sr_noise(7, 1, 1000) != nx.sr_noise(7, 2, 1000)).mean() > 0.9


def test_elementwise_and_pooling_match_the_formula():
    rng = np.random.default_rng(4)
    for _ in range(20):
        n = int(rng.integers(1, 100))
        (ma, mb), (sh, _) = random_scale(rng, 2, 104)
        lo, hi = sorted(int(v) for v in rng.integers(-128, 128, 2))
        a8, b8 = rng.integers(-128, 128, n), rng.integers(-128, 128, n)
        np.testing.assert_array_equal(golden.add_fwd(a8, b8, ma, mb, sh, lo, hi),
                                      [clamp(rq_ref(int(a) * ma + int(b) * mb, 1, sh), lo, hi) for a, b in zip(a8, b8)])
        a16, b16 = rng.integers(-2**15, 2**15, n), rng.integers(-2**15, 2**15, n)
        np.testing.assert_array_equal(golden.grad_add(a16, b16, ma, mb, sh),
                                      [sat(rq_ref(int(a) * ma + int(b) * mb, 1, sh), 16) for a, b in zip(a16, b16)])
        C, H, W = (int(v) for v in rng.integers(1, 9, 3))
        (m, _), (s, _) = random_scale(rng, 2, 74 * (H * W) ** 0.5)
        x = rng.integers(-128, 128, (C, H, W))
        np.testing.assert_array_equal(golden.gap_fwd(x, m, s),
                                      [sat(rq_ref(int(x[c].sum()), m, s), 8) for c in range(C)])
        gy = rng.integers(-2**15, 2**15, C)
        np.testing.assert_array_equal(golden.gap_bwd(gy, H * W, m, s),
                                      [[sat(rq_ref(g, m, s), 16)] * (H * W) for g in gy])
        g = rng.integers(-2**15, 2**15, (C, H * W))
        ms, ss = random_scale(rng, C, 2**14, 16)
        np.testing.assert_array_equal(golden.grad_scale_ch(g, ms, ss),
                                      [[sat(rq_ref(v, ms[c], ss[c]), 16) for v in g[c]] for c in range(C)])
        y, g16 = rng.integers(-128, 128, n), rng.integers(-2**15, 2**15, n)
        np.testing.assert_array_equal(golden.act_bwd(y, g16, lo, hi),
                                      [gv if lo < yv < hi else 0 for yv, gv in zip(y, g16)])


def exp_table(s_z):
    return nx.round_half_up(np.ldexp(np.exp(-np.arange(abi.EXP_ENTRIES) * s_z), abi.EXP_FRAC))


def test_loss_grad_is_the_rounded_softmax_gradient():
    rng = np.random.default_rng(5)
    one = 1 << abi.LOSS_GRAD_FRAC
    for _ in range(30):
        n, s_z = int(rng.integers(1, 30)), float(rng.uniform(0.005, 0.3))
        z = rng.integers(-128, 128, n)
        z[rng.integers(0, n)] = z.max()
        label = int(rng.integers(0, n))
        table = exp_table(s_z)
        g, predicted, p_label = golden.loss_grad(z, table, label)
        e = [int(table[z.max() - v]) for v in z]
        q = [math.floor(Fraction(ek * one, sum(e)) + Fraction(1, 2)) for ek in e]
        assert g.dtype == np.int16
        assert g.tolist() == [qk - one * (k == label) for k, qk in enumerate(q)]
        assert predicted == list(z).index(max(z)) == golden.argmax(z)
        assert p_label == q[label]
        # ... and close to the float softmax it stands for: each e is off by 1/2 in S >= 2**16.
        p = np.exp((z - z.max()) * s_z)
        np.testing.assert_allclose(q, p / p.sum() * one, atol=1 + n / 4)


# --------------------------------------------------------------------------- domain

def test_results_outside_the_devices_domain_are_refused():
    x, w = np.full((1, 1, 1), 127), np.full((1, 1, 1, 1), 127)
    with pytest.raises(ValueError, match="b \\+ sum .* outside int32"):
        golden.conv_fwd(x, w, [2**31 - 1], [1 << 14], [20])
    with pytest.raises(ValueError, match="multipliers"):
        golden.conv_fwd(x, w, [0], [1 << 15], [20])
    with pytest.raises(ValueError, match="shifts"):
        golden.gap_fwd(x, 100, 0)
    with pytest.raises(ValueError, match="shifts"):
        golden.add_fwd([1], [1], 1, 1, 63)
    with pytest.raises(ValueError, match="clamp"):
        golden.conv_fwd(x, w, [0], [1 << 14], [20], lo=5, hi=4)
    with pytest.raises(ValueError, match="x must be int8 codes"):
        golden.conv_fwd(x + 1, w, [0], [1 << 14], [20])
    with pytest.raises(ValueError, match="w must be int8 codes"):
        golden.conv_fwd(x, -w - 2, [0], [1 << 14], [20])
    with pytest.raises(ValueError, match="weight gradient .* outside int32"):
        golden.conv_grad_w(np.full((1, 23, 23), -2**15), np.full((1, 23, 23), -128), [0], 1)   # 529 * 2**22
    with pytest.raises(ValueError, match="label"):
        golden.loss_grad([1, 2], exp_table(0.1), 2)
    with pytest.raises(ValueError, match="exp table"):
        golden.loss_grad([1, 2], np.zeros(10), 0)
    with pytest.raises(ValueError, match="weights must be"):
        golden.conv_fwd(np.zeros((1, 4, 4)), np.zeros((1, 1, 3, 2)), [0], [1], [1])
    with pytest.raises(ValueError, match="groups"):
        golden.conv_fwd(np.zeros((3, 4, 4)), np.zeros((2, 1, 3, 3)), [0, 0], [1, 1], [1, 1], groups=2)


# --------------------------------------------------------------------------- arena views and run

def test_view_is_a_typed_little_endian_window_of_the_arena():
    A = np.zeros(16, np.uint8)
    v = golden.view(A, 4, "i16", 3)
    v[:] = [-2, 1, 0x1234]
    assert A[4:10].tolist() == [0xFE, 0xFF, 1, 0, 0x34, 0x12]
    assert golden.view(A, 8, np.int32, 2).dtype == np.dtype("<i4")
    assert golden.view(A, 16, "i8", 0).size == 0


@pytest.mark.parametrize("off, dtype, n, message", [
    (2, "i32", 1, "not aligned to 4 bytes"),
    (1, "i16", 1, "not aligned to 2 bytes"),
    (12, "i32", 2, "outside the arena of 16 bytes"),
    (-4, "i32", 1, "outside the arena"),
    (0, "i8", -1, "-1 elements"),
    (0, "i64", 1, "arena tensors are"),
])
def test_view_refuses_misaligned_or_outside_tensors(off, dtype, n, message):
    with pytest.raises(ValueError, match=message):
        golden.view(np.zeros(16, np.uint8), off, dtype, n)


def test_view_needs_a_byte_arena():
    with pytest.raises(ValueError, match="uint8"):
        golden.view(np.zeros(4, np.int32), 0, "i8", 1)


class Arena:
    """A uint8 arena with tensors placed one after the other, 4-byte aligned."""

    def __init__(self, size=4096):
        self.A, self.top = np.zeros(size, np.uint8), 0

    def put(self, dtype, values):
        values = np.asarray(values)
        off = self.top
        golden.view(self.A, off, dtype, values.size)[:] = values.reshape(-1)
        self.top += -(-values.size * golden.DTYPES[dtype].itemsize // 4) * 4
        return off

    def get(self, off, dtype, n):
        return golden.view(self.A, off, dtype, n).copy()


def test_run_executes_a_conv_call_on_the_arena():
    rng = np.random.default_rng(6)
    C, H, W, O, K, s, pad, groups = 4, 7, 5, 4, 3, 2, 1, 2
    OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
    x, w = rng.integers(-128, 128, (C, H, W)), rng.integers(-128, 128, (O, C // groups, K, K))
    b, m, sh = rng.integers(-2**20, 2**20, O), rng.integers(1 << 14, 1 << 15, O), rng.integers(15, 25, O)
    ar = Arena()
    f = dict(x_off=ar.put("i8", x), w_off=ar.put("i8", w), b_off=ar.put("i32", b), m_off=ar.put("i32", m),
             sh_off=ar.put("i32", sh), y_off=ar.put("i8", np.zeros(O * OH * OW)),
             C=C, H=H, W=W, O=O, OH=OH, OW=OW, K=K, stride=s, pad=pad, groups=groups, lo=0, hi=100, pad_x=pad)
    P = np.array([7, 7, *abi.record("conv_fwd", **f)], np.int32)
    before = ar.A.copy()
    golden.run(ar.A, P, 2)
    y = ar.get(f["y_off"], "i8", O * OH * OW).reshape(O, OH, OW)
    np.testing.assert_array_equal(y, conv_fwd_ref(x, w, b, m, sh, s, pad, groups, 0, 100))
    changed = np.flatnonzero(ar.A != before)
    assert changed.size == 0 or f["y_off"] <= changed.min() <= changed.max() < f["y_off"] + O * OH * OW


def test_run_loss_grad_reads_the_label_and_writes_the_io_block():
    ar = Arena()
    z = [3, -5, 9, 9, 0]
    f = dict(z_off=ar.put("i8", z), g_off=ar.put("i16", np.zeros(5)), n=5,
             exp_off=ar.put("i32", exp_table(0.05)), io_off=ar.put("i32", [1, -1, -1, 77]))
    golden.run(ar.A, np.array(abi.record("loss_grad", **f), np.int32), 0)
    g, predicted, p_label = golden.loss_grad(z, exp_table(0.05), 1)
    assert ar.get(f["io_off"], "i32", 4).tolist() == [1, predicted, p_label, 78]     # one more step
    ar.A[f["io_off"] + 12:f["io_off"] + 16] = np.frombuffer(np.int32(-1).tobytes(), np.uint8)
    golden.run(ar.A, np.array(abi.record("loss_grad", **f), np.int32), 0)
    assert ar.get(f["io_off"], "i32", 4).tolist()[abi.IO_STEP] == 0                      # mod 2**32
    assert predicted == 2
    np.testing.assert_array_equal(ar.get(f["g_off"], "i16", 5), g)


def test_run_load_and_patch_copy_bytes():
    ar = Arena()
    blob = bytes(range(200))
    dst = ar.put("u8", np.zeros(12))
    golden.run(ar.A, np.array(abi.record("load", blob_off=50, dst_off=dst, n=12), np.int32), 0, blob)
    assert ar.get(dst, "u8", 12).tolist() == list(range(50, 62))
    with pytest.raises(ValueError, match="outside the blob"):
        golden.run(ar.A, np.array(abi.record("load", blob_off=190, dst_off=dst, n=12), np.int32), 0, blob)
    src, rows = ar.put("u8", [1, 2, 3, 4, 5, 6]), ar.put("u8", np.zeros(4 * 3))
    idx = ar.put("i32", [3, 0, 3])          # a repeated row keeps the last source row
    golden.run(ar.A, np.array(abi.record("patch", src_off=src, dst_off=rows, idx_off=idx, n_sel=3, row_bytes=2),
                               np.int32), 0)
    assert ar.get(rows, "u8", 8).tolist() == [3, 4, 0, 0, 0, 0, 5, 6]


def test_run_refuses_bad_calls():
    ar = Arena(64)
    with pytest.raises(ValueError, match="not an opcode"):
        golden.run(ar.A, np.array([0, 1, 2], np.int32), 0)
    with pytest.raises(ValueError, match=r"act_bwd.g_off: offset 3 .* not aligned"):
        golden.run(ar.A, np.array(abi.record("act_bwd", y_off=0, g_off=3, n=2, lo=0, hi=9), np.int32), 0)
    with pytest.raises(ValueError, match="act_bwd.g_off: .* outside the arena"):
        golden.run(ar.A, np.array(abi.record("act_bwd", y_off=0, g_off=60, n=4, lo=0, hi=9), np.int32), 0)
    with pytest.raises(ValueError, match="y_off .* overlaps g_off"):
        golden.run(ar.A, np.array(abi.record("act_bwd", y_off=4, g_off=0, n=4, lo=0, hi=9), np.int32), 0)
    geometry = dict(C=1, H=3, W=3, O=1, OH=2, OW=3, K=3, stride=1, pad=1, groups=1)
    with pytest.raises(ValueError, match="OH, OW = 2, 3"):
        golden.run(ar.A, np.array(abi.record("conv_bwd_x", gy_off=0, w_off=0, gx_off=0, **geometry, m=1, sh=1),
                                   np.int32), 0)


def test_an_elementwise_op_may_write_over_its_input_and_nothing_else_may():
    ar = Arena(64)
    a = ar.put("i8", [10, -20, 30, 127])
    golden.run(ar.A, np.array(abi.record("add_fwd", a_off=a, b_off=a, y_off=a, n=4, ma=1 << 14, mb=1 << 14,
                                          sh=15, lo=-128, hi=127), np.int32), 0)
    assert ar.get(a, "i8", 4).tolist() == [10, -20, 30, 127]
    with pytest.raises(ValueError, match="overlaps"):
        golden.run(ar.A, np.array(abi.record("add_fwd", a_off=a, b_off=a, y_off=a + 1, n=4, ma=1, mb=1,
                                              sh=1, lo=-128, hi=127), np.int32), 0)
    with pytest.raises(ValueError, match="overlaps"):
        golden.run(ar.A, np.array(abi.record("gap_fwd", x_off=a, y_off=a, C=1, HW=4, m=1, sh=1), np.int32), 0)


def test_every_opcode_has_a_golden_kernel():
    assert set(golden._RUNNERS) == set(abi.OPS)


# --------------------------------------------------------------------------- the firmware's side

def test_firmware_abi_module_is_generated_from_the_abi():
    committed = (FIRMWARE / "tte_abi.py").read_text()
    assert committed == abi.firmware_constants(), (
        "firmware/tte_abi.py is stale; regenerate it with: .venv/bin/python -c \"from insitu.sparse.abi import "
        "firmware_constants as f; open('firmware/tte_abi.py', 'w').write(f())\"")


def test_c_abi_header_is_generated_from_the_abi():
    committed = (FIRMWARE / "native" / "tte_abi.h").read_text()
    assert committed == abi.c_header(), (
        "firmware/native/tte_abi.h is stale; regenerate it with: .venv/bin/python -c \"from insitu.sparse.abi import "
        "c_header as f; open('firmware/native/tte_abi.h', 'w').write(f())\"")


def test_firmware_field_comments_match_the_abi():
    """The viper kernels (tte_kernels.py; load and load_rows in tte_ops.py) read each field at a
    fixed P index, restated in a "# fields(op):" comment above the kernel: the comments must list
    abi.OPS exactly, for every opcode."""
    source = (FIRMWARE / "tte_kernels.py").read_text() + (FIRMWARE / "tte_ops.py").read_text()
    found = {op: tuple(f.strip() for f in names.split(","))
             for op, names in re.findall(r"^# fields\((\w+)\): (.+)$", source, re.M)}
    assert found == abi.OPS


BIG = 0x3FFFFFFF


def word(v: int) -> int:
    """A value the firmware holds in a machine word: on the Cortex-M7 it must fit int32."""
    assert -2**31 <= v < 2**31, f"{v} does not fit a 32-bit word"
    return v


def rq32(v, m, sh):
    """firmware _requant's arithmetic for one sum, transcribed line by line, every intermediate
    checked by word(): (r, wide), where wide means r = +-BIG stands for |rq| > 2**16."""
    k = min(sh - 16, 31)
    half = word(1 << (sh - 1)) if sh <= 15 else 0
    vl = word((v & 0x7FFF) * m)
    t = word(word(word(v >> 15) * m) + word(vl >> 15))
    if sh > 15:
        u = word(t >> k)
        return word(word(u >> 1) + word(u & 1)), False
    if t > 0x10000:
        return BIG, True
    if t < -0x10000:
        return -BIG, True
    return word(word(t << (15 - sh)) + word(word(word(vl & 0x7FFF) + half) >> sh)), False


def sub_i32(b, r, wide, v, m, sh):
    """firmware's b = sat32(b - r) in words (the wide case is exact Python ints on the device)."""
    imin = word(-0x40000000 + -0x40000000)
    imax = word(-1 - imin)
    if wide:
        return sat(b - ((v * m + (1 << (sh - 1))) >> sh), 32)
    if r > 0 and b < word(imin + r):
        return imin
    if r < 0 and b > word(imax + r):
        return imax
    return word(b - r)


EDGE_V = [0, 1, -1, 2, -2, 2**15 - 1, 2**15, -2**15, 2**16, -2**16 - 1, 2**30, -2**30, 2**31 - 1, -2**31, -2**31 + 1]
EDGE_M = [0, 1, 2, 3, 1 << 14, (1 << 15) - 1]
EDGE_SH = [1, 2, 7, 14, 15, 16, 17, 30, 31, 32, 33, 46, 47, 48, 61, 62]


def test_firmware_rounding_is_exact_in_32_bit_words():
    rng = np.random.default_rng(8)
    cases = [(v, m, sh) for v in EDGE_V for m in EDGE_M for sh in EDGE_SH]
    cases += zip(rng.integers(-2**31, 2**31, 3000).tolist(), rng.integers(0, 1 << 15, 3000).tolist(),
                 rng.integers(1, 63, 3000).tolist())
    cases += zip(rng.integers(-2**20, 2**20, 2000).tolist(), rng.integers(0, 1 << 15, 2000).tolist(),
                 rng.integers(1, 16, 2000).tolist())
    for v, m, sh in cases:
        exact = int(nx.shift_round(v * m, sh))
        r, wide = rq32(v, m, sh)
        if wide:
            assert abs(exact) > 2**16 and (r > 0) == (exact > 0), (v, m, sh)
        else:
            assert r == exact, (v, m, sh)
        # What each destination makes of r: clamps to i8/i16, weight and bias updates.
        for lo, hi in ((-128, 127), (-2**15, 2**15 - 1), (0, 6)):
            assert clamp(r, lo, hi) == clamp(exact, lo, hi)
        for w in (-128, -1, 0, 127):
            assert clamp(word(w - r), -128, 127) == sat(w - exact, 8)
        for b in (-2**31, -2**30, -1, 0, 5, 2**30, 2**31 - 1):
            assert sub_i32(b, r, wide, v, m, sh) == sat(b - exact, 32), (b, v, m, sh)

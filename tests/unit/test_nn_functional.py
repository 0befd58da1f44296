"""im2col/col2im layout and adjointness, softmax stability, the gradient checker itself."""

import numpy as np
import pytest

from insitu.nn import functional as F
from insitu.nn.gradcheck import layer_gradient_errors, numerical_gradient
from insitu.nn.layers import Layer

pytestmark = pytest.mark.unit

# (H, W, kernel, stride, padding): square and rectangular, overlapping and strided windows.
GEOMETRIES = [
    (5, 5, 3, 1, 0),
    (6, 7, 3, 2, 1),
    (7, 6, (2, 3), (2, 1), (0, 1)),
    (8, 8, 1, 2, 0),
    (4, 5, 1, 1, 0),
    (5, 5, 5, 1, 2),
    (9, 9, 3, 3, 1),
]


def naive_im2col(x, k, s, p):
    (kh, kw), (sh, sw), (ph, pw) = F.pair(k), F.pair(s), F.pair(p)
    n, c, h, w = x.shape
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    ho, wo = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    out = np.zeros((n, ho * wo, c * kh * kw))
    for b in range(n):
        for oh in range(ho):
            for ow in range(wo):
                out[b, oh * wo + ow] = xp[b, :, oh * sh : oh * sh + kh, ow * sw : ow * sw + kw].ravel()
    return out


@pytest.mark.parametrize("h,w,k,s,p", GEOMETRIES)
def test_im2col_matches_naive_layout(h, w, k, s, p):
    x = np.random.default_rng(0).standard_normal((2, 3, h, w))
    np.testing.assert_array_equal(F.im2col(x, k, s, p), naive_im2col(x, k, s, p))


@pytest.mark.parametrize("h,w,k,s,p", GEOMETRIES)
def test_col2im_is_adjoint_of_im2col(h, w, k, s, p):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, h, w))
    cols = F.im2col(x, k, s, p)
    y = rng.standard_normal(cols.shape)
    back = F.col2im(y, x.shape, k, s, p)
    assert back.shape == x.shape
    np.testing.assert_allclose(np.vdot(cols, y), np.vdot(x, back), rtol=1e-12)


def test_col2im_counts_window_overlaps():
    # Scattering ones counts how many windows cover each pixel: corners 1, centre 9 for 3x3/s1.
    counts = F.col2im(np.ones((1, 9, 9)), (1, 1, 5, 5), 3, 1, 0)[0, 0]
    assert counts[0, 0] == 1 and counts[2, 2] == 9 and counts[0, 2] == 3


def test_im2col_keeps_dtype_and_rejects_oversized_window():
    x = np.ones((1, 2, 4, 4), dtype=np.float32)
    assert F.im2col(x, 3, 1, 1).dtype == np.float32
    with pytest.raises(ValueError):
        F.im2col(x, 5, 1, 0)


def test_conv_output_size():
    assert F.conv_output_size(32, 3, 1, 1) == 32
    assert F.conv_output_size(32, 3, 2, 1) == 16
    assert F.conv_output_size(7, 3, 2, 0) == 3


def test_softmax_is_stable_and_normalized():
    z = np.array([[1000.0, 1001.0, 999.0], [-1000.0, -1000.0, -1000.0]])
    p = F.softmax(z)
    assert np.all(np.isfinite(p))
    np.testing.assert_allclose(p.sum(axis=1), 1.0)
    e = np.exp([0.0, 1.0, -1.0])
    np.testing.assert_allclose(p[0], e / e.sum())
    np.testing.assert_allclose(p[1], 1 / 3)
    np.testing.assert_allclose(F.log_softmax(z), np.log(p))


def test_one_hot():
    np.testing.assert_array_equal(F.one_hot(np.array([2, 0]), 3), [[0, 0, 1], [1, 0, 0]])


def test_numerical_gradient_of_known_function():
    x = np.array([1.0, -2.0, 0.5])
    np.testing.assert_allclose(numerical_gradient(lambda: float(np.sum(x**3)), x), 3 * x**2, rtol=1e-8)


class _WrongGradient(Layer):
    """y = 2x with a deliberately wrong backward (returns dy)."""

    def forward(self, x, train=True):
        return 2 * x

    def backward(self, dy):
        return dy


def test_gradient_checker_catches_a_wrong_backward():
    errs = layer_gradient_errors(_WrongGradient(), np.random.default_rng(0).standard_normal((3, 4)))
    assert errs["input"] > 0.1

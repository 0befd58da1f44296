"""Layer gradients against finite differences, convolution forward against direct loops,
Kronecker pairs against the weight gradients, dtype handling."""

import numpy as np
import pytest

import insitu.nn as nn
from insitu.nn.gradcheck import layer_gradient_errors

pytestmark = pytest.mark.unit

TOL = 1e-6


def assert_gradients_ok(layer, x, **kw):
    errs = layer_gradient_errors(layer, x, **kw)
    bad = {k: e for k, e in errs.items() if not e < TOL}
    assert not bad, f"{layer!r}: gradient errors {bad}"
    return errs


def randomize_bias(layer, seed=5):
    # Layers start with zero bias; random bias makes the checks cover the bias path too.
    if "bias" in layer.params:
        layer.params["bias"][:] = np.random.default_rng(seed).standard_normal(layer.params["bias"].shape)


def naive_conv2d(x, w, b, stride, padding):
    n, c, h, wd = x.shape
    co, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    ho, wo = (h + 2 * padding - kh) // stride + 1, (wd + 2 * padding - kw) // stride + 1
    y = np.zeros((n, co, ho, wo))
    for i in range(n):
        for o in range(co):
            for r in range(ho):
                for q in range(wo):
                    patch = xp[i, :, r * stride : r * stride + kh, q * stride : q * stride + kw]
                    y[i, o, r, q] = np.sum(patch * w[o]) + (b[o] if b is not None else 0)
    return y


def naive_depthwise(x, w, b, stride, padding):
    # Each channel is a 1-in/1-out convolution with its own kernel.
    chans = [naive_conv2d(x[:, c : c + 1], w[c : c + 1], b[c : c + 1], stride, padding) for c in range(x.shape[1])]
    return np.concatenate(chans, axis=1)


CONV_CASES = [  # (c_in, c_out, k, stride, padding, H, W)
    (2, 3, 3, 1, 0, 5, 5),
    (2, 3, 3, 1, 1, 5, 6),
    (3, 2, 3, 2, 1, 7, 7),
    (1, 2, 2, 2, 0, 6, 5),
    (2, 2, 5, 3, 2, 8, 8),
]


# ------------------------------------------------------------------ forward against references


@pytest.mark.parametrize("ci,co,k,s,p,h,w", CONV_CASES)
def test_conv2d_forward_matches_direct_loops(ci, co, k, s, p, h, w):
    layer = nn.Conv2d(ci, co, k, stride=s, padding=p, seed=0)
    randomize_bias(layer)
    x = np.random.default_rng(1).standard_normal((2, ci, h, w))
    ref = naive_conv2d(x, layer.params["weight"], layer.params["bias"], s, p)
    np.testing.assert_allclose(layer.forward(x), ref, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (3, 2, 1), (2, 2, 0)])
def test_depthwise_forward_matches_direct_loops(k, s, p):
    layer = nn.DepthwiseConv2d(3, k, stride=s, padding=p, seed=0)
    randomize_bias(layer)
    x = np.random.default_rng(1).standard_normal((2, 3, 6, 7))
    ref = naive_depthwise(x, layer.params["weight"], layer.params["bias"], s, p)
    np.testing.assert_allclose(layer.forward(x), ref, rtol=1e-12, atol=1e-12)


def test_pointwise_is_a_channel_matmul():
    layer = nn.PointwiseConv2d(4, 3, seed=0)
    randomize_bias(layer)
    x = np.random.default_rng(1).standard_normal((2, 4, 3, 5))
    ref = np.einsum("oc,nchw->nohw", layer.weight_matrix, x) + layer.params["bias"][:, None, None]
    np.testing.assert_allclose(layer.forward(x), ref, rtol=1e-12)
    assert layer.params["weight"].shape == (3, 4, 1, 1)


def test_dense_forward_and_init():
    layer = nn.Dense(400, 300, seed=3)
    x = np.random.default_rng(0).standard_normal((2, 400))
    np.testing.assert_allclose(layer.forward(x), x @ layer.params["weight"].T)
    # He init: std sqrt(2/n_in); 120k samples pin the estimate to ~0.3%.
    assert abs(layer.params["weight"].std() / np.sqrt(2 / 400) - 1) < 0.02
    np.testing.assert_array_equal(nn.Dense(4, 3, seed=7).params["weight"], nn.Dense(4, 3, seed=7).params["weight"])


def test_pools_forward():
    x = np.arange(16, dtype=float).reshape(1, 1, 4, 4)
    np.testing.assert_array_equal(nn.MaxPool2d(2).forward(x)[0, 0], [[5, 7], [13, 15]])
    np.testing.assert_array_equal(nn.AvgPool2d(2).forward(x)[0, 0], [[2.5, 4.5], [10.5, 12.5]])
    np.testing.assert_array_equal(nn.MaxPool2d(3, stride=1).forward(x)[0, 0], [[10, 11], [14, 15]])
    np.testing.assert_array_equal(nn.GlobalAvgPool2d().forward(x), [[7.5]])


def test_relu6_clips_both_sides():
    np.testing.assert_array_equal(nn.ReLU6().forward(np.array([[-1.0, 3.0, 7.0]])), [[0, 3, 6]])


# ------------------------------------------------------------------ gradient checks


@pytest.mark.parametrize("ci,co,k,s,p,h,w", CONV_CASES)
def test_conv2d_gradients(ci, co, k, s, p, h, w):
    layer = nn.Conv2d(ci, co, k, stride=s, padding=p, seed=0)
    randomize_bias(layer)
    assert_gradients_ok(layer, np.random.default_rng(2).standard_normal((2, ci, h, w)))


@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (3, 2, 1), (2, 2, 0), (3, 1, 0)])
def test_depthwise_gradients(k, s, p):
    layer = nn.DepthwiseConv2d(3, k, stride=s, padding=p, seed=0)
    randomize_bias(layer)
    assert_gradients_ok(layer, np.random.default_rng(2).standard_normal((2, 3, 6, 5)))


@pytest.mark.parametrize("stride", [1, 2])
def test_pointwise_gradients(stride):
    layer = nn.PointwiseConv2d(3, 4, stride=stride, seed=0)
    randomize_bias(layer)
    assert_gradients_ok(layer, np.random.default_rng(2).standard_normal((2, 3, 5, 5)))


@pytest.mark.parametrize("bias", [True, False])
def test_dense_gradients(bias):
    layer = nn.Dense(5, 4, bias=bias, seed=0)
    randomize_bias(layer)
    errs = assert_gradients_ok(layer, np.random.default_rng(2).standard_normal((3, 5)))
    assert ("bias" in errs) == bias


@pytest.mark.parametrize(
    "layer,shape,scale",
    [
        (nn.ReLU(), (3, 4, 3, 3), 1.0),
        (nn.ReLU6(), (3, 4, 3, 3), 5.0),  # scale 5 puts values on both kinks
        (nn.MaxPool2d(2), (2, 3, 6, 6), 1.0),
        (nn.MaxPool2d(3, stride=2), (2, 2, 7, 7), 1.0),  # overlapping windows
        (nn.MaxPool2d(2, stride=1), (1, 2, 5, 4), 1.0),
        (nn.AvgPool2d(2), (2, 3, 6, 6), 1.0),
        (nn.AvgPool2d(3, stride=2), (2, 2, 7, 7), 1.0),
        (nn.GlobalAvgPool2d(), (2, 3, 4, 5), 1.0),
        (nn.Flatten(), (2, 3, 2, 2), 1.0),
    ],
    ids=repr,
)
def test_parameter_free_layer_gradients(layer, shape, scale):
    x = scale * np.random.default_rng(3).standard_normal(shape)
    assert_gradients_ok(layer, x)


def test_maxpool_routes_gradient_to_the_maximum_only():
    x = np.array([[[[1.0, 4.0], [3.0, 2.0]]]])
    pool = nn.MaxPool2d(2)
    pool.forward(x)
    np.testing.assert_array_equal(pool.backward(np.array([[[[5.0]]]]))[0, 0], [[0, 5], [0, 0]])


# ------------------------------------------------------------------ Kronecker pairs (LRT)


def _train_step(layer, x, seed=4):
    layer.zero_grad()
    y = layer.forward(x)
    layer.backward(np.random.default_rng(seed).standard_normal(y.shape))


def test_dense_kronecker_pairs_reproduce_weight_gradient():
    layer = nn.Dense(6, 4, seed=0)
    x = np.random.default_rng(1).standard_normal((5, 6))
    _train_step(layer, x)
    dz, a = layer.kronecker_pairs()
    assert dz.shape == (5, 1, 4) and a.shape == (5, 1, 6)
    np.testing.assert_allclose(np.einsum("npo,npi->oi", dz, a), layer.grads["weight"], rtol=1e-12)
    np.testing.assert_array_equal(a[:, 0], x)


@pytest.mark.parametrize("ci,co,k,s,p,h,w", CONV_CASES)
def test_conv2d_kronecker_pairs_reproduce_weight_gradient(ci, co, k, s, p, h, w):
    layer = nn.Conv2d(ci, co, k, stride=s, padding=p, seed=0)
    x = np.random.default_rng(1).standard_normal((3, ci, h, w))
    _train_step(layer, x)
    dz, a = layer.kronecker_pairs()
    ho, wo = layer.output_shape(h, w)
    assert dz.shape == (3, ho * wo, co) and a.shape == (3, ho * wo, ci * k * k)
    g = np.einsum("npo,npi->oi", dz, a)
    np.testing.assert_allclose(g, layer.grads["weight"].reshape(co, -1), rtol=1e-10, atol=1e-12)
    # One pair of one sample: the outer product equals that sample-pixel's own contribution.
    single = nn.Conv2d(ci, co, k, stride=s, padding=p, seed=0)
    _train_step(single, x[1:2])
    dz1, a1 = single.kronecker_pairs()
    np.testing.assert_allclose(np.einsum("npo,npi->oi", dz1, a1), single.grads["weight"].reshape(co, -1), rtol=1e-10)


@pytest.mark.parametrize("k,s,p", [(3, 1, 1), (3, 2, 1), (2, 2, 0)])
def test_depthwise_kronecker_pairs_reproduce_weight_gradient(k, s, p):
    layer = nn.DepthwiseConv2d(4, k, stride=s, padding=p, seed=0)
    x = np.random.default_rng(1).standard_normal((3, 4, 6, 7))
    _train_step(layer, x)
    dz, a = layer.kronecker_pairs()
    assert dz.shape[2] == 4 and a.shape == dz.shape + (k * k,)
    g = np.einsum("npc,npck->ck", dz, a)
    np.testing.assert_allclose(g, layer.grads["weight"].reshape(4, k * k), rtol=1e-10, atol=1e-12)
    c = 2  # the per-channel statement, one channel at a time
    np.testing.assert_allclose(
        np.einsum("np,npk->k", dz[..., c], a[..., c, :]), layer.grads["weight"][c, 0].ravel(), rtol=1e-10
    )


def test_kronecker_pairs_need_a_backward():
    layer = nn.Conv2d(1, 1, 3)
    with pytest.raises(RuntimeError):
        layer.kronecker_pairs()
    layer.forward(np.zeros((1, 1, 4, 4)))
    with pytest.raises(RuntimeError):
        layer.kronecker_pairs()


@pytest.mark.parametrize(
    "layer,shape",
    [
        (nn.Dense(5, 3, seed=0), (2, 5)),
        (nn.Conv2d(2, 3, 3, padding=1, seed=0), (2, 2, 4, 4)),
        (nn.DepthwiseConv2d(2, 3, padding=1, seed=0), (2, 2, 4, 4)),
    ],
    ids=repr,
)
def test_skipping_weight_gradient_keeps_pairs_bias_and_input_gradient(layer, shape):
    x = np.random.default_rng(0).standard_normal(shape)
    _train_step(layer, x)
    full = {k: g.copy() for k, g in layer.grads.items()}
    dz_full, _ = layer.kronecker_pairs()
    dz_full = dz_full.copy()
    layer.zero_grad()
    layer.compute_weight_grad = False
    y = layer.forward(x)
    dx = layer.backward(np.random.default_rng(4).standard_normal(y.shape))
    assert not layer.grads["weight"].any()
    np.testing.assert_allclose(layer.grads["bias"], full["bias"])
    np.testing.assert_allclose(layer.kronecker_pairs()[0], dz_full)
    assert dx.shape == shape


@pytest.mark.parametrize(
    "layer", [nn.Dense(5, 3), nn.Conv2d(2, 3, 3), nn.PointwiseConv2d(2, 3), nn.DepthwiseConv2d(2, 3)], ids=repr
)
def test_weight_matrix_is_a_writable_view(layer):
    wm = layer.weight_matrix
    assert wm.ndim == 2 and np.shares_memory(wm, layer.params["weight"])
    wm[0, 0] = 123.0
    assert layer.params["weight"].reshape(-1)[0] == 123.0


# ------------------------------------------------------------------ contract details


def test_gradients_accumulate_until_zero_grad():
    layer = nn.Dense(3, 2, seed=0)
    x = np.random.default_rng(0).standard_normal((4, 3))
    dy = np.ones((4, 2))
    layer.forward(x)
    layer.backward(dy)
    once = layer.grads["weight"].copy()
    layer.forward(x)
    layer.backward(dy)
    np.testing.assert_allclose(layer.grads["weight"], 2 * once)
    layer.zero_grad()
    assert not layer.grads["weight"].any()


def test_backward_after_eval_forward_raises():
    layer = nn.Conv2d(1, 1, 3)
    layer.forward(np.zeros((1, 1, 4, 4)), train=False)
    with pytest.raises(RuntimeError):
        layer.backward(np.zeros((1, 1, 2, 2)))


@pytest.mark.parametrize(
    "layer,shape",
    [
        (nn.Dense(5, 3, seed=0), (2, 5)),
        (nn.Conv2d(2, 3, 3, stride=2, padding=1, seed=0), (2, 2, 5, 5)),
        (nn.DepthwiseConv2d(2, 3, padding=1, seed=0), (2, 2, 4, 4)),
        (nn.PointwiseConv2d(2, 3, seed=0), (2, 2, 4, 4)),
        (nn.ReLU(), (2, 3)),
        (nn.ReLU6(), (2, 3)),
        (nn.MaxPool2d(2), (2, 2, 4, 4)),
        (nn.AvgPool2d(2), (2, 2, 4, 4)),
        (nn.GlobalAvgPool2d(), (2, 2, 4, 4)),
        (nn.Flatten(), (2, 2, 4, 4)),
        (nn.BatchNorm(2), (3, 2, 4, 4)),
        (nn.StreamingBatchNorm(2, batch=4), (3, 2)),
    ],
    ids=repr,
)
def test_float32_in_float32_out(layer, shape):
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    y = layer.forward(x)
    assert y.dtype == np.float32
    dx = layer.backward(np.ones_like(y))
    assert dx.dtype == np.float32 and dx.shape == shape
    for g in layer.grads.values():
        assert g.dtype == np.float64


def test_float32_conv_matches_float64():
    layer = nn.Conv2d(2, 3, 3, padding=1, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 2, 5, 5))
    y64 = layer.forward(x, train=False)
    y32 = layer.forward(x.astype(np.float32), train=False)
    np.testing.assert_allclose(y32, y64, rtol=1e-5, atol=1e-5)


def test_float32_parameters():
    layer = nn.Conv2d(2, 3, 3, dtype=np.float32, seed=0)
    assert layer.params["weight"].dtype == np.float32 and layer.grads["weight"].dtype == np.float32


def test_shape_errors():
    with pytest.raises(ValueError):
        nn.Dense(4, 2).forward(np.zeros((3, 5)))
    with pytest.raises(ValueError):
        nn.Conv2d(3, 2, 3).forward(np.zeros((1, 2, 5, 5)))

"""PSG on the NumPy core: quantized forward/backward, eq. 2's signs from the integer spec, SignSGD."""

import numpy as np
import pytest

from insitu import numerics as nx
from insitu.e2train.psg import PSGLayer, PSGStats, SignSGD, psg_wrapper, quantize_tensor
from insitu.nn import Conv2d, Dense, ReLU, Sequential, softmax_cross_entropy

pytestmark = pytest.mark.unit


def _conv(seed=1):
    return Conv2d(2, 3, 3, padding=1, bias=False, seed=seed, dtype=np.float32)


def test_quantize_tensor_uses_the_max_abs_grid():
    x = np.array([0.3, -1.7, 0.01], dtype=np.float32)
    q, frac = quantize_tensor(x, 8)
    assert frac == nx.max_abs_format(x, 8).frac
    codes = np.ldexp(q.astype(np.float64), frac)
    assert np.array_equal(codes, np.round(codes)) and np.abs(codes).max() <= 127
    assert np.abs(q - x).max() <= 2.0 ** -frac / 2 + 1e-7


def test_psg_layer_signs_follow_the_integer_spec():
    rng = np.random.default_rng(0)
    layer = PSGLayer("c", _conv(), beta=0.05)
    x = rng.standard_normal((4, 2, 5, 5)).astype(np.float32)
    dy = rng.standard_normal((4, 3, 5, 5)).astype(np.float32)
    layer.forward(x)
    dx = layer.backward(dy)
    # The same computation by hand, from the spec.
    xq, x_frac = quantize_tensor(x, nx.PSG_ACTIVATION_BITS)
    dyq, dy_frac = quantize_tensor(dy, nx.PSG_GRADIENT_BITS)
    ref = Conv2d(2, 3, 3, padding=1, bias=False, dtype=np.float32)
    ref.params["weight"][...] = layer.params["weight"]
    ref.forward(xq)
    assert np.allclose(dx, ref.backward(dyq), atol=1e-5)       # dx: 8-bit weights, 16-bit dy
    dz, a = ref.kronecker_pairs()
    dz_codes = np.rint(np.ldexp(dz.reshape(-1, 3).astype(np.float64), dy_frac)).astype(np.int64)
    a_codes = np.rint(np.ldexp(a.reshape(-1, 18).astype(np.float64), x_frac)).astype(np.int64)
    g_full, g_msb = nx.psg_weight_gradient(dz_codes, a_codes)
    sign, predicted = nx.psg_sign(g_full, g_msb, nx.psg_threshold(g_msb, 0.05))
    assert np.array_equal(layer.grads["weight"].reshape(3, 18), sign)
    assert np.array_equal(layer.last_predicted, predicted)
    # The full-precision integer gradient is the float gradient of the quantized operands.
    float_grad = np.ldexp(g_full.astype(np.float64), -(dy_frac + x_frac))
    assert np.allclose(float_grad, ref.grads["weight"].reshape(3, 18), rtol=1e-4, atol=1e-4)
    assert layer.stats.total == sign.size and layer.stats.predicted == int(predicted.sum())


def test_beta_trades_predicted_signs_for_full_ones():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((8, 2, 6, 6)).astype(np.float32)
    dy = rng.standard_normal((8, 3, 6, 6)).astype(np.float32)
    fractions = []
    for beta in (0.01, 0.3, 0.9):
        layer = PSGLayer("c", _conv(), beta=beta)
        layer.forward(x)
        layer.backward(dy)
        fractions.append(layer.stats.fraction)
    assert fractions[0] > fractions[1] > fractions[2]
    assert fractions[0] > 0.8


def test_predicted_signs_agree_with_the_full_gradient_where_it_is_large():
    rng = np.random.default_rng(2)
    layer = PSGLayer("fc", Dense(64, 32, bias=False, seed=3, dtype=np.float32), beta=0.05)
    x = np.abs(rng.standard_normal((256, 64))).astype(np.float32)
    dy = rng.standard_normal((256, 32)).astype(np.float32)
    layer.forward(x)
    layer.backward(dy)
    exact = np.sign(dy.T.astype(np.float64) @ x)
    agree = (layer.grads["weight"] == exact)[layer.last_predicted].mean()
    assert agree > 0.95


def test_bad_beta_and_non_weight_layers_are_refused():
    for beta in (0.0, 1.0, -0.5, 1.5):
        with pytest.raises(ValueError, match=r"beta must be in \(0, 1\)"):
            psg_wrapper(beta)
    with pytest.raises(TypeError, match="weight layers"):
        PSGLayer("relu", ReLU())


def test_sign_sgd_steps_the_master_and_requantizes():
    wrap = psg_wrapper(0.05)
    model = Sequential(wrap("fc1", Dense(4, 8, seed=0, dtype=np.float32)), ReLU(),
                       wrap("fc2", Dense(8, 3, seed=1, dtype=np.float32)))
    opt = SignSGD(model, lr=0.01)
    master0 = {k: v.copy() for k, v in opt.master.items()}
    x = np.random.default_rng(0).standard_normal((16, 4)).astype(np.float32)
    y = np.arange(16) % 3
    opt.zero_grad()
    _, d = softmax_cross_entropy(model.forward(x), y)
    model.backward(d)
    signs = {p.key: p.grad.copy() for p in model.parameters()}
    opt.step()
    for key, master in opt.master.items():
        assert np.allclose(master, master0[key] - 0.01 * signs[key])
    layer = model[0]
    q, _ = quantize_tensor(opt.master["0.weight"], nx.PSG_WEIGHT_BITS)
    assert np.array_equal(layer.params["weight"], q)
    assert wrap.stats.total == 4 * 8 + 8 * 3
    # The optimizer state round-trips.
    state = opt.state_dict()
    opt2 = SignSGD(model, lr=0.01)
    opt2.load_state_dict(state)
    assert all(np.array_equal(opt2.master[k], v) for k, v in opt.master.items())


def test_psg_training_lowers_the_loss():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((128, 10)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 0)
    wrap = psg_wrapper(0.05, PSGStats())
    model = Sequential(wrap("fc1", Dense(10, 16, seed=0, dtype=np.float32)), ReLU(),
                       wrap("fc2", Dense(16, 3, seed=1, dtype=np.float32)))
    opt = SignSGD(model, lr=0.005)
    losses = []
    for _ in range(60):
        opt.zero_grad()
        loss, d = softmax_cross_entropy(model.forward(x), y)
        model.backward(d)
        opt.step()
        losses.append(loss)
    assert np.mean(losses[-5:]) < 0.7 * np.mean(losses[:5])
    assert 0.3 < wrap.stats.fraction <= 1.0

"""softmax cross-entropy (values, gradient, stability) and SGD update rules."""

import numpy as np
import pytest

import insitu.nn as nn
from insitu.nn.gradcheck import numerical_gradient, relative_error

pytestmark = pytest.mark.unit


def test_cross_entropy_value_matches_definition():
    logits = np.array([[2.0, 1.0, 0.1], [0.5, 2.5, -1.0]])
    labels = np.array([0, 2])
    p = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    loss, _ = nn.softmax_cross_entropy(logits, labels)
    assert loss == pytest.approx(-(np.log(p[0, 0]) + np.log(p[1, 2])) / 2, rel=1e-12)


def test_cross_entropy_gradient_matches_finite_differences():
    rng = np.random.default_rng(0)
    logits = rng.standard_normal((6, 4)) * 3
    labels = rng.integers(0, 4, size=6)
    _, d = nn.softmax_cross_entropy(logits, labels)
    num = numerical_gradient(lambda: nn.softmax_cross_entropy(logits, labels)[0], logits)
    assert relative_error(d, num) < 1e-7
    np.testing.assert_allclose(d.sum(axis=1), 0, atol=1e-15)  # softmax minus one-hot rows


def test_cross_entropy_is_stable_for_huge_logits():
    logits = np.array([[1e4, 0.0, -1e4], [0.0, 1e4, 1e4]])
    loss, d = nn.softmax_cross_entropy(logits, np.array([2, 0]))
    assert np.isfinite(loss) and np.all(np.isfinite(d))
    assert loss == pytest.approx((2e4 + 1e4 + np.log(2)) / 2)
    loss_ok, _ = nn.softmax_cross_entropy(logits, np.array([0, 1]))
    assert loss_ok == pytest.approx(np.log(2) / 2)


def test_cross_entropy_keeps_float32_and_checks_inputs():
    _, d = nn.softmax_cross_entropy(np.zeros((2, 3), dtype=np.float32), np.array([0, 1]))
    assert d.dtype == np.float32
    with pytest.raises(TypeError):
        nn.softmax_cross_entropy(np.zeros((2, 3)), np.array([0.0, 1.0]))
    with pytest.raises(ValueError):
        nn.softmax_cross_entropy(np.zeros((2, 3)), np.array([0, 1, 2]))


def test_mse_loss():
    pred, target = np.array([[1.0, 2.0]]), np.array([[0.0, 4.0]])
    loss, d = nn.mse_loss(pred, target)
    assert loss == pytest.approx(2.5)
    np.testing.assert_allclose(d, [[1.0, -2.0]])


def _layer_with(w, g):
    layer = nn.Dense(w.shape[1], w.shape[0], bias=False)
    layer.params["weight"][:] = w
    layer.grads["weight"][:] = g
    return layer


def test_sgd_plain_step_and_zero_grad():
    w, g = np.array([[1.0, -2.0]]), np.array([[0.5, 0.25]])
    layer = _layer_with(w, g)
    weight = layer.params["weight"]
    opt = nn.SGD(layer.parameters(), lr=0.1)
    opt.step()
    np.testing.assert_allclose(layer.params["weight"], w - 0.1 * g)
    assert layer.params["weight"] is weight  # updated in place
    opt.zero_grad()
    assert not layer.grads["weight"].any()


def test_sgd_momentum_and_weight_decay_follow_pytorch_rule():
    w0, g = np.array([[1.0, -2.0]]), np.array([[0.5, 0.25]])
    layer = _layer_with(w0, g)
    opt = nn.SGD(layer, lr=0.1, momentum=0.9, weight_decay=0.01)  # a layer works as source too
    w, v = w0.copy(), np.zeros_like(w0)
    for _ in range(3):
        opt.step()
        d = g + 0.01 * w
        v = 0.9 * v + d
        w = w - 0.1 * v
        np.testing.assert_allclose(layer.params["weight"], w, rtol=1e-12)


def test_sgd_over_a_model_touches_every_parameter():
    model = nn.Sequential(nn.Dense(3, 4, seed=0), nn.BatchNorm(4), nn.ReLU(), nn.Dense(4, 2, seed=1))
    before = {p.key: p.value.copy() for p in model.parameters()}
    assert set(before) == {"0.weight", "0.bias", "1.gamma", "1.beta", "3.weight", "3.bias"}
    for p in model.parameters():
        p.grad[...] = 1.0
    nn.SGD(model.parameters(), lr=0.5).step()
    for p in model.parameters():
        np.testing.assert_allclose(p.value, before[p.key] - 0.5)


def test_sgd_rejects_negative_hyperparameters():
    with pytest.raises(ValueError):
        nn.SGD([], lr=-1.0)


def test_sgd_momentum_state_resumes_step_for_step():
    """A run saved after two steps and resumed in a fresh optimizer ends where an uninterrupted
    one does (the velocities are the state)."""
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(16, 6)), rng.integers(0, 3, 16)

    def model():
        return nn.Sequential(nn.Dense(6, 8, seed=1), nn.ReLU(), nn.Dense(8, 3, seed=2))

    def step(net, opt, k):
        opt.zero_grad()
        net.backward(nn.softmax_cross_entropy(net.forward(x[4 * k:4 * k + 4], train=True), y[4 * k:4 * k + 4])[1])
        opt.step()

    straight = model()
    opt = nn.SGD(straight, lr=0.1, momentum=0.9, weight_decay=1e-3)
    assert opt.state_dict() == {}
    for k in range(4):
        step(straight, opt, k)
    first = model()
    opt1 = nn.SGD(first, lr=0.1, momentum=0.9, weight_decay=1e-3)
    for k in range(2):
        step(first, opt1, k)
    resumed = model()
    resumed.load_state_dict(first.state_dict())
    opt2 = nn.SGD(resumed, lr=0.1, momentum=0.9, weight_decay=1e-3)
    opt2.load_state_dict(opt1.state_dict())
    for k in range(2, 4):
        step(resumed, opt2, k)
    for key, value in straight.state_dict().items():
        np.testing.assert_array_equal(resumed.state_dict()[key], value, err_msg=key)

"""BatchNorm (train/eval, exact backward) and the LRT paper's streaming batch norm."""

import numpy as np
import pytest

import insitu.nn as nn
from insitu.nn.gradcheck import layer_gradient_errors

pytestmark = pytest.mark.unit

TOL = 1e-6


def randomize_affine(layer, seed=7):
    rng = np.random.default_rng(seed)
    layer.params["gamma"][:] = rng.uniform(0.5, 2.0, layer.num_features)
    layer.params["beta"][:] = rng.standard_normal(layer.num_features)


# ------------------------------------------------------------------ BatchNorm


@pytest.mark.parametrize("shape", [(5, 3), (3, 2, 3, 4), (1, 2, 3, 3)])
def test_batchnorm_train_gradients(shape):
    bn = nn.BatchNorm(shape[1])
    randomize_affine(bn)
    x = 2 + 3 * np.random.default_rng(11).standard_normal(shape)
    errs = layer_gradient_errors(bn, x)
    assert max(errs.values()) < TOL, errs


def test_batchnorm_train_normalizes_per_channel_and_updates_running_stats():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 3, 4, 4)) * np.array([1, 2, 3])[:, None, None] + np.array([5, -1, 0])[:, None, None]
    bn = nn.BatchNorm(3, momentum=0.25)
    y = bn.forward(x, train=True)
    np.testing.assert_allclose(y.mean(axis=(0, 2, 3)), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=(0, 2, 3)), 1, rtol=1e-4)  # eps=1e-5 shrinks it a hair
    m = 8 * 4 * 4
    np.testing.assert_allclose(bn.buffers["running_mean"], 0.25 * x.mean(axis=(0, 2, 3)))
    np.testing.assert_allclose(
        bn.buffers["running_var"], 0.75 + 0.25 * x.var(axis=(0, 2, 3)) * m / (m - 1)
    )


def test_batchnorm_eval_uses_running_stats_and_does_not_update():
    bn = nn.BatchNorm(2, eps=1e-3)
    randomize_affine(bn)
    bn.buffers["running_mean"][:] = [1.0, -2.0]
    bn.buffers["running_var"][:] = [4.0, 0.25]
    x = np.random.default_rng(0).standard_normal((3, 2))
    g, b = bn.params["gamma"], bn.params["beta"]
    expect = g * (x - [1.0, -2.0]) / np.sqrt(np.array([4.0, 0.25]) + 1e-3) + b
    np.testing.assert_allclose(bn.forward(x, train=False), expect)
    # Eval is per-sample: one sample alone gives the same row.
    np.testing.assert_allclose(bn.forward(x[1:2], train=False), expect[1:2])
    np.testing.assert_array_equal(bn.buffers["running_mean"], [1.0, -2.0])


def test_batchnorm_running_stats_converge_to_data_stats():
    rng = np.random.default_rng(1)
    bn = nn.BatchNorm(2)
    for _ in range(200):
        bn.forward(rng.normal([3.0, -1.0], [2.0, 0.5], size=(32, 2)))
    np.testing.assert_allclose(bn.buffers["running_mean"], [3.0, -1.0], atol=0.35)  # EMA noise ~0.08
    np.testing.assert_allclose(bn.buffers["running_var"], [4.0, 0.25], rtol=0.3)


def test_batchnorm_rejects_wrong_channel_count():
    with pytest.raises(ValueError):
        nn.BatchNorm(3).forward(np.zeros((2, 4)))


# ------------------------------------------------------------------ StreamingBatchNorm


def paper_stream(samples, B, eps):
    """Independent reference: the paper's per-sample update, with sigma_i^2 from np.var.

    Returns the normalized output of each sample (statistics include that sample) and the
    final (mu_s, sq_s). Initial state mu_s = 0, sq_s = 1.
    """
    eta = 1 - 1 / B
    c = samples.shape[1]
    mu_s, sq_s = np.zeros(c), np.ones(c)
    outs = []
    for xi in samples:
        per_ch = xi.reshape(c, -1)
        mu_i, var_i = per_ch.mean(axis=1), per_ch.var(axis=1)
        mu_s = eta * mu_s + (1 - eta) * mu_i
        sq_s = eta * sq_s + (1 - eta) * (var_i + mu_i**2)
        var_b = sq_s - mu_s**2
        shape = (c,) + (1,) * (xi.ndim - 1)
        outs.append((xi - mu_s.reshape(shape)) / np.sqrt(var_b.reshape(shape) + eps))
    return np.stack(outs), mu_s, sq_s


@pytest.mark.parametrize("shape", [(40, 3), (25, 2, 3, 3)])
def test_streaming_bn_follows_the_paper_recurrence(shape):
    rng = np.random.default_rng(0)
    loc = np.array([2.0, -1.0, 0.5])[: shape[1]]
    x = rng.standard_normal(shape) * 1.5 + loc.reshape((-1,) + (1,) * (len(shape) - 2))
    sbn = nn.StreamingBatchNorm(shape[1], batch=8, eps=1e-4)
    # Stream in uneven chunks (1, 2, 3, ...) to show chunking does not matter.
    outs, start, size = [], 0, 1
    while start < len(x):
        outs.append(sbn.forward(x[start : start + size], train=True))
        start, size = start + size, size + 1
    ref_y, ref_mu, ref_sq = paper_stream(x, 8, 1e-4)
    np.testing.assert_allclose(np.concatenate(outs), ref_y, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(sbn.buffers["running_mean"], ref_mu, rtol=1e-12)
    np.testing.assert_allclose(sbn.buffers["running_sq"], ref_sq, rtol=1e-12)
    np.testing.assert_allclose(sbn.running_var, ref_sq - ref_mu**2, rtol=1e-10)


def test_streaming_bn_weights_new_sample_by_one_over_b():
    sbn = nn.StreamingBatchNorm(1, batch=4)
    sbn.forward(np.array([[8.0]]))
    # mu_s = 3/4 * 0 + 1/4 * 8, sq_s = 3/4 * 1 + 1/4 * 64
    assert sbn.buffers["running_mean"][0] == pytest.approx(2.0)
    assert sbn.buffers["running_sq"][0] == pytest.approx(16.75)


def test_streaming_bn_eval_uses_state_without_updating():
    sbn = nn.StreamingBatchNorm(2, batch=10)
    randomize_affine(sbn)
    sbn.forward(np.random.default_rng(0).standard_normal((30, 2)) + 3)
    mu, sq = sbn.buffers["running_mean"].copy(), sbn.buffers["running_sq"].copy()
    x = np.random.default_rng(1).standard_normal((4, 2))
    y = sbn.forward(x, train=False)
    expect = sbn.params["gamma"] * (x - mu) / np.sqrt(sq - mu**2 + sbn.eps) + sbn.params["beta"]
    np.testing.assert_allclose(y, expect)
    np.testing.assert_array_equal(sbn.buffers["running_mean"], mu)
    np.testing.assert_array_equal(sbn.buffers["running_sq"], sq)


@pytest.mark.parametrize("shape", [(1, 3), (1, 2, 3, 3)])
def test_streaming_bn_single_sample_gradients_with_frozen_statistics(shape):
    sbn = nn.StreamingBatchNorm(shape[1], batch=5)
    randomize_affine(sbn)
    sbn.forward(np.random.default_rng(0).standard_normal((10,) + shape[1:]) + 1)  # non-trivial state
    # With one sample, the statistics its forward used are the state afterwards, so eval-mode
    # finite differences see exactly the "statistics are constants" function.
    errs = layer_gradient_errors(sbn, np.random.default_rng(1).standard_normal(shape), fd_train=False)
    assert max(errs.values()) < TOL, errs


def test_streaming_bn_backward_treats_each_samples_statistics_as_constants():
    sbn = nn.StreamingBatchNorm(2, batch=3)
    randomize_affine(sbn)
    x = np.random.default_rng(0).standard_normal((4, 2, 2, 2))
    y = sbn.forward(x)
    _, mu, sq = paper_stream(x, 3, sbn.eps)  # only the final state...
    dy = np.random.default_rng(1).standard_normal(y.shape)
    dx = sbn.backward(dy)
    # ...so rebuild each sample's statistics to get its scale.
    eta, mu_s, sq_s, scales = 1 - 1 / 3, np.zeros(2), np.ones(2), []
    for xi in x:
        mu_s = eta * mu_s + (1 - eta) * xi.mean(axis=(1, 2))
        sq_s = eta * sq_s + (1 - eta) * (xi**2).mean(axis=(1, 2))
        scales.append(sbn.params["gamma"] / np.sqrt(sq_s - mu_s**2 + sbn.eps))
    np.testing.assert_allclose(mu_s, mu)
    np.testing.assert_allclose(dx, dy * np.array(scales)[:, :, None, None], rtol=1e-12)
    xhat = (y - sbn.params["beta"][:, None, None]) / sbn.params["gamma"][:, None, None]
    np.testing.assert_allclose(sbn.grads["gamma"], (dy * xhat).sum(axis=(0, 2, 3)), rtol=1e-10)
    np.testing.assert_allclose(sbn.grads["beta"], dy.sum(axis=(0, 2, 3)), rtol=1e-12)


def test_streaming_bn_works_at_batch_size_one():
    sbn = nn.StreamingBatchNorm(4, batch=100)
    rng = np.random.default_rng(0)
    for _ in range(600):
        y = sbn.forward(rng.normal(5.0, 3.0, size=(1, 4)))
        assert np.all(np.isfinite(y))
    # After ~6 time constants the EMA state tracks the data: mean 5, variance 9.
    np.testing.assert_allclose(sbn.buffers["running_mean"], 5.0, atol=1.2)
    np.testing.assert_allclose(sbn.running_var, 9.0, rtol=0.4)


def test_streaming_bn_batch_one_hyperparameter():
    sbn = nn.StreamingBatchNorm(1, batch=1)  # eta = 0: only the current sample counts
    sbn.forward(np.array([[3.0], [7.0]]))
    assert sbn.buffers["running_mean"][0] == 7.0 and sbn.buffers["running_sq"][0] == 49.0
    with pytest.raises(ValueError):
        nn.StreamingBatchNorm(1, batch=0)

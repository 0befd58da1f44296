"""Sequential end to end: gradients through whole models and the loss, predict, state dicts,
and small training runs that must actually learn."""

import numpy as np
import pytest

import insitu.nn as nn
from insitu.nn.gradcheck import layer_gradient_errors, numerical_gradient, relative_error

pytestmark = pytest.mark.unit

TOL = 1e-6


def small_cnn(seed=0):
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, stride=1, padding=1, bias=False, seed=seed),  # BN cancels a bias
        nn.BatchNorm(4),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.DepthwiseConv2d(4, 3, stride=2, padding=1, seed=seed + 1),
        nn.ReLU6(),
        nn.PointwiseConv2d(4, 5, seed=seed + 2),
        nn.AvgPool2d(2, stride=1),
        nn.Flatten(),
        nn.Dense(5, 3, seed=seed + 3),
    )


def test_sequential_gradients_through_a_whole_cnn():
    model = small_cnn()
    for p in model.parameters():
        if p.name in ("bias", "beta"):
            p.value[:] = np.random.default_rng(9).standard_normal(p.value.shape) * 0.1
    x = np.random.default_rng(1).standard_normal((2, 2, 8, 8))
    errs = layer_gradient_errors(model, x)
    assert len(errs) == 1 + 9  # input + every parameter
    assert max(errs.values()) < TOL, errs


def test_gradients_of_loss_through_a_model():
    rng = np.random.default_rng(0)
    model = nn.Sequential(nn.Dense(4, 6, seed=0), nn.ReLU(), nn.BatchNorm(6), nn.Dense(6, 3, seed=1))
    x, labels = rng.standard_normal((5, 4)), rng.integers(0, 3, size=5)

    def loss():
        return nn.softmax_cross_entropy(model.forward(x), labels)[0]

    model.zero_grad()
    _, d = nn.softmax_cross_entropy(model.forward(x), labels)
    model.backward(d)
    for p in model.parameters():
        assert relative_error(p.grad, numerical_gradient(loss, p.value)) < TOL, p.key


def test_predict_in_batches_equals_one_eval_forward():
    model = small_cnn()
    model.forward(np.random.default_rng(2).standard_normal((4, 2, 8, 8)))  # move BN stats
    x = np.random.default_rng(3).standard_normal((7, 2, 8, 8))
    np.testing.assert_allclose(model.predict(x, batch_size=3), model.forward(x, train=False), rtol=1e-12)


def test_state_dict_round_trip():
    a, b = small_cnn(seed=0), small_cnn(seed=10)
    a.forward(np.random.default_rng(0).standard_normal((3, 2, 8, 8)))
    state = a.state_dict()
    assert "1.running_mean" in state and "0.weight" in state
    b.load_state_dict(state)
    x = np.random.default_rng(1).standard_normal((2, 2, 8, 8))
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    state["0.weight"] += 1  # a copy, not a view
    assert not np.array_equal(a.state_dict()["0.weight"], state["0.weight"])
    with pytest.raises(KeyError):
        b.load_state_dict({k: v for k, v in state.items() if k != "4.bias"})


def blobs(n, rng):
    """Two Gaussian blobs in 2-D, centres (-2, -2) and (2, 2), unit variance; ~0.1% overlap."""
    labels = rng.integers(0, 2, size=n)
    x = rng.standard_normal((n, 2)) + np.where(labels[:, None] == 1, 2.0, -2.0)
    return x, labels


def accuracy(model, x, labels):
    return float(np.mean(model.predict(x).argmax(axis=1) == labels))


def test_minibatch_training_learns_two_blobs():
    rng = np.random.default_rng(0)
    x, y = blobs(512, rng)
    xt, yt = blobs(512, rng)
    model = nn.Sequential(nn.Dense(2, 16, seed=1), nn.BatchNorm(16), nn.ReLU(), nn.Dense(16, 2, seed=2))
    # Start from a model that is bad on purpose: the last layer flipped.
    model[3].params["weight"][:] = -np.abs(model[3].params["weight"]) * [[1], [-1]]
    opt = nn.SGD(model.parameters(), lr=0.1, momentum=0.9)
    first = nn.softmax_cross_entropy(model.predict(x), y)[0]
    for epoch in range(5):
        for i in range(0, len(x), 32):
            opt.zero_grad()
            loss, d = nn.softmax_cross_entropy(model.forward(x[i : i + 32]), y[i : i + 32])
            model.backward(d)
            opt.step()
    last = nn.softmax_cross_entropy(model.predict(x), y)[0]
    assert last < 0.5 * first
    assert accuracy(model, xt, yt) > 0.97


def test_online_batch_one_training_with_streaming_bn_learns_two_blobs():
    # The LRT setting: one sample at a time, streaming batch norm instead of batch statistics.
    rng = np.random.default_rng(1)
    x, y = blobs(600, rng)
    x = x * 5 + 20  # badly scaled inputs, which the streaming norm must absorb
    xt, yt = blobs(300, rng)
    xt = xt * 5 + 20
    model = nn.Sequential(nn.StreamingBatchNorm(2, batch=20), nn.Dense(2, 8, seed=3), nn.ReLU(), nn.Dense(8, 2, seed=4))
    opt = nn.SGD(model.parameters(), lr=0.05)
    hits = []
    for xi, yi in zip(x, y):
        opt.zero_grad()
        logits = model.forward(xi[None])
        hits.append(logits.argmax() == yi)
        _, d = nn.softmax_cross_entropy(logits, np.array([yi]))
        model.backward(d)
        opt.step()
    assert np.mean(hits[-200:]) > 0.95  # online accuracy at the end of the stream
    assert accuracy(model, xt, yt) > 0.95


def test_conv_training_learns_bar_orientation():
    # 6x6 images with one vertical or one horizontal bar plus noise; the label is the orientation.
    rng = np.random.default_rng(2)

    def bars(n):
        labels = rng.integers(0, 2, size=n)
        img = 0.3 * rng.standard_normal((n, 1, 6, 6))
        pos = rng.integers(0, 6, size=n)
        idx = np.arange(n)
        img[idx[labels == 0], 0, :, pos[labels == 0]] += 1.0
        img[idx[labels == 1], 0, pos[labels == 1], :] += 1.0
        return img, labels

    x, y = bars(256)
    xt, yt = bars(256)
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1, seed=5), nn.ReLU(), nn.MaxPool2d(2), nn.GlobalAvgPool2d(), nn.Dense(4, 2, seed=6)
    )
    opt = nn.SGD(model.parameters(), lr=0.1, momentum=0.9)
    before = accuracy(model, xt, yt)
    for epoch in range(8):
        for i in range(0, len(x), 16):
            opt.zero_grad()
            _, d = nn.softmax_cross_entropy(model.forward(x[i : i + 16]), y[i : i + 16])
            model.backward(d)
            opt.step()
    after = accuracy(model, xt, yt)
    assert after > 0.9 and after > before

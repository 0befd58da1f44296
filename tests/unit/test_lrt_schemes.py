"""The quantized network and the online schemes: formats in the loop, when and what gets written."""

import numpy as np
import pytest

from insitu.data import load_dataset
from insitu.lrt.qnet import dense_net, paper_cnn
from insitu.lrt.schemes import LRTConfig, OnlineTrainer, evaluate, pretrain
from insitu.numerics import LRT_ACCUMULATOR, LRT_BIAS, LRT_WEIGHT


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    x = ds.float_images("train")[:, None].astype(np.float64)
    return x, ds.y_train.astype(np.int64), ds.float_images("test")[:, None].astype(np.float64), ds.y_test


def _on_grid(values, fmt):
    np.testing.assert_array_equal(fmt.quantize(values), values)


def _trained_mlp(digits, seed=0):
    x, y, _, _ = digits
    net = dense_net(sample_shape=(8, 8), hidden=(32,), seed=seed)
    pretrain(net, x[:600], y[:600], epochs=3, lr=0.05, seed=seed)
    return net


def test_pretraining_learns_and_leaves_a_valid_nvm_image(digits):
    _, _, xt, yt = digits
    net = _trained_mlp(digits)
    assert evaluate(net, xt, yt) > 0.6          # 10 classes: chance is 0.1
    for layer in net.weight_layers:
        _on_grid(layer.weight, LRT_WEIGHT)
    for _, value, _ in net.one_d_params():
        _on_grid(value, LRT_BIAS)


def test_cnn_forward_is_quantized_and_pairs_are_one_per_pixel():
    net = paper_cnn(seed=1)
    x = np.random.default_rng(0).random((2, 1, 28, 28))
    logits = net.forward(x)
    _on_grid(logits, LRT_ACCUMULATOR)
    net.backward(np.zeros_like(logits) + 0.25)
    dz, a = net.weight_layers[0].kronecker_pairs()
    assert dz.shape == (2, 784, 8) and a.shape == (2, 784, 9)


def _stream(trainer, x, y, n, start=0):
    return sum(trainer.step(x[i:i + 1], int(y[i])) for i in range(start, start + n))


def test_inference_writes_nothing_and_freezes_everything(digits):
    x, y, _, _ = digits
    net = _trained_mlp(digits)
    before = net.state_dict()
    trainer = OnlineTrainer(net, "inference")
    _stream(trainer, x, y, 50, start=600)
    after = net.state_dict()
    assert all(np.array_equal(before[k], after[k]) for k in before)
    assert trainer.total_writes() == 0


def test_bias_scheme_changes_only_one_d_parameters(digits):
    x, y, _, _ = digits
    net = _trained_mlp(digits)
    weights = [l.weight.copy() for l in net.weight_layers]
    biases = {k: v.copy() for k, v, _ in net.one_d_params()}
    trainer = OnlineTrainer(net, "bias")
    _stream(trainer, x, y, 50, start=600)
    assert all(np.array_equal(w, l.weight) for w, l in zip(weights, net.weight_layers))
    assert any(not np.array_equal(biases[k], v) for k, v, _ in net.one_d_params())
    assert trainer.total_writes() == 0
    for _, value, _ in net.one_d_params():
        _on_grid(value, LRT_BIAS)


def test_sgd_writes_every_sample_and_counts_code_changes(digits):
    x, y, _, _ = digits
    net = _trained_mlp(digits)
    trainer = OnlineTrainer(net, "sgd", LRTConfig(lr=0.5))
    before = [l.weight.copy() for l in net.weight_layers]
    _stream(trainer, x, y, 30, start=600)
    changed = sum(int(np.count_nonzero(b != l.weight)) for b, l in zip(before, net.weight_layers))
    assert 0 < changed <= trainer.total_writes()
    for layer in net.weight_layers:
        _on_grid(layer.weight, LRT_WEIGHT)
    # An update below half a weight LSB rounds away: no write at all.
    tiny = OnlineTrainer(_trained_mlp(digits), "sgd", LRTConfig(lr=1e-6))
    _stream(tiny, x, y, 30, start=600)
    assert tiny.total_writes() == 0


def test_sgd_on_convolutions_writes_once_per_pixel_update():
    net = paper_cnn(seed=2)
    trainer = OnlineTrainer(net, "sgd", LRTConfig(lr=2.0))
    x = np.random.default_rng(1).random((1, 1, 28, 28))
    trainer.step(x, 3)
    # conv1 has 72 cells and 784 pixel updates: a cell can be written many times in one sample
    assert trainer.arrays["conv1"].max_writes > 1
    # every pixel with a non-zero output gradient is one update operation on every cell
    dz, _ = net.weight_layers[0].kronecker_pairs()
    assert trainer.arrays["conv1"].update_ops == int(np.any(dz[0] != 0, axis=1).sum()) > 1


@pytest.mark.parametrize("scheme", ["lrt", "lrt-maxnorm"])
def test_lrt_writes_only_at_pseudo_batch_boundaries(digits, scheme):
    x, y, _, _ = digits
    net = _trained_mlp(digits)
    trainer = OnlineTrainer(net, scheme, LRTConfig(lr=0.05, dense_batch=20))
    _stream(trainer, x, y, 19, start=600)
    assert trainer.total_writes() == 0                  # still accumulating
    _stream(trainer, x, y, 1, start=619)
    summary = trainer.lrt_summary()
    assert all(s["pseudo_batches"] == 1 for s in summary.values())
    writes_at_20 = trainer.total_writes()
    assert writes_at_20 > 0
    # Every write happened at once: no cell was written more than once.
    assert trainer.max_writes_per_cell() == 1 and trainer.max_update_ops_per_cell() == 1
    for layer in net.weight_layers:
        _on_grid(layer.weight, LRT_WEIGHT)


def test_lrt_keeps_accumulating_below_the_minimum_density(digits):
    x, y, _, _ = digits
    net = _trained_mlp(digits)
    trainer = OnlineTrainer(net, "lrt", LRTConfig(lr=1e-4, dense_batch=10, rho_min=0.5))
    _stream(trainer, x, y, 40, start=600)
    assert trainer.total_writes() == 0
    state = next(iter(trainer.lrt.values()))
    assert state.attempts == 4 and state.samples == 40     # the effective batch grew to 40


def test_online_lrt_learns_from_scratch(digits):
    x, y, xt, yt = digits
    net = dense_net(sample_shape=(8, 8), hidden=(32,), seed=3)
    base = evaluate(net, xt, yt)
    trainer = OnlineTrainer(net, "lrt-maxnorm", LRTConfig(lr=0.03, dense_batch=10))
    for epoch in range(2):
        _stream(trainer, x, y, 1000)
    assert evaluate(net, xt, yt) > base + 0.2


def test_bad_configuration_is_refused():
    net = dense_net(sample_shape=(8, 8), hidden=(16,))
    with pytest.raises(ValueError, match="unknown scheme 'adam'"):
        OnlineTrainer(net, "adam")
    with pytest.raises(ValueError, match="conv_batch must be an integer >= 1"):
        OnlineTrainer(net, "lrt", LRTConfig(conv_batch=0))
    with pytest.raises(ValueError, match="lr must be a positive number"):
        OnlineTrainer(net, "lrt", LRTConfig(lr=float("nan")))


def test_step_refuses_batches_bad_labels_and_nan(digits):
    x, y, _, _ = digits
    trainer = OnlineTrainer(dense_net(sample_shape=(8, 8), hidden=(16,)), "sgd")
    with pytest.raises(ValueError, match="one sample at a time"):
        trainer.step(x[:3], 1)
    with pytest.raises(ValueError, match=r"label must be in \[0, 10\)"):
        trainer.step(x[:1], 10)
    with pytest.raises(ValueError, match=r"label must be in \[0, 10\)"):
        trainer.step(x[:1], -1)
    with pytest.raises(ValueError, match="NaN"):
        trainer.step(np.full_like(x[:1], np.nan), 1)
    assert trainer.samples == 0 and trainer.total_writes() == 0

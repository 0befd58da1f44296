"""The float reference of int8 training (float SGD on the dequantized graph)."""

import numpy as np
import pytest

from insitu import nn
from insitu.sparse import scheme as S
from insitu.sparse.calibrate import calibrate_gradients
from insitu.sparse.compiler import Options, compile_training
from insitu.sparse.graph import random_graph
from insitu.sparse.reference import FloatReference
from insitu.sparse.simulate import Simulator

pytestmark = pytest.mark.unit


def _data(g, n, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, size=(n, 1) + g.tensors[g.input].shape[1:]).astype(np.int8)
    return x, rng.integers(0, g.num_classes, size=n)


def _loss(ref, x, y):
    z = ref.forward(x)
    z = z - z.max(axis=1, keepdims=True)
    return float(-(z[0, y] - np.log(np.exp(z[0]).sum())))


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_gradient_is_the_loss_derivative(seed):
    g = random_graph(seed)
    ref = FloatReference(g, S.full_update(g), lr=0.0)
    x, y = _data(g, 1, seed)
    xf = x.astype(np.float64) * g.tensors[g.input].scale
    logits = ref.forward(xf, train=True)
    p = nn.functional.softmax(logits, axis=1)
    p[0, y[0]] -= 1
    ref.backward(p)
    rng = np.random.default_rng(seed)
    for n in g.convs:
        layer = ref.layers[n.name]
        for key in ("weight", "bias"):
            if key == "weight" and not layer.compute_weight_grad:
                continue
            a = layer.params[key]
            i = np.unravel_index(int(rng.integers(a.size)), a.shape)
            analytic = float(layer.grads[key][i])
            old, eps = a[i], 1e-6
            a[i] = old + eps
            up = _loss(ref, xf, y[0])
            a[i] = old - eps
            down = _loss(ref, xf, y[0])
            a[i] = old
            assert analytic == pytest.approx((up - down) / (2 * eps), rel=1e-4, abs=1e-7), (n.name, key)


def test_only_the_schemes_tensors_move():
    g = random_graph(3)
    convs = [c.name for c in g.convs]
    scheme = S.Scheme(2, {convs[-2]: 0.5, convs[-1]: 1.0})
    ref = FloatReference(g, scheme, lr=0.1)
    before = {k: {p: v.copy() for p, v in ref.layers[k].params.items()} for k in convs}
    x, y = _data(g, 8)
    ref.train(x, y)
    bias_layers = set(scheme.bias_layers(g))
    for n in g.convs:
        w_moved = np.any(ref.layers[n.name].params["weight"] != before[n.name]["weight"], axis=(1, 2, 3))
        b_moved = ref.layers[n.name].params["bias"] != before[n.name]["bias"]
        if n.name in scheme.weights:
            assert not w_moved[np.setdiff1d(np.arange(n.out_channels), scheme.selected_channels(n))].any()
            assert w_moved[scheme.selected_channels(n)].any()
        else:
            assert not w_moved.any()
        assert b_moved.any() == (n.name in bias_layers)


def test_the_head_learns_faster_with_its_own_rate():
    g = random_graph(4)
    x, y = _data(g, 4)
    head = g.convs[-1].name
    a, b = (FloatReference(g, S.classifier_only(g), lr=0.01, lr_scale=scale) for scale in ({}, {head: 3.0}))
    a.train(x[:1], y[:1])
    b.train(x[:1], y[:1])
    w0 = g.convs[-1].weight * g.convs[-1].w_scale.reshape(-1, 1, 1, 1)
    step_a = a.layers[head].params["weight"] - w0
    step_b = b.layers[head].params["weight"] - w0
    assert np.allclose(step_b, 3.0 * step_a)


@pytest.mark.parametrize("seed", [0, 5])
def test_int8_training_follows_the_float_reference(seed):
    """A classifier-only update in int8 (QAS) moves the head's weights as float SGD does."""
    g = random_graph(seed)
    x, y = _data(g, 16, seed)
    scheme = S.classifier_only(g)
    c = compile_training(g, scheme, calibrate_gradients(g, x, y), Options(lr=0.05))
    sim = Simulator(c)
    ref = FloatReference(g, scheme, lr=0.05)
    sim.train(x, y)
    ref.train(x, y)
    head = g.convs[-1]
    buf = next(b for b in c.buffers if b.name == f"w:{head.name}")
    w8 = sim.A[buf.offset:buf.offset + head.weight.size].view(np.int8).reshape(head.weight.shape)
    moved8 = (w8.astype(float) - head.weight) * head.w_scale.reshape(-1, 1, 1, 1)
    movedf = ref.layers[head.name].params["weight"] - head.weight * head.w_scale.reshape(-1, 1, 1, 1)
    cos = (moved8 * movedf).sum() / (np.linalg.norm(moved8) * np.linalg.norm(movedf))
    assert cos > 0.8

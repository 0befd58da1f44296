"""TTNet: float gradients, the fixed-point (BinaryConnect) network against float, clipping, pruning,
the paper's memory figures, input padding; and the Adam optimizer the TT training uses."""

import numpy as np
import pytest

from insitu import nn
from insitu.nn.gradcheck import numerical_gradient, relative_error
from insitu.numerics import TT_BIAS, tt_factor_format
from insitu.tt.model import PADDED_IMAGE, TTNet, pad_images
from insitu.tt.prior import update_lambdas

pytestmark = pytest.mark.unit

#: A tiny two-layer TT network: 32 = 2x16 -> 32 = 2x16 -> 16 = 1x16, TT rank 3 (the last input
#: mode of each layer is a multiple of the PEs' 16 lanes, as PE3 needs).
TINY = (((2, 16), (2, 16)), ((2, 16), (1, 16)))
WIDTH = 32


def _tiny(quantized=False, seed=0, rank=3):
    return TTNet(layers=TINY, rank=rank, quantized=quantized, seed=seed)


def _batch(seed=0, n=64):
    """Inputs on the 1/32 grid (exact at the 8-bit activation scale the fixed network picks for
    them), labels of the 10 classes."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, 32, (n, WIDTH)) / 32, rng.integers(0, 10, n)


def _gradients(net, x, y):
    logits = net.forward(x)
    _, dlogits = nn.softmax_cross_entropy(logits, y)
    net.backward(dlogits)
    return logits, {k: g.copy() for k, g in net.grads.items()}


def _cosine(a, b):
    a, b = a.ravel(), b.ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


# ------------------------------------------------------------------------------ float gradients

def test_float_gradients_match_finite_differences():
    net = _tiny(seed=1)
    rng = np.random.default_rng(5)
    for bias in net.biases:
        bias[...] = rng.standard_normal(bias.shape) * 0.1
    x, y = rng.standard_normal((6, WIDTH)), rng.integers(0, 10, 6)
    _, grads = _gradients(net, x, y)
    assert sorted(grads) == ["l0.bias", "l0.g1", "l0.g2", "l1.bias", "l1.g1", "l1.g2"]

    def loss():
        return nn.softmax_cross_entropy(net.forward(x, train=False), y)[0]

    for key, value in net.params.items():
        assert value.dtype == np.float64
        num = numerical_gradient(loss, value)
        assert relative_error(grads[key], num) < 1e-6, key
        assert np.any(grads[key]), key
    # The 6 padding outputs beyond the 10 classes get no gradient.
    assert not np.any(grads["l1.bias"][10:])


def test_params_are_the_cores_and_biases_themselves():
    net = _tiny()
    assert net.params["l0.g1"] is net.ttms[0].cores[0]
    assert net.params["l1.g2"] is net.ttms[1].cores[1]
    assert net.params["l1.bias"] is net.biases[1]
    assert net.ranks == [[1, 3, 1], [1, 3, 1]]


def test_backward_replaces_gradients_rather_than_accumulating():
    net = _tiny()
    x, y = _batch()
    _, first = _gradients(net, x, y)
    _, second = _gradients(net, x, y)
    for key in first:
        np.testing.assert_array_equal(first[key], second[key])


def test_forward_checks_the_input_width_and_backward_needs_a_forward():
    net = _tiny()
    with pytest.raises(ValueError, match="pad_images"):
        net.forward(np.zeros((2, 7)))
    with pytest.raises(RuntimeError):
        net.backward(np.zeros((2, 10)))


def test_bad_construction_is_refused():
    with pytest.raises(ValueError, match="rank"):
        TTNet(layers=TINY, rank=0)
    with pytest.raises(ValueError, match="chain"):
        TTNet(layers=(((2, 16), (2, 16)), ((4, 16), (1, 16))), rank=2)
    with pytest.raises(ValueError, match="classes"):
        TTNet(layers=TINY, rank=2, classes=17)


# ------------------------------------------------------------------------------ fixed point

def _float_twin(qnet, seed):
    """The float network with the fixed network's 4-bit factor values (what its PEs compute with)."""
    fnet = _tiny(seed=seed)
    for tq, tf, fracs in zip(qnet.ttms, fnet.ttms, qnet.core_fracs):
        for n, (core, frac) in enumerate(zip(tq.cores, fracs)):
            tf.cores[n][...] = tt_factor_format(frac).quantize(core)
    return fnet


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fixed_gradients_follow_float_gradients_of_the_quantized_factors(seed):
    qnet = _tiny(quantized=True, seed=seed)
    fnet = _float_twin(qnet, seed)
    # The shadow factors are not on the 4-bit grid; the twin's are.
    assert not np.array_equal(qnet.ttms[0].cores[0], fnet.ttms[0].cores[0])
    x, y = _batch(seed)
    q_logits, q_grads = _gradients(qnet, x, y)
    f_logits, f_grads = _gradients(fnet, x, y)
    assert np.linalg.norm(q_logits - f_logits) < 0.1 * np.linalg.norm(f_logits)
    assert set(q_grads) == set(f_grads)
    for key in f_grads:
        assert q_grads[key].shape == f_grads[key].shape
        assert _cosine(q_grads[key], f_grads[key]) > 0.95, key
        ratio = np.linalg.norm(q_grads[key]) / np.linalg.norm(f_grads[key])
        assert 0.8 < ratio < 1.25, key


def test_fixed_forward_is_deterministic_and_inference_leaves_the_scales_alone():
    qnet = _tiny(quantized=True, seed=4)
    x, y = _batch(4)
    first = qnet.forward(x, train=False)
    np.testing.assert_array_equal(qnet.forward(x, train=False), first)
    _gradients(qnet, x, y)                                     # a training pass sets the scales
    scales = qnet.executor.state()
    act = {k: s.frac for k, s in qnet.act_scales.items()}
    a = qnet.forward(x, train=False)
    b = qnet.forward(x, train=False)
    np.testing.assert_array_equal(a, b)
    assert qnet.executor.state() == scales
    assert {k: s.frac for k, s in qnet.act_scales.items()} == act
    # The fixed network computes on the 4-bit factors, not the shadows.
    shadows = _tiny(quantized=False, seed=4)
    assert not np.array_equal(a, shadows.forward(x, train=False))


def test_after_step_clips_shadow_factors_and_biases_and_updates_lambdas():
    qnet = _tiny(quantized=True, seed=2)
    for ttm in qnet.ttms:
        for core in ttm.cores:
            core *= 100.0                                      # far beyond the 4-bit grid
    qnet.biases[0][...] = np.linspace(-50, 50, qnet.biases[0].size)
    qnet.biases[1][...] = 0.25
    stale = [[lam.copy() for lam in layer] for layer in qnet.lambdas]
    qnet.after_step()
    for ttm, fracs in zip(qnet.ttms, qnet.core_fracs):
        for core, frac in zip(ttm.cores, fracs):
            fmt = tt_factor_format(frac)
            assert core.min() >= fmt.min_value and core.max() <= fmt.max_value
            assert np.isin(core, [fmt.min_value, fmt.max_value]).any()          # some did clip
    assert qnet.biases[0].min() == TT_BIAS.min_value == -2.0
    assert qnet.biases[0].max() == TT_BIAS.max_value
    np.testing.assert_array_equal(qnet.biases[1], 0.25)        # inside the range: untouched
    for ttm, lams, old in zip(qnet.ttms, qnet.lambdas, stale):
        for lam, expected, before in zip(lams, update_lambdas(ttm.cores), old):
            np.testing.assert_allclose(lam, expected, rtol=1e-12)
            assert not np.allclose(lam, before)


def test_after_step_of_the_float_network_does_not_clip():
    net = _tiny()
    net.ttms[0].cores[0] *= 100.0
    net.biases[0][...] = 50.0
    before = net.ttms[0].cores[0].copy()
    net.after_step()
    np.testing.assert_array_equal(net.ttms[0].cores[0], before)
    np.testing.assert_array_equal(net.biases[0], 50.0)
    np.testing.assert_allclose(net.lambdas[0][0], update_lambdas(net.ttms[0].cores)[0])


def test_add_prior_grads_adds_weight_times_the_prior_gradient():
    net = _tiny()
    x, y = _batch()
    _, data_grads = _gradients(net, x, y)
    net.add_prior_grads(0.5)
    core = net.ttms[0].cores[0]
    np.testing.assert_allclose(net.grads["l0.g1"], data_grads["l0.g1"] + core / net.lambdas[0][0],
                               rtol=1e-12)
    np.testing.assert_array_equal(net.grads["l0.g2"], data_grads["l0.g2"])   # last core: no prior
    np.testing.assert_array_equal(net.grads["l0.bias"], data_grads["l0.bias"])


# ------------------------------------------------------------------------------ pruning

def test_prune_removes_exactly_the_zeroed_slice_and_keeps_the_function():
    net = _tiny(seed=3)
    x, y = _batch(3)
    optimizer = nn.Adam(net, lr=1e-2)
    _gradients(net, x, y)
    optimizer.step()                                           # Adam state to slice
    net.ttms[0].cores[0][..., 1] = 0.0
    net.after_step()
    assert net.lambdas[0][0][1] == 0.0
    full_before = net.ttms[0].full()
    other_before = net.ttms[1].full()
    logits_before = net.forward(x, train=False)
    state_before = {k: {n: v.copy() for n, v in st.items()} for k, st in optimizer.state.items()}

    assert net.prune(0.01, optimizer) == 1
    assert net.ranks == [[1, 2, 1], [1, 3, 1]]
    np.testing.assert_allclose(net.ttms[0].full(), full_before, rtol=1e-12, atol=1e-15)
    np.testing.assert_array_equal(net.ttms[1].full(), other_before)
    np.testing.assert_allclose(net.forward(x, train=False), logits_before, rtol=1e-12, atol=1e-12)
    assert net.params["l0.g1"].shape == net.grads["l0.g1"].shape == (1, 2, 2, 2)
    assert net.params["l0.g2"].shape == net.grads["l0.g2"].shape == (2, 16, 16, 1)
    assert net.params["l0.g1"] is net.ttms[0].cores[0]
    for name in ("m", "v"):
        np.testing.assert_array_equal(optimizer.state["l0.g1"][name],
                                      np.delete(state_before["l0.g1"][name], 1, axis=3))
        np.testing.assert_array_equal(optimizer.state["l0.g2"][name],
                                      np.delete(state_before["l0.g2"][name], 1, axis=0))
        np.testing.assert_array_equal(optimizer.state["l1.g1"][name], state_before["l1.g1"][name])
    assert [len(lam) for lam in net.lambdas[0]] == [2]

    # Training goes on with the smaller cores; the sliced moments are used, not reset.
    m_kept = optimizer.state["l0.g1"]["m"].copy()
    _, grads = _gradients(net, x, y)
    optimizer.step()
    np.testing.assert_allclose(optimizer.state["l0.g1"]["m"], 0.9 * m_kept + 0.1 * grads["l0.g1"])


def test_prune_with_nothing_below_threshold_changes_nothing():
    net = _tiny(seed=3)
    params = dict(net.params)
    assert net.prune(0.0) == 0
    assert net.ranks == [[1, 3, 1], [1, 3, 1]]
    assert all(net.params[k] is v for k, v in params.items())


# ------------------------------------------------------------------------------ Table 1 memory

def test_paper_network_parameters_and_memory_match_table_1():
    float_net, fixed_net = TTNet(), TTNet(quantized=True)
    assert float_net.ranks == [[1, 16, 16, 16, 1], [1, 16, 1]]
    assert float_net.parameter_count == fixed_net.parameter_count == 14800
    assert float_net.factor_count == 14800 - 512 - 16
    assert float_net.memory_bits == 14800 * 32
    assert fixed_net.memory_bits == 61312                      # 4-bit factors, 8-bit biases


# ------------------------------------------------------------------------------ padding

def test_pad_images_pads_28x28_to_28x32_with_zero_columns_on_the_right():
    rng = np.random.default_rng(0)
    images = rng.random((3, 28, 28)) + 0.1
    padded = pad_images(images)
    assert padded.shape == (3, 896) and PADDED_IMAGE == (28, 32)
    grid = padded.reshape(3, 28, 32)
    np.testing.assert_array_equal(grid[:, :, :28], images)
    assert not np.any(grid[:, :, 28:])
    np.testing.assert_array_equal(pad_images(images.reshape(3, 784)), padded)


@pytest.mark.parametrize("shape", [(2, 27, 27), (2, 28, 32), (2, 783)])
def test_pad_images_rejects_other_image_sizes(shape):
    with pytest.raises(ValueError, match="28x28"):
        pad_images(np.zeros(shape))


# ------------------------------------------------------------------------------ Adam

def test_adam_first_two_steps_match_hand_computation():
    layer = nn.Dense(2, 1, bias=False)
    layer.params["weight"][...] = [[1.0, -2.0]]
    opt = nn.Adam(layer, lr=0.1)                               # betas (0.9, 0.999), eps 1e-8
    layer.grads["weight"][...] = [[0.5, -3.0]]
    opt.step()
    # Step 1: m_hat = g, v_hat = g^2, so w -= lr * g / (|g| + eps).
    np.testing.assert_allclose(layer.params["weight"], [[0.900000002, -1.9000000003333333]], rtol=1e-14)
    layer.grads["weight"][...] = [[-1.0, 0.0]]
    opt.step()
    # Step 2, first element: m = 0.9*0.05 + 0.1*(-1) = -0.055, v = 0.999*0.00025 + 0.001 = 0.00124975,
    # w -= 0.1 * (m / 0.19) / (sqrt(v / 0.001999) + 1e-8). Second: g = 0, only the momentum moves it.
    np.testing.assert_allclose(layer.params["weight"], [[0.9366103542405654, -1.832994175235627]],
                               rtol=1e-12)
    assert opt.steps == 2
    np.testing.assert_allclose(opt.state["weight"]["m"], [[-0.055, -0.27]], rtol=1e-12)


@pytest.mark.parametrize("kwargs", [{"lr": 0.0}, {"lr": -1e-3}, {"betas": (1.0, 0.999)}, {"eps": 0.0}])
def test_adam_rejects_bad_hyperparameters(kwargs):
    with pytest.raises(ValueError, match="Adam needs"):
        nn.Adam(nn.Dense(2, 1), **kwargs)

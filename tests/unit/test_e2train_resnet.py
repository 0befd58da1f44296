"""insitu.e2train.resnet / gates: the small ResNet and SLU's gates (subset execution, gradients,
the eq. 1 regularizer and its anti-collapse rule, counting what ran)."""

import numpy as np
import pytest

from insitu import nn
from insitu.e2train.gates import RNNGates
from insitu.e2train.resnet import ResNet
from insitu.nn.gradcheck import numerical_gradient, relative_error

pytestmark = pytest.mark.unit


class Spy(nn.Layer):
    """A layer_wrapper that records how many samples each forward/backward saw."""

    def __init__(self, name, inner, log):
        super().__init__()
        self.name, self.inner, self.log = name, inner, log
        self.params, self.grads, self.buffers = inner.params, inner.grads, inner.buffers

    def forward(self, x, train=True):
        self.log.append((self.name, "fwd", x.shape[0]))
        return self.inner.forward(x, train)

    def backward(self, dy):
        self.log.append((self.name, "bwd", dy.shape[0]))
        return self.inner.backward(dy)


def spy_model(log, **kw):
    kw = {"in_channels": 1, "num_classes": 3, "w0": 2, "blocks_per_stage": 2, "seed": 1,
          "dtype": np.float64, **kw}
    return ResNet(layer_wrapper=lambda name, layer: Spy(name, layer, log), **kw)


def batch(n=4, c=1, hw=6, seed=0, dtype=np.float64):
    return np.random.default_rng(seed).standard_normal((n, c, hw, hw)).astype(dtype)


# ---------------------------------------------------------------------------------- structure

def test_shapes_names_and_specs():
    m = ResNet(in_channels=3, num_classes=7, w0=4, blocks_per_stage=2, gated=True, input_size=8)
    x = batch(5, 3, 8, dtype=np.float32)
    logits = m.forward(x, train=True)
    assert logits.shape == (5, 7) and logits.dtype == np.float32
    assert m.gated_blocks == ["s1.b0", "s1.b1", "s2.b1", "s3.b1"]   # projection blocks not gated
    names = list(m.weight_layers())
    assert names[0] == "stem.conv" and names[-1] == "fc"
    assert "s2.b0.short.conv" in names and "s1.b0.short.conv" not in names
    assert len([n for n in names if n != "fc"]) == 1 + 3 * 2 * 2 + 2     # 6n+2 - fc, + 2 shortcuts
    specs = {s["name"]: s for s in m.layer_specs()}
    assert set(m.executed) == set(specs)            # every counted layer has a spec
    assert specs["stem.conv"]["macs"] == 4 * 8 * 8 * 3 * 9
    assert specs["s2.b0.conv1"]["macs"] == 8 * 4 * 4 * 4 * 9 and specs["s2.b0.conv1"]["in_elems"] == 4 * 64
    assert specs["s1.b1.conv2"]["block"] == "s1.b1" and specs["s2.b0.conv1"]["block"] is None
    assert specs["s1.b1.gate"]["kind"] == "gate" and specs["fc"]["kind"] == "dense"
    assert sum(s["weight_elems"] for s in specs.values()) == sum(p.value.size for p in m.parameters())
    keys = [p.key for p in m.parameters()]
    assert len(keys) == len(set(keys)) and "gates.lstm.w_ih" in keys and "s1.b0.bn1.gamma" in keys
    with pytest.raises(ValueError, match="8x8"):
        m.forward(batch(2, 3, 6, dtype=np.float32))
    with pytest.raises(ValueError, match="input size"):
        ResNet(1, 3, w0=2, blocks_per_stage=1).layer_specs()


def test_state_dict_round_trip_includes_buffers_and_gates():
    a = ResNet(1, 3, w0=2, blocks_per_stage=1, gated=True, seed=1)
    b = ResNet(1, 3, w0=2, blocks_per_stage=1, gated=True, seed=2)
    a.forward(batch(4, dtype=np.float32))                  # moves BN running statistics
    state = a.state_dict()
    assert "stem.bn.running_mean" in state and "gates.out.bias" in state
    b.load_state_dict(state)
    x = batch(3, seed=5, dtype=np.float32)
    np.testing.assert_array_equal(a.predict(x), b.predict(x))
    with pytest.raises(KeyError):
        b.load_state_dict({k: v for k, v in state.items() if k != "fc.bias"})


def test_gating_a_network_without_identity_blocks_is_an_error():
    with pytest.raises(ValueError, match="identity shortcut.*has none"):
        ResNet(1, 3, w0=2, blocks_per_stage=0, gated=True)
    ResNet(1, 3, w0=2, blocks_per_stage=0, gated=False).forward(batch(2, dtype=np.float32))


# ---------------------------------------------------------------------------------- gradients

def _check_main_gradients(m, x, keep=lambda key: not key.startswith("gates."), tol=1e-5):
    snapshot = {k: v.copy() for k, v in m.named_buffers()}
    m.zero_grad()
    y = m.forward(x, train=True)
    r = np.random.default_rng(3).standard_normal(y.shape)
    dx = m.backward(r)
    analytic = {p.key: p.grad.copy() for p in m.parameters()}

    def loss():
        out = float(np.sum(m.forward(x, train=True) * r))
        for k, v in m.named_buffers():
            v[...] = snapshot[k]
        return out

    errors = {"input": relative_error(dx, numerical_gradient(loss, x))}
    for p in m.parameters():
        if keep(p.key):
            errors[p.key] = relative_error(analytic[p.key], numerical_gradient(loss, p.value))
    bad = {k: e for k, e in errors.items() if e > tol}
    assert not bad, bad
    return analytic


def test_gradcheck_ungated_model():
    m = ResNet(1, 3, w0=2, blocks_per_stage=1, seed=4, dtype=np.float64)
    _check_main_gradients(m, batch(3, hw=6))


def test_gradcheck_gated_model_with_fixed_decisions():
    m = ResNet(1, 3, w0=2, blocks_per_stage=2, gated=True, seed=4, dtype=np.float64)
    # gate 0: partial, gate 1: nobody, gate 2: everybody, gate 3: partial
    m.decision_override = np.array([[1, 0, 1, 0], [0, 0, 1, 1], [1, 0, 1, 1], [0, 0, 1, 0]], bool)
    # (s3's 3x3 convs and the projection blocks are left to the ungated check: time)
    analytic = _check_main_gradients(
        m, batch(4, hw=6), keep=lambda k: k.startswith(("stem.", "s1.", "s2.b1.", "s3.b1.bn", "fc.")))
    # the block nobody executed gets no gradient at all
    for k in ("s1.b1.conv1.weight", "s1.b1.conv2.weight", "s1.b1.bn1.gamma", "s1.b1.bn2.beta"):
        assert not analytic[k].any(), k


def test_rnn_gates_backward_through_time_matches_finite_differences():
    rng = np.random.default_rng(0)
    gates = RNNGates([3, 0, 5], hidden=4, seed=1, dtype=np.float64, init_bias=0.3)
    for v in gates.params.values():                        # away from the initial special values
        v += 0.3 * rng.standard_normal(v.shape)
    seq = [(0, rng.standard_normal((6, 3))), (0, rng.standard_normal((6, 3))), (2, rng.standard_normal((6, 5)))]
    r = [rng.standard_normal(6) for _ in seq]

    def loss():
        gates.reset(6, train=False)
        return float(sum(np.sum(gates.step(s, u) * rk) for (s, u), rk in zip(seq, r)))

    gates.zero_grad()
    gates.reset(6, train=True)
    for s, u in seq:
        gates.step(s, u)
    gates.backward(r)
    for p in gates.parameters():
        err = relative_error(p.grad, numerical_gradient(loss, p.value))
        assert err < 1e-6, (p.key, err)


def test_straight_through_gate_gradient():
    """dL/dp = <dL/dpre, F(x)> for executed samples (dL/dd at d = 1 of ReLU(x + d F)), 0 for
    skipped: checked against differencing a soft scale on the residual branch."""
    m = ResNet(1, 3, w0=2, blocks_per_stage=1, gated=True, seed=2, dtype=np.float64, slu_alpha=0.0)
    x = batch(4, hw=6)
    m.decision_override = np.array([[1], [0], [1], [1]], bool)
    m.zero_grad()
    y = m.forward(x)
    r = np.random.default_rng(1).standard_normal(y.shape)
    blk = m.blocks[0]
    captured = {}
    orig_backward = m.gates.backward
    m.gates.backward = lambda dps: captured.setdefault("dp", dps[0].copy())
    m.backward(r)
    m.gates.backward = orig_backward
    # finite differences of L(d) with out = ReLU(x + d * F) for sample n, via a patched bn2
    fd = np.zeros(4)
    for n in (0, 2, 3):
        vals = []
        for eps in (1e-6, -1e-6):
            scale = np.ones(4)
            scale[n] += eps
            bn2_fwd = blk.bn2.forward
            idx = np.flatnonzero(m.decision_override[:, 0])
            blk.bn2.forward = lambda h, train=True, f=bn2_fwd, s=scale[idx]: f(h, train) * s[:, None, None, None]
            snapshot = {k: v.copy() for k, v in m.named_buffers()}
            vals.append(float(np.sum(m.forward(x) * r)))
            for k, v in m.named_buffers():
                v[...] = snapshot[k]
            blk.bn2.forward = bn2_fwd
        fd[n] = (vals[0] - vals[1]) / 2e-6
    assert captured["dp"][1] == 0
    np.testing.assert_allclose(captured["dp"], fd, rtol=1e-5, atol=1e-9)


def test_regularizer_gradient_matches_eq1_cost():
    m = ResNet(1, 3, w0=2, blocks_per_stage=2, gated=True, seed=3, dtype=np.float64,
               slu_alpha=0.7, target_skip=1.0)                # unhinged eq. 1
    x = batch(4, hw=6)
    m.zero_grad()
    logits = m.forward(x)
    m.backward(np.zeros_like(logits))                          # only the regularizer drives the gates
    assert 0 < m.slu_cost <= 1

    snapshot = {k: v.copy() for k, v in m.named_buffers()}

    def cost():
        m.forward(x, train=True)                               # same BN statistics as above
        for k, v in m.named_buffers():
            v[...] = snapshot[k]
        return m.slu_alpha * m.slu_cost

    for key in ("out.bias", "out.weight", "lstm.w_hh", "proj0.weight", "proj2.bias"):
        err = relative_error(m.gates.grads[key], numerical_gradient(cost, m.gates.params[key]))
        assert err < 1e-4, (key, err)            # w_hh: small entries, FD noise ~1e-6
    # the set-point rule: past the target the push reverses, at alpha = 0 it is off
    m.target_skip, m.skip_ratio = 0.3, 0.5
    assert m.regularizer_sign() == -1
    m.skip_ratio = 0.1
    assert m.regularizer_sign() == 1
    m.slu_alpha = 0.0
    assert m.regularizer_sign() == 0


# ---------------------------------------------------------------------------------- skipping

def test_skipped_blocks_do_no_work_and_subsets_are_computed():
    log = []
    m = spy_model(log, gated=True)
    m.decision_override = np.array([[1, 0, 1, 0], [0, 0, 1, 0], [1, 0, 1, 0], [0, 0, 1, 0], [0, 0, 1, 1]], bool)
    m.zero_grad()
    y = m.forward(batch(5))
    m.backward(np.ones_like(y))
    seen = {(name, d): k for name, d, k in log}
    assert seen[("s1.b0.conv1", "fwd")] == seen[("s1.b0.conv2", "bwd")] == 2     # x[idx] only
    assert not any(name.startswith("s1.b1.") for name, _, _ in log)            # never touched
    assert seen[("s2.b1.conv1", "fwd")] == 5 and seen[("s3.b1.conv2", "bwd")] == 1
    assert seen[("s2.b0.conv1", "fwd")] == 5                                   # not gated
    w = m.weight_layers()["s1.b1.conv1"]
    assert not w.grads["weight"].any()
    ex = m.executed
    assert ex["s1.b0.conv1"] == ex["s1.b0.bn2"] == 2 and ex["s1.b1.conv1"] == 0
    assert ex["s3.b1.conv1"] == 1 and ex["stem.conv"] == ex["fc"] == ex["s1.b1.gate"] == 5
    assert m.gate_executed == {"s1.b0": 0.4, "s1.b1": 0.0, "s2.b1": 1.0, "s3.b1": 0.2}
    # skip ratio = gated MACs skipped / gated MACs
    specs = {s["name"]: s for s in m.layer_specs()}
    flops = np.array([specs[f"{b}.conv1"]["macs"] + specs[f"{b}.conv2"]["macs"] for b in m.gated_blocks])
    frac = np.array([0.4, 0.0, 1.0, 0.2])
    assert m.skip_ratio == pytest.approx(1 - frac @ flops / flops.sum())


def test_skipped_samples_pass_through_and_eval_counts():
    m = ResNet(1, 3, w0=2, blocks_per_stage=1, gated=True, seed=0, dtype=np.float64)
    x = batch(3)
    m.decision_override = np.array([[0], [0], [0]], bool)
    skip_all = m.forward(x, train=False)
    assert m.executed["s1.b0.conv1"] == 0 and m.skip_ratio == 1.0
    ref = ResNet(1, 3, w0=2, blocks_per_stage=1, gated=True, seed=0, dtype=np.float64)
    ref.decision_override = np.array([[1], [1], [0]], bool)
    mixed = ref.forward(x, train=False)                    # eval mode: per-sample, BN running stats
    np.testing.assert_allclose(mixed[2], skip_all[2])
    assert not np.allclose(mixed[0], skip_all[0])
    assert ref.executed["s1.b0.conv2"] == 2                 # dynamic inference is counted too
    # dynamic decisions: p >= 0.5 at the initial bias, every block runs
    m.decision_override = None
    m.forward(x, train=False)
    assert m.skip_ratio == 0.0 and all(p.min() > 0.8 for p in m.gate_probs.values())


def _toy_training(alpha, steps=50, target=0.5):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 1, 8, 8)).astype(np.float32)
    y = (x[:, 0, :4].mean(axis=(1, 2)) > 0).astype(np.int64) + (x[:, 0, :, :4].mean(axis=(1, 2)) > 0)
    m = ResNet(1, 3, w0=4, blocks_per_stage=2, gated=True, slu_alpha=alpha, target_skip=target, seed=0)
    opt = nn.SGD(m, lr=0.05, momentum=0.9)
    skips = []
    for s in range(steps):
        idx = rng.integers(0, len(x), 32)
        opt.zero_grad()
        _, d = nn.softmax_cross_entropy(m.forward(x[idx]), y[idx])
        m.backward(d)
        opt.step()
        skips.append(m.skip_ratio)
    return np.array(skips)


def test_alpha_raises_the_skip_ratio_and_zero_alpha_keeps_blocks_running():
    assert _toy_training(0.0).max() == 0.0
    skips = _toy_training(8.0)
    assert skips[:5].max() == 0.0                         # all blocks run at first
    assert skips[-20:].mean() > 0.2
    assert skips[-20:].min() < 1.0                         # the set-point rule reopens gates

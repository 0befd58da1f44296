"""The quantized network of the LRT paper: quantization in the loop, forward and backward.

Reference: the hardware quantization model (appendix C of the SKS paper, figure 2; appendix D of
the LRT paper). Forward of a weight layer ``ℓ``::

    z = Qb(α · W * a)          W in [-1, 1] at 8 b (the NVM cells), α the power of 2 nearest
                               to He initialization, Qb the 16-b accumulator format [-8, 8]
    y = Qb(streaming-batch-norm(z))            (hidden layers; γ, β are the layer's "biases")
    a' = Qa(ReLU(y))                           8 b in [0, 2]
    logits = Qb(α · W a + b)                   (last layer)

Backward uses the straight-through estimator for every quantizer, and quantizes gradients with Qg
(8 b in [-1, 1]) where the paper does: after the ReLU derivative and before they reach W and b.
Each weight layer leaves its Kronecker pairs ``(α·dz, a)`` (one per output pixel) for the trainer;
it never forms the weight gradient itself (``compute_weight_grad = False``) unless pre-training.

Formats come from the one spec, :mod:`insitu.numerics` (``LRT_*``).
"""

from __future__ import annotations

import math

import numpy as np

from insitu import nn
from insitu.numerics import (LRT_ACCUMULATOR, LRT_ACTIVATION, LRT_GRADIENT, LRT_WEIGHT,
                             FixedPoint)

__all__ = ["QWeightLayer", "QReLU", "QNormalize", "QNet", "paper_cnn", "dense_net", "ARCHITECTURES",
           "PAPER_CNN_MIN_SIZE"]

#: The smallest image side :func:`paper_cnn` takes: its three 2x2 max pools leave 1 pixel of 8.
PAPER_CNN_MIN_SIZE = 8

# Initial weights are drawn with this standard deviation inside [-1, 1]; α restores He scaling.
_INIT_STD = 0.5


def _nearest_power_of_two(x: float) -> float:
    return 2.0 ** round(math.log2(x))


class QWeightLayer:
    """A convolution or dense layer whose weight lives in NVM cells of format ``weight_format``.

    ``weight`` is the stored grid values (a view of the core layer's parameter, so writes by the
    NVM model are what the forward pass reads). ``bias`` (last layer only) is a 16-b register.
    """

    def __init__(self, name: str, core: nn.Conv2d | nn.Dense, fan_in: int, bias: bool,
                 weight_format: FixedPoint = LRT_WEIGHT, seed=None):
        self.name = name
        self.core = core
        self.core.compute_weight_grad = False
        self.weight_format = weight_format
        rng = np.random.default_rng(seed)
        w = self.core.params["weight"]
        w[...] = weight_format.quantize(np.clip(rng.standard_normal(w.shape) * _INIT_STD, -1, 1))
        self.alpha = _nearest_power_of_two(math.sqrt(2.0 / fan_in) / _INIT_STD)
        n_out = w.shape[0]
        self.bias = np.zeros(n_out) if bias else None
        self.bias_grad = np.zeros(n_out) if bias else None

    @property
    def weight(self) -> np.ndarray:
        return self.core.params["weight"]

    @property
    def weight_matrix(self) -> np.ndarray:
        return self.core.weight_matrix

    def forward(self, x, train=True):
        z = self.core.forward(x, train) * self.alpha
        if self.bias is not None:
            z += self.bias if z.ndim == 2 else self.bias[:, None, None]
        return LRT_ACCUMULATOR.quantize(z)

    def backward(self, dz):
        # Qg before the gradient reaches W and b: they cannot accumulate below the gradient LSB.
        dz = LRT_GRADIENT.quantize(dz)
        if self.bias_grad is not None:
            self.bias_grad += dz.sum(axis=(0,) if dz.ndim == 2 else (0, 2, 3))
        return self.core.backward(self.alpha * dz)

    def kronecker_pairs(self):
        """``(dz, a)`` of the last backward, ``(N, P, n_out)`` and ``(N, P, n_in)``, with α in dz."""
        return self.core.kronecker_pairs()

    def one_d_params(self):
        if self.bias is not None:
            yield f"{self.name}.bias", self.bias, self.bias_grad


class QNormalize:
    """Streaming batch norm followed by Qb; γ and β are trained like biases (16 b, every sample)."""

    def __init__(self, name: str, channels: int, batch: int):
        self.name = name
        self.bn = nn.StreamingBatchNorm(channels, batch=batch)

    def forward(self, x, train=True):
        return LRT_ACCUMULATOR.quantize(self.bn.forward(x, train))

    def backward(self, dy):
        return self.bn.backward(dy)

    def one_d_params(self):
        for key in ("gamma", "beta"):
            yield f"{self.name}.{key}", self.bn.params[key], self.bn.grads[key]


class QReLU:
    """``Qa(ReLU(y))``; backward: straight through inside the clipping range, then Qg."""

    def forward(self, x, train=True):
        self._mask = ((x > 0) & (x < LRT_ACTIVATION.max_value)) if train else None
        return LRT_ACTIVATION.quantize(np.maximum(x, 0.0))

    def backward(self, dy):
        if getattr(self, "_mask", None) is None:
            raise RuntimeError("QReLU.backward needs a preceding forward(x, train=True)")
        return LRT_GRADIENT.quantize(dy * self._mask)


class QNet:
    """A sequence of stages (weight layers, normalizations, quantized ReLUs, pooling, flatten)."""

    def __init__(self, stages, name: str):
        self.stages = list(stages)
        self.name = name

    @property
    def weight_layers(self) -> list[QWeightLayer]:
        return [s for s in self.stages if isinstance(s, QWeightLayer)]

    def one_d_params(self):
        """``(key, value, grad)`` of every 1-D parameter: biases and normalization γ, β."""
        for s in self.stages:
            if hasattr(s, "one_d_params"):
                yield from s.one_d_params()

    def forward(self, x, train=True):
        for s in self.stages:
            x = s.forward(x, train)
        return x

    def backward(self, dlogits):
        d = dlogits
        for s in reversed(self.stages):
            d = s.backward(d)
        return d

    def zero_grad(self):
        for _, _, g in self.one_d_params():
            g.fill(0)

    def predict(self, x, batch: int = 500) -> np.ndarray:
        return np.concatenate([self.forward(x[i:i + batch], train=False)
                               for i in range(0, len(x), batch)])

    def state_dict(self) -> dict:
        out = {}
        for layer in self.weight_layers:
            out[f"{layer.name}.weight"] = layer.weight.copy()
        for key, value, _ in self.one_d_params():
            out[key] = value.copy()
        for s in self.stages:
            if isinstance(s, QNormalize):
                for k, v in s.bn.buffers.items():
                    out[f"{s.name}.{k}"] = v.copy()
        return out

    def load_state_dict(self, state: dict) -> None:
        mine = self.state_dict()
        if set(state) != set(mine):
            raise ValueError(f"state of network {self.name!r} has keys {sorted(state)}, "
                             f"expected {sorted(mine)}")
        targets = {f"{l.name}.weight": l.weight for l in self.weight_layers}
        targets.update({k: v for k, v, _ in self.one_d_params()})
        for s in self.stages:
            if isinstance(s, QNormalize):
                targets.update({f"{s.name}.{k}": v for k, v in s.bn.buffers.items()})
        for key, target in targets.items():
            if np.shape(state[key]) != target.shape:
                raise ValueError(f"{key}: shape {np.shape(state[key])}, expected {target.shape}")
            target[...] = state[key]


def paper_cnn(sample_shape=(28, 28), classes=10, seed=0, conv_batch=10, dense_batch=100) -> QNet:
    """The paper's representative CNN: four 3×3 convolutions and two dense layers.

    The paper gives no widths; these keep a sample's pixel pairs near a thousand:
    conv 1→8 (28×28) pool, conv 8→16 (14×14) pool, conv 16→16, conv 16→16 (7×7) pool,
    dense 144→64, dense 64→classes. Grey images of any ``sample_shape`` (H, W) with sides
    >= :data:`PAPER_CNN_MIN_SIZE` (the pools floor odd sides): dense 16·(H//8)·(W//8)→64.
    """
    h, w = sample_shape
    stages = []
    c_in = 1
    widths = (8, 16, 16, 16)
    pools = (True, True, False, True)
    for i, (c_out, pool) in enumerate(zip(widths, pools), start=1):
        conv = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)
        stages += [QWeightLayer(f"conv{i}", conv, 9 * c_in, bias=False, seed=seed * 100 + i),
                   QNormalize(f"norm{i}", c_out, conv_batch), QReLU()]
        if pool:
            stages.append(nn.MaxPool2d(2))
            h, w = h // 2, w // 2
        c_in = c_out
    flat = c_in * h * w
    stages += [nn.Flatten(),
               QWeightLayer("fc1", nn.Dense(flat, 64, bias=False), flat, bias=False, seed=seed * 100 + 5),
               QNormalize("norm5", 64, dense_batch), QReLU(),
               QWeightLayer("fc2", nn.Dense(64, classes, bias=False), 64, bias=True, seed=seed * 100 + 6)]
    return QNet(stages, "cnn")


def dense_net(sample_shape=(28, 28), classes=10, seed=0, hidden=(128,), dense_batch=100, **_) -> QNet:
    """A dense network (flatten, hidden layers with streaming batch norm, classifier); any
    ``sample_shape`` (images or feature vectors)."""
    n_in = int(np.prod(sample_shape))
    stages: list[object] = [nn.Flatten()]
    for i, width in enumerate(hidden, start=1):
        stages += [QWeightLayer(f"fc{i}", nn.Dense(n_in, width, bias=False), n_in, bias=False,
                                seed=seed * 100 + i),
                   QNormalize(f"norm{i}", width, dense_batch), QReLU()]
        n_in = width
    k = len(hidden) + 1
    stages.append(QWeightLayer(f"fc{k}", nn.Dense(n_in, classes, bias=False), n_in, bias=True,
                               seed=seed * 100 + k))
    return QNet(stages, "mlp")


ARCHITECTURES = {"cnn": paper_cnn, "mlp": dense_net}

"""Predictive sign gradient descent (PSG, E²-Train section 3.3) on the NumPy core.

Every weight layer is wrapped in a :class:`PSGLayer`:

* **forward**: the input is quantized to 8-bit codes (:data:`~insitu.numerics.PSG_ACTIVATION_BITS`)
  and the layer computes with 8-bit weights (:data:`~insitu.numerics.PSG_WEIGHT_BITS`); its
  output leaves as a 16-bit word (:data:`~insitu.numerics.PSG_OUTPUT_BITS`). All use a
  per-tensor power-of-2 max-abs scale (:func:`~insitu.numerics.max_abs_format`), so the largest
  value never saturates. The float32 "master" weights live in the optimizer.
* **backward**: the output gradient is quantized to 16-bit codes
  (:data:`~insitu.numerics.PSG_GRADIENT_BITS`); the input gradient is computed from it and the
  8-bit weights. The weight gradient is not computed in float: the layer's Kronecker pairs (its
  own cached im2col patches and output gradients, already on the grids) go to
  :func:`~insitu.numerics.psg_weight_gradient` as integer codes, which returns the full gradient
  and the MSB predictor (4-bit x, 10-bit g); :func:`~insitu.numerics.psg_threshold` and
  :func:`~insitu.numerics.psg_sign` turn them into the signs of eq. 2. The layer's weight
  "gradient" is that sign.
* :class:`SignSGD` updates every parameter by ``-lr * sign``: the PSG signs for wrapped weights,
  the sign of the float gradient for the rest (biases, BatchNorm, SLU gates), as SignSGD does.

Straight-through quantization: the gradient passes the input quantizer unchanged (the standard
estimator for fake-quantized training). BatchNorm, ReLU and the residual adds stay float32 here;
the energy model prices them at 32 bits (:mod:`insitu.e2train.energy`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import numpy as np

from insitu import numerics as nx
from insitu.nn.layers import Layer, Param, WeightLayer


def _validate_beta(beta: float) -> float:
    if not 0.0 < float(beta) < 1.0:
        raise ValueError(f"PSG beta must be in (0, 1) (the paper uses 0.05), got {beta!r}")
    return float(beta)


def quantize_tensor(x: np.ndarray, bits: int) -> tuple[np.ndarray, int]:
    """``x`` on a ``bits``-bit grid with the finest power-of-2 scale that holds max |x|.

    Returns the fake-quantized array (x's dtype) and the scale's ``frac`` (codes = value * 2**frac).
    """
    fmt = nx.max_abs_format(x, bits)
    return fmt.quantize(x).astype(x.dtype, copy=False), fmt.frac


def _codes(values: np.ndarray, frac: int) -> np.ndarray:
    """The integer codes of values already on a ``2**-frac`` grid (exact: a power-of-2 scaling)."""
    return np.ldexp(values.astype(np.float64), frac).astype(nx.CODE_DTYPE)


@dataclass
class PSGStats:
    """What the predictor decided, summed over every layer and step that shares it."""

    predicted: int = 0              # weight-gradient entries whose sign came from g_msb
    total: int = 0                  # weight-gradient entries computed

    def add(self, predicted: int, total: int) -> None:
        self.predicted += predicted
        self.total += total

    @property
    def fraction(self) -> float:
        """Fraction of signs taken from the predictor (the paper: >= 60 % at beta = 0.05)."""
        return self.predicted / self.total if self.total else 0.0


class PSGLayer(Layer):
    """A weight layer (Conv2d / Dense) trained with PSG; see the module docstring.

    Shares ``params`` and ``grads`` with the wrapped layer; ``params["weight"]`` holds the 8-bit
    weights (as floats on their grid) that the forward pass uses, set by :meth:`load_weight`.
    """

    def __init__(self, name: str, inner: Layer, beta: float = 0.05, stats: PSGStats | None = None):
        super().__init__()
        if not hasattr(inner, "kronecker_pairs"):
            raise TypeError(f"PSG wraps weight layers (Conv2d, Dense), not {type(inner).__name__}")
        self.name, self.inner = name, cast(WeightLayer, inner)
        self.beta = _validate_beta(beta)
        self.stats = stats if stats is not None else PSGStats()
        self.params, self.grads, self.buffers = inner.params, inner.grads, inner.buffers
        self.inner.compute_weight_grad = False  # the float GEMM is replaced by the integer one
        self._x_frac: int | None = None
        self.last_predicted: np.ndarray | None = None
        setattr(inner, "psg", self)             # lets optimizers find the wrapper from a Param
        # The float initial weights seed the optimizer's master copy; the layer keeps 8 bits.
        self.initial_master = inner.params["weight"].astype(np.float32, copy=True)
        self.load_weight(self.initial_master)

    def load_weight(self, master: np.ndarray) -> None:
        """Quantize float master weights to the 8-bit grid the layer computes with."""
        q, _ = quantize_tensor(np.asarray(master, dtype=self.params["weight"].dtype), nx.PSG_WEIGHT_BITS)
        self.params["weight"][...] = q

    def forward(self, x, train=True):
        xq, self._x_frac = quantize_tensor(x, nx.PSG_ACTIVATION_BITS)
        return quantize_tensor(self.inner.forward(xq, train), nx.PSG_OUTPUT_BITS)[0]

    def backward(self, dy):
        dyq, dy_frac = quantize_tensor(dy, nx.PSG_GRADIENT_BITS)
        dx = self.inner.backward(dyq)
        dz, a = self.inner.kronecker_pairs()
        assert self._x_frac is not None         # set by the forward that the pairs come from
        n_out = dz.shape[-1]
        g_full, g_msb = nx.psg_weight_gradient(_codes(dz.reshape(-1, n_out), dy_frac),
                                               _codes(a.reshape(-1, a.shape[-1]), self._x_frac))
        tau = nx.psg_threshold(g_msb, self.beta)
        sign, predicted = nx.psg_sign(g_full, g_msb, tau)
        grad = self.grads["weight"]
        grad += sign.reshape(grad.shape).astype(grad.dtype)
        self.last_predicted = predicted
        self.stats.add(int(predicted.sum()), predicted.size)
        return dx

    def __repr__(self):
        return f"PSG({self.inner!r}, beta={self.beta})"


def psg_wrapper(beta: float = 0.05, stats: PSGStats | None = None):
    """A ``layer_wrapper(name, layer)`` for :class:`insitu.e2train.resnet.ResNet`: every weight
    layer becomes a :class:`PSGLayer` sharing ``stats``."""
    beta = _validate_beta(beta)
    stats = stats if stats is not None else PSGStats()
    return _PSGWrapper(beta, stats)


class _PSGWrapper:
    """:func:`psg_wrapper`'s ``layer_wrapper``; ``stats`` is the :class:`PSGStats` it shares."""

    def __init__(self, beta: float, stats: PSGStats):
        self.beta, self.stats = beta, stats

    def __call__(self, name: str, layer: Layer) -> Layer:
        return PSGLayer(name, layer, self.beta, self.stats)


def _psg_layer(p: Param) -> PSGLayer | None:
    """The PSG wrapper of a parameter's layer, whether the handle names the wrapper or the inner."""
    return p.layer if isinstance(p.layer, PSGLayer) else getattr(p.layer, "psg", None)


class SignSGD:
    """``w -= lr * (sign(g) + weight_decay * w)`` on float32 master copies.

    For a :class:`PSGLayer` weight the "gradient" already is eq. 2's sign; after the step the
    layer's 8-bit weights are requantized from the master. Other parameters use ``sign(g)`` of
    their float gradient. ``lr`` may change between steps (schedules).
    """

    def __init__(self, params, lr: float, weight_decay: float = 0.0):
        if hasattr(params, "parameters"):
            params = params.parameters()
        self.params: list[Param] = list(params)
        if not lr > 0 or weight_decay < 0:
            raise ValueError(f"SignSGD needs lr > 0 and weight_decay >= 0, got {lr} and {weight_decay}")
        self.lr, self.weight_decay = lr, weight_decay
        # Master copies of the quantized weights (PSG layers compute with the 8-bit copy).
        self._psg = {p.key: layer for p in self.params
                     if p.name == "weight" and (layer := _psg_layer(p)) is not None}
        self.master = {key: layer.initial_master.copy() for key, layer in self._psg.items()}

    def step(self) -> None:
        for p in self.params:
            g = np.sign(p.grad)
            if p.key in self.master:
                w = self.master[p.key]
                w -= self.lr * (g + self.weight_decay * w)
                self._psg[p.key].load_weight(w)
            else:
                w = p.value
                w -= (self.lr * (g + self.weight_decay * w)).astype(w.dtype, copy=False)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad.fill(0)

    def state_dict(self) -> dict[str, np.ndarray]:
        return {f"master.{k}": v.copy() for k, v in self.master.items()}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        for k, v in state.items():
            key = k.removeprefix("master.")
            if key not in self.master:
                raise KeyError(f"SignSGD state has no master weight {key!r}")
            self.master[key][...] = v
        for key, layer in self._psg.items():
            layer.load_weight(self.master[key])

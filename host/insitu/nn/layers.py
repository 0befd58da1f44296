"""Layers with explicit forward and backward passes (no autograd).

Contract of every :class:`Layer`:

* ``forward(x, train=True)`` returns the output. With ``train=True`` the layer caches what its
  backward pass needs; with ``train=False`` it caches nothing (inference, evaluation).
* ``backward(dy)`` returns ``dx`` and **adds** the parameter gradients into ``self.grads`` (like
  PyTorch, gradients accumulate until ``zero_grad()``). It must follow a ``train=True`` forward.
* ``params`` / ``grads`` are dicts with the same keys; ``buffers`` holds non-learnable state
  (BatchNorm running statistics). Optimizers update ``params`` in place, so references stay valid.
* Outputs keep the input's dtype (float32 in, float32 out); gradients keep the parameter dtype.

Weight layers (the :class:`WeightLayer` subclasses :class:`Dense`, :class:`Conv2d`,
:class:`PointwiseConv2d`, :class:`DepthwiseConv2d`) also expose, for low-rank training (LRT/SKS):

* ``weight_matrix``: the weight as an ``(n_out, n_in)`` matrix, a reshape *view* (writes go
  through to ``params["weight"]``);
* ``kronecker_pairs() -> (dz, a)``: the per-sample (and per-output-pixel) factors whose outer
  products sum to the weight gradient, ``grad_matrix = einsum('npo,npi->oi', dz, a)``;
* ``compute_weight_grad`` (default True): set False to skip the weight-gradient GEMM in
  ``backward`` (``grads["weight"]`` is then left untouched) when a trainer consumes the pairs
  instead. Bias gradients are always computed (they are cheap and LRT trains biases directly).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
from numpy.typing import DTypeLike

from .functional import col2im, conv_output_size, im2col, pair

__all__ = [
    "Layer",
    "Param",
    "WeightLayer",
    "Dense",
    "Conv2d",
    "PointwiseConv2d",
    "DepthwiseConv2d",
    "ReLU",
    "ReLU6",
    "MaxPool2d",
    "AvgPool2d",
    "GlobalAvgPool2d",
    "Flatten",
]


@dataclass(frozen=True)
class Param:
    """A handle on one learnable array: ``layer.params[name]`` and ``layer.grads[name]``.

    Reading through the layer (rather than holding the arrays) means a handle stays valid even
    if a trainer replaces the array object. ``key`` is a readable name such as ``"3.weight"``.
    """

    layer: "Layer"
    name: str
    key: str

    @property
    def value(self) -> np.ndarray:
        return self.layer.params[self.name]

    @property
    def grad(self) -> np.ndarray:
        return self.layer.grads[self.name]


class Layer:
    """Base class; parameter-free layers only override ``forward``/``backward``."""

    def __init__(self) -> None:
        self.params: dict[str, np.ndarray] = {}
        self.grads: dict[str, np.ndarray] = {}
        self.buffers: dict[str, np.ndarray] = {}
        self._cache: Any = None         # what backward needs, each layer its own; None: nothing

    def forward(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        raise NotImplementedError

    def backward(self, dy: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def __call__(self, x: np.ndarray, train: bool = True) -> np.ndarray:
        return self.forward(x, train)

    def zero_grad(self) -> None:
        for g in self.grads.values():
            g.fill(0)

    def parameters(self, prefix: str = "") -> Iterator[Param]:
        for name in self.params:
            yield Param(self, name, f"{prefix}{name}")

    def named_buffers(self, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
        for name, v in self.buffers.items():
            yield f"{prefix}{name}", v

    def _add_param(self, name: str, value: np.ndarray) -> None:
        self.params[name] = value
        self.grads[name] = np.zeros_like(value)

    def _saved(self) -> Any:
        if self._cache is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward called without a preceding forward(x, train=True)"
            )
        return self._cache

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def _he_normal(rng: np.random.Generator, shape, fan_in: int, dtype: DTypeLike) -> np.ndarray:
    # He et al. 2015: keeps activation variance constant through ReLU layers.
    return (rng.standard_normal(shape) * np.sqrt(2.0 / fan_in)).astype(dtype)


# --------------------------------------------------------------------------------------------
# Weight layers
# --------------------------------------------------------------------------------------------


class WeightLayer(Layer):
    """What the weight layers share for low-rank training: the switch that skips the weight
    gradient and the per-sample Kronecker pairs that the last backward produced."""

    def __init__(self) -> None:
        super().__init__()
        self.compute_weight_grad = True
        self._pairs: tuple[np.ndarray, np.ndarray] | None = None

    def kronecker_pairs(self) -> tuple[np.ndarray, np.ndarray]:
        if self._pairs is None:
            raise RuntimeError("kronecker_pairs() needs a forward(train=True) and a backward first")
        return self._pairs


class Dense(WeightLayer):
    """Fully connected: ``y = x @ W.T + b`` with ``W`` of shape ``(n_out, n_in)``.

    Kronecker pairs: ``dz`` is ``(N, 1, n_out)`` (the output gradient), ``a`` is ``(N, 1, n_in)``
    (the input), one pair per sample.
    """

    def __init__(self, n_in: int, n_out: int, bias: bool = True, seed=None,
                 dtype: DTypeLike = np.float64):
        super().__init__()
        self.n_in, self.n_out = n_in, n_out
        rng = np.random.default_rng(seed)
        self._add_param("weight", _he_normal(rng, (n_out, n_in), n_in, dtype))
        if bias:
            self._add_param("bias", np.zeros(n_out, dtype=dtype))

    @property
    def weight_matrix(self) -> np.ndarray:
        return self.params["weight"]

    def forward(self, x, train=True):
        if x.ndim != 2 or x.shape[1] != self.n_in:
            raise ValueError(f"Dense expects (N, {self.n_in}) input, got {x.shape}")
        w = self.params["weight"].astype(x.dtype, copy=False)
        y = x @ w.T
        if "bias" in self.params:
            y += self.params["bias"].astype(x.dtype, copy=False)
        self._cache = x if train else None
        self._pairs = None
        return y

    def backward(self, dy):
        x = self._saved()
        self._pairs = (dy[:, None, :], x[:, None, :])
        if self.compute_weight_grad:
            self.grads["weight"] += dy.T @ x
        if "bias" in self.params:
            self.grads["bias"] += dy.sum(axis=0)
        return dy @ self.params["weight"].astype(dy.dtype, copy=False)

    def __repr__(self):
        return f"Dense({self.n_in}, {self.n_out}, bias={'bias' in self.params})"


class Conv2d(WeightLayer):
    """2-D convolution (cross-correlation, as in every DL framework) computed as im2col + GEMM.

    Weight ``(c_out, c_in, kh, kw)``; ``weight_matrix`` is its ``(c_out, c_in*kh*kw)`` view.
    Kronecker pairs: one per sample and output pixel, ``dz`` ``(N, P, c_out)`` and ``a`` ``(N, P,
    c_in*kh*kw)`` (the im2col patch), ``P = H_out*W_out``.
    """

    def __init__(
        self, c_in, c_out, kernel_size, stride=1, padding=0, bias=True, seed=None,
        dtype: DTypeLike = np.float64
    ):
        super().__init__()
        self.c_in, self.c_out = c_in, c_out
        self.kernel_size, self.stride, self.padding = pair(kernel_size), pair(stride), pair(padding)
        kh, kw = self.kernel_size
        rng = np.random.default_rng(seed)
        fan_in = c_in * kh * kw
        self._add_param("weight", _he_normal(rng, (c_out, c_in, kh, kw), fan_in, dtype))
        if bias:
            self._add_param("bias", np.zeros(c_out, dtype=dtype))

    @property
    def weight_matrix(self) -> np.ndarray:
        return self.params["weight"].reshape(self.c_out, -1)

    def output_shape(self, h: int, w: int) -> tuple[int, int]:
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        return conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)

    def forward(self, x, train=True):
        if x.ndim != 4 or x.shape[1] != self.c_in:
            raise ValueError(f"{type(self).__name__} expects (N, {self.c_in}, H, W) input, got {x.shape}")
        n, _, h, w = x.shape
        ho, wo = self.output_shape(h, w)
        cols = im2col(x, self.kernel_size, self.stride, self.padding)  # (N, P, K)
        y = cols @ self.weight_matrix.astype(x.dtype, copy=False).T  # (N, P, c_out)
        if "bias" in self.params:
            y += self.params["bias"].astype(x.dtype, copy=False)
        self._cache = (x.shape, cols) if train else None
        self._pairs = None
        return np.ascontiguousarray(y.reshape(n, ho, wo, self.c_out).transpose(0, 3, 1, 2))

    def backward(self, dy):
        x_shape, cols = self._saved()
        n = dy.shape[0]
        dz = np.ascontiguousarray(dy.transpose(0, 2, 3, 1)).reshape(n, -1, self.c_out)
        self._pairs = (dz, cols)
        if self.compute_weight_grad:
            gw = dz.reshape(-1, self.c_out).T @ cols.reshape(-1, cols.shape[-1])
            self.grads["weight"] += gw.reshape(self.params["weight"].shape)
        if "bias" in self.params:
            self.grads["bias"] += dz.sum(axis=(0, 1))
        dcols = dz @ self.weight_matrix.astype(dy.dtype, copy=False)
        return col2im(dcols, x_shape, self.kernel_size, self.stride, self.padding)

    def __repr__(self):
        return (
            f"{type(self).__name__}({self.c_in}, {self.c_out}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, padding={self.padding}, bias={'bias' in self.params})"
        )


class PointwiseConv2d(Conv2d):
    """1x1 convolution (the channel-mixing half of a depthwise-separable block)."""

    def __init__(self, c_in, c_out, stride=1, bias=True, seed=None, dtype: DTypeLike = np.float64):
        super().__init__(c_in, c_out, 1, stride=stride, padding=0, bias=bias, seed=seed, dtype=dtype)


class DepthwiseConv2d(WeightLayer):
    """Depthwise convolution: channel ``c`` is convolved with its own ``kh x kw`` kernel.

    Weight ``(C, 1, kh, kw)``; ``weight_matrix`` is its ``(C, kh*kw)`` view. A depthwise weight is
    not one dense matrix, so the Kronecker factors are the per-channel analogue: ``dz`` is
    ``(N, P, C)`` and ``a`` is ``(N, P, C, kh*kw)``, and the gradient of channel ``c``'s kernel is
    ``einsum('np,npk->k', dz[..., c], a[..., c, :])``, i.e. all channels at once
    ``einsum('npc,npck->ck', dz, a)`` — for each channel a rank-1 sum over samples and pixels of
    (scalar output gradient) x (k*k patch).
    """

    def __init__(self, channels, kernel_size, stride=1, padding=0, bias=True, seed=None,
                 dtype: DTypeLike = np.float64):
        super().__init__()
        self.channels = channels
        self.kernel_size, self.stride, self.padding = pair(kernel_size), pair(stride), pair(padding)
        kh, kw = self.kernel_size
        rng = np.random.default_rng(seed)
        self._add_param("weight", _he_normal(rng, (channels, 1, kh, kw), kh * kw, dtype))
        if bias:
            self._add_param("bias", np.zeros(channels, dtype=dtype))

    @property
    def weight_matrix(self) -> np.ndarray:
        return self.params["weight"].reshape(self.channels, -1)

    def forward(self, x, train=True):
        if x.ndim != 4 or x.shape[1] != self.channels:
            raise ValueError(f"DepthwiseConv2d expects (N, {self.channels}, H, W) input, got {x.shape}")
        n, c, h, w = x.shape
        (kh, kw), (sh, sw), (ph, pw) = self.kernel_size, self.stride, self.padding
        ho, wo = conv_output_size(h, kh, sh, ph), conv_output_size(w, kw, sw, pw)
        # im2col's last axis is ordered (c, i, j), so splitting it gives per-channel patches.
        cols = im2col(x, self.kernel_size, self.stride, self.padding).reshape(n, ho * wo, c, kh * kw)
        y = np.einsum("npck,ck->npc", cols, self.weight_matrix.astype(x.dtype, copy=False))
        if "bias" in self.params:
            y += self.params["bias"].astype(x.dtype, copy=False)
        self._cache = (x.shape, cols) if train else None
        self._pairs = None
        return np.ascontiguousarray(y.reshape(n, ho, wo, c).transpose(0, 3, 1, 2))

    def backward(self, dy):
        x_shape, cols = self._saved()
        n, c = dy.shape[:2]
        dz = np.ascontiguousarray(dy.transpose(0, 2, 3, 1)).reshape(n, -1, c)
        self._pairs = (dz, cols)
        if self.compute_weight_grad:
            gw = np.einsum("npc,npck->ck", dz, cols)
            self.grads["weight"] += gw.reshape(self.params["weight"].shape)
        if "bias" in self.params:
            self.grads["bias"] += dz.sum(axis=(0, 1))
        dcols = dz[..., None] * self.weight_matrix.astype(dy.dtype, copy=False)  # (N, P, C, kk)
        return col2im(dcols.reshape(n, dz.shape[1], -1), x_shape, self.kernel_size, self.stride, self.padding)

    def __repr__(self):
        return (
            f"DepthwiseConv2d({self.channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
            f"padding={self.padding}, bias={'bias' in self.params})"
        )


# --------------------------------------------------------------------------------------------
# Parameter-free layers
# --------------------------------------------------------------------------------------------


class ReLU(Layer):
    def forward(self, x, train=True):
        mask = x > 0
        self._cache = mask if train else None
        return x * mask

    def backward(self, dy):
        return dy * self._saved()


class ReLU6(Layer):
    """``min(max(x, 0), 6)`` (MobileNet's activation; bounded, so it quantizes well)."""

    def forward(self, x, train=True):
        mask = (x > 0) & (x < 6)
        self._cache = mask if train else None
        return np.clip(x, 0, 6)

    def backward(self, dy):
        return dy * self._saved()


class _Pool2d(Layer):
    """Shared window plumbing: each channel is unfolded separately with im2col."""

    def __init__(self, kernel_size, stride=None):
        super().__init__()
        self.kernel_size = pair(kernel_size)
        self.stride = pair(stride) if stride is not None else self.kernel_size

    def _windows(self, x):
        n, c, h, w = x.shape
        kh, kw = self.kernel_size
        ho = conv_output_size(h, kh, self.stride[0])
        wo = conv_output_size(w, kw, self.stride[1])
        cols = im2col(x.reshape(n * c, 1, h, w), self.kernel_size, self.stride)  # (N*C, P, kk)
        return cols, (n, c, ho, wo)

    def _unwindow(self, dcols, x_shape):
        n, c, h, w = x_shape
        return col2im(dcols, (n * c, 1, h, w), self.kernel_size, self.stride).reshape(x_shape)

    def __repr__(self):
        return f"{type(self).__name__}(kernel_size={self.kernel_size}, stride={self.stride})"


class MaxPool2d(_Pool2d):
    """Max pooling; the gradient goes to the (first) maximum of each window."""

    def forward(self, x, train=True):
        cols, (n, c, ho, wo) = self._windows(x)
        idx = cols.argmax(axis=2)
        y = np.take_along_axis(cols, idx[..., None], axis=2)[..., 0]
        self._cache = (x.shape, idx, cols.shape) if train else None
        return y.reshape(n, c, ho, wo)

    def backward(self, dy):
        x_shape, idx, cols_shape = self._saved()
        dcols = np.zeros(cols_shape, dtype=dy.dtype)
        np.put_along_axis(dcols, idx[..., None], dy.reshape(idx.shape)[..., None], axis=2)
        return self._unwindow(dcols, x_shape)


class AvgPool2d(_Pool2d):
    def forward(self, x, train=True):
        cols, (n, c, ho, wo) = self._windows(x)
        self._cache = (x.shape, cols.shape) if train else None
        return cols.mean(axis=2).reshape(n, c, ho, wo)

    def backward(self, dy):
        x_shape, cols_shape = self._saved()
        kk = cols_shape[2]
        dcols = np.broadcast_to((dy.reshape(cols_shape[:2]) / kk)[..., None], cols_shape)
        return self._unwindow(np.ascontiguousarray(dcols), x_shape)


class GlobalAvgPool2d(Layer):
    """``(N, C, H, W) -> (N, C)``: mean over all pixels."""

    def forward(self, x, train=True):
        self._cache = x.shape if train else None
        return x.mean(axis=(2, 3))

    def backward(self, dy):
        n, c, h, w = self._saved()
        return np.broadcast_to((dy / (h * w))[:, :, None, None], (n, c, h, w)).copy()


class Flatten(Layer):
    """``(N, ...) -> (N, prod(...))``."""

    def forward(self, x, train=True):
        self._cache = x.shape if train else None
        return x.reshape(x.shape[0], -1)

    def backward(self, dy):
        return dy.reshape(self._saved())

"""Batch normalization: the standard layer and the LRT paper's streaming variant.

Both normalize per channel: for ``(N, C)`` input over the batch axis, for ``(N, C, H, W)`` input
over the batch and pixel axes. Statistics live in ``buffers`` (float64 regardless of input dtype).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import DTypeLike

from .layers import Layer

__all__ = ["BatchNorm", "StreamingBatchNorm"]


def _check(x: np.ndarray, c: int, name: str) -> None:
    if x.ndim not in (2, 4) or x.shape[1] != c:
        raise ValueError(f"{name} expects (N, {c}) or (N, {c}, H, W) input, got {x.shape}")


def _per_channel(v: np.ndarray, ndim: int) -> np.ndarray:
    """Reshape a ``(C,)`` vector so it broadcasts against ``(N, C)`` or ``(N, C, H, W)``."""
    return v[:, None, None] if ndim == 4 else v


class _NormBase(Layer):
    def __init__(self, num_features: int, eps: float, dtype) -> None:
        super().__init__()
        self.num_features = num_features
        self.eps = eps
        self._add_param("gamma", np.ones(num_features, dtype=dtype))
        self._add_param("beta", np.zeros(num_features, dtype=dtype))

    def _affine(self, xhat: np.ndarray) -> np.ndarray:
        g = _per_channel(self.params["gamma"].astype(xhat.dtype, copy=False), xhat.ndim)
        b = _per_channel(self.params["beta"].astype(xhat.dtype, copy=False), xhat.ndim)
        return g * xhat + b

    def _affine_grads(self, dy: np.ndarray, xhat: np.ndarray) -> None:
        axes = (0,) if dy.ndim == 2 else (0, 2, 3)
        self.grads["gamma"] += (dy * xhat).sum(axis=axes)
        self.grads["beta"] += dy.sum(axis=axes)

    def __repr__(self):
        return f"{type(self).__name__}({self.num_features})"


class BatchNorm(_NormBase):
    """Standard batch norm (Ioffe & Szegedy 2015).

    Train mode normalizes with the batch mean and biased batch variance and backpropagates through
    them exactly; it updates ``running = (1 - momentum) * running + momentum * batch`` (the running
    variance uses the unbiased batch variance, as PyTorch does). Eval mode uses the running
    statistics. Initial running statistics: mean 0, variance 1.
    """

    def __init__(self, num_features: int, momentum: float = 0.1, eps: float = 1e-5,
                 dtype: DTypeLike = np.float64):
        super().__init__(num_features, eps, dtype)
        self.momentum = momentum
        self.buffers["running_mean"] = np.zeros(num_features)
        self.buffers["running_var"] = np.ones(num_features)

    def forward(self, x, train=True):
        _check(x, self.num_features, "BatchNorm")
        axes = (0,) if x.ndim == 2 else (0, 2, 3)
        if train:
            mean = x.mean(axis=axes)
            var = x.var(axis=axes)
            m = x.size // self.num_features
            mom = self.momentum
            rm, rv = self.buffers["running_mean"], self.buffers["running_var"]
            rm *= 1 - mom
            rm += mom * mean
            rv *= 1 - mom
            rv += mom * var * (m / max(m - 1, 1))
        else:
            mean, var = self.buffers["running_mean"], self.buffers["running_var"]
        inv_std = (1.0 / np.sqrt(var + self.eps)).astype(x.dtype, copy=False)
        mean = mean.astype(x.dtype, copy=False)
        xhat = (x - _per_channel(mean, x.ndim)) * _per_channel(inv_std, x.ndim)
        self._cache = (xhat, inv_std) if train else None
        return self._affine(xhat)

    def backward(self, dy):
        xhat, inv_std = self._saved()
        axes = (0,) if dy.ndim == 2 else (0, 2, 3)
        self._affine_grads(dy, xhat)
        dxhat = dy * _per_channel(self.params["gamma"].astype(dy.dtype, copy=False), dy.ndim)
        # d/dx of (x - mean(x)) / std(x), with the mean over the normalized axes.
        dx = (
            dxhat
            - dxhat.mean(axis=axes, keepdims=True)
            - xhat * (dxhat * xhat).mean(axis=axes, keepdims=True)
        )
        return dx * _per_channel(inv_std, dy.ndim)


class StreamingBatchNorm(_NormBase):
    """Streaming batch norm for online (batch-size-1) training, as in the LRT paper.

    Reference: Gural, Nadeau, Tikekar and Murmann, "Low-rank training of deep neural networks for
    emerging memory technology" (arXiv 2009.03887, ``papers/lrt-low-rank-training-nvm.txt``,
    appendix F "Streaming batch
    normalization"; appendix E of the SKS version). The paper keeps two per-channel state
    variables, a mean ``mu_s`` and a mean of squares ``sq_s``, and for each sample ``i`` with
    per-sample statistics ``mu_i`` and ``sigma_i^2`` (over the sample's pixels of that channel;
    for ``(N, C)`` input a single value, so ``sigma_i^2 = 0``) updates::

        mu_s := eta * mu_s + (1 - eta) * mu_i
        sq_s := eta * sq_s + (1 - eta) * (sigma_i^2 + mu_i^2)        with eta = 1 - 1/B

    and uses ``mu_b = mu_s`` and ``sigma_b^2 = sq_s - mu_s^2`` (its eq. 24, the batch variance as
    mean of squares minus squared mean) in ``y = gamma * (x - mu_b) / sqrt(sigma_b^2 + eps) + beta``.

    What this class does exactly (choices the paper leaves open are marked *):

    * train mode: the samples of a batch are streamed in order; sample ``n`` first updates the
      state, then is normalized with the updated state (*: so it sees itself with weight 1/B,
      like a sample inside a standard batch of B). After the call the buffers hold the state after
      the last sample. A batch of N gives the same outputs and state as N calls with one sample.
    * eval mode: normalizes with the current state and does not update it.
    * backward: the statistics are treated as constants, ``dx = dy * gamma / sqrt(sigma_b^2+eps)``
      (the current sample's 1/B contribution to them is not differentiated); gamma and beta get
      their exact gradients.
    * (*) initial state ``mu_s = 0, sq_s = 1`` (unit variance, like PyTorch's running_var); no
      bias correction. ``sigma_b^2`` is clipped at 0 against rounding.

    Buffers: ``running_mean`` (``mu_s``) and ``running_sq`` (``sq_s``); ``running_var`` is derived.
    """

    def __init__(self, num_features: int, batch: int, eps: float = 1e-5,
                 dtype: DTypeLike = np.float64):
        super().__init__(num_features, eps, dtype)
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.batch = batch
        self.eta = 1.0 - 1.0 / batch
        self.buffers["running_mean"] = np.zeros(num_features)
        self.buffers["running_sq"] = np.ones(num_features)

    @property
    def running_var(self) -> np.ndarray:
        mu, sq = self.buffers["running_mean"], self.buffers["running_sq"]
        return np.maximum(sq - mu * mu, 0.0)

    def forward(self, x, train=True):
        _check(x, self.num_features, "StreamingBatchNorm")
        mu_s, sq_s = self.buffers["running_mean"], self.buffers["running_sq"]
        if train:
            # Per-sample statistics (N, C): mu_i and sigma_i^2 + mu_i^2 = mean of squares.
            flat = x.reshape(x.shape[0], self.num_features, -1).astype(np.float64, copy=False)
            mu_i = flat.mean(axis=2)
            sq_i = (flat * flat).mean(axis=2)
            mu = np.empty_like(mu_i)
            sq = np.empty_like(sq_i)
            # The recurrence is sequential by definition; one step is O(C) work per sample.
            for n in range(x.shape[0]):
                mu_s *= self.eta
                mu_s += (1 - self.eta) * mu_i[n]
                sq_s *= self.eta
                sq_s += (1 - self.eta) * sq_i[n]
                mu[n], sq[n] = mu_s, sq_s
        else:
            mu, sq = mu_s[None, :], sq_s[None, :]
        var = np.maximum(sq - mu * mu, 0.0)
        inv_std = (1.0 / np.sqrt(var + self.eps)).astype(x.dtype, copy=False)  # (N or 1, C)
        mu = mu.astype(x.dtype, copy=False)
        if x.ndim == 4:
            mu, inv_std = mu[:, :, None, None], inv_std[:, :, None, None]
        xhat = (x - mu) * inv_std
        self._cache = (xhat, inv_std) if train else None
        return self._affine(xhat)

    def backward(self, dy):
        xhat, inv_std = self._saved()
        self._affine_grads(dy, xhat)
        g = _per_channel(self.params["gamma"].astype(dy.dtype, copy=False), dy.ndim)
        return dy * g * inv_std

    def __repr__(self):
        return f"StreamingBatchNorm({self.num_features}, batch={self.batch})"

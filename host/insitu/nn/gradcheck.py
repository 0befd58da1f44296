"""Finite-difference gradient checks for layers (used by the tests; handy for new layers too)."""

from __future__ import annotations

from typing import Callable

import numpy as np

from .layers import Layer

__all__ = ["numerical_gradient", "relative_error", "layer_gradient_errors"]


def numerical_gradient(f: Callable[[], float], x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the scalar ``f()`` w.r.t. every element of ``x`` (perturbed in place
    and restored). ``x`` should be float64, or the differences drown in rounding."""
    grad = np.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)  # views: x must be contiguous
    if not np.shares_memory(flat, x):
        raise ValueError("numerical_gradient needs a contiguous array")
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + eps
        fp = f()
        flat[i] = old - eps
        fm = f()
        flat[i] = old
        gflat[i] = (fp - fm) / (2 * eps)
    return grad


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """``max|a - b|`` relative to the larger of the two max magnitudes (0 when both are 0)."""
    scale = max(float(np.max(np.abs(a), initial=0)), float(np.max(np.abs(b), initial=0)))
    if scale == 0:
        return 0.0
    return float(np.max(np.abs(a - b))) / scale


def layer_gradient_errors(
    layer: Layer, x: np.ndarray, *, seed: int = 987654, eps: float = 1e-6, fd_train: bool = True
) -> dict[str, float]:
    """Relative errors of ``layer``'s analytic gradients against central differences.

    Uses the scalar ``L = sum(forward(x) * R)`` for a fixed random ``R``, so ``dy = R``. Returns
    ``{"input": err, "<param key>": err, ...}`` (keys as in ``layer.parameters()``, e.g.
    ``"weight"`` for a layer, ``"0.weight"`` for a Sequential). ``fd_train`` selects the mode of the forward passes
    that are differenced (``False`` for layers whose backward treats train-mode statistics as
    constants, e.g. StreamingBatchNorm with a single sample). Buffers are restored after every
    differenced forward so running statistics do not drift during the check.
    """
    x = np.array(x, dtype=np.float64)
    layer.zero_grad()
    y = layer.forward(x, train=True)
    r = np.random.default_rng(seed).standard_normal(y.shape)
    dx = layer.backward(r)
    analytic = {p.key: p.grad.copy() for p in layer.parameters()}
    snapshot = {k: v.copy() for k, v in layer.named_buffers()}

    def loss() -> float:
        out = float(np.sum(layer.forward(x, train=fd_train) * r))
        for k, v in layer.named_buffers():
            v[...] = snapshot[k]
        return out

    errors = {"input": relative_error(dx, numerical_gradient(loss, x, eps))}
    for p in layer.parameters():
        errors[p.key] = relative_error(analytic[p.key], numerical_gradient(loss, p.value, eps))
    return errors


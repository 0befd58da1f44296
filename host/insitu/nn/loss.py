"""Losses: each returns ``(mean loss, gradient w.r.t. the prediction)``, ready for ``backward``."""

from __future__ import annotations

import numpy as np

from .functional import log_softmax

__all__ = ["softmax_cross_entropy", "mse_loss"]


def softmax_cross_entropy(logits: np.ndarray, labels: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean cross-entropy of ``softmax(logits)`` against int class ``labels``.

    ``logits`` is ``(N, K)``, ``labels`` is ``(N,)`` ints in ``[0, K)``. Returns the mean loss (a
    Python float) and ``dlogits = (softmax(logits) - onehot(labels)) / N`` in the logits' dtype.
    Stable for any logit magnitude (log-sum-exp with the max shift).
    """
    labels = np.asarray(labels)
    if logits.ndim != 2 or labels.shape != (logits.shape[0],):
        raise ValueError(f"expected (N, K) logits and (N,) labels, got {logits.shape} and {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise TypeError(f"labels must be integer class indices, got dtype {labels.dtype}")
    n = logits.shape[0]
    rows = np.arange(n)
    logp = log_softmax(logits, axis=1)
    loss = -float(logp[rows, labels].mean())
    dlogits = np.exp(logp)
    dlogits[rows, labels] -= 1
    dlogits /= n
    return loss, dlogits


def mse_loss(pred: np.ndarray, target: np.ndarray) -> tuple[float, np.ndarray]:
    """Mean over all elements of ``(pred - target)^2``; gradient ``2 (pred - target) / size``."""
    diff = pred - target
    return float(np.mean(diff * diff)), (2.0 / diff.size) * diff

"""The rank-adaptive prior of the TT paper (eq. 2 and 4) and rank pruning.

Every element of the rank slice ``G_n[:, :, :, r]`` has a zero-mean Gaussian prior of variance
``lambda_n(r)``; each ``lambda_n(r)`` has a log-uniform prior. For cores ``n = 1 .. d-1`` (the last
core's trailing rank is 1 and carries no lambda)::

    g = sum_n sum_r ||G_n[..., r]||^2 / lambda_n(r) + (1 + R_{n-1} I_n J_n) / 2 * log lambda_n(r)   (2)
    lambda_n(r) = 2 / (1 + R_{n-1} I_n J_n) * ||G_n[..., r]||^2                                  (4)

(4) is the minimizer of (2) in lambda, so after each update slices that the data does not support
shrink towards zero; a slice whose lambda falls below a threshold is removed from ``G_n`` (trailing
axis) and ``G_{n+1}`` (leading axis), lowering the TT rank ``R_n``.
"""

from __future__ import annotations

import numpy as np

#: Floor of lambda, so that an all-zero slice gives a finite prior gradient (0 / floor = 0).
LAMBDA_FLOOR = 1e-30


def slice_sq_norms(core: np.ndarray) -> np.ndarray:
    """``||G[:, :, :, r]||_F^2`` for each trailing rank index r."""
    return np.einsum("abcr,abcr->r", core, core)


def slice_size(core: np.ndarray) -> int:
    """``R_{n-1} * J_n * I_n``: the elements in one rank slice."""
    return core.shape[0] * core.shape[1] * core.shape[2]


def update_lambdas(cores) -> list[np.ndarray]:
    """Eq. 4 for cores ``1 .. d-1`` of one TT matrix (a list of ``d - 1`` vectors)."""
    return [2.0 / (1 + slice_size(c)) * slice_sq_norms(c) for c in cores[:-1]]


def prior_value(cores, lambdas) -> float:
    """Eq. 2 for one TT matrix."""
    total = 0.0
    for core, lam in zip(cores[:-1], lambdas):
        lam = np.maximum(lam, LAMBDA_FLOOR)
        total += float(np.sum(slice_sq_norms(core) / lam + (1 + slice_size(core)) / 2 * np.log(lam)))
    return total


def prior_grads(cores, lambdas) -> list[np.ndarray]:
    """``d g / d G_n = 2 G_n[..., r] / lambda_n(r)`` (zero for the last core)."""
    grads = [2.0 * core / np.maximum(lam, LAMBDA_FLOOR) for core, lam in zip(cores[:-1], lambdas)]
    return grads + [np.zeros_like(cores[-1])]


def ranks_to_keep(lam: np.ndarray, threshold: float) -> np.ndarray:
    """Indices of the rank slices whose lambda is at least ``threshold`` times the largest one.

    At least one slice always stays (a TT rank cannot drop to 0).
    """
    if not 0 <= threshold < 1:
        raise ValueError(f"prune threshold must be in [0, 1), got {threshold}")
    keep = np.flatnonzero(lam >= threshold * lam.max())
    return keep if keep.size else np.array([int(np.argmax(lam))])

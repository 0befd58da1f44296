"""Gradient max-norming (SKS paper, appendix D; LRT paper, appendix E).

Per-sample gradients span a wide dynamic range. Dividing each gradient tensor by its own max |x|
fixes the range but magnifies noise during quiet periods, so the paper divides by the larger of
the current max and a bias-corrected moving average of past maxima. With decay ``beta`` and floor
``eps``, and state ``k = 0``, ``x_mv = eps``, each call does::

    k     := k + 1
    x_max := max|x| + eps
    x_mv  := beta * x_mv + (1 - beta) * x_max
    x_norm = x / max(x_max, x_mv / (1 - beta**k))

The state is two scalars per tensor, which is what fits the auxiliary-memory budget (unlike Adam's
per-parameter moments).
"""

from __future__ import annotations

import math
from numbers import Integral, Real

import numpy as np

__all__ = ["MaxNorm"]


class MaxNorm:
    """Max-norm of one gradient tensor: ``norm = MaxNorm(); g_normed = norm(g)``."""

    def __init__(self, beta: float = 0.999, eps: float = 1e-4):
        if isinstance(beta, bool) or not isinstance(beta, Real) or not 0.0 < beta < 1.0:
            raise ValueError(f"beta must be in (0, 1), got {beta!r}")
        if isinstance(eps, bool) or not isinstance(eps, Real) or not (math.isfinite(eps) and eps > 0):
            raise ValueError(f"eps must be a positive finite number, got {eps!r}")
        self.beta = float(beta)
        self.eps = float(eps)
        self.k = 0
        self.x_mv = self.eps

    def _step(self, x):
        """The normalized value and the state after ``x``, without storing the state."""
        x = np.asarray(x, dtype=np.float64)
        if x.size == 0:
            raise ValueError("MaxNorm: cannot normalize an empty tensor")
        if not np.isfinite(x).all():
            raise ValueError("MaxNorm: the input holds non-finite values")
        k = self.k + 1
        x_max = float(np.max(np.abs(x))) + self.eps
        x_mv = self.beta * self.x_mv + (1.0 - self.beta) * x_max
        # Bias correction as in Adam: early on x_mv is mostly its initial value.
        x_mv_hat = x_mv / (1.0 - self.beta ** k)
        return x / max(x_max, x_mv_hat), k, x_mv

    def __call__(self, x) -> np.ndarray:
        """Update the state with ``x`` and return it normalized (max |output| < 1)."""
        out, self.k, self.x_mv = self._step(x)
        return out

    def peek(self, x) -> np.ndarray:
        """What ``self(x)`` would return, leaving the state untouched (to test whether an update
        would be large enough before committing to it)."""
        return self._step(x)[0]

    @property
    def scale(self) -> float:
        """The current bias-corrected moving average of maxima (``eps``-based before any call)."""
        return self.x_mv / (1.0 - self.beta ** self.k) if self.k else self.x_mv

    # -- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"beta": self.beta, "eps": self.eps, "k": self.k, "x_mv": self.x_mv}

    def load_state_dict(self, state: dict) -> None:
        missing = {"k", "x_mv"} - set(state)
        if missing:
            raise ValueError(f"MaxNorm state is missing {sorted(missing)}")
        # A state saved under other hyper-parameters would silently change the normalization.
        for key in ("beta", "eps"):
            if key in state and float(state[key]) != getattr(self, key):
                raise ValueError(f"MaxNorm state has {key}={state[key]}, this instance {getattr(self, key)}")
        k, x_mv = state["k"], state["x_mv"]
        if isinstance(k, np.ndarray) and k.ndim == 0:     # as np.load gives it back from .npz
            k = k.item()
        if isinstance(k, bool) or not isinstance(k, Integral) or k < 0:
            raise ValueError(f"MaxNorm state: k must be an integer >= 0, got {k!r}")
        x_mv = float(x_mv)
        if not (math.isfinite(x_mv) and x_mv > 0):
            raise ValueError(f"MaxNorm state: x_mv must be a positive finite number, got {x_mv!r}")
        self.k, self.x_mv = int(k), x_mv

    def __repr__(self) -> str:
        return f"MaxNorm(beta={self.beta}, eps={self.eps}, k={self.k}, x_mv={self.x_mv:.6g})"

"""Optimizers that update layer parameters in place from the gradients in ``layer.grads``."""

from __future__ import annotations

from typing import Iterable

import numpy as np

from .layers import Layer, Param

__all__ = ["SGD"]


class SGD:
    """Stochastic gradient descent with optional momentum and L2 weight decay (PyTorch semantics).

    ``params`` is an iterable of :class:`~insitu.nn.layers.Param` handles (what
    ``model.parameters()`` yields) or a layer/model with a ``parameters()`` method. Per step, for
    each parameter ``w`` with gradient ``g``::

        g = g + weight_decay * w
        v = momentum * v + g          (only when momentum > 0; v starts at 0)
        w -= lr * v                   (or lr * g without momentum)

    Weight decay applies to every parameter given; to exempt biases and norm parameters, build
    the optimizer from a filtered list, e.g. ``[p for p in model.parameters() if p.name == "weight"]``.
    ``lr`` may be changed between steps (schedules).
    """

    def __init__(self, params: Iterable[Param] | Layer, lr: float, momentum: float = 0.0, weight_decay: float = 0.0):
        if hasattr(params, "parameters"):
            params = params.parameters()
        self.params: list[Param] = list(params)
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise ValueError("lr, momentum and weight_decay must be >= 0")
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self._velocity: list[np.ndarray | None] = [None] * len(self.params)

    def step(self) -> None:
        for k, p in enumerate(self.params):
            w, g = p.value, p.grad
            if self.weight_decay:
                g = g + self.weight_decay * w
            if self.momentum:
                v = self._velocity[k]
                if v is None:
                    v = self._velocity[k] = np.zeros_like(w)
                v *= self.momentum
                v += g
                g = v
            w -= (self.lr * g).astype(w.dtype, copy=False)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad.fill(0)

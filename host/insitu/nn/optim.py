"""Optimizers that update layer parameters in place from the gradients in ``layer.grads``."""

from __future__ import annotations

from typing import Iterable, cast

import numpy as np

from .layers import Layer, Param

__all__ = ["SGD", "Adam"]


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
        if hasattr(params, "parameters"):             # a layer or a model
            params = cast(Layer, params).parameters()
        self.params: list[Param] = list(cast("Iterable[Param]", params))
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

    def state_dict(self) -> dict[str, np.ndarray]:
        """The momentum velocities by parameter key (none before the first step or without momentum):
        what a resumed run needs to step on exactly as an uninterrupted one."""
        return {f"velocity.{p.key}": v.copy() for p, v in zip(self.params, self._velocity) if v is not None}

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        index = {p.key: k for k, p in enumerate(self.params)}
        self._velocity = [None] * len(self.params)
        for name, value in state.items():
            self._velocity[index[name.removeprefix("velocity.")]] = np.array(value, copy=True)


class Adam:
    """Adam (Kingma & Ba 2015) with PyTorch's defaults and bias correction.

    Moments live in :attr:`state` keyed by ``param.key`` as ``{"m": ..., "v": ...}``, so a trainer
    that changes a parameter's shape (TT rank pruning) slices them alongside the parameter.
    """

    def __init__(self, params: Iterable[Param] | Layer, lr: float = 1e-3, betas=(0.9, 0.999),
                 eps: float = 1e-8):
        if hasattr(params, "parameters"):             # a layer or a model
            params = cast(Layer, params).parameters()
        self.params: list[Param] = list(cast("Iterable[Param]", params))
        if not lr > 0 or not all(0 <= b < 1 for b in betas) or not eps > 0:
            raise ValueError(f"Adam needs lr > 0, betas in [0, 1) and eps > 0; got lr={lr}, "
                             f"betas={betas}, eps={eps}")
        self.lr, self.betas, self.eps = lr, tuple(betas), eps
        self.steps = 0
        self.state: dict[str, dict[str, np.ndarray]] = {}

    def step(self) -> None:
        self.steps += 1
        b1, b2 = self.betas
        correction1, correction2 = 1 - b1 ** self.steps, 1 - b2 ** self.steps
        for p in self.params:
            w, g = p.value, p.grad
            st = self.state.get(p.key)
            if st is None:
                st = self.state[p.key] = {"m": np.zeros_like(w), "v": np.zeros_like(w)}
            elif st["m"].shape != w.shape:
                # A trainer that reshapes a parameter (rank pruning) must slice its moments too.
                raise ValueError(f"Adam: parameter {p.key} has shape {w.shape} but its moments "
                                 f"{st['m'].shape}; slice optimizer.state[{p.key!r}] with it")
            st["m"] *= b1
            st["m"] += (1 - b1) * g
            st["v"] *= b2
            st["v"] += (1 - b2) * g * g
            step = self.lr * (st["m"] / correction1) / (np.sqrt(st["v"] / correction2) + self.eps)
            w -= step.astype(w.dtype, copy=False)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad.fill(0)

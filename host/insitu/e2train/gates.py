"""SLU's RNN gates (E²-Train appendix C, after SkipNet's "RNNGates").

One gate sits in front of each gated residual block. Its input is the block's input::

    pooled = GAP(x)                         (N, C)        global average pooling
    u      = proj_s(pooled)                 (N, 10)       one linear projection per stage s
    h, c   = LSTM(u, (h, c))                (N, 10)       ONE cell shared by all gates; its state
                                                          runs from gate to gate in block order
    p      = sigmoid(out(h))                (N,)          shared linear 10 -> 1

``p`` is the probability that the block executes; the model runs it where ``p >= 0.5``.

:class:`RNNGates` owns the parameters and does the recurrence. The model calls :meth:`reset`
once per forward pass, :meth:`step` once per gated block (in block order), and after its own
backward pass :meth:`backward` with ``dL/dp`` of every gate; backpropagation through time runs
over the gate sequence only. Nothing flows back into ``pooled``: the gates read the network's
features as constants (the gradient into the main network would be a tiny, noisy term through
GAP, and skipping it saves a full-size broadcast add per gate in the backward pass).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numpy.typing import DTypeLike

from insitu.nn.layers import Layer

__all__ = ["RNNGates", "GATE_HIDDEN"]

#: Width of the projected gate input and of the LSTM state (the paper: 10).
GATE_HIDDEN = 10


def _sigmoid(z: np.ndarray) -> np.ndarray:
    # Split by sign so exp never overflows.
    out = np.empty_like(z)
    pos = z >= 0
    out[pos] = 1.0 / (1.0 + np.exp(-z[pos]))
    ez = np.exp(z[~pos])
    out[~pos] = ez / (1.0 + ez)
    return out


class RNNGates(Layer):
    """Shared-weight recurrent gates. ``stage_channels[s]`` is the channel count of the blocks
    gated in stage ``s`` (one projection per stage).

    Parameters (``params``/``grads`` keys): ``proj<s>.weight`` ``(H, C_s)``, ``proj<s>.bias``,
    ``lstm.w_ih`` / ``lstm.w_hh`` ``(4H, H)`` (row blocks i, f, g, o), ``lstm.bias`` ``(4H,)``,
    ``out.weight`` ``(H,)``, ``out.bias`` ``(1,)``.

    ``init_bias`` is the initial output bias: sigmoid(2.5) ~ 0.92, so at the start every block
    runs for (almost) every sample and the network first learns as an ordinary ResNet.
    """

    def __init__(self, stage_channels: Sequence[int], hidden: int = GATE_HIDDEN, seed=None,
                 dtype: DTypeLike = np.float32, init_bias: float = 2.5):
        super().__init__()
        self.hidden = hidden
        self.stage_channels = tuple(int(c) for c in stage_channels)
        self.dtype = np.dtype(dtype)
        rng = np.random.default_rng(seed)
        k = 1.0 / np.sqrt(hidden)

        def uni(shape, bound):
            return rng.uniform(-bound, bound, shape).astype(dtype)

        for s, c in enumerate(self.stage_channels):
            if c:
                self._add_param(f"proj{s}.weight", uni((hidden, c), 1.0 / np.sqrt(c)))
                self._add_param(f"proj{s}.bias", np.zeros(hidden, dtype=dtype))
        self._add_param("lstm.w_ih", uni((4 * hidden, hidden), k))
        self._add_param("lstm.w_hh", uni((4 * hidden, hidden), k))
        self._add_param("lstm.bias", np.zeros(4 * hidden, dtype=dtype))
        # A small output weight keeps p near sigmoid(init_bias) for every input at the start.
        self._add_param("out.weight", uni((hidden,), 0.1 * k))
        self._add_param("out.bias", np.full(1, init_bias, dtype=dtype))
        self._h = self._c = None
        self._tape: list | None = None

    # ---------------------------------------------------------------------------------- cost

    def step_macs(self, channels: int, pixels: int) -> int:
        """Forward MACs per sample of one gate: GAP adds, projection, LSTM cell, output."""
        h = self.hidden
        return channels * pixels + channels * h + 4 * h * (h + h) + h

    def num_params(self) -> int:
        return sum(v.size for v in self.params.values())

    # ---------------------------------------------------------------------------------- passes

    def reset(self, n: int, train: bool = True) -> None:
        """Start a gate sequence for a batch of ``n`` samples (zero LSTM state)."""
        self._h = np.zeros((n, self.hidden), dtype=self.dtype)
        self._c = np.zeros((n, self.hidden), dtype=self.dtype)
        self._tape = [] if train else None

    def step(self, stage: int, pooled: np.ndarray) -> np.ndarray:
        """One gate: ``pooled`` ``(N, C_stage)`` -> execution probabilities ``p`` ``(N,)``."""
        if self._h is None:
            raise RuntimeError("RNNGates.step before reset()")
        P = self.params
        pooled = pooled.astype(self.dtype, copy=False)
        u = pooled @ P[f"proj{stage}.weight"].T + P[f"proj{stage}.bias"]
        z = u @ P["lstm.w_ih"].T + self._h @ P["lstm.w_hh"].T + P["lstm.bias"]
        H = self.hidden
        i = _sigmoid(z[:, :H])
        f = _sigmoid(z[:, H:2 * H])
        g = np.tanh(z[:, 2 * H:3 * H])
        o = _sigmoid(z[:, 3 * H:])
        c = f * self._c + i * g
        tc = np.tanh(c)
        h = o * tc
        p = _sigmoid(h @ P["out.weight"] + P["out.bias"][0])
        if self._tape is not None:
            self._tape.append((stage, pooled, u, self._h, self._c, i, f, g, o, tc, h, p))
        self._h, self._c = h, c
        return p

    # The gates share Layer's parameter plumbing, not its backward: they take every gate's dL/dp
    # and send no gradient back.
    def backward(self, dps: Sequence[np.ndarray]) -> None:  # pyright: ignore[reportIncompatibleMethodOverride]
        """Backpropagation through the gate sequence: ``dps[k]`` is ``dL/dp`` ``(N,)`` of the
        k-th gate of the last training forward. Adds into ``grads``; returns nothing (no
        gradient goes to the pooled features, see the module docstring)."""
        if self._tape is None:
            raise RuntimeError("RNNGates.backward without a preceding training forward")
        if len(dps) != len(self._tape):
            raise ValueError(f"got dL/dp for {len(dps)} gates, the forward ran {len(self._tape)}")
        P, G, H = self.params, self.grads, self.hidden
        dh_next = dc_next = None
        for (stage, pooled, u, h_prev, c_prev, i, f, g, o, tc, h, p), dp in zip(
                reversed(self._tape), reversed(dps)):
            dlogit = (np.asarray(dp, dtype=self.dtype) * p * (1 - p))     # (N,)
            G["out.weight"] += dlogit @ h
            G["out.bias"] += dlogit.sum()
            dh = dlogit[:, None] * P["out.weight"][None, :]
            if dh_next is not None:
                dh = dh + dh_next
            dc = dh * o * (1 - tc * tc)
            if dc_next is not None:
                dc = dc + dc_next
            dz = np.empty((len(p), 4 * H), dtype=self.dtype)
            dz[:, :H] = dc * g * i * (1 - i)
            dz[:, H:2 * H] = dc * c_prev * f * (1 - f)
            dz[:, 2 * H:3 * H] = dc * i * (1 - g * g)
            dz[:, 3 * H:] = dh * tc * o * (1 - o)
            G["lstm.w_ih"] += dz.T @ u
            G["lstm.w_hh"] += dz.T @ h_prev
            G["lstm.bias"] += dz.sum(axis=0)
            du = dz @ P["lstm.w_ih"]
            G[f"proj{stage}.weight"] += du.T @ pooled
            G[f"proj{stage}.bias"] += du.sum(axis=0)
            dh_next = dz @ P["lstm.w_hh"]
            dc_next = dc * f

    def __repr__(self):
        return f"RNNGates(stages={self.stage_channels}, hidden={self.hidden})"

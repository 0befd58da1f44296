"""The tensor-train matrix (TTM): a J x I weight stored as d cores ``(R_{n-1}, J_n, I_n, R_n)``.

``W(j_1..j_d, i_1..i_d) = G_1[:, j_1, i_1, :] @ G_2[:, j_2, i_2, :] @ ... @ G_d[:, j_d, i_d, :]``;
rows of W are ``j = (j_1, .., j_d)`` and columns ``i = (i_1, .., i_d)``, both row-major. Forward
and backward run through the primitive-op schedule (float executor), so every check of this class
against the dense matrix is also a check of the schedule.
"""

from __future__ import annotations

import math

import numpy as np

from .execute import FloatExecutor
from .schedule import (check_modes, factor_grad_ops, forward_ops, grad_buffer, input_grad_ops,
                       weight_grad_op)

__all__ = ["TTMatrix", "he_core_std"]

#: Largest intermediate (elements) the direct factor gradient may create.
DIRECT_INTERMEDIATE_LIMIT = 1 << 26


def he_core_std(in_modes, ranks) -> float:
    """Per-core standard deviation that gives the full matrix He variance ``2 / I``.

    Each element of W is a sum of ``prod(R_1..R_{d-1})`` products of d core elements, so
    ``Var(W) = std**(2d) * prod(R)``.
    """
    d = len(in_modes)
    var_w = 2.0 / math.prod(in_modes)
    return (var_w / math.prod(ranks[1:-1])) ** (1.0 / (2 * d))


class TTMatrix:
    """A TT-matrix of shape ``(prod(out_modes), prod(in_modes))``.

    ``ranks`` is an int (every internal rank), the ``d - 1`` internal ranks, or all ``d + 1``.
    Cores start He-scaled Gaussian (``seed``); pass ``cores`` to set them.
    """

    def __init__(self, in_modes, out_modes, ranks, seed=None, cores=None):
        self.in_modes, self.out_modes, ranks = check_modes(in_modes, out_modes, ranks)
        self.d = len(self.in_modes)
        if cores is None:
            rng = np.random.default_rng(seed)
            std = he_core_std(self.in_modes, ranks)
            cores = [rng.standard_normal((ranks[n], self.out_modes[n], self.in_modes[n], ranks[n + 1])) * std
                     for n in range(self.d)]
        self.cores = [np.array(c, dtype=np.float64) for c in cores]
        self._check_cores()
        if self.ranks != ranks:
            raise ValueError(f"the cores have ranks {list(self.ranks)} but ranks={list(ranks)} was given")
        self._executor = FloatExecutor()

    # ------------------------------------------------------------------ shape
    def _check_cores(self) -> None:
        if len(self.cores) != self.d:
            raise ValueError(f"expected {self.d} cores for {self.d} modes, got {len(self.cores)}")
        for n, core in enumerate(self.cores):
            if core.ndim != 4 or core.shape[1:3] != (self.out_modes[n], self.in_modes[n]):
                raise ValueError(f"core {n + 1} has shape {core.shape}; expected (R_{n}, "
                                 f"{self.out_modes[n]}, {self.in_modes[n]}, R_{n + 1})")
            if n and core.shape[0] != self.cores[n - 1].shape[3]:
                raise ValueError(f"core {n + 1} starts with rank {core.shape[0]} but core {n} ends "
                                 f"with rank {self.cores[n - 1].shape[3]}")
        if self.cores[0].shape[0] != 1 or self.cores[-1].shape[3] != 1:
            raise ValueError("the first core must start and the last core end with rank 1")

    @property
    def ranks(self) -> tuple[int, ...]:
        return (1, *(c.shape[3] for c in self.cores))

    @property
    def shape(self) -> tuple[int, int]:
        return math.prod(self.out_modes), math.prod(self.in_modes)

    @property
    def parameter_count(self) -> int:
        return sum(c.size for c in self.cores)

    def full(self) -> np.ndarray:
        """The dense ``J x I`` matrix."""
        t = self.cores[0][0]                                        # (J_1, I_1, R_1)
        for core in self.cores[1:]:
            j, i, _ = t.shape
            t = np.einsum("jir,rabs->jaibs", t, core).reshape(j * core.shape[1], i * core.shape[2], -1)
        return t[:, :, 0]

    # ------------------------------------------------------------------ passes
    def _check_batch(self, x: np.ndarray, width: int, what: str) -> np.ndarray:
        x = np.asarray(x, dtype=np.float64)
        if x.ndim != 2 or x.shape[1] != width:
            raise ValueError(f"{what} must be (batch, {width}); got shape {x.shape}")
        return x

    def _run(self, ops, buffers) -> dict:
        for op in ops:
            self._executor.run(op, buffers, self.cores, (self.out_modes, self.in_modes))
        return buffers

    def forward(self, x) -> np.ndarray:
        """``Y = X W^T`` for a batch (rows are samples): eq. 8-10."""
        x = self._check_batch(x, self.shape[1], "X")
        ops = forward_ops(self.in_modes, self.out_modes, self.ranks, x.shape[0])
        return self._run(ops, {"x": x.ravel()})["y"].reshape(x.shape[0], -1)

    def backward_input(self, dy) -> np.ndarray:
        """``dX = dY W``: eq. 11-13."""
        dy = self._check_batch(dy, self.shape[0], "dY")
        ops = input_grad_ops(self.in_modes, self.out_modes, self.ranks, dy.shape[0])
        return self._run(ops, {"dy": dy.ravel()})["dx"].reshape(dy.shape[0], -1)

    def factor_grads(self, x, dy, method: str = "full") -> list[np.ndarray]:
        """Gradients of ``sum(dY * (X W^T))`` with respect to each core.

        ``method="full"``: the full-weight gradient on PE3, then eq. 14-19 (what the accelerator
        runs; best for large ranks and batches). ``"direct"``: contract X and dY with the other
        cores without forming the full gradient (best for small ranks and batches).
        """
        x = self._check_batch(x, self.shape[1], "X")
        dy = self._check_batch(dy, self.shape[0], "dY")
        if x.shape[0] != dy.shape[0]:
            raise ValueError(f"X has {x.shape[0]} samples but dY has {dy.shape[0]}")
        if method == "direct":
            return self._direct_grads(x, dy)
        if method != "full":
            raise ValueError(f"method must be 'full' or 'direct', got {method!r}")
        ops = [weight_grad_op(self.in_modes, self.out_modes, x.shape[0]),
               *factor_grad_ops(self.in_modes, self.out_modes, self.ranks)]
        buffers = self._run(ops, {"x": x.ravel(), "dy": dy.ravel()})
        return [buffers[grad_buffer(n, self.d)].reshape(core.shape) for n, core in enumerate(self.cores)]

    def _direct_grads(self, x, dy) -> list[np.ndarray]:
        batch, d = x.shape[0], self.d
        xt = x.reshape(batch, *self.in_modes)
        dyt = dy.reshape(batch, *self.out_modes)
        # einsum letters: s sample, i* input modes, j* output modes, r* ranks.
        letters = iter("abcdefghklmnopqtuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
        i_ax = [next(letters) for _ in range(d)]
        j_ax = [next(letters) for _ in range(d)]
        r_ax = [next(letters) for _ in range(d + 1)]
        core_subs = [f"{r_ax[n]}{j_ax[n]}{i_ax[n]}{r_ax[n + 1]}" for n in range(d)]
        grads = []
        for n in range(d):
            others = [k for k in range(d) if k != n]
            subs = ["s" + "".join(i_ax), "s" + "".join(j_ax)] + [core_subs[k] for k in others]
            # The boundary ranks (size 1) of core n appear in no other operand: drop, then restore.
            out = core_subs[n].replace(r_ax[0], "").replace(r_ax[d], "")
            spec = ",".join(subs) + "->" + out
            operands = (xt, dyt, *(self.cores[k] for k in others))
            # A greedy order without numpy's default cap on intermediates (the largest input), which
            # would forbid every useful intermediate and contract all operands in one naive loop.
            path = np.einsum_path(spec, *operands, optimize=("greedy", DIRECT_INTERMEDIATE_LIMIT))[0]
            grad = np.einsum(spec, *operands, optimize=path)
            grads.append(grad.reshape(self.cores[n].shape))
        return grads

    def __repr__(self) -> str:
        return (f"TTMatrix(in_modes={list(self.in_modes)}, out_modes={list(self.out_modes)}, "
                f"ranks={list(self.ranks)})")

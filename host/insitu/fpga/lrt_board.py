"""LRT online adaptation with the per-sample vector work on the accelerator's LRT PE.

The algorithm half of ``insitu train --board <fpga board> --algo lrt``: the streaming Kronecker
sum (SKS, Algorithm 1 of the SKS paper; float reference :class:`insitu.lrt.sks.KroneckerSum`) split
between the LRT PE and the processor the way the PE was built for (``docs/rtl.md``,
:mod:`insitu.lrt.pe_ops`):

* **PE** (integer, O((m+n)·q) per sample): PROJECT / REPROJECT (modified Gram-Schmidt), APPEND
  (the normalized residual as basis column r), ROTATE (``Q[:, :r] ← Q·M``), and once per batch
  UPDATE (``W ← W − round(Q_L diag(s) Q_Rᵀ, SHIFT)``, counting the writes of every cell);
* **processor** (float, O(q³) per sample): the q × q core (:func:`insitu.lrt.sks.core_rotation`:
  the SVD of ``C = c_L c_Rᵀ + diag(c_x)`` and the minimum-variance unbiased estimator), the weights
  ``c_x``, the scales of the streamed words, and everything of the network but the adapted layer.

The hardware is reached through a *port* (:class:`PEPort`): the PYNQ driver on a board, the
simulated board on its twin, or any adapter over the golden model :class:`~insitu.lrt.pe_ops.
LRTPEModel` (the unit tests have one). Fixed-point formats all come from :mod:`insitu.numerics`.

Which layer: the PE holds one weight matrix of at most ``lrt_rows_max`` (256) rows and columns and
``lrt_cells_max`` (16,384) cells, and its q = r + 1 basis columns bound the rank to
``lrt_cols_max − 1`` (7). :class:`LRTBoardTrainer` adapts the **last dense layer** of the LRT
paper's quantized network (:mod:`insitu.lrt.qnet`), which fits as it is in both architectures:
64 → 10 (640 cells) in the paper's CNN, 128 → 10 (1,280 cells) in the MLP; rank ≤ 7 < 10 classes.
(The CNN's 144 → 64 would fit too, the MLP's 784 → 128 would not. One weight memory holds one
layer: the last, the one the LRT paper's transfer experiment (table 1) recovers, and the one whose
gradient needs no backward pass through frozen layers.) The other layers are frozen on the
processor, their batch-norm statistics too (the prefix runs in inference mode, a chunk of samples
at once); the adapted layer's 16-bit bias is trained on the processor every sample, as the LRT
schemes of :mod:`insitu.lrt.schemes` train it.

Any dataset of :mod:`insitu.lrt.online` runs here (images of any size, RGB made grey, feature
vectors for the MLP): the frozen layers on the processor take any input, and the PE only ever
sees the adapted layer, whose columns are the network's fixed hidden width (64 or 128). What a
dataset can change is the layer's rows, its K classes: they must fit the PE's memories (K ≤ 256
for the CNN, K ≤ 128 for the MLP) and exceed the rank (rank ≤ min(7, K − 1)); both are checked
before pre-training, and refused naming the limit.

Differences from :class:`insitu.lrt.schemes.OnlineTrainer` (scheme ``lrt``), and why:

* every ``batch`` samples the PE writes the update; ρ_min (skip an update that changes < 1 % of the
  cells) is not applied: deciding it needs the dense update on the processor, the very work the PE
  does, and the PE writes only cells whose code changes anyway;
* the step is ``ΔW = −lr·√B·Ĝ`` with ``Ĝ = L·Rᵀ / B`` (the trainer's square-root rule with
  ``B_eff = B``), so ``lr`` means what it means for ``insitu lrt adapt``;
* after each update the accumulator is reset (``c_x = 0``) and its bases are re-orthonormalized on
  the processor (read back, QR, loaded again; their span is kept). With ``c_x = 0`` any orthonormal
  basis gives the same estimate, and this bounds the loss of orthogonality of Q1.14 bases, which
  are rounded at every ROTATE, to one batch of rotations (without it, max |QᵀQ − I| measured
  9e-4 after 100 pairs and 2e-3 after 2000, and kept growing);
* weight drift (the ``analog`` / ``digital`` environments) is not modelled on the PE's weight
  memory: those environments are refused;
* no max-norm (``lrt-maxnorm``): it needs max |Ĝ| over the cells, which no PE op returns.

Write counts: the PE counts writes per cell (16-bit, saturating) since its last LRT_LOAD_WEIGHTS.
A resumed run loads the weights again, which restarts those counters at 0, so the trainer keeps the
counts of before on the processor and adds them to what the PE reports (see
:class:`LRTBoardTrainer`).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Callable, Protocol

import numpy as np

from insitu import nn
from insitu.checks import check_int
from insitu.harness import CURVE_POINTS, RunPlan, check_resumable, run_training, say
from insitu.lrt.adapt import (OFFLINE_SAMPLES, PRETRAIN_EPOCHS, AdaptLearner, build_network, curve_positions,
                              pretrained_model)
from insitu.lrt.online import OnlineData
from insitu.accel.stream import pad_words
from insitu.lrt.pe_ops import append_reciprocal
from insitu.lrt.qnet import QNet
from insitu.lrt.sks import random_orthonormal, core_rotation
from insitu.lrt.schemes import LRTConfig, cross_entropy, evaluate, loss_gradient
from insitu.numerics import LRT_BASIS, LRT_BIAS, LRT_PE_WORD_BITS, LRT_WEIGHT, max_abs_format
from insitu.accel.params import AcceleratorParams
from insitu.accel.regmap import Op

from .regs import bitstream_params

__all__ = ["PEPort", "PEKroneckerSum", "LRTBoardTrainer", "run_board_adapt", "pe_params", "check_pe_fit",
           "BOARD_ENVS"]

#: Environments the board run accepts: the input-distribution ones (no drift of the weight cells).
BOARD_ENVS = ("control", "shift")

_REPROJECT_BELOW = 0.5       # (1/√2)²: a residual keeping less than 1/√2 of |x| gets a second pass


class PEPort(Protocol):
    """What the algorithm needs of the accelerator (the driver or a simulated board implements it)."""

    def run(self, op: Op, words: np.ndarray | None = None, **registers) -> np.ndarray:
        """Write the named registers (regmap names: SHIFT, LRT_SIDE, LRT_ROWS_L, LRT_ROWS_R,
        LRT_COLS, LRT_RECIP), START ``op``, stream ``words`` in (signed 16-bit words as int64,
        exactly the op's input length, a multiple of 8), return the output stream (signed int64
        words, full padded length). Registers keep their values between runs, like hardware."""
        ...

    def read(self, name: str) -> int:
        """Read a register by its regmap name (LRT_NORM2_LO/HI, LRT_WRITES_MAX, CAP_LRT_ROWS_MAX…)."""
        ...


def pe_params(port: PEPort) -> AcceleratorParams:
    """The LRT PE's bounds of the bitstream behind ``port`` (its CAP_LRT_* registers)."""
    return bitstream_params(port.read, "CAP_LRT_")


class _CountingPort:
    """The port, counting the ops run (by Op name) for the report."""

    def __init__(self, port: PEPort):
        self.port = port
        self.ops: Counter[str] = Counter()

    def run(self, op: Op, words=None, **registers) -> np.ndarray:
        self.ops[op.name] += 1
        return np.asarray(self.port.run(op, words, **registers), dtype=np.int64)

    def read(self, name: str) -> int:
        return int(self.port.read(name))

    def norm2(self) -> int:
        """LRT_NORM2: the exact squared residual norm of the last projection (64 bits in two reads)."""
        return self.read("LRT_NORM2_LO") | self.read("LRT_NORM2_HI") << 32


def check_pe_fit(m: int, n: int, rank: int, params: AcceleratorParams,
                 kappa_th: float | None = None) -> None:
    """ValueError unless a rank-``rank`` sum of ``m × n`` outer products fits the PE of ``params``."""
    check_int("rows m", m, 1, params.lrt_rows_max, "rows of Q_L: the PE's lrt_rows_max")
    check_int("columns n", n, 1, params.lrt_rows_max, "rows of Q_R: the PE's lrt_rows_max")
    top = min(params.lrt_cols_max - 1, min(m, n) - 1)
    if top < 1:
        raise ValueError(f"no rank fits a {m} x {n} matrix on a PE with {params.lrt_cols_max} basis "
                         "columns")
    check_int("rank", rank, 1, top,
              f"q = rank + 1 basis columns must fit the PE's {params.lrt_cols_max}, and rank "
              f"{min(m, n)} would be a full-rank estimate of a {m} x {n} matrix: use a lower rank")
    if kappa_th is not None and not (np.isfinite(kappa_th) and kappa_th > 0):
        raise ValueError(f"kappa_th must be a positive number or None (never skip), got {kappa_th!r}")


class PEKroneckerSum:
    """Rank-``rank`` streaming estimate of ``Σ dz ⊗ a`` whose vector work runs on the LRT PE.

    The fixed-point mirror of :class:`insitu.lrt.sks.KroneckerSum` (same ``seed`` → same initial
    bases and random signs): the PE holds ``Q_L`` (``n_out`` rows, side 0) and ``Q_R`` (``n_in``
    rows, side 1) as Q1.14 codes, the processor holds ``c_x``. :meth:`add` streams one pair;
    :meth:`apply_update` runs LRT_UPDATE with the estimate; :meth:`estimate` reads the bases back.

    Each input vector is sent as 16-bit words with a power-of-2 scale chosen from its *norm*
    (``max_abs_format`` of 2·|x|): the projections ``c_j = Q_jᵀx`` are bounded by |x|, not by
    max |x|, and the factor 2 leaves room for bases whose column norms drifted above 1.
    """

    def __init__(self, port: PEPort | _CountingPort, n_out: int, n_in: int, rank: int,
                 unbiased: bool = True, seed=None, kappa_th: float | None = None,
                 params: AcceleratorParams | None = None):
        self.pe = port if isinstance(port, _CountingPort) else _CountingPort(port)
        self.params = params or pe_params(self.pe.port)
        check_pe_fit(n_out, n_in, rank, self.params, kappa_th)
        self.n_out, self.n_in, self.rank = int(n_out), int(n_in), int(rank)
        self.q = self.rank + 1
        self.unbiased = bool(unbiased)
        self.kappa_th = kappa_th
        self._rng = np.random.default_rng(seed)
        # Drawn as KroneckerSum draws them, so both start from the same bases.
        bases = (random_orthonormal(self._rng, self.n_out, self.q),
                 random_orthonormal(self._rng, self.n_in, self.q))
        self.cx = np.zeros(self.rank)
        self.counts = {"added": 0, "skipped": 0, "zero": 0, "reprojected": 0}
        # The sizes go with the ops that (re)load the PE; the per-sample ops rely on the
        # registers keeping them, as hardware does (SHIFT, shared with the TT PEs, goes every time).
        self._sizes = {"LRT_ROWS_L": self.n_out, "LRT_ROWS_R": self.n_in, "LRT_COLS": self.rank}
        for side, Q in enumerate(bases):
            self.load_basis(side, LRT_BASIS.quantize_code(Q))

    # -- the PE ----------------------------------------------------------------------------------
    def _rows(self, side: int) -> int:
        return self.n_in if side else self.n_out

    def load_basis(self, side: int, codes: np.ndarray) -> None:
        """Load ``side``'s basis (``rows × ≤ lrt_cols_max`` Q1.14 codes; missing columns are 0)."""
        rows, cols = self._rows(side), self.params.lrt_cols_max
        full = np.zeros((rows, cols), np.int64)
        full[:, :codes.shape[1]] = codes
        self.pe.run(Op.LRT_LOAD_BASIS, pad_words(full), LRT_SIDE=side, **self._sizes)

    def read_basis(self, side: int) -> np.ndarray:
        """``side``'s basis codes from the PE, ``rows × q`` (the columns in use and the scratch one)."""
        rows, cols = self._rows(side), self.params.lrt_cols_max
        out = self.pe.run(Op.LRT_READ_BASIS, LRT_SIDE=side, **self._sizes)
        return out[:rows * cols].reshape(rows, cols)[:, :self.q]

    def _project(self, side: int, x: np.ndarray) -> np.ndarray:
        """PROJECT (and REPROJECT when needed), APPEND: ``(c_1..c_r, |residual|)`` in x's units."""
        fmt = max_abs_format(2.0 * np.linalg.norm(x), LRT_PE_WORD_BITS)
        codes = fmt.quantize_code(x)
        x_norm2 = int(codes @ codes)
        r = self.rank
        c = self.pe.run(Op.LRT_PROJECT, pad_words(codes), LRT_SIDE=side)[:r]
        norm2 = self.pe.norm2()
        if norm2 < _REPROJECT_BELOW * x_norm2:            # "twice is enough"
            c = c + self.pe.run(Op.LRT_REPROJECT, LRT_SIDE=side)[:r]
            norm2 = self.pe.norm2()
            self.counts["reprojected"] += 1
        recip, shift = append_reciprocal(norm2)
        self.pe.run(Op.LRT_APPEND, LRT_SIDE=side, LRT_RECIP=recip, SHIFT=shift)
        out = np.empty(r + 1)
        out[:r] = fmt.to_float(c)
        out[r] = math.sqrt(norm2) * fmt.lsb
        return out

    # -- streaming -------------------------------------------------------------------------------
    def add(self, dz, a) -> None:
        """Stream one outer product ``dz ⊗ a`` (``n_out`` and ``n_in`` finite values)."""
        dz = np.asarray(dz, dtype=np.float64).ravel()
        a = np.asarray(a, dtype=np.float64).ravel()
        if dz.size != self.n_out or a.size != self.n_in:
            raise ValueError(f"PEKroneckerSum.add: dz needs {self.n_out} values and a {self.n_in}, "
                             f"got {dz.size} and {a.size}")
        if not (np.isfinite(dz).all() and np.isfinite(a).all()):
            raise ValueError("PEKroneckerSum.add: dz or a contains NaN or inf; the estimate is unchanged")
        signs = self._rng.integers(0, 2, size=(1, self.q)) * 2.0 - 1.0     # as KroneckerSum.add
        if not (dz.any() and a.any()):
            self.counts["zero"] += 1                   # a zero outer product changes nothing
            return
        cL = self._project(0, dz)
        cR = self._project(1, a)
        r = self.rank
        if self.kappa_th and abs(cL[0] * cR[0] + self.cx[0]) > self.kappa_th * abs(cL[r] * cR[r]):
            self.counts["skipped"] += 1                # the κ_th skip of sks.py (appendix H)
            return
        ML, MR, new_cx = core_rotation(cL, cR, self.cx, signs[0], self.unbiased)
        for side, M in ((0, ML), (1, MR)):
            self.pe.run(Op.LRT_ROTATE, pad_words(LRT_BASIS.quantize_code(M)), LRT_SIDE=side)
        self.cx[:] = new_cx
        self.counts["added"] += 1

    def reset(self) -> None:
        """Forget the sum (``c_x = 0``) and re-orthonormalize the bases on the processor (same span;
        any orthonormal basis will do for a zero estimate)."""
        self.cx[:] = 0.0
        for side in (0, 1):
            Q = LRT_BASIS.to_float(self.read_basis(side)[:, :self.rank])
            qm, rm = np.linalg.qr(Q)
            # Signs that keep each column pointing where it did (QR's are arbitrary).
            qm *= np.where(np.diag(rm) < 0, -1.0, 1.0)
            self.load_basis(side, LRT_BASIS.quantize_code(qm))

    # -- results ---------------------------------------------------------------------------------
    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """``(L, R)`` from the PE's bases, de-quantized: ``L @ R.T`` is the estimate."""
        root = np.sqrt(self.cx)
        QL = LRT_BASIS.to_float(self.read_basis(0)[:, :self.rank])
        QR = LRT_BASIS.to_float(self.read_basis(1)[:, :self.rank])
        return QL * root, QR * root

    def estimate(self) -> np.ndarray:
        """The dense ``n_out × n_in`` estimate (reads both bases back; for tests and reports)."""
        L, R = self.factors()
        return L @ R.T

    def apply_update(self, scale: float) -> None:
        """LRT_UPDATE: ``W ← W − round(scale · estimate)`` in LRT_WEIGHT codes (the PE counts the
        cells it writes). ``s·2**-SHIFT = scale·c_x·2**(weight frac − 2·basis frac)``, so that
        ``Q_L diag(s) Q_Rᵀ·2**-SHIFT`` (bases in Q1.14 codes) is ``scale·L·Rᵀ`` in weight codes;
        ``s`` gets the finest 16-bit scale that holds it, within the PE's SHIFT range."""
        v = scale * self.cx * 2.0 ** (LRT_WEIGHT.frac - 2 * LRT_BASIS.frac)
        fmt = max_abs_format(v, LRT_PE_WORD_BITS)
        shift = min(max(fmt.frac, self.params.shift_min), self.params.shift_max)
        s = fmt.with_frac(shift).quantize_code(v)
        self.pe.run(Op.LRT_UPDATE, pad_words(s), SHIFT=shift, **self._sizes)

    # -- checkpoints -----------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays = {"QL": self.read_basis(0), "QR": self.read_basis(1), "cx": self.cx.copy()}
        return arrays, {"rng": self._rng.bit_generator.state, "counts": dict(self.counts)}

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Resume from :meth:`state`: the bases go back to the PE (a fresh PE is fine)."""
        for key, rows in (("QL", self.n_out), ("QR", self.n_in)):
            if np.shape(arrays[key]) != (rows, self.q):
                raise ValueError(f"PEKroneckerSum state {key} has shape {np.shape(arrays[key])}, "
                                 f"expected {(rows, self.q)}: a checkpoint of another layer or rank")
        if np.shape(arrays["cx"]) != (self.rank,):
            raise ValueError(f"PEKroneckerSum state cx has shape {np.shape(arrays['cx'])}, "
                             f"expected {(self.rank,)}")
        self.load_basis(0, np.asarray(arrays["QL"], np.int64))
        self.load_basis(1, np.asarray(arrays["QR"], np.int64))
        self.cx[:] = arrays["cx"]
        self._rng.bit_generator.state = meta["rng"]
        self.counts = {k: int(v) for k, v in meta["counts"].items()}


# ------------------------------------------------------------------------------ the trainer

class LRTBoardTrainer:
    """Online adaptation of the last dense layer of a :class:`~insitu.lrt.qnet.QNet` on the LRT PE.

    ``port``: the accelerator (:class:`PEPort`). ``net``: the pre-trained quantized network (e.g.
    from :func:`insitu.lrt.adapt.pretrained_model`); its last weight layer (``m × n``, ``m`` the
    classes) is adapted, the rest is frozen. Defaults are those of :class:`insitu.lrt.schemes.
    LRTConfig` (``batch`` is its ``dense_batch``; ``bias_lr=None`` freezes the bias). ``params``: the
    PE's bounds (default: read from the port's CAP registers). ``context``: JSON-ready facts of the
    run (environment, dataset, …) that a saved state must match to be resumed here.

    On construction the PE gets the layer's weights (LRT_LOAD_WEIGHTS, which clears its write
    counters) and the accumulator's initial bases. Then :meth:`step` / :meth:`train` feed samples;
    every ``batch`` samples the PE writes the update and the processor reads the weights back
    (LRT_READ_WEIGHTS) into the copy its forward pass uses.

    Write counts: the PE counts writes per cell since its last LRT_LOAD_WEIGHTS. A resumed run
    (:meth:`load_state`) loads the weights again, so the PE's counters restart at 0; the counts of
    before are kept on the processor (``prior_counts``, ``prior_writes_total``) and added to what
    the PE reports (:meth:`write_counts`, :meth:`writes_total`, :meth:`max_writes_per_cell`).
    """

    def __init__(self, port: PEPort, net: QNet, *, rank: int = LRTConfig.rank,
                 batch: int = LRTConfig.dense_batch, lr: float = LRTConfig.lr,
                 bias_lr: float | None = LRTConfig.bias_lr, unbiased: bool = LRTConfig.unbiased,
                 kappa_th: float | None = LRTConfig.kappa_th, seed: int = 0,
                 params: AcceleratorParams | None = None, context: dict | None = None):
        self.pe = _CountingPort(port)
        self.context = dict(context or {})
        self.params = params or pe_params(port)
        self.net = net
        self.m, self.n = self.check(net, self.params, rank=rank, batch=batch, lr=lr,
                                    bias_lr=bias_lr, kappa_th=kappa_th)
        self.layer = net.weight_layers[-1]
        self.layer_name = self.layer.name
        self.prefix = net.stages[:-1]
        self.batch = int(batch)
        self.lr, self.bias_lr = float(lr), bias_lr
        self.seed = seed
        self.sks = PEKroneckerSum(self.pe, self.m, self.n, rank, unbiased=unbiased, seed=seed,
                                  kappa_th=kappa_th, params=self.params)
        self.rank = self.sks.rank
        self.samples = 0                 # samples seen (the position in the online stream)
        self.last_losses = np.zeros(0)   # the losses of the samples of the last train()
        self.in_batch = 0                # samples accumulated since the last update
        self.updates = 0                 # LRT_UPDATE ops run
        self.prior_counts = np.zeros((self.m, self.n), np.int64)
        self.prior_writes_total = 0
        self._load_weights()

    @staticmethod
    def check(net: QNet, params: AcceleratorParams, *, rank: int = LRTConfig.rank,
              batch: int = LRTConfig.dense_batch, lr: float = LRTConfig.lr,
              bias_lr: float | None = LRTConfig.bias_lr,
              kappa_th: float | None = LRTConfig.kappa_th) -> tuple[int, int]:
        """ValueError (saying what to change) unless these options fit ``net`` and the PE of
        ``params``; returns the adapted layer's ``(m, n)``. Cheap: run it before pre-training."""
        layer = net.weight_layers[-1]
        if not isinstance(layer.core, nn.Dense):
            raise ValueError(f"layer {layer.name} is a {type(layer.core).__name__}: the LRT PE adapts "
                             "a dense layer (use a network whose last weight layer is dense)")
        if net.stages[-1] is not layer:
            raise ValueError(f"layer {layer.name} is not the network's last stage: the PE adapts "
                             "the layer whose outputs are the logits")
        if layer.weight_format != LRT_WEIGHT:
            raise ValueError(f"layer {layer.name} stores {layer.weight_format}, the PE's weight memory "
                             f"holds {LRT_WEIGHT}: build the network with the default weight format")
        m, n = layer.weight.shape
        # The last layer's m rows are the dataset's classes, its n columns the network's hidden
        # width (fixed): the class count is what a dataset can push past the PE's memories.
        if max(m, n) > params.lrt_rows_max or m * n > params.lrt_cells_max:
            classes = min(params.lrt_rows_max, params.lrt_cells_max // n)
            raise ValueError(f"layer {layer.name} ({m} classes x {n}) does not fit the LRT PE (rows and "
                             f"columns <= {params.lrt_rows_max}, cells <= {params.lrt_cells_max}): "
                             f"with {n} inputs it adapts at most {classes} classes; use a dataset "
                             "with fewer classes, `insitu lrt adapt` (no PE), or a bitstream "
                             "generated with larger LRT memories")
        if isinstance(rank, int) and 1 <= rank < params.lrt_cols_max and rank >= m:
            raise ValueError(f"rank {rank} is too large for the {m} classes of the dataset: the "
                             f"adapted layer {layer.name} is {m} x {n}, and a rank-{m} estimate "
                             f"would be full rank; use --rank {m - 1} or lower")
        check_pe_fit(m, n, rank, params, kappa_th)
        check_int("batch", batch, 1, 2**31, "samples per weight update")
        if not (isinstance(lr, (int, float)) and np.isfinite(lr) and lr > 0):
            raise ValueError(f"lr must be a positive number, got {lr!r}")
        if bias_lr is not None and not (isinstance(bias_lr, (int, float)) and np.isfinite(bias_lr)
                                        and bias_lr > 0):
            raise ValueError(f"bias_lr must be a positive number or None (a frozen bias), got {bias_lr!r}")
        return int(m), int(n)

    # -- the PE's weights ------------------------------------------------------------------------
    def _load_weights(self) -> None:
        codes = LRT_WEIGHT.quantize_code(self.layer.weight)
        self.pe.run(Op.LRT_LOAD_WEIGHTS, pad_words(codes), **self.sks._sizes)

    def read_weights(self) -> np.ndarray:
        """The PE's weight codes, ``m × n``."""
        return self.pe.run(Op.LRT_READ_WEIGHTS, **self.sks._sizes)[:self.m * self.n].reshape(self.m, self.n)

    def pe_counts(self) -> np.ndarray:
        """The PE's write counters since its last LRT_LOAD_WEIGHTS, ``m × n``."""
        return self.pe.run(Op.LRT_READ_COUNTS, **self.sks._sizes)[:self.m * self.n].reshape(self.m, self.n)

    def write_counts(self) -> np.ndarray:
        """Writes per cell over the whole run (the processor's prior counts plus the PE's)."""
        return self.prior_counts + self.pe_counts()

    def writes_total(self) -> int:
        return self.prior_writes_total + self.pe.read("LRT_WRITES_TOTAL")

    def max_writes_per_cell(self) -> int:
        """LRT_WRITES_MAX; after a resume, the largest summed count (the register restarted)."""
        if not self.prior_counts.any():
            return self.pe.read("LRT_WRITES_MAX")
        return int(self.write_counts().max())

    # -- learning ---------------------------------------------------------------------------------
    def features(self, x: np.ndarray) -> np.ndarray:
        """The frozen layers' output for samples ``x`` (inference mode: nothing of theirs changes)."""
        for stage in self.prefix:
            x = stage.forward(x, train=False)
        return x

    def step(self, x: np.ndarray, label: int) -> bool:
        """One online sample ``x`` (shape ``(1, ...)``): predict, learn from ``label``; True if right."""
        return bool(self.train(x, np.array([label]))[0])

    def train(self, x: np.ndarray, y: np.ndarray, after_each=lambda i, correct: None) -> np.ndarray:
        """Samples ``x`` (``(N, ...)``) in order, one at a time, ``after_each(i, correct)`` after
        each; returns whether each was predicted right. Their losses (each sample's cross-entropy
        before it was learnt) are left in :attr:`last_losses`."""
        x = np.asarray(x, dtype=np.float64)
        y = np.asarray(y).astype(np.int64).ravel()
        if len(x) != len(y) or not np.isfinite(x).all():
            raise ValueError(f"train: need finite samples and one label each, got {len(x)} samples "
                             f"and {len(y)} labels")
        if y.size and not (0 <= y.min() and y.max() < self.m):
            raise ValueError(f"train: labels must be in [0, {self.m}), got {y.min()}..{y.max()}")
        feats = self.features(x)                       # the frozen prefix, for the whole chunk
        right = np.zeros(len(y), bool)
        self.last_losses = np.zeros(len(y))
        for i in range(len(y)):
            right[i] = self._learn(feats[i:i + 1], y[i:i + 1], i)
            after_each(i, bool(right[i]))
        return right

    def _learn(self, feat: np.ndarray, label: np.ndarray, i: int = 0) -> bool:
        layer = self.layer
        logits = layer.forward(feat, train=True)
        correct = bool(np.argmax(logits[0]) == label[0])
        # The sample's cross-entropy, from the logits its gradient needs anyway (O(classes)).
        self.last_losses[i] = cross_entropy(logits[0], int(label[0]))
        if layer.bias_grad is not None:
            layer.bias_grad.fill(0.0)
        layer.backward(loss_gradient(logits, label))
        if self.bias_lr is not None and layer.bias is not None:
            assert layer.bias_grad is not None      # a QWeightLayer with a bias has its gradient
            layer.bias[...] = LRT_BIAS.quantize(layer.bias - self.bias_lr * layer.bias_grad)
        dz, a = layer.kronecker_pairs()                # α·dz (m) and a (n): one pair, dense layer
        self.sks.add(dz[0, 0], a[0, 0])
        self.samples += 1
        self.in_batch += 1
        if self.in_batch == self.batch:
            self._update()
        return correct

    def _update(self) -> None:
        # ΔW = −lr·√B·(L·Rᵀ / B): the trainer's square-root rule at B_eff = B.
        self.sks.apply_update(self.lr / math.sqrt(self.in_batch))
        self.layer.weight[...] = LRT_WEIGHT.to_float(self.read_weights())
        self.sks.reset()
        self.in_batch = 0
        self.updates += 1

    # -- reports ----------------------------------------------------------------------------------
    def summary(self) -> dict:
        """What the PE and the trainer report now (JSON-ready but ``write_counts``)."""
        counts = self.write_counts()
        return {
            "layer": self.layer_name, "layer_shape": [self.m, self.n], "rank": self.rank,
            "batch": self.batch, "lr": self.lr, "bias_lr": self.bias_lr,
            "unbiased": self.sks.unbiased, "kappa_th": self.sks.kappa_th,
            "samples": self.samples, "updates": self.updates,
            "max_writes_per_cell": self.max_writes_per_cell(),
            "writes_total": self.writes_total(),
            "mean_writes_per_cell": round(float(counts.mean()), 3),
            "write_counts": counts,
            "pe_registers": {"LRT_WRITES_MAX": self.pe.read("LRT_WRITES_MAX"),
                             "LRT_WRITES_TOTAL": self.pe.read("LRT_WRITES_TOTAL")},
            "pairs": dict(self.sks.counts),
            "pe_ops": dict(sorted(self.pe.ops.items())),
        }

    # -- checkpoints ------------------------------------------------------------------------------
    def _identity(self) -> dict:
        return {"layer": self.layer_name, "shape": [self.m, self.n], "rank": self.rank,
                "batch": self.batch, "lr": self.lr, "bias_lr": self.bias_lr,
                "unbiased": self.sks.unbiased, "kappa_th": self.sks.kappa_th, "seed": self.seed,
                "context": self.context}

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        """Everything needed to resume: ``(arrays, meta)`` for :func:`insitu.checkpoint.save_checkpoint`
        (read from the PE: its bases, weights and counters)."""
        sks_arrays, sks_meta = self.sks.state()
        arrays = {f"sks/{k}": v for k, v in sks_arrays.items()}
        arrays["weight"] = self.read_weights()
        if self.layer.bias is not None:
            arrays["bias"] = self.layer.bias.copy()
        arrays["write_counts"] = self.write_counts()
        meta = {"identity": self._identity(), "sks": sks_meta, "samples": self.samples,
                "in_batch": self.in_batch, "updates": self.updates,
                "writes_total": self.writes_total(), "pe_ops": dict(self.pe.ops)}
        return arrays, meta

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        """Resume from :meth:`state` of a trainer built the same way (same network, options). The
        PE is loaded again (bases, weights); its write counters restart at 0, so the saved counts
        become ``prior_counts``."""
        if meta.get("identity") != self._identity():
            raise ValueError(f"the saved state is of another run ({meta.get('identity')}); this trainer "
                             f"is {self._identity()}")
        weight = np.asarray(arrays["weight"], np.int64)
        if weight.shape != (self.m, self.n):
            raise ValueError(f"saved weights have shape {weight.shape}, expected {(self.m, self.n)}")
        self.sks.load_state({k[4:]: v for k, v in arrays.items() if k.startswith("sks/")}, meta["sks"])
        self.layer.weight[...] = LRT_WEIGHT.to_float(weight)
        if self.layer.bias is not None:
            self.layer.bias[...] = arrays["bias"]
        self._load_weights()                           # clears the PE's counters
        self.prior_counts = np.asarray(arrays["write_counts"], np.int64).copy()
        self.prior_writes_total = int(meta["writes_total"])
        self.samples, self.in_batch = int(meta["samples"]), int(meta["in_batch"])
        self.updates = int(meta["updates"])
        self.pe.ops = Counter(meta["pe_ops"])


def _check_env(env: str) -> None:
    if env not in BOARD_ENVS:
        raise ValueError(f"env must be one of {', '.join(BOARD_ENVS)} on the board, got {env!r} (the "
                         "analog/digital drift of weight cells is not modelled on the PE's weight "
                         "memory; run them with `insitu lrt adapt`)")


def run_board_adapt(port: PEPort, env: str = "shift", samples: int = 1000, *, seed: int = 0,
                    arch: str = "cnn", dataset: str = "fashion-mnist", data_dir=None,
                    rank: int = LRTConfig.rank, batch: int = LRTConfig.dense_batch,
                    lr: float = LRTConfig.lr, bias_lr: float | None = LRTConfig.bias_lr,
                    unbiased: bool = LRTConfig.unbiased, kappa_th: float | None = LRTConfig.kappa_th,
                    offline_samples: int = OFFLINE_SAMPLES, pretrain_epochs: int = PRETRAIN_EPOCHS,
                    segment: int = 10_000,
                    test_samples: int = 1000, cache_dir=None, chunk: int = 1000,
                    curve_points: int = 200, checkpoint=None, checkpoint_every: int = 1000, identity: dict | None = None,
                    counters=None, advance: Callable[[int], None] = lambda n: None,
                    params: AcceleratorParams | None = None) -> dict:
    """Deploy the pre-trained network (:func:`insitu.lrt.adapt.pretrained_model`, cached) and adapt
    its last layer on the PE behind ``port`` over ``samples`` online samples of ``env``: the loop of
    ``insitu lrt adapt`` (:class:`insitu.lrt.adapt.AdaptLearner` in the run harness) with this
    module's trainer.

    ``checkpoint``: resumed from when it exists, written every ``checkpoint_every`` samples (and on
    SIGINT/SIGTERM); ``identity``: what else makes the caller's run (its options); ``counters``: an
    object whose ``state()`` / ``load_state(meta)`` the checkpoint keeps too (the caller's
    accelerator counts). ``chunk``: samples per harness step at most (the frozen layers run a
    chunk at once; a step is also at most 1/CURVE_POINTS of the budget, for the curve's points).
    Accuracy before and after is measured on the first ``test_samples`` of the test split
    (``data.test``), and so is the curve's test accuracy at each point. Returns the result record.
    """
    _check_env(env)
    samples = check_int("samples", samples, 1, what="online samples to train on")
    test_samples = check_int("test_samples", test_samples, 1, what="test samples to evaluate")
    config = LRTConfig()               # the pre-trained network of `insitu lrt adapt`
    data = OnlineData(dataset, data_dir, seed=seed, segment=segment)
    params = params or pe_params(port)
    # Everything that can be wrong, found before minutes of pre-training.
    LRTBoardTrainer.check(build_network(arch, data, seed, config), params, rank=rank, batch=batch,
                          lr=lr, bias_lr=bias_lr, kappa_th=kappa_th)
    context = {"env": env, "dataset": data.dataset.key, "arch": arch,
               "offline_samples": offline_samples,
               "pretrain_epochs": pretrain_epochs, "segment": segment}
    # The curve's points come at the ends of steps: a step of at most 1/CURVE_POINTS of the budget
    # gives it its points (the samples are learnt one at a time: the chunk changes no result).
    step = max(1, min(chunk, -(-samples // CURVE_POINTS)))
    plan = RunPlan("insitu train --algo lrt",
                   {**(identity or {}), **context, "rank": rank, "batch": batch, "lr": lr,
                    "bias_lr": bias_lr, "unbiased": unbiased, "kappa_th": kappa_th, "seed": seed},
                   samples, step, checkpoint, checkpoint_every)
    check_resumable(plan)                  # a checkpoint of another run: refused before pre-training
    net, pre = pretrained_model(arch, dataset, data_dir, seed, offline_samples, pretrain_epochs,
                                cache_dir, config)
    x_test, y_test = data.test(test_samples)
    x_test = x_test.astype(np.float64)
    accuracy_before = evaluate(net, x_test, y_test)
    trainer = LRTBoardTrainer(port, net, rank=rank, batch=batch, lr=lr, bias_lr=bias_lr,
                              unbiased=unbiased, kappa_th=kappa_th, seed=seed, params=params,
                              context=context)
    adapt = AdaptLearner(trainer, data, env, curve_at=curve_positions(samples, curve_points))
    learner = _BoardLearner(adapt, trainer, counters)
    features: list[np.ndarray] = []            # the test set through the frozen layers, once

    def probe() -> dict:
        """The whole test set's accuracy, cheaply: the frozen layers' outputs do not change, so
        only the adapted layer runs (on the processor's copy of the PE's weights): the same
        predictions as the final evaluation's."""
        if not features:
            features.append(trainer.features(x_test))
        logits = trainer.layer.forward(features[0], train=False)
        return {"test_accuracy": round(float(np.mean(np.argmax(logits, axis=1) == y_test)), 5)}

    outcome = run_training(plan, learner, advance=advance, say=say, probe=probe,
                           evaluate=lambda: {"accuracy": round(evaluate(net, x_test, y_test), 5)})
    online = adapt.online_accuracy(samples)
    result = trainer.summary()
    result.update({
        **online, "online_curve": adapt.curve, "curve": outcome.curve,
        "env": env, "dataset": data.name, "arch": arch, "seed": seed,
        "accuracy_before": round(accuracy_before, 5),
        "accuracy": outcome.evaluation["accuracy"],
        "test_samples": int(len(y_test)),
        "pretrained_validation_accuracy": pre["validation_accuracy"],
        "resumed_from": outcome.resumed_from,
        "seconds": round(outcome.seconds, 3),
        "seconds_per_sample": (round(outcome.seconds / (samples - (outcome.resumed_from or 0)), 6)
                               if samples > (outcome.resumed_from or 0) else None),
    })
    if env == "shift":
        result["segments"] = data.segments(samples)
    return result


class _BoardLearner:
    """The :class:`~insitu.lrt.adapt.AdaptLearner` of the board for the harness: each step's loss is
    the mean of its samples' (:attr:`LRTBoardTrainer.last_losses`), and with ``counters`` its
    checkpoints also keep ``counters.state()`` (the accelerator's counts)."""

    def __init__(self, learner: AdaptLearner, trainer: LRTBoardTrainer, counters=None):
        self.learner, self.trainer, self.counters = learner, trainer, counters

    def __getattr__(self, name):
        return getattr(self.learner, name)         # its `correct`, curve, online accuracy

    def train(self, start: int, count: int) -> float | None:
        self.learner.train(start, count)
        losses = self.trainer.last_losses
        return float(np.mean(losses)) if len(losses) else None

    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        arrays, meta = self.learner.state()
        if self.counters is None:
            return arrays, meta
        return arrays, {**meta, "counters": self.counters.state()}

    def load_state(self, arrays: dict[str, np.ndarray], meta: dict) -> None:
        self.learner.load_state(arrays, meta)
        if self.counters is not None:
            self.counters.load_state(meta["counters"])

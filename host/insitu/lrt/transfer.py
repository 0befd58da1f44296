"""Transfer learning and algorithm comparison: the LRT paper's Table 1 at FashionMNIST scale.

Reference: Gural, Nadeau, Tikekar and Murmann, "Low-rank training of deep neural networks for
emerging memory technology" (arXiv 2009.03887, ``shared/papers/lrt-low-rank-training-nvm.txt``),
section 7.2 and Table 1; UORO is
Tallec & Ollivier (2017), cited in section 2; max-norm is appendix E; the quantization model is
appendix D; the square-root learning-rate scaling is appendices D and H.

The paper feeds quantized ResNet-34 features of 10k ImageNet images to a one-layer quantized
network (1000 × 512) whose pre-trained weights were damaged by noise (top-1 73 % → 52.7 %), then
recovers the layer online with SGD, UORO, biased SVD and unbiased LRT at several ranks and learning
rates. Here, at our scale:

1. *Pre-training*: a small float CNN (``insitu.nn``: two 3×3 conv/pool stages, a 512-unit hidden
   Dense + ReLU, a K-way Dense for the dataset's K classes; SGD with momentum 0.9, lr 0.05, batch
   64) trained ``pretrain_epochs`` epochs on ``pretrain_samples`` training images. Images are taken
   grey (RGB by the data layer's rule) at their own size (sides >= 4); a dataset of feature vectors
   gets the dense equivalent instead (``insitu.nn.networks.mlp``: one 512-unit hidden layer).
2. *The quantized layer*: the 512 penultimate features (ResNet-34 also has 512) of ``samples``
   *other* training images (footnote 7: training data on purpose) are scaled by the power of two
   ``s_a`` that puts their 99.9th percentile (on pre-training images) inside [0, 2), and
   quantized with ``LRT_ACTIVATION``; the final Dense weight is divided by the power of two
   ``α_w`` that brings it into [-1, 1] and quantized with ``LRT_WEIGHT``, its bias with
   ``LRT_BIAS``. Forward (appendix D, last layer): ``z = Qb(α · W a + b)`` with ``α = α_w·s_a``.
3. *Damage*: ``W ← Qw(W + σ·E)``, ``E`` standard normal from the seed; per seed, ``σ`` is found
   by bisection so that the damaged accuracy is ``damage_ratio`` (default 0.72, the paper's
   52.7/73) times the pre-trained accuracy.
4. *Online recovery* (predict, then learn from the label; one sample at a time, order shuffled per
   seed; ``Qb`` is the 16-b accumulator format, ``Qg`` the gradient format):
   ``dz = Qg(softmax(z) − onehot(y))``; every sample the bias takes
   ``b ← Qb(b − η·MN_b(dz))``. Weights, with ``Q_lsb(x) = round(x / LSB)·LSB`` (so a weight can
   never accumulate below its LSB) and saturation at the format's range:

   * **SGD**: every sample ``W ← W + Q_lsb(−η · MN_W(dz ⊗ a))``;
   * **UORO / SVD / LRT**: the estimator streams the pairs ``(dz, a)`` of ``B`` samples; then
     ``W ← W + Q_lsb(−η·√B · MN_W(L Rᵀ))`` and the estimator is reset. ``√B`` is the paper's
     square-root learning-rate scaling (appendix H: "the learning rate is scaled proportional to
     the square-root of the batch size B"), so the ``η`` columns are comparable across rows.

   ``MN`` is gradient max-norm (appendix E, β = 0.999, ε = 1e-4), one state per tensor
   (W and b separately, per run). UORO is :class:`UoroSum`; SVD is
   ``KroneckerSum(unbiased=False)``, LRT ``KroneckerSum(unbiased=True)``; their factors are
   quantized to 16 bits with a dynamic power-of-2 scale (appendix D).
5. *Score*: accuracy recovery = online accuracy over the last 20 % of the stream minus the
   damaged layer's accuracy on the same samples (no training), per seed; mean ± standard deviation
   (ddof = 1) over seeds. ``max_writes_per_cell`` is the largest number of code changes of any
   weight cell, worst over seeds.

Choices the paper leaves open are the ones listed above (network, scales, noise model and its
calibration, the evaluation window, the bias learning rate ``η`` without the ``√B`` factor, no
``ρ_min`` deferral of small updates, ``κ_th`` off by default). All runs of one seed share the
sample order and the damaged weights and are simulated together, vectorized over runs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real

import numpy as np
from insitu import nn
from insitu.checks import ArgumentError, check_int
from insitu.data import load_dataset
from insitu.lrt.sks import KroneckerSum, LowRankSum
from insitu.numerics import (
    LRT_ACCUMULATOR,
    LRT_ACTIVATION,
    LRT_BIAS,
    LRT_FACTOR_BITS,
    LRT_GRADIENT,
    LRT_WEIGHT,
    round_half_up,
)
from insitu.nn.networks import CNN_MIN_SIZE, cnn, image_input, mlp

__all__ = [
    "ALGORITHMS",
    "UoroSum",
    "format_table",
    "progress_total",
    "run_transfer",
]

ALGORITHMS = ("SGD", "UORO", "SVD", "LRT")
DEFAULT_RANKS = (1, 2, 4, 8)
DEFAULT_LRS = (0.003, 0.01, 0.03, 0.1, 0.3)
DEFAULT_SEEDS = (0, 1, 2)
DEFAULT_SAMPLES = 10_000
DEFAULT_PRETRAIN_SAMPLES = 15_000
DEFAULT_PRETRAIN_EPOCHS = 2
HIDDEN = 512                   # penultimate features, as ResNet-34's 512
WINDOW_FRACTION = 0.2          # the scored tail of the online stream
DAMAGE_RATIO = 52.7 / 73.0     # the paper's inference / pre-trained accuracy
MAXNORM_BETA, MAXNORM_EPS = 0.999, 1e-4


Progress = Callable[[int], None] | None


# --------------------------------------------------------------------------- UORO

class UoroSum(LowRankSum):
    """UORO's rank-1 unbiased streaming estimate of ``Σ dz ⊗ a`` (Tallec & Ollivier, 2017).

    With the estimate ``L̃ R̃ᵀ`` and a new pair, a random sign ``ν = ±1`` mixes them::

        L̃ ← ρ₀ L̃ + ν ρ₁ dz,    R̃ ← R̃ / ρ₀ + ν a / ρ₁

    so ``E[L̃ R̃ᵀ] = L̃ R̃ᵀ + dz ⊗ a`` (the cross terms carry ν). The factors
    ``ρ₀ = √(|R̃|/|L̃|)`` and ``ρ₁ = √(|a|/|dz|)`` minimize the variance of the cross terms. Same
    interface as :class:`~insitu.lrt.sks.KroneckerSum` (``add``, ``add_many``, ``factors``,
    ``reset``, ``estimate``); memory ``n_out + n_in`` values.
    """

    rank = 1

    def __init__(self, n_out: int, n_in: int, seed=None, factor_bits: int | None = None):
        for name, v in (("n_out", n_out), ("n_in", n_in)):
            if isinstance(v, bool) or not isinstance(v, Integral) or v < 1:
                raise ValueError(f"UoroSum: {name} must be an integer >= 1, got {v!r}")
        if factor_bits is not None and (isinstance(factor_bits, bool)
                                        or not isinstance(factor_bits, Integral) or factor_bits < 2):
            raise ValueError(f"UoroSum: factor_bits must be an integer >= 2 or None, got {factor_bits!r}")
        self.n_out, self.n_in = int(n_out), int(n_in)
        self.factor_bits = factor_bits
        self._rng = np.random.default_rng(seed)
        self.L = np.zeros(self.n_out)
        self.R = np.zeros(self.n_in)

    def _stream(self, dz, a) -> None:
        # One uniform double per pair, so a block draws exactly what pair-by-pair calls would.
        signs = np.where(self._rng.random(dz.shape[0]) < 0.5, -1.0, 1.0)
        for p in range(dz.shape[0]):
            n_dz = math.sqrt(float(dz[p] @ dz[p]))
            n_a = math.sqrt(float(a[p] @ a[p]))
            if n_dz == 0.0 or n_a == 0.0:
                continue                      # a zero outer product changes nothing
            rho1 = math.sqrt(n_a / n_dz)
            new_L = (signs[p] * rho1) * dz[p]
            new_R = (signs[p] / rho1) * a[p]
            n_L = math.sqrt(float(self.L @ self.L))
            n_R = math.sqrt(float(self.R @ self.R))
            if n_L > 0.0 and n_R > 0.0:
                rho0 = math.sqrt(n_R / n_L)
                new_L += rho0 * self.L
                new_R += self.R / rho0
            # else the old estimate is zero: the first pair is taken exactly.
            self.L, self.R = new_L, new_R

    def reset(self) -> None:
        self.L = np.zeros(self.n_out)
        self.R = np.zeros(self.n_in)

    def _raw_factors(self) -> tuple[np.ndarray, np.ndarray]:
        return self.L[:, None].copy(), self.R[:, None].copy()


# --------------------------------------------------------------------------- max-norm, vectorized

class _MaxNormBank:
    """Gradient max-norm (appendix E) of ``count`` independent tensors called together.

    Row ``c`` of the input is tensor ``c``; each row keeps its own moving average, exactly as one
    :class:`insitu.lrt.maxnorm.MaxNorm` per row would (a unit test checks this), without a Python
    call per run per sample.
    """

    def __init__(self, count: int, beta: float = MAXNORM_BETA, eps: float = MAXNORM_EPS):
        self.beta, self.eps = beta, eps
        self.k = 0
        self.x_mv = np.full(count, eps)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        self.k += 1
        x_max = np.abs(x).reshape(len(x), -1).max(axis=1) + self.eps
        self.x_mv = self.beta * self.x_mv + (1.0 - self.beta) * x_max
        scale = np.maximum(x_max, self.x_mv / (1.0 - self.beta ** self.k))
        return x / scale.reshape((-1,) + (1,) * (x.ndim - 1))


# --------------------------------------------------------------------------- argument checks

def _check_list(name, values) -> tuple:
    try:
        values = tuple(values)
    except TypeError:
        raise ArgumentError(f"{name} must be a list, got {values!r}") from None
    if not values:
        raise ArgumentError(f"{name} must not be empty")
    if len(set(values)) != len(values):
        raise ArgumentError(f"{name} has repeated values: {list(values)}")
    return values


def _check_args(ranks, lrs, seeds, samples, batch, algorithms, pretrain_samples, pretrain_epochs,
                damage_ratio, kappa_th):
    # (typeshed's numbers.Real declares only < and <= of the comparisons: the `# pyright: ignore`s
    # below are its > and >=, which every Real has at run time.)
    algorithms = _check_list("algorithms", algorithms)
    unknown = [a for a in algorithms if a not in ALGORITHMS]
    if unknown:
        raise ArgumentError(f"algorithms: unknown {unknown}; known: {', '.join(ALGORITHMS)}")
    ranks = _check_list("ranks", ranks)
    for r in ranks:
        if isinstance(r, bool) or not isinstance(r, Integral) or r < 1:
            raise ArgumentError(f"ranks must be integers >= 1, got {r!r}")
        if r >= HIDDEN:  # pyright: ignore[reportOperatorIssue]
            raise ArgumentError(f"ranks: rank {r} must be < the feature count {HIDDEN}")
    lrs = _check_list("lrs", lrs)
    for lr in lrs:
        if isinstance(lr, bool) or not isinstance(lr, Real) or not (math.isfinite(lr) and lr > 0):  # pyright: ignore[reportOperatorIssue]
            raise ArgumentError(f"lrs must be positive finite numbers, got {lr!r}")
    seeds = _check_list("seeds", seeds)
    for s in seeds:
        check_int("each of seeds", s, 0)
    batch = check_int("batch", batch, 1)
    samples = check_int("samples", samples, 1)
    if samples < batch:
        raise ArgumentError(f"samples ({samples}) must be >= batch ({batch}): no update would happen")
    check_int("pretrain_samples", pretrain_samples, 1)
    check_int("pretrain_epochs", pretrain_epochs, 1)
    if isinstance(damage_ratio, bool) or not isinstance(damage_ratio, Real) or not 0 < damage_ratio < 1:  # pyright: ignore[reportOperatorIssue]
        raise ArgumentError(f"damage_ratio must be in (0, 1), got {damage_ratio!r}")
    if kappa_th is not None and not (isinstance(kappa_th, Real) and math.isfinite(kappa_th) and kappa_th > 0):  # pyright: ignore[reportOperatorIssue]
        raise ArgumentError(f"kappa_th must be a positive number or None, got {kappa_th!r}")
    return (tuple(int(r) for r in ranks), tuple(float(x) for x in lrs), tuple(int(s) for s in seeds),
            samples, batch, algorithms)


def progress_total(samples: int = DEFAULT_SAMPLES, seeds: Sequence[int] = DEFAULT_SEEDS,
                   pretrain_samples: int = DEFAULT_PRETRAIN_SAMPLES,
                   pretrain_epochs: int = DEFAULT_PRETRAIN_EPOCHS) -> int:
    """What the ``progress`` calls of :func:`run_transfer` add up to: pre-training samples, then
    online samples of every seed (all runs of one seed advance together)."""
    return pretrain_samples * pretrain_epochs + samples * len(tuple(seeds))


# --------------------------------------------------------------------------- the problem

@dataclass
class _Problem:
    features: np.ndarray       # (N, F) quantized activations in [0, 2)
    labels: np.ndarray         # (N,)
    weight: np.ndarray         # (K, F) pre-trained weight on the LRT_WEIGHT grid
    bias: np.ndarray           # (K,) on the LRT_BIAS grid
    alpha: float               # power-of-2 forward scale α_w · s_a
    info: dict


def _pow2_ceil(x: float) -> float:
    return 2.0 ** math.ceil(math.log2(x)) if x > 0 else 1.0


def _logits(features, weight, bias, alpha):
    """The quantized last layer ``Qb(α · W a + b)`` for a block of samples; weight (…, K, F)."""
    return LRT_ACCUMULATOR.quantize(alpha * (features @ np.swapaxes(weight, -1, -2)) + bias)


def _prepare(data, samples, dataset, pretrain_samples, pretrain_epochs, seed, progress) -> _Problem:
    started = time.perf_counter()
    classes = int(data.num_classes)
    if data.kind == "images":
        data = image_input(data, "the transfer experiment's CNN", CNN_MIN_SIZE, why="two 2x2 pools")
        model = cnn(data.sample_shape, classes, seed, hidden=HIDDEN)
        x, x_test = data.float_images("train")[:, None], data.float_images("test")[:, None]
    else:
        model = mlp(data.sample_shape, classes, seed, hidden=HIDDEN)
        x, x_test = data.float_images("train"), data.float_images("test")
    y = np.asarray(data.y_train, dtype=np.int64)
    if pretrain_samples + samples > len(x):
        raise ArgumentError(f"samples ({samples}) + pretrain_samples ({pretrain_samples}) exceed "
                               f"the {len(x)} training samples of {dataset}")
    perm = np.random.default_rng([seed, 0]).permutation(len(x))
    pre_idx, online_idx = perm[:pretrain_samples], perm[pretrain_samples:pretrain_samples + samples]

    optimizer = nn.SGD(model, lr=0.05, momentum=0.9)
    for epoch in range(pretrain_epochs):
        order = np.random.default_rng([seed, 1, epoch]).permutation(pre_idx)
        for i in range(0, len(order), 64):
            idx = order[i:i + 64]
            model.zero_grad()
            _, dlogits = nn.softmax_cross_entropy(model.forward(x[idx]), y[idx])
            model.backward(dlogits)
            optimizer.step()
            if progress:
                progress(len(idx))
    pretrain_seconds = time.perf_counter() - started

    backbone = nn.Sequential(*model.layers[:-1])
    head = model.layers[-1]
    # Activation scale from pre-training images (not the online ones): the power of 2 that puts
    # the 99.9th percentile of the features inside LRT_ACTIVATION's [0, 2).
    calib = backbone.predict(x[pre_idx[:2000]]).astype(np.float64)
    s_a = _pow2_ceil(float(np.percentile(calib, 99.9)) / LRT_ACTIVATION.max_value)
    feats = backbone.predict(x[online_idx]).astype(np.float64)
    features = LRT_ACTIVATION.quantize(feats / s_a)
    w_float = head.params["weight"].astype(np.float64)
    b_float = head.params["bias"].astype(np.float64)
    alpha_w = _pow2_ceil(float(np.max(np.abs(w_float))))      # |W / α_w| <= 1: nothing clips
    weight = LRT_WEIGHT.quantize(w_float / alpha_w)
    bias = LRT_BIAS.quantize(b_float)
    test_accuracy = float(np.mean(np.argmax(model.predict(x_test), axis=1) == data.y_test))
    info = {
        "dataset": dataset,
        "pretrain_samples": pretrain_samples,
        "pretrain_epochs": pretrain_epochs,
        "pretrain_seconds": round(pretrain_seconds, 2),
        "float_test_accuracy": test_accuracy,
        "float_online_accuracy": float(np.mean(np.argmax(feats @ w_float.T + b_float, axis=1)
                                               == y[online_idx])),
        "features": int(features.shape[1]),
        "classes": classes,
        "activation_scale": s_a,
        "weight_scale": alpha_w,
    }
    return _Problem(features, y[online_idx], weight, bias, alpha_w * s_a, info)


def _accuracy(problem: _Problem, weight) -> float:
    z = _logits(problem.features, weight, problem.bias, problem.alpha)
    return float(np.mean(np.argmax(z, axis=1) == problem.labels))


def _damage(problem: _Problem, seed: int, ratio: float):
    """The damaged weight of ``seed``: ``Qw(W + σ·E)``, ``E`` standard normal from the seed, with
    σ found by bisection so that the damaged accuracy is ``ratio`` × the pre-trained accuracy
    (calibrated per seed, so that seeds differ in the damage pattern, not in its severity).
    Returns ``(σ, damaged weight)``."""
    target = ratio * _accuracy(problem, problem.weight)
    noise = np.random.default_rng([seed, 2]).standard_normal(problem.weight.shape)

    def damaged(sigma):
        return LRT_WEIGHT.quantize(problem.weight + sigma * noise)

    lo, hi = 0.0, 0.05
    while _accuracy(problem, damaged(hi)) > target and hi < 64:
        lo, hi = hi, 2 * hi
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        if _accuracy(problem, damaged(mid)) > target:
            lo = mid
        else:
            hi = mid
    return hi, damaged(hi)


# --------------------------------------------------------------------------- the online runs

@dataclass(frozen=True)
class _Config:
    algorithm: str
    rank: int | None
    lr: float


def _configs(algorithms, ranks, lrs) -> list[_Config]:
    out = []
    for algo in ALGORITHMS:
        if algo not in algorithms:
            continue
        algo_ranks = (None,) if algo == "SGD" else (1,) if algo == "UORO" else ranks
        out += [_Config(algo, r, lr) for r in algo_ranks for lr in lrs]
    return out


def _online(problem: _Problem, weight0, order, configs, batch, seed, kappa_th, progress):
    """Simulate every config on one seed's stream: ``(hits (C, N), writes (C, K, F), weight
    (C, K, F), bias (C, K))``, the last three at the end of the stream."""
    feats, labels = problem.features[order], problem.labels[order]
    n, (k, f) = len(order), weight0.shape
    count = len(configs)
    lr = np.array([c.lr for c in configs])
    codes = np.repeat(LRT_WEIGHT.quantize_code(weight0)[None], count, axis=0)   # (C, K, F)
    weight = LRT_WEIGHT.to_float(codes)
    bias = np.repeat(problem.bias[None], count, axis=0)
    writes = np.zeros(codes.shape, dtype=np.int64)
    hits = np.zeros((count, n), dtype=bool)
    scale = 2.0 ** LRT_WEIGHT.frac                    # update → codes: a weight LSB is one code

    sgd = np.array([c.algorithm == "SGD" for c in configs])
    est_idx = np.flatnonzero(~sgd)
    estimators = []
    for i in est_idx:
        c, sub_seed = configs[i], [seed, 3, int(i)]
        if c.algorithm == "UORO":
            estimators.append(UoroSum(k, f, seed=sub_seed, factor_bits=LRT_FACTOR_BITS))
        else:
            estimators.append(KroneckerSum(k, f, c.rank, unbiased=c.algorithm == "LRT", seed=sub_seed,
                                           kappa_th=kappa_th, factor_bits=LRT_FACTOR_BITS))
    bias_norm = _MaxNormBank(count)
    sgd_norm = _MaxNormBank(int(sgd.sum()))
    est_norm = _MaxNormBank(len(est_idx))
    sgd_lr = lr[sgd][:, None, None]
    est_lr = lr[est_idx][:, None, None] * math.sqrt(batch)     # the paper's √B scaling
    dz_buf = np.zeros((batch, count, k))
    rows = np.arange(count)

    def write(idx, delta_codes):
        new = LRT_WEIGHT.saturate(codes[idx] + delta_codes)
        writes[idx] += new != codes[idx]
        codes[idx] = new
        weight[idx] = LRT_WEIGHT.to_float(new)

    for t in range(n):
        a, label = feats[t], labels[t]
        z = LRT_ACCUMULATOR.quantize(problem.alpha * (weight @ a) + bias)      # (C, K)
        hits[:, t] = np.argmax(z, axis=1) == label
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        p[rows, label] -= 1.0
        dz = LRT_GRADIENT.quantize(p)
        bias = LRT_BIAS.quantize(bias - lr[:, None] * bias_norm(dz))
        if sgd.any():
            g = dz[sgd][:, :, None] * a[None, None, :]
            write(sgd, round_half_up(-sgd_lr * sgd_norm(g) * scale))
        slot = t % batch
        dz_buf[slot] = dz
        if slot == batch - 1:
            if len(est_idx):
                a_block = feats[t - batch + 1:t + 1]
                est = np.empty((len(est_idx), k, f))
                for j, (i, e) in enumerate(zip(est_idx, estimators, strict=True)):
                    e.add_many(dz_buf[:, i, :], a_block)
                    L, R = e.factors()
                    est[j] = L @ R.T
                    e.reset()
                write(est_idx, round_half_up(-est_lr * est_norm(est) * scale))
            if progress:
                progress(batch)
    if progress and n % batch:
        progress(n % batch)
    return hits, writes, weight, bias


# --------------------------------------------------------------------------- the experiment

def run_transfer(ranks: Sequence[int] = DEFAULT_RANKS, lrs: Sequence[float] = DEFAULT_LRS,
                 seeds: Sequence[int] = DEFAULT_SEEDS, samples: int = DEFAULT_SAMPLES,
                 batch: int = 100, dataset: str = "fashion-mnist", data_dir=None,
                 progress: Progress = None, *, algorithms: Sequence[str] = ALGORITHMS,
                 pretrain_samples: int = DEFAULT_PRETRAIN_SAMPLES,
                 pretrain_epochs: int = DEFAULT_PRETRAIN_EPOCHS, pretrain_seed: int = 0,
                 damage_ratio: float = DAMAGE_RATIO, kappa_th: float | None = None) -> dict:
    """Table 1 of the LRT paper at our scale (see the module docstring); a JSON-ready dict.

    ``progress(n)`` is called as samples are consumed; the calls add up to
    :func:`progress_total` of the same arguments. Accuracies and recoveries are fractions
    (0.065 = 6.5 points). Bad arguments raise :class:`ArgumentError` (a ValueError).
    """
    ranks, lrs, seeds, samples, batch, algorithms = _check_args(
        ranks, lrs, seeds, samples, batch, algorithms, pretrain_samples, pretrain_epochs,
        damage_ratio, kappa_th)
    pretrain_seed = check_int("pretrain_seed", pretrain_seed, 0)
    started = time.perf_counter()
    data = load_dataset(dataset, data_dir)
    # KroneckerSum needs rank < min(n_out, n_in): checked before the minutes of pre-training.
    limit = min(int(data.num_classes), HIDDEN)
    if any(r >= limit for r in ranks) and {"SVD", "LRT"} & set(algorithms):
        raise ArgumentError(f"ranks must be < {limit} (the smaller of {data.num_classes} classes "
                               f"and {HIDDEN} features), got {list(ranks)}")
    problem = _prepare(data, samples, dataset, pretrain_samples, pretrain_epochs, pretrain_seed,
                       progress)
    pretrained = _accuracy(problem, problem.weight)
    configs = _configs(algorithms, ranks, lrs)
    window = max(1, round(WINDOW_FRACTION * samples))

    recoveries = np.zeros((len(configs), len(seeds)))
    finals = np.zeros((len(configs), len(seeds)))
    writes = np.zeros((len(configs), len(seeds)), dtype=np.int64)
    inference, inference_window, sigmas = [], [], []
    for j, seed in enumerate(seeds):
        sigma, damaged = _damage(problem, seed, damage_ratio)
        sigmas.append(sigma)
        order = np.random.default_rng([seed, 1]).permutation(samples)
        z = _logits(problem.features[order], damaged, problem.bias, problem.alpha)
        inf_hits = np.argmax(z, axis=1) == problem.labels[order]
        inference.append(float(inf_hits.mean()))
        inference_window.append(float(inf_hits[-window:].mean()))
        hits, cell_writes, _, _ = _online(problem, damaged, order, configs, batch, seed,
                                          kappa_th, progress)
        finals[:, j] = hits[:, -window:].mean(axis=1)
        recoveries[:, j] = finals[:, j] - inference_window[-1]
        writes[:, j] = cell_writes.reshape(len(configs), -1).max(axis=1)

    ddof = 1 if len(seeds) > 1 else 0
    table = []
    for i, c in enumerate(configs):
        table.append({
            "algorithm": c.algorithm,
            "rank": c.rank,
            "lr": c.lr,
            "recovery_mean": float(recoveries[i].mean()),
            "recovery_std": float(recoveries[i].std(ddof=ddof)),
            "final_accuracy_mean": float(finals[i].mean()),
            "max_writes_per_cell": int(writes[i].max()),
        })
    best = {}
    for row in table:
        if row["algorithm"] not in best or row["recovery_mean"] > best[row["algorithm"]]["recovery_mean"]:
            best[row["algorithm"]] = row
    return {
        "table": table,
        "best": best,
        "pretrained_accuracy": pretrained,
        "inference_accuracy": float(np.mean(inference)),
        "inference_accuracy_std": float(np.std(inference, ddof=ddof)),
        "inference_window_accuracy": float(np.mean(inference_window)),
        "samples": samples,
        "window": window,
        "batch": batch,
        "seeds": list(seeds),
        "ranks": list(ranks),
        "lrs": list(lrs),
        "algorithms": list(algorithms),
        "weight_lr_scaling": "SGD: eta per sample; UORO/SVD/LRT: eta*sqrt(batch) per batch update; "
                             "biases: eta per sample; every update max-normed",
        "damage_sigma": sigmas,
        "kappa_th": kappa_th,
        "pretrain": problem.info,
        "seconds": round(time.perf_counter() - started, 2),
    }


# --------------------------------------------------------------------------- the table

def _signed_pct(x: float) -> str:
    return f"{100 * x:+.1f}"


def format_table(result: dict) -> str:
    """Render ``run_transfer``'s result like the paper's Table 1 (``*`` marks the best η per row),
    followed by the worst-case writes per weight cell."""
    lrs = result["lrs"]
    cells = {(r["algorithm"], r["rank"], r["lr"]): r for r in result["table"]}
    rows = []
    for algo in ALGORITHMS:
        for rank in dict.fromkeys(r["rank"] for r in result["table"] if r["algorithm"] == algo):
            rows.append((algo, rank))
    first = {}
    for algo, rank in rows:
        first.setdefault(algo, rank)

    def name(algo, rank):                   # the algorithm is named on its first row only
        return algo if first[algo] == rank else ""

    head = f"{'Algorithm':<9} {'r':>2} " + "".join(f"{lr:>14.3f}" for lr in lrs)
    pre = result["pretrain"]
    title = (f"Accuracy recovery beyond inference (%, mean ± std over {len(result['seeds'])} seeds; "
             f"max-norm; batch B = {result['batch']}; * = best η of the row)")
    setting = (f"{pre['dataset']}: pre-trained {100 * result['pretrained_accuracy']:.1f}%, damaged "
               f"(inference) {100 * result['inference_accuracy']:.1f}% ± "
               f"{100 * result['inference_accuracy_std']:.1f}%; {result['samples']} online samples, "
               f"last {result['window']} scored")
    lines = [title, setting, head, "-" * len(head)]
    for algo, rank in rows:
        row = [cells.get((algo, rank, lr)) for lr in lrs]
        best = max((c["recovery_mean"] for c in row if c), default=None)
        text = ""
        for c in row:
            if c is None:
                text += f"{'':>14}"
                continue
            mark = "*" if c["recovery_mean"] == best else " "
            cell = f"{_signed_pct(c['recovery_mean'])}±{100 * c['recovery_std']:.1f}{mark}"
            text += f"{cell:>14}"
        lines.append(f"{name(algo, rank):<9} {'-' if rank is None else rank:>2} {text}")
    lines += ["", "Max writes per weight cell (worst seed)", head, "-" * len(head)]
    for algo, rank in rows:
        counts = [cells[(algo, rank, lr)]["max_writes_per_cell"] if (algo, rank, lr) in cells else ""
                  for lr in lrs]
        text = "".join(f"{count:>14}" for count in counts)
        lines.append(f"{name(algo, rank):<9} {'-' if rank is None else rank:>2} {text}")
    return "\n".join(lines)

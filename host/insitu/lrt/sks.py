"""Streaming Kronecker sum approximation (SKS): a rank-r running estimate of Σ dz ⊗ a.

Reference: Algorithm 1 (appendix A) and sections 4.4–4.6 of the SKS paper
(``../shared/papers/sks-streaming-kronecker-sum-training.md``); Benzing et al. 2019 for the
optimal-Kronecker-sum estimator. Algorithm 1's line ``a ← a − c_L,j·Q_L,j`` is a typo: the R
side subtracts ``c_R,j·Q_R,j``.

State: orthonormal bases ``Q_L`` (n_out × q) and ``Q_R`` (n_in × q), q = r + 1, and weights
``c_x`` (r values), so that the estimate is ``Q_L[:, :r] diag(c_x) Q_R[:, :r]ᵀ``. Each sample

1. *vector work*, O((n+m)·q) — what the FPGA's LRT PE does: modified Gram-Schmidt projections
   ``c = Qᵀx`` (one basis vector after another) and the residual, its norm, the new basis vector
   ``residual · (1/norm)``; later the rotation ``Q[:, :r] ← Q · M`` (O((n+m)·q·r));
2. *core work*, O(q³) — what the processor does: ``C = c_L c_Rᵀ + diag(c_x)``, its SVD, and the
   estimator that folds the q singular values into r, giving the q × r rotations ``M_L, M_R`` and
   the new ``c_x``.

The two halves are separate functions (:func:`mgs_project`, :func:`rotate`, :func:`core_rotation`)
so the RTL golden model and the board driver can run them on different engines.

numba is optional. The kernels are compiled with numba where it imports (the trainer feeds one
pair per output pixel, hundreds of pairs per sample; compiled is several hundred times faster);
elsewhere (no numba wheels on 32-bit ARM, numba too new for the NumPy installed) the same source
runs as plain Python. ``INSITU_NUMBA=0`` (or false, no, off) in the environment, read at import,
forces the plain path; ``USES_NUMBA`` says which path runs. Both paths give bit-identical results:
the kernels use only loops of scalar IEEE operations in a fixed order — no ``np.sum`` (pairwise in
NumPy, sequential in numba), no ``@`` (two BLAS builds), no LAPACK (:func:`svd` is a one-sided
Jacobi SVD in loops) — and numba runs without fastmath, so it neither fuses multiply-adds nor
reorders sums.

Choices the paper leaves open (documented here, tested in ``tests/unit/test_lrt_sks.py``):

* The bases start as a random orthonormal pair (from ``seed``) with ``c_x = 0``: the estimate is
  zero and the bases are orthonormal from the first sample on.
* A second Gram-Schmidt pass runs when the residual keeps less than 1/√2 of the input's norm
  (Kahan's "twice is enough"), so a sample that lies almost in the span cannot bring a
  non-orthogonal vector into the bases. The PE runs it as a second projection.
* The κ_th skip (appendix H): a sample with ``|C₁₁| > κ_th·|C_qq|`` is dropped before the SVD.
  ``kappa_th=None`` (the default here) never skips; the trainer uses the paper's κ_th = 100.
* The optional dynamic quantization (``factor_bits``) applies to the returned factors ``L, R``:
  each gets the finest power-of-2 scale that holds its max |x| (``numerics.max_abs_format``).
"""

from __future__ import annotations

import math
import os

import numpy as np

from insitu.numerics import max_abs_format

__all__ = ["KroneckerSum", "LowRankSum", "mgs_project", "rotate", "core_rotation", "svd",
           "USES_NUMBA"]


def _load_numba():
    """numba if it should and can be used, else None (the kernels then run as plain Python)."""
    if os.environ.get("INSITU_NUMBA", "").strip().lower() in ("0", "false", "no", "off"):
        return None
    try:
        import numba
    except Exception:   # not installed, or built for another NumPy (numba >= 0.58 on NumPy 1.21)
        return None
    return numba


_numba = _load_numba()
USES_NUMBA = _numba is not None


def _kernel(fn):
    # No fastmath: without it LLVM neither fuses multiply-adds nor reorders sums, so the compiled
    # kernel rounds exactly as the interpreted source does.
    return _numba.njit(cache=True)(fn) if _numba is not None else fn


# Status codes of one streamed pair.
ADDED, SKIPPED, ZERO = 0, 1, 2

_REORTHOGONALIZE_BELOW = 0.7071067811865476   # 1/sqrt(2): "twice is enough" (Kahan, Parlett)
# Squared once here, so that both paths compare against the same constant (CPython's ``x ** 2``
# calls libm's pow, numba multiplies: they need not round alike).
_REORTHOGONALIZE_BELOW2 = _REORTHOGONALIZE_BELOW * _REORTHOGONALIZE_BELOW
_MAX_MAGNITUDE = 1e75                           # inputs above this could overflow norms
_ROUNDING_LEVEL = 1e-12                         # relative size of a singular value that is noise

_EPS = 2.220446049250313e-16                    # float64 machine epsilon
_JACOBI_MAX_SWEEPS = 60                         # q <= 17 converges in well under 15
# A column whose squared norm (in C scaled to a max |entry| near 1) is below this counts as zero.
_JACOBI_NEGLIGIBLE = 1e-280


# ----------------------------------------------------------------------------- vector work

@_kernel
def mgs_project(Q, x, r, c):
    """Modified Gram-Schmidt against the first ``r`` columns of ``Q``.

    Writes the projections into ``c[:r]`` and the normalized residual into ``Q[:, r]``; returns
    the residual norm (also stored in ``c[r]``). ``x`` is not modified.
    """
    n = x.shape[0]
    res = x.copy()
    x_norm2 = 0.0
    for i in range(n):
        x_norm2 += res[i] * res[i]
    for j in range(r):
        c[j] = 0.0
    norm2 = 0.0                  # (set by the first pass)
    for _pass in range(2):
        for j in range(r):
            p = 0.0
            for i in range(n):
                p += Q[i, j] * res[i]
            c[j] += p
            for i in range(n):
                res[i] -= p * Q[i, j]
        norm2 = 0.0
        for i in range(n):
            norm2 += res[i] * res[i]
        if norm2 >= _REORTHOGONALIZE_BELOW2 * x_norm2:
            break
    norm = np.sqrt(norm2)
    c[r] = norm
    # The new basis vector is the residual times a reciprocal (what the PE is given); a zero
    # residual leaves a zero column, which the core then gives zero weight.
    inv = 1.0 / norm if norm > 0.0 else 0.0
    for i in range(n):
        Q[i, r] = res[i] * inv
    return norm


@_kernel
def rotate(Q, M):
    """``Q[:, :r] ← Q · M`` for a q × r rotation ``M`` (the basis update)."""
    n, q = Q.shape
    r = M.shape[1]
    out = np.zeros((n, r))
    for i in range(n):
        for k in range(q):
            qik = Q[i, k]
            if qik != 0.0:
                for j in range(r):
                    out[i, j] += qik * M[k, j]
    for i in range(n):
        for j in range(r):
            Q[i, j] = out[i, j]


# ------------------------------------------------------------------------------- core work

@_kernel
def svd(C):
    """``(U, σ, V)`` with ``C = U diag(σ) Vᵀ`` for a square ``C``: one-sided Jacobi, plain loops.

    Not ``np.linalg.svd``: NumPy and numba reach LAPACK through different builds (NumPy's own,
    scipy's), which need not round alike; these loops round the same compiled or interpreted.
    σ is descending (ties keep column order); each pair (u_j, v_j) is signed so that the largest
    |entry| of v_j (the first on ties) is positive; the u_j of zero singular values complete U to
    an orthonormal basis (Gram-Schmidt on the unit vector with the largest residual).
    """
    q = C.shape[0]
    # Scale by a power of 2 (exact) to a max |entry| near 1: squared column norms can neither
    # overflow (inputs up to 1e75 give entries near 1e153) nor underflow.
    cmax = 0.0
    for i in range(q):
        for j in range(q):
            cmax = max(cmax, abs(C[i, j]))
    e = 0
    if cmax > 0.0:
        e = min(1000, max(-1000, math.frexp(cmax)[1]))
    down = math.ldexp(1.0, -e)
    A = np.empty((q, q))
    for i in range(q):
        for j in range(q):
            A[i, j] = C[i, j] * down
    V = np.zeros((q, q))
    for i in range(q):
        V[i, i] = 1.0
    tol = q * _EPS
    # Cyclic sweeps in a fixed order, rotating column pairs (i, j) until all are orthogonal.
    for _sweep in range(_JACOBI_MAX_SWEEPS):
        rotated = False
        for i in range(q - 1):
            for j in range(i + 1, q):
                alpha = 0.0
                beta = 0.0
                gamma = 0.0
                for k in range(q):
                    aki = A[k, i]
                    akj = A[k, j]
                    alpha += aki * aki
                    beta += akj * akj
                    gamma += aki * akj
                if alpha < _JACOBI_NEGLIGIBLE or beta < _JACOBI_NEGLIGIBLE:
                    continue
                if abs(gamma) <= tol * np.sqrt(alpha) * np.sqrt(beta):
                    continue
                rotated = True
                zeta = (beta - alpha) / (2.0 * gamma)
                # The smaller root of t² + 2ζt − 1 = 0; 1/(2|ζ|) where ζ² would overflow.
                if abs(zeta) < 1e150:
                    t = 1.0 / (abs(zeta) + np.sqrt(1.0 + zeta * zeta))
                else:
                    t = 0.5 / abs(zeta)
                if zeta < 0.0:
                    t = -t
                cs = 1.0 / np.sqrt(1.0 + t * t)
                sn = cs * t
                for k in range(q):
                    aki = A[k, i]
                    akj = A[k, j]
                    A[k, i] = cs * aki - sn * akj
                    A[k, j] = sn * aki + cs * akj
                    vki = V[k, i]
                    vkj = V[k, j]
                    V[k, i] = cs * vki - sn * vkj
                    V[k, j] = sn * vki + cs * vkj
        if not rotated:
            break
    # The column norms are the singular values; order them descending (a stable selection sort).
    norm2 = np.empty(q)
    for j in range(q):
        s = 0.0
        for k in range(q):
            s += A[k, j] * A[k, j]
        norm2[j] = s
    order = np.empty(q, dtype=np.int64)
    taken = np.zeros(q, dtype=np.bool_)
    for pos in range(q):
        best = -1
        for j in range(q):
            if not taken[j] and (best < 0 or norm2[j] > norm2[best]):
                best = j
        taken[best] = True
        order[pos] = best
    U = np.zeros((q, q))
    Vs = np.empty((q, q))
    sig = np.zeros(q)
    up = math.ldexp(1.0, e)
    null = np.zeros(q, dtype=np.bool_)
    for pos in range(q):
        j = order[pos]
        # The sign convention: the largest |entry| of v_j is positive.
        big = 0
        for k in range(1, q):
            if abs(V[k, j]) > abs(V[big, j]):
                big = k
        flip = -1.0 if V[big, j] < 0.0 else 1.0
        for k in range(q):
            Vs[k, pos] = flip * V[k, j]
        if norm2[j] < _JACOBI_NEGLIGIBLE:
            null[pos] = True           # no direction of its own: completed below
            continue
        s = np.sqrt(norm2[j])
        sig[pos] = s * up
        for k in range(q):
            U[k, pos] = flip * (A[k, j] / s)
    # Complete U: for each zero singular value, the unit vector that keeps most of its length
    # after two Gram-Schmidt passes against the columns already set.
    w = np.empty(q)
    best_w = np.empty(q)
    for pos in range(q):
        if not null[pos]:
            continue
        best_norm2 = -1.0
        for m in range(q):
            for k in range(q):
                w[k] = 0.0
            w[m] = 1.0
            for _pass in range(2):
                for col in range(q):
                    if null[col] and col >= pos:
                        continue        # not set yet
                    p = 0.0
                    for k in range(q):
                        p += U[k, col] * w[k]
                    for k in range(q):
                        w[k] -= p * U[k, col]
            wn2 = 0.0
            for k in range(q):
                wn2 += w[k] * w[k]
            if wn2 > best_norm2:
                best_norm2 = wn2
                for k in range(q):
                    best_w[k] = w[k]
        wn = np.sqrt(best_norm2)
        for k in range(q):
            U[k, pos] = best_w[k] / wn
    return U, sig, Vs


@_kernel
def _times(X, Y):
    """``X @ Y`` in plain loops (``@`` would be BLAS: another rounding in each path)."""
    n, q = X.shape
    r = Y.shape[1]
    out = np.zeros((n, r))
    for i in range(n):
        for j in range(r):
            s = 0.0
            for k in range(q):
                s += X[i, k] * Y[k, j]
            out[i, j] = s
    return out


@_kernel
def core_rotation(cL, cR, cx, signs, unbiased):
    """The q × q work of one sample: ``(M_L, M_R, new_cx)``.

    ``C = c_L c_Rᵀ + diag(c_x, 0)``; with ``C = U diag(σ) Vᵀ`` the new bases are ``Q_L·U·Q_x`` and
    ``Q_R·V·Q_x``. Biased: ``Q_x = [I_r; 0]`` keeps the top r singular values. Unbiased: the
    minimum-variance estimator keeps σ_1..σ_{m-1} and mixes σ_m..σ_q into k = q − m directions
    with a Householder basis orthogonal to x₀ and random ``signs`` (±1, at least q of them).
    """
    q = cL.shape[0]
    r = q - 1
    C = np.empty((q, q))
    for i in range(q):
        for j in range(q):
            C[i, j] = cL[i] * cR[j]
    for i in range(r):
        C[i, i] += cx[i]
    U, sig, V = svd(C)
    # Singular values at rounding level are zeros: mixing them in would add sqrt(eps)-size noise
    # to an estimate that is exact (a sum of rank <= r).
    for i in range(q):
        if sig[i] <= _ROUNDING_LEVEL * sig[0]:
            sig[i] = 0.0
    Qx = np.zeros((q, r))
    new_cx = np.zeros(r)
    if not unbiased:
        for i in range(r):
            Qx[i, i] = 1.0
            new_cx[i] = sig[i]
        return _times(U, Qx), _times(V, Qx), new_cx

    # m (0-based m0): the first j with (q - j - 1)·σ_j <= Σ_{l >= j} σ_l; it is at most q - 2
    # because the condition always holds there.
    tail = np.zeros(q + 1)
    for j in range(q - 1, -1, -1):
        tail[j] = tail[j + 1] + sig[j]
    m0 = q - 2
    for j in range(q - 1):
        if (q - j - 1) * sig[j] <= tail[j]:
            m0 = j
            break
    k = q - 1 - m0
    s1 = tail[m0]
    for i in range(m0):
        Qx[i, i] = 1.0
        new_cx[i] = sig[i]
    if s1 <= 0.0:
        # The tail is empty: nothing to mix, the estimate is exact.
        for i in range(m0, r):
            Qx[i, i] = 1.0
        return _times(U, Qx), _times(V, Qx), new_cx
    x0 = np.empty(k + 1)
    x0_norm2 = 0.0
    for i in range(k + 1):
        x0[i] = np.sqrt(max(0.0, 1.0 - sig[m0 + i] * k / s1))
        x0_norm2 += x0[i] * x0[i]
    x0_norm = np.sqrt(x0_norm2)
    for i in range(k + 1):
        x0[i] /= x0_norm
    # Householder reflection H = I - 2 v vᵀ / |v|² with v = x0 - e1 maps e1 to x0; its other
    # columns are an orthonormal basis X of x0's complement (|v| > 0 since x0_1 <= 1/√2 here).
    v = x0.copy()
    v[0] -= 1.0
    vv = 0.0
    for i in range(k + 1):
        vv += v[i] * v[i]
    for a in range(k + 1):
        for b in range(k):
            h = (1.0 if a == b + 1 else 0.0) - 2.0 * v[a] * v[b + 1] / vv
            Qx[m0 + a, m0 + b] = signs[a] * h
    for i in range(m0, r):
        new_cx[i] = s1 / k
    return _times(U, Qx), _times(V, Qx), new_cx


# ------------------------------------------------------------------------------ the stream

@_kernel
def _add_pairs(QL, QR, cx, dz, a, signs, unbiased, kappa_th, counts):
    """Stream pairs ``dz[p] ⊗ a[p]`` into the state; ``counts`` gets added/skipped/zero."""
    q = QL.shape[1]
    r = q - 1
    cL = np.zeros(q)
    cR = np.zeros(q)
    for p in range(dz.shape[0]):
        nz = False
        for i in range(dz.shape[1]):
            if dz[p, i] != 0.0:
                nz = True
                break
        na = False
        for i in range(a.shape[1]):
            if a[p, i] != 0.0:
                na = True
                break
        if not (nz and na):
            counts[ZERO] += 1          # a zero outer product changes nothing
            continue
        mgs_project(QL, dz[p], r, cL)
        mgs_project(QR, a[p], r, cR)
        if kappa_th > 0.0 and abs(cL[0] * cR[0] + cx[0]) > kappa_th * abs(cL[r] * cR[r]):
            counts[SKIPPED] += 1
            continue
        ML, MR, new_cx = core_rotation(cL, cR, cx, signs[p], unbiased)
        rotate(QL, ML)
        rotate(QR, MR)
        for i in range(r):
            cx[i] = new_cx[i]
        counts[ADDED] += 1


def random_orthonormal(rng: np.random.Generator, n: int, q: int) -> np.ndarray:
    g = rng.standard_normal((n, q))
    qm, rm = np.linalg.qr(g)
    return np.ascontiguousarray(qm * np.sign(np.diag(rm)))


class LowRankSum:
    """What every streaming low-rank estimator of ``Σ dz ⊗ a`` shares: quantized factors, the
    dense estimate and the auxiliary memory. Subclasses give ``_raw_factors()`` and set
    ``n_out``, ``n_in``, ``rank`` and ``factor_bits``."""

    n_out: int
    n_in: int
    rank: int
    factor_bits: int | None

    def _raw_factors(self) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _stream(self, dz: np.ndarray, a: np.ndarray) -> None:
        """Stream checked pairs: contiguous float64 ``(P, n_out)`` and ``(P, n_in)``, finite."""
        raise NotImplementedError

    def add(self, dz, a) -> None:
        """Stream one outer product ``dz ⊗ a`` (dz: n_out values, a: n_in values)."""
        self.add_many(np.asarray(dz, dtype=np.float64).reshape(1, -1),
                      np.asarray(a, dtype=np.float64).reshape(1, -1))

    def add_many(self, dz, a) -> None:
        """Stream the outer products of corresponding rows, ``dz (P, n_out)``, ``a (P, n_in)``."""
        what = type(self).__name__
        dz = np.ascontiguousarray(dz, dtype=np.float64)
        a = np.ascontiguousarray(a, dtype=np.float64)
        if dz.ndim != 2 or dz.shape[1] != self.n_out:
            raise ValueError(f"{what}.add: dz must have {self.n_out} values per pair "
                             f"(shape (P, {self.n_out})), got shape {dz.shape}")
        if a.ndim != 2 or a.shape[1] != self.n_in:
            raise ValueError(f"{what}.add: a must have {self.n_in} values per pair "
                             f"(shape (P, {self.n_in})), got shape {a.shape}")
        if dz.shape[0] != a.shape[0]:
            raise ValueError(f"{what}.add: dz has {dz.shape[0]} pairs but a has {a.shape[0]}")
        # Checked before anything is touched: a NaN or inf must never enter the state.
        for name, v in (("dz", dz), ("a", a)):
            if not np.isfinite(v).all():
                raise ValueError(f"{what}.add: {name} contains NaN or inf; the estimate is unchanged")
            # Squared norms of larger values overflow float64.
            if v.size and np.abs(v).max() > _MAX_MAGNITUDE:
                raise ValueError(f"{what}.add: {name} has values above {_MAX_MAGNITUDE:g}; "
                                 f"scale the inputs down")
        self._stream(dz, a)

    def factors(self) -> tuple[np.ndarray, np.ndarray]:
        """``(L, R)``, shapes ``(n_out, rank)`` and ``(n_in, rank)``: ``L @ R.T`` ≈ the sum."""
        L, R = self._raw_factors()
        if self.factor_bits is not None:
            L = max_abs_format(L, self.factor_bits).quantize(L)
            R = max_abs_format(R, self.factor_bits).quantize(R)
        return L, R

    def estimate(self) -> np.ndarray:
        """The dense ``n_out × n_in`` estimate ``L @ R.T`` (for tests and small layers)."""
        L, R = self.factors()
        return L @ R.T

    @property
    def aux_memory_bits(self) -> int:
        """Auxiliary memory of the factors at 16 bits per value, r·(n+m)·16 (the paper's figure)."""
        return self.rank * (self.n_out + self.n_in) * 16


class KroneckerSum(LowRankSum):
    """Rank-``rank`` streaming estimate of ``Σ dz ⊗ a`` (a weight gradient), memory O((n+m)·q).

    ``add(dz, a)`` streams one outer product, ``add_many(dz, a)`` a block of them (rows are pairs,
    streamed in order — the pixels of a convolution), ``factors()`` returns ``(L, R)`` with
    ``L @ R.T`` the estimate of everything added since ``reset()``.

    ``unbiased=True`` uses the minimum-variance unbiased estimator (random signs from ``seed``);
    ``False`` keeps the top-r singular triplets (zero variance, biased). ``kappa_th`` drops samples
    whose approximate condition number ``|C₁₁/C_qq|`` exceeds it (None: never). ``factor_bits``
    quantizes the returned factors to that many bits with a dynamic power-of-2 scale.
    """

    def __init__(self, n_out: int, n_in: int, rank: int, unbiased: bool = True, seed=None,
                 kappa_th: float | None = None, factor_bits: int | None = None):
        for name, v in (("n_out", n_out), ("n_in", n_in), ("rank", rank)):
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
                raise ValueError(f"KroneckerSum: {name} must be an integer >= 1, got {v!r}")
        if rank >= min(n_out, n_in):
            raise ValueError(f"KroneckerSum: rank must be < min(n_out, n_in) = {min(n_out, n_in)} "
                             f"(a full-rank estimate needs no low-rank method), got rank={rank}")
        if kappa_th is not None and not (np.isfinite(kappa_th) and kappa_th > 0):
            raise ValueError(f"KroneckerSum: kappa_th must be a positive number or None, got {kappa_th!r}")
        if factor_bits is not None and (not isinstance(factor_bits, int) or factor_bits < 2):
            raise ValueError(f"KroneckerSum: factor_bits must be an integer >= 2 or None, got {factor_bits!r}")
        self.n_out, self.n_in, self.rank = int(n_out), int(n_in), int(rank)
        self.q = self.rank + 1
        self.unbiased = bool(unbiased)
        self.kappa_th = kappa_th
        self.factor_bits = factor_bits
        self._rng = np.random.default_rng(seed)
        self.QL = random_orthonormal(self._rng, self.n_out, self.q)
        self.QR = random_orthonormal(self._rng, self.n_in, self.q)
        self.cx = np.zeros(self.rank)
        self.counts = np.zeros(3, dtype=np.int64)    # pairs added, skipped (κ_th), zero

    # -- streaming ---------------------------------------------------------------------------
    def _stream(self, dz, a) -> None:
        signs = self._rng.integers(0, 2, size=(dz.shape[0], self.q)) * 2.0 - 1.0
        _add_pairs(self.QL, self.QR, self.cx, dz, a, signs, self.unbiased,
                   float(self.kappa_th or 0.0), self.counts)

    def reset(self) -> None:
        """Forget everything added (the bases are kept: any orthonormal basis will do)."""
        self.cx[:] = 0.0

    # -- results -------------------------------------------------------------------------------
    @property
    def pairs_added(self) -> int:
        return int(self.counts[ADDED])

    @property
    def pairs_skipped(self) -> int:
        return int(self.counts[SKIPPED])

    @property
    def bases(self) -> tuple[np.ndarray, np.ndarray]:
        """The orthonormal bases ``Q_L[:, :r]``, ``Q_R[:, :r]`` (column q is scratch space)."""
        return self.QL[:, :self.rank], self.QR[:, :self.rank]

    def _raw_factors(self) -> tuple[np.ndarray, np.ndarray]:
        root = np.sqrt(self.cx)
        return self.QL[:, :self.rank] * root, self.QR[:, :self.rank] * root

    def state_dict(self) -> dict:
        return {"QL": self.QL.copy(), "QR": self.QR.copy(), "cx": self.cx.copy(),
                "counts": self.counts.copy(), "rng": self._rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        missing = {"QL", "QR", "cx", "counts", "rng"} - set(state)
        if missing:
            raise ValueError(f"KroneckerSum state lacks {sorted(missing)}")
        for key, ref in (("QL", self.QL), ("QR", self.QR), ("cx", self.cx), ("counts", self.counts)):
            if np.shape(state[key]) != ref.shape:
                raise ValueError(f"KroneckerSum state {key} has shape {np.shape(state[key])}, "
                                 f"expected {ref.shape}")
            if not np.isfinite(state[key]).all():
                raise ValueError(f"KroneckerSum state {key} contains NaN or inf")
        if np.any(np.asarray(state["cx"]) < 0):
            raise ValueError("KroneckerSum state cx has negative weights")
        for key in ("QL", "QR"):
            basis = np.asarray(state[key])[:, :self.rank]
            if np.abs(basis.T @ basis - np.eye(self.rank)).max() > 1e-8:
                raise ValueError(f"KroneckerSum state {key} is not an orthonormal basis")
        self.QL[...] = state["QL"]
        self.QR[...] = state["QR"]
        self.cx[...] = state["cx"]
        self.counts[...] = state["counts"]
        self._rng.bit_generator.state = state["rng"]

    def __repr__(self) -> str:
        return (f"KroneckerSum({self.n_out}, {self.n_in}, rank={self.rank}, "
                f"unbiased={self.unbiased}, kappa_th={self.kappa_th})")

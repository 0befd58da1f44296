"""Per-sample cost of streaming low-rank accumulation versus a dense gradient accumulator.

Reference: Gural, Nadeau, Tikekar and Murmann, "Low-rank training of deep neural networks for
emerging memory technology" (arXiv 2009.03887, ``shared/papers/lrt-low-rank-training-nvm.txt``),
section 4.2.4: LRT costs O((n_i + n_o + q)·q²) operations per sample, plus O(n_i·n_o·q / B)
amortized for the update, while expanding every Kronecker sum costs O(n_i·n_o) per sample;
section 3 (LAM): the factors need r·(n_i + n_o)·b bits of auxiliary memory instead of n_i·n_o·b.

:func:`run_bench` times, in this process, for square layers ``n_out = n_in = n``:

* ``lrt_us``: one :meth:`KroneckerSum.add` per pair, Python call overhead included (what a
  trainer that gets one sample at a time pays);
* ``lrt_many_us``: :meth:`KroneckerSum.add_many` on all pairs at once, per pair (the cost of the
  estimator itself, as a convolution's pixels are streamed);
* ``dense_us``: the fastest plain-NumPy rank-1 update of a preallocated float64 ``G`` among
  ``np.add(G, np.outer(dz, a), out=G)``, ``G += dz[:, None] * a`` and a multiply into a
  preallocated scratch followed by ``G += scratch``; every candidate is in ``dense_methods_us``;
* ``dense_dger_us``: BLAS ``dger`` (SciPy) updating a Fortran-ordered ``G`` in place, which NumPy
  has no call for; reported beside the NumPy baseline, with ``speedup_vs_dger``.

Everything runs on one thread (BLAS is limited to one with threadpoolctl): the estimator is a
sequential per-sample loop, and the comparison is per core.

Every figure is the median over ``repeats`` timed passes over the same ``pairs`` (after an untimed
warm-up pass), divided by ``pairs``. Memory assumes 16-bit values for both, as the paper does for
the factors L, R (appendix D): ``aux_memory_bits = rank·(n + m)·16`` and
``dense_memory_bits = n·m·16`` (a 16-bit accumulator; the float64 one timed here is 4× that).
"""

from __future__ import annotations

import platform
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext

import numpy as np

from insitu.checks import ArgumentError, check_int
from insitu.lrt.sks import KroneckerSum

# Imported here, not when first timed: threadpoolctl can only limit the threads of a BLAS that is
# already loaded when the limit is set (SciPy bundles its own OpenBLAS).
try:
    # (SciPy makes its BLAS wrappers when the module loads: pyright does not see them.)
    from scipy.linalg.blas import dger  # pyright: ignore[reportAttributeAccessIssue]
except ImportError:                              # SciPy is a dependency, but the bench need not fail
    dger = None

__all__ = ["DEFAULT_SIZES", "format_bench", "run_bench"]

DEFAULT_SIZES = (256, 512, 1024, 2048)
DEFAULT_PAIRS = 200
DEFAULT_REPEATS = 5
ACCUMULATOR_BITS = 16




def _median_us(run: Callable[[], None], pairs: int, repeats: int) -> float:
    """Median over ``repeats`` timed calls of ``run`` (one pass over the pairs), per pair, in µs."""
    run()                                       # warm-up: JIT, caches, page faults of G
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return float(np.median(times)) / pairs * 1e6


def _lrt_add(ks: KroneckerSum, dz: np.ndarray, a: np.ndarray) -> Callable[[], None]:
    pairs = list(zip(dz, a, strict=True))

    def run():
        for x, y in pairs:
            ks.add(x, y)

    return run


def _lrt_add_many(ks: KroneckerSum, dz: np.ndarray, a: np.ndarray) -> Callable[[], None]:
    return lambda: ks.add_many(dz, a)


def _dense_candidates(n: int, dz: np.ndarray, a: np.ndarray) -> dict[str, Callable[[], None]]:
    g = np.zeros((n, n))
    scratch = np.empty((n, n))
    rows = [(dz[i], a[i]) for i in range(len(dz))]
    cols = [(dz[i][:, None], a[i][None, :]) for i in range(len(dz))]

    def outer_add():
        for x, y in rows:
            np.add(g, np.outer(x, y), out=g)

    def broadcast():
        for x, y in cols:
            np.add(g, x * y, out=g)                 # G += dz[:, None] * a

    def scratch_add():
        for x, y in cols:
            np.multiply(x, y, out=scratch)          # no allocation per pair
            np.add(g, scratch, out=g)

    return {"np.add(G, np.outer)": outer_add, "G += dz[:, None] * a": broadcast,
            "multiply into scratch, G += scratch": scratch_add}


def _dger(n: int, dz: np.ndarray, a: np.ndarray) -> Callable[[], None] | None:
    if dger is None:
        return None
    ger = dger                                   # (not None, for the closure)
    g = np.zeros((n, n), order="F")              # dger updates a Fortran array in place

    def run():
        for i in range(len(dz)):
            ger(1.0, dz[i], a[i], a=g, overwrite_a=1)

    return run


def _single_threaded_blas():
    """Every kernel timed here runs on one core (numba's loops, NumPy's ufuncs); BLAS ``dger``
    is held to one thread too, so that the comparison is per core and a loaded machine does not
    stall BLAS worker threads."""
    try:
        from threadpoolctl import threadpool_limits
    except ImportError:
        return nullcontext()
    return threadpool_limits(limits=1, user_api="blas")


def _bench_size(n: int, rank: int, pairs: int, repeats: int, seed: int, rng) -> dict:
    m = n
    dz = rng.standard_normal((pairs, n))
    a = rng.standard_normal((pairs, m))
    ks = KroneckerSum(n, m, rank, seed=seed)
    lrt_us = _median_us(_lrt_add(ks, dz, a), pairs, repeats)
    lrt_many_us = _median_us(_lrt_add_many(ks, dz, a), pairs, repeats)
    methods = {name: _median_us(run, pairs, repeats)
               for name, run in _dense_candidates(n, dz, a).items()}
    dense_method = min(methods, key=methods.__getitem__)
    dense_us = methods[dense_method]
    dger_run = _dger(n, dz, a)
    dger_us = _median_us(dger_run, pairs, repeats) if dger_run else None
    aux_bits = rank * (n + m) * ACCUMULATOR_BITS
    dense_bits = n * m * ACCUMULATOR_BITS
    return {
        "n": n,
        "m": m,
        "rank": rank,
        "lrt_us": lrt_us,
        "lrt_many_us": lrt_many_us,
        "dense_us": dense_us,
        "dense_method": dense_method,
        "dense_methods_us": methods,
        "dense_dger_us": dger_us,
        "speedup": dense_us / lrt_us,
        "speedup_many": dense_us / lrt_many_us,
        "speedup_vs_dger": dger_us / lrt_us if dger_us else None,
        "aux_memory_bits": aux_bits,
        "dense_memory_bits": dense_bits,
        "memory_ratio": dense_bits / aux_bits,
    }


def run_bench(sizes: Sequence[int] = DEFAULT_SIZES, rank: int = 4, pairs: int = DEFAULT_PAIRS,
              seed: int = 0, progress: Callable[[int], None] | None = None, *,
              repeats: int = DEFAULT_REPEATS) -> dict:
    """Time LRT against dense accumulation for each ``n`` in ``sizes``; a JSON-ready dict.

    ``progress(1)`` is called after each size (the calls add up to ``len(sizes)``). Bad
    arguments raise :class:`~insitu.checks.ArgumentError` (a ValueError).
    """
    try:
        sizes = tuple(sizes)
    except TypeError:
        raise ArgumentError(f"sizes must be a list of integers, got {sizes!r}") from None
    if not sizes:
        raise ArgumentError("sizes must not be empty")
    rank = check_int("rank", rank, 1)
    for n in sizes:
        check_int("each of sizes", n, 2)
        if rank >= n:
            raise ArgumentError(f"sizes: n = {n} must be > rank ({rank}); a full-rank estimate "
                                   "needs no low-rank method")
    pairs = check_int("pairs", pairs, 1)
    repeats = check_int("repeats", repeats, 1)
    seed = check_int("seed", seed, 0)

    started = time.perf_counter()
    rng = np.random.default_rng(seed)
    rows = []
    with _single_threaded_blas():
        for n in sizes:
            rows.append(_bench_size(n, rank, pairs, repeats, seed, rng))
            if progress:
                progress(1)
    return {
        "rows": rows,
        "rank": rank,
        "pairs": pairs,
        "repeats": repeats,
        "seed": seed,
        "accumulator_bits": ACCUMULATOR_BITS,
        "timing": "median of repeats passes over the pairs after one warm-up pass, per pair; "
                  "float64 arrays; same process; one thread (BLAS limited to 1)",
        "machine": {"python": platform.python_version(), "numpy": np.__version__,
                    "processor": platform.processor() or platform.machine()},
        "seconds": round(time.perf_counter() - started, 2),
    }


def format_bench(result: dict) -> str:
    """A text table of :func:`run_bench`'s result."""
    head = (f"{'n':>6} {'rank':>4} {'lrt add µs':>11} {'add_many µs':>12} {'dense µs':>10} "
            f"{'dger µs':>9} {'speedup':>8} {'vs dger':>8} {'aux bits':>10} {'dense bits':>11} "
            f"{'mem ratio':>9}")
    title = (f"Per-pair cost of accumulating dz ⊗ a (n_out = n_in = n; median of {result['repeats']} "
             f"passes over {result['pairs']} pairs); speedup = dense / lrt add; "
             f"memory at {result['accumulator_bits']} bits per value")
    lines = [title, head, "-" * len(head)]
    for r in result["rows"]:
        dger = f"{r['dense_dger_us']:9.1f}" if r["dense_dger_us"] is not None else f"{'-':>9}"
        vs = f"{r['speedup_vs_dger']:8.1f}" if r["speedup_vs_dger"] is not None else f"{'-':>8}"
        lines.append(f"{r['n']:>6} {r['rank']:>4} {r['lrt_us']:11.1f} {r['lrt_many_us']:12.1f} "
                     f"{r['dense_us']:10.1f} {dger} {r['speedup']:8.1f} {vs} "
                     f"{r['aux_memory_bits']:>10} {r['dense_memory_bits']:>11} {r['memory_ratio']:9.1f}")
    lines.append("dense = fastest plain-NumPy method per row: "
                 + ", ".join(f"n={r['n']}: {r['dense_method']}" for r in result["rows"]))
    return "\n".join(lines)

"""numba is optional in insitu.lrt.sks: the uncompiled kernels give the compiled ones' bits.

The plain path is a second copy of sks.py loaded with INSITU_NUMBA=0 (its kernels are the Python
source itself); the numba path is the module as imported normally.
"""

import hashlib
import importlib.util
import os
import subprocess
import sys
import time

import numpy as np
import pytest

from insitu.lrt import sks

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def plain():
    """A second copy of sks.py loaded with INSITU_NUMBA=0: its kernels are the Python source."""
    spec = importlib.util.spec_from_file_location("insitu.lrt._sks_plain", sks.__file__)
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("INSITU_NUMBA", "0")
        spec.loader.exec_module(module)
    assert not module.USES_NUMBA
    return module


@pytest.fixture(scope="module")
def compiled():
    """The module as imported. (Not a compiled copy under another name: numba's on-disk cache is
    keyed by the source file, and a copy's entries can break the real module's next load.)"""
    if not sks.USES_NUMBA:
        try:
            import numba  # noqa: F401
        except Exception:
            pytest.skip("numba is not importable: there is no compiled path to compare with")
        pytest.skip("INSITU_NUMBA=0 turns the compiled path off in this session")
    return sks


def _same_bits(x, y) -> bool:
    """Bit identity: equal shapes and dtypes, and equal bit patterns (so 0.0 differs from -0.0)."""
    x, y = np.asarray(x), np.asarray(y)
    return (x.shape == y.shape and x.dtype == y.dtype
            and np.array_equal(x.view(np.uint8), y.view(np.uint8)))


def _stream(rng, n_out, n_in, rank, count):
    """Pairs with what the kernels branch on: zero pairs, tiny ones (κ skips), pairs inside the
    span (rank-deficient C), repeats, and a wide range of magnitudes."""
    basis_dz = rng.standard_normal((n_out, rank))
    basis_a = rng.standard_normal((n_in, rank))
    dz = rng.standard_normal((count, n_out)) * 10.0 ** rng.uniform(-3, 3, (count, 1))
    a = rng.standard_normal((count, n_in))
    kind = rng.integers(0, 6, count)
    for p in range(count):
        if kind[p] == 0:
            (dz if p % 2 else a)[p] = 0.0
        elif kind[p] == 1:
            dz[p] *= 1e-6
            a[p] *= 1e-6
        elif kind[p] == 2:
            dz[p] = basis_dz @ rng.standard_normal(rank)
            a[p] = basis_a @ rng.standard_normal(rank)
        elif kind[p] == 3 and p > 0:
            dz[p], a[p] = dz[p - 1], -a[p - 1]
    return dz, a


def _run(module, n_out, n_in, rank, unbiased, kappa_th, seed, dz, a):
    ks = module.KroneckerSum(n_out, n_in, rank, unbiased=unbiased, seed=seed, kappa_th=kappa_th)
    states = []
    for lo, hi in ((0, 1), (1, len(dz) // 2), (len(dz) // 2, len(dz))):
        ks.add_many(dz[lo:hi], a[lo:hi])
        states.append((ks.QL.copy(), ks.QR.copy(), ks.cx.copy(), ks.counts.copy()))
    return states


@pytest.mark.parametrize("case", range(6))
def test_streams_give_the_same_bits_with_and_without_numba(case, plain, compiled):
    rng = np.random.default_rng(1000 + case)
    rank = int(rng.integers(1, 7))
    n_out = int(rng.integers(rank + 1, 24))
    n_in = int(rng.integers(rank + 1, 40))
    unbiased = bool(case % 2)
    kappa_th = (None, 30.0, 1e4)[case % 3]
    dz, a = _stream(rng, n_out, n_in, rank, 30)
    expected = _run(compiled, n_out, n_in, rank, unbiased, kappa_th, case, dz, a)
    got = _run(plain, n_out, n_in, rank, unbiased, kappa_th, case, dz, a)
    for step, (want, have) in enumerate(zip(expected, got)):
        for name, x, y in zip(("QL", "QR", "cx", "counts"), want, have):
            assert _same_bits(x, y), \
                f"{name} differs after chunk {step} ({n_out}x{n_in}, rank {rank})"
    counts = expected[-1][3]
    assert counts[sks.ZERO] > 0 and counts[sks.ADDED] > 0
    if kappa_th == 30.0:
        assert counts[sks.SKIPPED] > 0


def test_the_largest_core_gives_the_same_bits(plain, compiled):
    """q = 17 (rank 16), the largest core the SVD is checked at, a few pairs."""
    rng = np.random.default_rng(17)
    dz, a = _stream(rng, 20, 24, 16, 8)
    for unbiased in (True, False):
        want = _run(compiled, 20, 24, 16, unbiased, None, 3, dz, a)[-1]
        have = _run(plain, 20, 24, 16, unbiased, None, 3, dz, a)[-1]
        assert all(_same_bits(x, y) for x, y in zip(want, have))


def test_the_core_and_its_svd_give_the_same_bits(plain, compiled):
    rng = np.random.default_rng(5)
    for q in range(2, 18):
        for trial in range(3):
            cL, cR = rng.standard_normal(q), rng.standard_normal(q)
            cx = np.sort(rng.random(q - 1))[::-1] * 10.0 ** rng.uniform(-50, 50)
            if trial == 1:
                cx[q // 2:] = 0.0          # rank-deficient C
            elif trial == 2:
                cx[:] = 0.0                # rank 1
            signs = rng.choice([-1.0, 1.0], q)
            C = np.outer(cL, cR) + np.diag(np.append(cx, 0.0))
            for x, y in zip(compiled.svd(C), plain.svd(C)):
                assert _same_bits(x, y), f"svd, q={q}, trial {trial}"
            for unbiased in (True, False):
                for x, y in zip(compiled.core_rotation(cL, cR, cx, signs, unbiased),
                                plain.core_rotation(cL, cR, cx, signs, unbiased)):
                    assert _same_bits(x, y), f"core_rotation, q={q}, trial {trial}"


_SUBPROCESS = """
import hashlib, sys
import numpy as np
sys.modules["numba"] = None          # import numba now raises ImportError
import insitu.lrt.sks as sks
assert not sks.USES_NUMBA
rng = np.random.default_rng(0)
ks = sks.KroneckerSum(9, 13, 3, unbiased=True, seed=2, kappa_th=100.0)
ks.add_many(rng.standard_normal((12, 9)), rng.standard_normal((12, 13)))
state = ks.QL.tobytes() + ks.QR.tobytes() + ks.cx.tobytes() + ks.counts.tobytes()
print(hashlib.sha256(state).hexdigest())
"""


def test_sks_imports_and_gives_the_same_result_where_numba_cannot_be_imported():
    env = {k: v for k, v in os.environ.items() if k != "INSITU_NUMBA"}
    out = subprocess.run([sys.executable, "-c", _SUBPROCESS], capture_output=True, text=True,
                         env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    rng = np.random.default_rng(0)
    ks = sks.KroneckerSum(9, 13, 3, unbiased=True, seed=2, kappa_th=100.0)
    ks.add_many(rng.standard_normal((12, 9)), rng.standard_normal((12, 13)))
    here = hashlib.sha256(ks.QL.tobytes() + ks.QR.tobytes() + ks.cx.tobytes() + ks.counts.tobytes())
    assert out.stdout.strip() == here.hexdigest()


def test_speed_of_both_paths_is_printed(plain, compiled):
    """Not a check: prints µs per pair of add_many (n_out=10, n_in=800, rank 4); `pytest -s`."""
    rng = np.random.default_rng(0)
    dz, a = rng.standard_normal((100, 10)), rng.standard_normal((100, 800))
    per_pair = {}
    for name, module, pairs in (("numba", compiled, 100), ("plain", plain, 5)):
        module.KroneckerSum(10, 800, 4, seed=0).add_many(dz[:2], a[:2])     # compile / warm up
        ks = module.KroneckerSum(10, 800, 4, seed=0)
        start = time.perf_counter()
        ks.add_many(dz[:pairs], a[:pairs])
        per_pair[name] = (time.perf_counter() - start) / pairs * 1e6
    print(f"\nKroneckerSum(10, 800, rank 4).add_many: numba {per_pair['numba']:.1f} us/pair, "
          f"plain {per_pair['plain']:.0f} us/pair ({per_pair['plain'] / per_pair['numba']:.0f}x)")

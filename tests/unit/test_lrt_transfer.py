"""The Table 1 experiment (insitu.lrt.transfer): UORO, vectorized max-norm, a tiny run, bad input.

The tiny runs use the always-present digits dataset and a few hundred online samples.
"""

import json

import numpy as np
import pytest

from insitu.checks import ArgumentError
from insitu.lrt.maxnorm import MaxNorm
from insitu.lrt.transfer import (
    ALGORITHMS,
    UoroSum,
    _MaxNormBank,
    format_table,
    progress_total,
    run_transfer,
)
from insitu.numerics import LRT_WEIGHT

pytestmark = pytest.mark.unit

TINY = dict(dataset="digits", samples=300, batch=100, pretrain_samples=800, pretrain_epochs=2)


@pytest.fixture(scope="module")
def tiny():
    calls = []
    result = run_transfer(ranks=(1, 2), lrs=(0.003, 0.1), seeds=(0, 1), progress=calls.append, **TINY)
    return result, calls


# --------------------------------------------------------------------------- UORO

def test_uoro_is_unbiased_over_seeds():
    rng = np.random.default_rng(11)
    pairs = [(rng.standard_normal(4), rng.standard_normal(3)) for _ in range(5)]
    total = sum(np.outer(dz, a) for dz, a in pairs)
    trials = 4000
    draws = np.empty((trials, 4, 3))
    for seed in range(trials):
        est = UoroSum(4, 3, seed=seed)
        for dz, a in pairs:
            est.add(dz, a)
        draws[seed] = est.estimate()
    mean = draws.mean(axis=0)
    stderr = draws.std(axis=0, ddof=1) / np.sqrt(trials)
    # Each element within 4.5 standard errors of the true sum (a bias of 1 % of its scale would not be).
    assert np.all(np.abs(mean - total) <= 4.5 * stderr + 1e-12), (mean - total) / stderr
    # It is a rank-1 estimate of a rank-3 sum: single draws are far from the sum.
    assert np.mean([np.linalg.norm(d - total) for d in draws[:50]]) > 0.1 * np.linalg.norm(total)


def test_uoro_is_exact_for_one_pair_and_for_collinear_pairs():
    rng = np.random.default_rng(3)
    dz, a = rng.standard_normal(6), rng.standard_normal(5)
    est = UoroSum(6, 5, seed=0)
    est.add(dz, a)
    np.testing.assert_allclose(est.estimate(), np.outer(dz, a), rtol=1e-12, atol=1e-12)
    # Zero pairs change nothing; reset forgets.
    est.add(np.zeros(6), a)
    np.testing.assert_allclose(est.estimate(), np.outer(dz, a), rtol=1e-12, atol=1e-12)
    est.reset()
    assert not est.estimate().any()
    L, R = est.factors()
    assert L.shape == (6, 1) and R.shape == (5, 1)


def test_uoro_add_many_equals_add_one_by_one_and_rejects_bad_input():
    rng = np.random.default_rng(5)
    dz, a = rng.standard_normal((7, 4)), rng.standard_normal((7, 9))
    one, many = UoroSum(4, 9, seed=2), UoroSum(4, 9, seed=2)
    many.add_many(dz, a)
    for i in range(7):
        one.add(dz[i], a[i])
    np.testing.assert_array_equal(one.estimate(), many.estimate())
    with pytest.raises(ValueError, match="a must have 9 values per pair"):
        many.add_many(dz, a[:, :3])
    with pytest.raises(ValueError, match="NaN"):
        many.add(np.full(4, np.nan), a[0])
    with pytest.raises(ValueError, match="n_out"):
        UoroSum(0, 3)


# --------------------------------------------------------------------------- max-norm bank

def test_max_norm_bank_matches_one_max_norm_per_row():
    rng = np.random.default_rng(8)
    bank = _MaxNormBank(3)
    singles = [MaxNorm() for _ in range(3)]
    for step in range(200):
        x = rng.standard_normal((3, 4, 5)) * np.array([1.0, 1e-3, 10.0 ** (step % 7 - 3)])[:, None, None]
        out = bank(x)
        for c in range(3):
            np.testing.assert_allclose(out[c], singles[c](x[c]), rtol=1e-12)


# --------------------------------------------------------------------------- a tiny run

def test_result_structure_and_consistency(tiny):
    result, _ = tiny
    json.dumps(result)                                 # JSON-ready
    rows = result["table"]
    # SGD: one row per lr; UORO: rank 1; SVD and LRT: every rank.
    assert len(rows) == 2 * (1 + 1 + 2 + 2)
    assert {(r["algorithm"], r["rank"]) for r in rows} == {
        ("SGD", None), ("UORO", 1), ("SVD", 1), ("SVD", 2), ("LRT", 1), ("LRT", 2)}
    for r in rows:
        assert set(r) >= {"algorithm", "rank", "lr", "recovery_mean", "recovery_std", "max_writes_per_cell"}
        # Recovery is the online accuracy minus the damaged layer's on the same (last) samples.
        assert r["recovery_mean"] == pytest.approx(r["final_accuracy_mean"] - result["inference_window_accuracy"])
        assert r["recovery_std"] >= 0
        # A batch algorithm writes a cell at most once per update; SGD at most once per sample.
        limit = result["samples"] if r["algorithm"] == "SGD" else result["samples"] // result["batch"]
        assert 0 <= r["max_writes_per_cell"] <= limit
    assert result["samples"] == 300 and result["seeds"] == [0, 1] and result["window"] == 60
    assert 0 < result["inference_accuracy"] < result["pretrained_accuracy"] <= 1
    # The damage is calibrated to the paper's ratio (52.7 / 73) of the pre-trained accuracy.
    assert result["inference_accuracy"] == pytest.approx(result["pretrained_accuracy"] * 52.7 / 73, abs=0.03)
    for algo, best in result["best"].items():
        assert best["recovery_mean"] == max(r["recovery_mean"] for r in rows if r["algorithm"] == algo)
    assert set(result["best"]) == set(ALGORITHMS)


def test_sgd_with_a_tiny_learning_rate_writes_nothing(tiny):
    result, _ = tiny
    sgd = {r["lr"]: r for r in result["table"] if r["algorithm"] == "SGD"}
    # A max-normed update is at most lr = 0.003 < half an LSB (2**-8): every update rounds to 0.
    assert 0.003 < LRT_WEIGHT.lsb / 2
    assert sgd[0.003]["max_writes_per_cell"] == 0
    # ... while a large one does write, and the batch algorithms accumulate below the LSB.
    assert sgd[0.1]["max_writes_per_cell"] > 0
    lrt = [r for r in result["table"] if r["algorithm"] == "LRT" and r["lr"] == 0.003]
    assert all(r["max_writes_per_cell"] > 0 for r in lrt)


def test_progress_adds_up_and_the_run_is_deterministic(tiny):
    result, calls = tiny
    assert sum(calls) == progress_total(300, (0, 1), 800, 2)
    again = run_transfer(ranks=(1, 2), lrs=(0.003, 0.1), seeds=(0, 1), **TINY)
    strip = lambda r: {k: v for k, v in r.items() if k not in ("seconds", "pretrain")}
    assert strip(again) == strip(result)


def test_format_table_marks_the_best_lr_of_each_row(tiny):
    result, _ = tiny
    text = format_table(result)
    lines = text.splitlines()
    assert "0.003" in lines[2] and "0.100" in lines[2]
    table_rows = lines[4:4 + 6]
    assert [line.split()[0] for line in table_rows if line.split()[0] in ALGORITHMS] == list(ALGORITHMS)
    assert all(line.count("*") == 1 for line in table_rows)
    assert "Max writes per weight cell" in text


def test_a_subset_of_algorithms():
    result = run_transfer(ranks=(2,), lrs=(0.01,), seeds=(3,), algorithms=("LRT",), **TINY)
    assert [(r["algorithm"], r["rank"]) for r in result["table"]] == [("LRT", 2)]
    assert result["table"][0]["recovery_std"] == 0.0              # one seed


# --------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("kwargs,name", [
    (dict(ranks=(0,)), "ranks"),
    (dict(ranks=()), "ranks"),
    (dict(ranks=(600,)), "ranks"),
    (dict(ranks=(1.5,)), "ranks"),
    (dict(lrs=(0.0,)), "lrs"),
    (dict(lrs=(-0.1,)), "lrs"),
    (dict(lrs=()), "lrs"),
    (dict(lrs=(float("nan"),)), "lrs"),
    (dict(seeds=()), "seeds"),
    (dict(seeds=(1, 1)), "seeds"),
    (dict(samples=99), "samples"),
    (dict(batch=0), "batch"),
    (dict(algorithms=("ADAM",)), "algorithms"),
    (dict(damage_ratio=1.5), "damage_ratio"),
    (dict(samples=2000), "samples"),                    # digits has 1437 training images
])
def test_bad_arguments_name_the_argument(kwargs, name):
    args = {**TINY, **kwargs}
    with pytest.raises(ValueError, match=name):
        run_transfer(**args)


def test_rank_must_be_below_the_class_count():
    # digits has 10 classes: KroneckerSum needs rank < min(10, 512); refused before pre-training.
    with pytest.raises(ArgumentError, match="ranks must be < 10"):
        run_transfer(ranks=(10,), **TINY)

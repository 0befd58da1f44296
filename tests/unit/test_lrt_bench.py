"""The LRT vs dense accumulation micro-benchmark (insitu.lrt.bench): fields, consistency, bad input.

Timings are never asserted (they depend on the machine and its load); only their bookkeeping is.
"""

import json

import pytest

from insitu.lrt.bench import format_bench, run_bench

pytestmark = pytest.mark.unit


@pytest.fixture(scope="module")
def tiny():
    calls = []
    result = run_bench(sizes=(8, 24), rank=2, pairs=6, seed=1, progress=calls.append, repeats=2)
    return result, calls


def test_rows_have_every_field_and_consistent_figures(tiny):
    result, calls = tiny
    json.dumps(result)
    assert sum(calls) == 2
    assert [r["n"] for r in result["rows"]] == [8, 24]
    for r in result["rows"]:
        n = r["n"]
        assert r["m"] == n and r["rank"] == 2
        for key in ("lrt_us", "lrt_many_us", "dense_us"):
            assert r[key] > 0
        assert r["speedup"] == pytest.approx(r["dense_us"] / r["lrt_us"])
        assert r["speedup_many"] == pytest.approx(r["dense_us"] / r["lrt_many_us"])
        # The dense baseline is the fastest of the NumPy candidates, and it is named.
        assert r["dense_us"] == min(r["dense_methods_us"].values())
        assert r["dense_methods_us"][r["dense_method"]] == r["dense_us"]
        assert len(r["dense_methods_us"]) >= 3
        assert r["aux_memory_bits"] == 2 * (n + n) * 16
        assert r["dense_memory_bits"] == n * n * 16
        assert r["memory_ratio"] == pytest.approx(r["dense_memory_bits"] / r["aux_memory_bits"])
        if r["dense_dger_us"] is not None:
            assert r["speedup_vs_dger"] == pytest.approx(r["dense_dger_us"] / r["lrt_us"])
    assert result["pairs"] == 6 and result["repeats"] == 2 and result["accumulator_bits"] == 16


def test_format_bench_has_one_line_per_size(tiny):
    result, _ = tiny
    lines = format_bench(result).splitlines()
    assert "speedup" in lines[1]
    assert [line.split()[0] for line in lines[3:5]] == ["8", "24"]


@pytest.mark.parametrize("kwargs,name", [
    (dict(sizes=()), "sizes"),
    (dict(sizes=(8, 1)), "sizes"),
    (dict(sizes=(4,), rank=4), "sizes"),
    (dict(sizes=5), "sizes"),
    (dict(rank=0), "rank"),
    (dict(pairs=0), "pairs"),
    (dict(repeats=0), "repeats"),
    (dict(seed=-1), "seed"),
])
def test_bad_arguments_name_the_argument(kwargs, name):
    args = {"sizes": (8,), "pairs": 2, "repeats": 1, **kwargs}
    with pytest.raises(ValueError, match=name):
        run_bench(**args)

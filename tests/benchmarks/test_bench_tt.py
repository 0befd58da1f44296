"""Benchmarks (print figures, assert nothing about speed or accuracy): TT executor throughput and
the paper's Table 1 on FashionMNIST.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_tt.py
"""

import json
import os

import pytest

from insitu.data import dataset_info
from insitu.errors import InsituError
from insitu.tt.bench import format_bench, run_bench
from insitu.tt.report import format_table
from insitu.tt.experiment import VARIANTS, TTTrainConfig, run_tt_training

pytestmark = pytest.mark.benchmark


def test_executor_throughput():
    result = run_bench()
    print()
    print(format_bench(result))
    print(f"bench: {result['seconds']} s")
    assert [r["variant"] for r in result["rows"]] == ["dense", "float", "fixed"]


def test_table1():
    """All five variants; epochs from INSITU_TT_EPOCHS (default 10)."""
    try:
        dataset_info("fashion-mnist")
    except InsituError as exc:
        pytest.skip(f"FashionMNIST not available: {exc}")
    epochs = int(os.environ.get("INSITU_TT_EPOCHS", "10"))
    results = [run_tt_training(TTTrainConfig(variant=v, epochs=epochs)) for v in VARIANTS]
    print()
    print(format_table(results))
    print(json.dumps([{k: r[k] for k in ("variant", "test_accuracy", "memory_reduction", "ranks",
                                         "seconds")} for r in results]))
    assert len(results) == len(VARIANTS)

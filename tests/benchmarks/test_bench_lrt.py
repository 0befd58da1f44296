"""Benchmarks (print figures, assert nothing about speed or accuracy): LRT vs dense accumulation
cost, and the LRT paper's Table 1 (transfer learning, algorithm comparison) at FashionMNIST scale.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_lrt.py
"""

import json
import time

import pytest

from insitu.data import dataset_info
from insitu.errors import InsituError
from insitu.lrt.bench import format_bench, run_bench
from insitu.lrt.transfer import format_table, run_transfer

pytestmark = pytest.mark.benchmark


def test_lrt_vs_dense_accumulation():
    result = run_bench()
    print()
    print(format_bench(result))
    print(f"bench: {result['seconds']} s")
    assert [r["n"] for r in result["rows"]] == [256, 512, 1024, 2048]


def test_transfer_table():
    try:
        dataset_info("fashion-mnist")
    except InsituError as exc:  # the dataset is a system package; say so rather than fail obscurely
        pytest.skip(f"FashionMNIST not available: {exc}")
    started = time.perf_counter()
    result = run_transfer()
    print()
    print(format_table(result))
    print(json.dumps({k: result[k] for k in ("pretrained_accuracy", "inference_accuracy",
                                              "inference_accuracy_std", "damage_sigma", "pretrain")}))
    print(f"transfer: {time.perf_counter() - started:.1f} s")
    assert len(result["table"]) == 5 * (1 + 1 + 4 + 4)

"""Benchmark (prints figures): the E²-Train experiment — ResNet-14 on 14x14 FashionMNIST, 32-bit
SGD vs SMD, SLU, PSG and all three (the paper's Tables 2-3, Fig. 4), and whether all three reach
the target (energy saving >= 80 % vs 32-bit SGD at <= 2 points accuracy loss).

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_e2train.py
(E2TRAIN_EPOCHS overrides the epochs; the rows land in E2TRAIN_OUT, default a temp folder.)
"""

import json
import os
import time
from pathlib import Path

import pytest

from insitu.data import dataset_info
from insitu.e2train.trainer import ABLATION_ROWS, E2Config, run_experiment
from insitu.errors import InsituError

pytestmark = pytest.mark.benchmark


def test_e2train_ablation(tmp_path):
    try:
        dataset_info("fashion-mnist")
    except InsituError as exc:
        pytest.skip(f"FashionMNIST not available: {exc}")
    config = E2Config(epochs=int(os.environ.get("E2TRAIN_EPOCHS", E2Config.epochs)))
    out = Path(os.environ.get("E2TRAIN_OUT", tmp_path))
    started = time.perf_counter()
    summary = run_experiment(config, list(ABLATION_ROWS), out)
    print()
    print(f"{'row':<12} {'acc %':>6} {'loss':>6} {'comp.sav':>8} {'energy.sav':>10} {'energy J':>9} "
          f"{'PSG pred':>8} {'SLU skip':>8} {'train s':>7}")
    for r in summary["rows"]:
        print(f"{r['row']:<12} {100 * r['accuracy']:6.2f} {100 * r['accuracy_loss']:+6.2f} "
              f"{100 * r['computational_saving']:7.1f}% {100 * r['energy_saving']:9.1f}% {r['energy_j']:9.4f} "
              f"{r['psg_predicted_fraction'] or 0:8.2f} {r['slu_skip_ratio'] or 0:8.2f} {r['train_seconds']:7.0f}")
    e2 = summary["rows"][-1]
    met = e2["energy_saving"] >= 0.8 and e2["accuracy_loss"] <= 0.02
    print(json.dumps({"config": summary["config"], "target_met": met}))
    print(f"e2train ablation: {time.perf_counter() - started:.0f} s")
    assert e2["row"] == "smd+slu+psg"

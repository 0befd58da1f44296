"""Benchmark (prints figures): the E²-Train experiment — ResNet-14 on 14x14 FashionMNIST, 32-bit
SGD vs SMD, SLU, PSG and all three (the paper's Tables 2-3, Fig. 4) over several seeds, and
whether all three reach the target (energy saving >= 80 % vs 32-bit SGD at <= 2 points accuracy
loss), per seed and on the mean.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_e2train.py
Environment: E2TRAIN_SEEDS (default "0,1,2"; one process per seed, as many at once as CPUs),
E2TRAIN_EPOCHS (default the CLI's 6), E2TRAIN_OUT (rows, e2train-seed<S>.json and the figure
of the first seed; default a temporary folder). About 8 minutes a seed on one core.
"""

import json
import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from insitu.data import dataset_info
from insitu.e2train.plot import plot_experiment
from insitu.e2train.experiment import ABLATION_ROWS, E2Config, run_experiment
from insitu.errors import InsituError
from insitu.io import atomic_write_json

pytestmark = pytest.mark.benchmark


def _one_seed(seed: int, epochs: int, out: str) -> dict:
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        return run_experiment(E2Config(epochs=epochs, seed=seed), list(ABLATION_ROWS), Path(out))


def test_e2train_ablation(tmp_path):
    try:
        dataset_info("fashion-mnist")
    except InsituError as exc:
        pytest.skip(f"FashionMNIST not available: {exc}")
    seeds = [int(s) for s in os.environ.get("E2TRAIN_SEEDS", "0,1,2").split(",")]
    epochs = int(os.environ.get("E2TRAIN_EPOCHS", E2Config.epochs))
    out = Path(os.environ.get("E2TRAIN_OUT", tmp_path))
    started = time.perf_counter()
    workers = min(len(seeds), os.cpu_count() or 1)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        summaries = dict(zip(seeds, pool.map(_one_seed, seeds, [epochs] * len(seeds), [str(out)] * len(seeds))))
    for seed, summary in summaries.items():
        atomic_write_json(out / f"e2train-seed{seed}.json", summary)
    plot_experiment(summaries[seeds[0]], out / "e2train.png")

    print()
    header = (f"{'seed':>4} {'row':<12} {'acc %':>6} {'loss':>6} {'comp.sav':>8} {'energy.sav':>10} "
              f"{'energy J':>9} {'PSG pred':>8} {'SLU skip':>8} {'epochs':>6} {'train s':>7}")
    print(header)
    for seed, summary in summaries.items():
        for r in summary["rows"]:
            print(f"{seed:>4} {r['row']:<12} {100 * r['accuracy']:6.2f} {100 * r['accuracy_loss']:+6.2f} "
                  f"{100 * r['computational_saving']:7.1f}% {100 * r['energy_saving']:9.1f}% "
                  f"{r['energy_j']:9.4f} {r['psg_predicted_fraction'] or 0:8.2f} "
                  f"{r['slu_skip_ratio'] or 0:8.2f} {r['epochs']:>6} {r['train_seconds']:7.0f}")
    print(f"mean ± std over seeds {seeds}:")
    means = {}
    for name in [r["row"] for r in summaries[seeds[0]]["rows"]]:
        rows = [next(r for r in s["rows"] if r["row"] == name) for s in summaries.values()]
        stats = {k: (float(np.mean([r[k] for r in rows])), float(np.std([r[k] for r in rows])))
                 for k in ("accuracy", "accuracy_loss", "computational_saving", "energy_saving")}
        means[name] = stats
        print(f"     {name:<12} " + "  ".join(f"{k} {100 * m:.2f} ± {100 * s:.2f}" for k, (m, s) in stats.items()))
    e2 = means["smd+slu+psg"]
    per_seed = {seed: next(r for r in s["rows"] if r["row"] == "smd+slu+psg") for seed, s in summaries.items()}
    met = {seed: r["energy_saving"] >= 0.8 and r["accuracy_loss"] <= 0.02 for seed, r in per_seed.items()}
    met_mean = e2["energy_saving"][0] >= 0.8 and e2["accuracy_loss"][0] <= 0.02
    print(json.dumps({"epochs": epochs, "seeds": seeds, "target_met_per_seed": met, "target_met_on_mean": met_mean}))
    print(f"e2train ablation: {time.perf_counter() - started:.0f} s with {workers} processes; figure "
          f"{out / 'e2train.png'}")
    assert set(per_seed) == set(seeds)

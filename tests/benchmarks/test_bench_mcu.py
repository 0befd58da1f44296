"""Benchmark (prints figures, asserts nothing about accuracy): tiny-training Figure 9 and 10(a) on
the MCU path, mbv2-28 on digits. At three memory budgets the classifier alone, bias-only, the last
k layers and the searched sparse scheme are trained on the same samples; the full update's peak
memory (without and with reordering) is set against each searched scheme's, planned and measured
on the twin (the smallest heap each program trains in). The target: the searched scheme's peak
at least 7x below the full update's (no reordering), each measured.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_mcu.py

Writes docs/results/mcu/fig9-mbv2-28-digits.{json,png,txt}. The contribution analysis of the
search is cached (minutes the first time, under ~/.cache/insitu/mcu/contributions). The default
rates and data are docs/mcu.md's adapt setting (test_bench_mcu_int8.py): a backbone lr of 0.01,
the classifier 5x that, the whole training split EPOCHS times (the harness's stream: a fresh
permutation per epoch). Settings by environment variable (a quick check:
INSITU_MCU_BENCH_SAMPLES=20 INSITU_MCU_BENCH_OUT=/tmp/mcu):

  INSITU_MCU_BENCH_EPOCHS        epochs of the training split (EPOCHS)
  INSITU_MCU_BENCH_SAMPLES       training samples of every scheme and of the analysis
                                 (default: the task's training split x EPOCHS)
  INSITU_MCU_BENCH_LR            learning rate of every layer but the classifier (0.01)
  INSITU_MCU_BENCH_HEAD          the classifier's lr factor (5; 1: one rate for every layer)
  INSITU_MCU_BENCH_EVAL_SAMPLES  test samples (default: the task's, at most 500)
  INSITU_MCU_BENCH_SEEDS         the sample orders every scheme trains in (0,1,2: the searches and
                                 the table at seed 0's, the means over all of them below it)
  INSITU_MCU_BENCH_BUDGETS       budgets of the planned arena (32K,48K,64K)
  INSITU_MCU_BENCH_EVALUATIONS   schemes each search samples per budget (2000)
  INSITU_MCU_BENCH_MODEL, INSITU_MCU_BENCH_TASK   (mbv2-28, digits)
  INSITU_MCU_BENCH_OUT           the folder of the results (docs/results/mcu)
"""

import json
import os
import time
from pathlib import Path

import pytest

from insitu.io import atomic_write, atomic_write_json
from insitu.mcu.compare import METHODS, format_text, plot_compare, run_compare
from insitu.mcu.board_runs import Prepared
from insitu.sparse.contributions import Bundle
from insitu.sparse.models import model_config
from insitu.sparse.tasks import load_task
from insitu.training import sample_order

pytestmark = pytest.mark.benchmark

ROOT = Path(__file__).resolve().parents[2]
#: Epochs of the training split by default: 3, as the int8 benchmark's adapt setting trains (about
#: 3x the analysis and training time of one epoch).
EPOCHS = 3


def _search_bundle(model: str, task: str, lr: float, seed: int) -> Bundle:
    return Bundle.from_prepared(Prepared(model, task, "classifier", lr, seed), lr, sample_order)


def _env_int(name: str, default):
    value = os.environ.get(name)
    return int(value) if value else default


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name)
    return float(value) if value else default


def test_fig9_sparse_update_vs_baselines_at_equal_memory():
    model = os.environ.get("INSITU_MCU_BENCH_MODEL", "mbv2-28")
    task = os.environ.get("INSITU_MCU_BENCH_TASK", "digits")
    budgets = os.environ.get("INSITU_MCU_BENCH_BUDGETS", "32K,48K,64K")
    out = Path(os.environ.get("INSITU_MCU_BENCH_OUT") or ROOT / "docs" / "results" / "mcu")
    n_train = len(load_task(task, model_config(model).input_size)[1])
    samples = _env_int("INSITU_MCU_BENCH_SAMPLES", n_train * _env_int("INSITU_MCU_BENCH_EPOCHS", EPOCHS))
    lr, head = _env_float("INSITU_MCU_BENCH_LR", 0.01), _env_float("INSITU_MCU_BENCH_HEAD", 5.0)
    started = time.perf_counter()
    print()
    print(f"{model} on {task}: {samples} training samples ({samples / n_train:g} epochs of {n_train}), "
          f"lr {lr:g}, classifier {head:g}x", flush=True)
    result = run_compare(model, task, budgets, prepare=_search_bundle, train_samples=samples,
                         eval_samples=_env_int("INSITU_MCU_BENCH_EVAL_SAMPLES", None), lr=lr, seed=0,
                         evaluations=_env_int("INSITU_MCU_BENCH_EVALUATIONS", 2000),
                         workers=max(1, os.cpu_count() or 1), measure_heap=True, board_time=True,
                         lr_scale={"classifier": head} if head != 1 else None,
                         sample_seeds=[int(v) for v in os.environ.get("INSITU_MCU_BENCH_SEEDS", "0,1,2").split(",")],
                         say=lambda msg: print(f"[{time.perf_counter() - started:7.1f} s] {msg}", flush=True))
    text = format_text(result)
    print(text)
    stem = out / f"fig9-{model}-{task}"
    atomic_write_json(stem.with_suffix(".json"), result)
    atomic_write(stem.with_suffix(".txt"), text)
    plot_compare(result, stem.with_suffix(".png"))
    summary = [{"budget_bytes": r["budget_bytes"],
                **{kind: (r["methods"][kind]["accuracy"], r["methods"][kind]["arena_bytes"]) for kind, _ in METHODS}}
               for r in result["rows"]]
    print(json.dumps(summary))
    for r in result["memory"]["rows"]:
        if r["kind"] == "sparse":
            print(f"{r['name']}: full (no reorder) / sparse = {r['ratio_planned_vs_full_no_reorder']:.1f}x planned, "
                  f"{r['ratio_measured_vs_full_no_reorder']:.1f}x measured "
                  f"(target {result['memory']['target_ratio']:g}x: {'met' if r['target_met'] else 'NOT met'})")
    print(f"written: {stem}.{{json,txt,png}}; {time.perf_counter() - started:.0f} s")
    assert len(result["rows"]) == len(result["budgets"])

"""Benchmark (prints figures, asserts nothing about accuracy): does the scheme search's pick train
well? At several budgets and seeds, `insitu mcu search`'s evolutionary and random searches (5000
evaluations each) on mbv2-28 adapted to digits, every search's shortlist of KEEP candidates
validated by short training (:func:`insitu.sparse.search.validate_candidates`: 500 samples at
the MCU commands' default rates, lr 0.01 with the classifier at 5x, scored on the test split, as
the contribution analysis trains a configuration), the
candidate that trains best picked. Both searches get the same validation budget; random search's
plain pick (its best-predicted scheme, trained) is reported beside it.

The contribution analysis (and the new head it trains) is seed 0's from the cache
(~/.cache/insitu/mcu/contributions; a fresh one costs ~450 s on 2 workers); the seed changes the
searches' draws and the validation training's sample order.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_mcu_search.py

Writes docs/results/mcu/search-trained.{txt,json} (after every cell). Settings by environment variable:

  INSITU_MCU_SEARCH_BUDGETS       budgets (32K,64K,128K)
  INSITU_MCU_SEARCH_SEEDS         seeds (0,1,2)
  INSITU_MCU_SEARCH_KEEP          candidates validated per search (8)
  INSITU_MCU_SEARCH_MIN_DISTANCE  genes the candidates differ in pairwise (4)
  INSITU_MCU_SEARCH_EVALUATIONS   schemes each search samples (5000)
  INSITU_MCU_SEARCH_OUT           the folder of the results (docs/results/mcu)
"""

import json
import os
import time
from pathlib import Path

import pytest

from insitu.checks import parse_size
from insitu.io import atomic_write, atomic_write_json
from insitu.mcu.board_runs import default_lr_scale
from insitu.sparse import DEFAULT_LR
from insitu.sparse.search import run_search

pytestmark = pytest.mark.benchmark

ROOT = Path(__file__).resolve().parents[2]
COMMAND = ("OMP_NUM_THREADS=1 .venv/bin/python -m pytest -m benchmark -s "
           "tests/benchmarks/test_bench_mcu_search.py")


def _env(name, default):
    return os.environ.get(f"INSITU_MCU_SEARCH_{name}", default)


def table(cells, settings) -> str:
    lines = [f"# {COMMAND}",
             f"# {json.dumps(settings)}",
             f"# mbv2-28 -> digits; trained: accuracy after 500 samples at lr {settings['lr']:g} "
             f"(per-layer factors {settings['lr_scale']}) on the 359 test samples;",
             "# Σ: eq. 5's predicted gain (points over the classifier alone, "
             f"{100 * cells[0]['reference_accuracy']:.1f} %) of the pick" if cells else "",
             "budget  seed | evo: pick trained  Σ pred  (best-pred trained  Σ) | rnd: pick trained  Σ pred "
             "| rnd plain: trained  Σ | evo >= rnd (validated) | evo >= rnd (plain)"]
    for c in cells:
        e, r = c["evolutionary"], c["random"]
        lines.append(f"{c['budget']:>6} {c['seed']:>5} | {100 * e['accuracy']:14.1f} % {100 * e['objective']:+7.1f} "
                     f"({100 * e['plain']['accuracy']:14.1f} % {100 * e['plain']['objective']:+5.1f}) "
                     f"| {100 * r['accuracy']:14.1f} % {100 * r['objective']:+7.1f} "
                     f"| {100 * r['plain']['accuracy']:15.1f} % {100 * r['plain']['objective']:+5.1f} "
                     f"| {'yes' if e['accuracy'] >= r['accuracy'] else 'NO':>22} "
                     f"| {'yes' if e['accuracy'] >= r['plain']['accuracy'] else 'NO':>18}")
    if cells:
        n = len(cells)
        won = sum(c["evolutionary"]["accuracy"] >= c["random"]["accuracy"] for c in cells)
        won_plain = sum(c["evolutionary"]["accuracy"] >= c["random"]["plain"]["accuracy"] for c in cells)
        mean = lambda f: 100 * sum(f(c) for c in cells) / n
        lines.append(f"evo >= rnd: {won}/{n} cells vs validated random, {won_plain}/{n} vs random's plain pick; "
                     f"means: evo {mean(lambda c: c['evolutionary']['accuracy']):.1f} %, "
                     f"rnd validated {mean(lambda c: c['random']['accuracy']):.1f} %, "
                     f"rnd plain {mean(lambda c: c['random']['plain']['accuracy']):.1f} %, "
                     f"evo best-predicted {mean(lambda c: c['evolutionary']['plain']['accuracy']):.1f} %")
        lines.append("")
        lines.append("candidates (predicted = classifier alone + Σ; trained), the pick marked *:")
        for c in cells:
            for name in ("evolutionary", "random"):
                v = c[name]
                lines.append(f"{c['budget']} seed {c['seed']} {name}:")
                for i, row in enumerate(v["candidates"]):
                    lines.append(f"  {'*' if i == v['pick'] else ' '} predicted {100 * row['predicted']:6.1f} %  "
                                 f"trained {100 * row['accuracy']:5.1f} %  {row['memory_bytes']:>7,} B  "
                                 f"{row['scheme_text']}")
    return "\n".join(lines) + "\n"


def test_search_picks_trained():
    from insitu.cli.mcu import _search_bundle

    budgets = [b.strip() for b in _env("BUDGETS", "32K,64K,128K").split(",")]
    seeds = [int(s) for s in _env("SEEDS", "0,1,2").split(",")]
    keep, min_distance = int(_env("KEEP", "8")), int(_env("MIN_DISTANCE", "4"))
    evaluations = int(_env("EVALUATIONS", "5000"))
    out = ROOT / _env("OUT", "docs/results/mcu")
    lr_scale = default_lr_scale("mbv2-28")
    settings = {"model": "mbv2-28", "task": "digits", "budgets": budgets, "seeds": seeds, "keep": keep,
                "min_distance": min_distance, "evaluations": evaluations, "train_samples": 500, "lr": DEFAULT_LR,
                "lr_scale": lr_scale, "analysis_seed": 0}
    cells = []
    started = time.perf_counter()
    for seed in seeds:
        for budget in budgets:
            t0 = time.perf_counter()
            r = run_search("mbv2-28", "digits", parse_size(budget), prepare=_search_bundle, evaluations=evaluations,
                           train_samples=500, lr=DEFAULT_LR, lr_scale=lr_scale, seed=seed, workers=1, keep=keep,
                           min_distance=min_distance, analysis_seed=0)
            assert r["contributions"]["cached"] or seed == 0, "the analysis should come from the cache"
            cell = {"budget": budget, "seed": seed, "reference_accuracy": r["contributions"]["reference_accuracy"],
                    "seconds": time.perf_counter() - t0, **r["validation"]}
            for name in ("evolutionary", "random"):
                cell[name]["search_objective"] = r["searches"][name]["objective"]
            cells.append(cell)
            text = table(cells, settings)
            print(text.splitlines()[4 + len(cells)], f"({cell['seconds']:.0f} s)", flush=True)
            atomic_write(out / "search-trained.txt", text + f"# {time.perf_counter() - started:.0f} s in all\n")
            atomic_write_json(out / "search-trained.json", {"settings": settings, "cells": cells})
    print(table(cells, settings))

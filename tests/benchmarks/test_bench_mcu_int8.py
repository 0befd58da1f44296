"""Benchmark (prints figures, asserts nothing about accuracy): int8 training with QAS on the host
simulator (bit-exact with the device) against float SGD on the dequantized graph
(:class:`insitu.sparse.reference.FloatReference`), for the same scheme, samples, order, learning
rates and seeds: the classifier, last-3, the 64 KiB searched scheme of docs/mcu.md and the full
update, mbv2-28 pre-trained on FashionMNIST, adapted to digits.

Two settings:

* ``adapt``: the whole digits training split (1438 samples), EPOCHS epochs (the harness's
  stream: a fresh permutation per epoch), lr LR, the classifier's rate HEAD times LR;
  scored on the whole test split (359);
* ``fig9``: docs/mcu.md's Figure 9 setting, 500 samples, lr 0.05 for every layer.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_mcu_int8.py

Writes docs/results/mcu/int8-vs-float.{txt,json}. Settings by environment variable:

  INSITU_MCU_INT8_SEEDS    seeds (0,1,2)
  INSITU_MCU_INT8_EPOCHS   epochs of the adapt setting (3)
  INSITU_MCU_INT8_LR       backbone lr of the adapt setting (0.01)
  INSITU_MCU_INT8_HEAD     the classifier's lr factor in the adapt setting (5)
  INSITU_MCU_INT8_SETTINGS which settings to run (adapt,fig9)
  INSITU_MCU_INT8_OUT      the folder of the results (docs/results/mcu)
"""

import json
import os
import time
from pathlib import Path

import numpy as np
import pytest

from insitu.harness import sample_order
from insitu.io import atomic_write, atomic_write_json
from insitu.mcu.board_runs import Prepared
from insitu.sparse.compiler import Options, compile_training
from insitu.sparse.reference import FloatReference
from insitu.sparse.scheme import preset
from insitu.sparse.simulate import Simulator

pytestmark = pytest.mark.benchmark

ROOT = Path(__file__).resolve().parents[2]
SCHEMES = {
    "classifier": "classifier",
    "last-3": "last-3",
    "searched 64 KiB": json.dumps({"bias_k": 6, "weights": {"classifier": 1.0, "b6.project": 0.25,
                                                            "b7.expand": 0.5, "b7.project": 0.25}}),
    "full": "full",
}


def run(model, task, seeds, samples_of, lr, lr_scale, say) -> dict:
    rows = {name: {"int8": [], "float": []} for name in SCHEMES}
    for seed in seeds:
        prep = Prepared(model, task, "classifier", lr, seed)
        n = samples_of(len(prep.y_train))
        order = sample_order(len(prep.y_train), seed, 0, n)
        x, y = prep.x_train[order], prep.y_train[order]
        for name, text in SCHEMES.items():
            scheme = preset(prep.graph, text)
            started = time.perf_counter()
            sim = Simulator(compile_training(prep.graph, scheme, prep.grad_scales, Options(lr=lr, lr_scale=lr_scale)))
            sim.train(x, y)
            a8 = sim.accuracy(prep.x_test, prep.y_test)
            mid = time.perf_counter()
            ref = FloatReference(prep.graph, scheme, lr, lr_scale=lr_scale)
            ref.train(x, y)
            af = ref.accuracy(prep.x_test, prep.y_test)
            rows[name]["int8"].append(float(a8))
            rows[name]["float"].append(float(af))
            say(f"seed {seed} {name:16s} int8 {100 * a8:5.1f} %  float {100 * af:5.1f} %  "
                f"({mid - started:.0f} s + {time.perf_counter() - mid:.0f} s, {n} samples)")
    return {"samples": n, "lr": lr, "lr_scale": lr_scale, "seeds": list(seeds), "rows": rows}


def table(title: str, result: dict) -> str:
    seeds = result["seeds"]
    head = " | ".join(f"s{s}" for s in seeds)
    lines = [title, "",
             f"| scheme | int8: {head} | int8 mean | float: {head} | float mean | int8 - float |",
             "|---" * (2 * len(seeds) + 4) + "|"]
    for name, r in result["rows"].items():
        i8, fl = np.array(r["int8"]) * 100, np.array(r["float"]) * 100
        lines.append(f"| {name} | {' | '.join(f'{v:.1f}' for v in i8)} | **{i8.mean():.1f}** | "
                     f"{' | '.join(f'{v:.1f}' for v in fl)} | **{fl.mean():.1f}** | {i8.mean() - fl.mean():+.1f} |")
    return "\n".join(lines) + "\n"


def test_int8_qas_vs_float_sgd_on_the_dequantized_graph():
    seeds = [int(s) for s in os.environ.get("INSITU_MCU_INT8_SEEDS", "0,1,2").split(",")]
    epochs = int(os.environ.get("INSITU_MCU_INT8_EPOCHS", "3"))
    lr = float(os.environ.get("INSITU_MCU_INT8_LR", "0.01"))
    head = float(os.environ.get("INSITU_MCU_INT8_HEAD", "5"))
    settings = os.environ.get("INSITU_MCU_INT8_SETTINGS", "adapt,fig9").split(",")
    out = Path(os.environ.get("INSITU_MCU_INT8_OUT") or ROOT / "docs" / "results" / "mcu")
    started = time.perf_counter()

    def say(msg):
        print(f"[{time.perf_counter() - started:7.1f} s] {msg}", flush=True)

    print()
    results, text = {}, []
    if "adapt" in settings:
        r = run("mbv2-28", "digits", seeds, lambda n: epochs * n, lr, {"classifier": head}, say)
        results["adapt"] = r
        text.append(table(f"mbv2-28 -> digits, whole training split x {epochs} epochs ({r['samples']} samples), "
                          f"batch 1, lr {lr:g} (classifier {head:g} x), test split (359); accuracy %", r))
    if "fig9" in settings:
        r = run("mbv2-28", "digits", seeds, lambda n: 500, 0.05, {}, say)
        results["fig9"] = r
        text.append(table("Figure 9 setting: mbv2-28 -> digits, 500 samples, batch 1, lr 0.05 for every layer, "
                          "test split (359); accuracy %", r))
    body = "\n".join(text)
    command = ".venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_mcu_int8.py"
    print(body)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "int8-vs-float.txt",
                 f"# {command}\n# (OMP/OPENBLAS/MKL/NUMBA_NUM_THREADS=1; {time.perf_counter() - started:.0f} s)\n\n{body}")
    atomic_write_json(out / "int8-vs-float.json", {"command": command, **results})
    assert results

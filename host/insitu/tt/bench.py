"""Throughput of the TT executors and the PE work per sample (`insitu tt bench`).

:func:`run_bench` measures, in this process, training steps of the paper's network on a fixed
batch of FashionMNIST-sized random inputs:

* ``float``: the schedule run by the float executor (float64 factors);
* ``fixed``: the schedule run by the fixed-point golden model (4-bit factors, 16-bit data, spec
  rounding) plus BinaryConnect on the processor;
* ``dense``: the vanilla 896-512-16 float network on the NumPy core, the baseline of the ratios.

Each figure is the median over ``repeats`` timed passes of ``steps`` steps, after one untimed warm-up
step. MACs come from the schedule: per sample, forward plus backward of both layers, with the
batch-level factor-gradient ops divided by the batch size; padding along ``c`` is included.
"""

from __future__ import annotations

import platform
import statistics
import time
from typing import cast

import numpy as np

from .schedule import layer_schedule, macs_by_kind
from .experiment import CLASSES, Model, TTTrainConfig
from .model import TTNet


def schedule_macs(model: Model, batch: int) -> dict:
    """MACs per sample by PE kind for one training step of the model's TT layers."""
    totals = {"PE1": 0, "PE2": 0, "PE3": 0}
    for k, ttm in enumerate(cast(TTNet, model.net).ttms):          # (a tensorized model)
        ops = layer_schedule(ttm.in_modes, ttm.out_modes, ttm.ranks, batch, input_grad=k > 0)
        for kind, macs in macs_by_kind(ops).items():
            totals[kind] += macs
    per_sample = {kind: macs / batch for kind, macs in totals.items()}
    per_sample["total"] = sum(per_sample.values())
    return per_sample


def run_bench(batch: int = 64, steps: int = 5, repeats: int = 3, rank: int = 16, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    x = rng.random((batch, 896))
    y = rng.integers(0, CLASSES, batch)
    rows, started = [], time.perf_counter()
    for variant in ("dense", "float", "fixed"):
        model = Model(TTTrainConfig(variant=variant, rank=rank, batch_size=batch, seed=seed), 60_000)
        model.step(x, y)                                     # warm-up: scales, caches
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(steps):
                model.step(x, y)
            times.append((time.perf_counter() - t0) / steps)
        step_s = statistics.median(times)
        row = {"variant": variant, "step_ms": step_s * 1e3, "samples_per_s": batch / step_s}
        if variant != "dense":
            row["macs_per_sample"] = schedule_macs(model, batch)
        rows.append(row)
    dense = rows[0]["samples_per_s"]
    for row in rows:
        row["speed_vs_dense"] = row["samples_per_s"] / dense
    return {"batch": batch, "rank": rank, "steps": steps, "repeats": repeats, "rows": rows,
            "machine": f"{platform.machine()}, {platform.python_implementation()} {platform.python_version()}",
            "seconds": round(time.perf_counter() - started, 1)}


def format_bench(result: dict) -> str:
    lines = [f"training step, batch {result['batch']}, initial rank {result['rank']} ({result['machine']})",
             f"{'variant':8s} {'ms/step':>9s} {'samples/s':>10s} {'vs dense':>9s} "
             f"{'MAC/sample PE1':>15s} {'PE2':>10s} {'PE3':>9s} {'total':>10s}"]
    for r in result["rows"]:
        macs = r.get("macs_per_sample")
        mac_text = (f"{macs['PE1']:15,.0f} {macs['PE2']:10,.0f} {macs['PE3']:9,.0f} {macs['total']:10,.0f}"
                    if macs else f"{'':15s} {'':10s} {'':9s} {'':10s}")
        lines.append(f"{r['variant']:8s} {r['step_ms']:9.1f} {r['samples_per_s']:10.0f} "
                     f"{r['speed_vs_dense']:8.2f}x {mac_text}")
    return "\n".join(lines)

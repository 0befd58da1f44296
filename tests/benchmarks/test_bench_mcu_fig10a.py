"""Benchmark (prints figures): tiny-training Figure 10(a) for the paper's three networks at
128x128 (insitu.sparse.models.PAPER_MODELS): the peak training memory of the full update, the
sparse update and the sparse update with operator reordering, planned by the training compiler,
and the ratios. The networks are pretrained here (FashionMNIST as RGB, cached), get a new head for
digits and their gradient scales calibrated, as `insitu train --algo sparse` does.

- full: every weight and bias trained, gradients materialized and applied at the end (the
  conventional framework's memory); full + reorder: the same with each gradient fused with its
  update (in place);
- sparse: the default scheme of `insitu train` for the network (the largest scheme released with
  the paper that fits the board's heap: insitu.mcu.board_runs.default_scheme), gradients applied
  at the end; sparse + reorder: in place, as `insitu train` runs it.

For sparse + reorder, what the arena holds at its peak (insitu.sparse.compiler.live_peak: the
input window, the trained tensors, the activations) says what sets its size.

Each plan is given as the arena (the one block the firmware allocates: tensors, tables, the
input or its window; the program table is a buffer of its own) and the whole heap the Cortex-M7 twin needs (arena + the runtime model of
insitu.mcu.board_runs: RUNTIME_HEAP_BYTES + HEAP_BYTES_PER_CALL a kernel call), and whether that fits the STM32F746's
256 KB with the 5 % margin. The measured column takes the peak heap of `insitu train --board
stm32f746-disco-sim --algo sparse --model M --out DIR/train-M.json` runs (the same program as
sparse + reorder) from INSITU_MCU_FIG10A_RUNS=DIR, where there. With INSITU_MCU_FIG10A_MEASURE=1,
each column whose predicted heap fits the twin's largest heap (1 MiB) is also run there: flashed,
2 samples trained and 1 evaluated in a 1 MiB heap, its peak heap read (~4 min each, most of it the
flashing of the 0.5-0.7 MB blob over the twin's UART).

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_mcu_fig10a.py
Writes docs/results/mcu/fig10a-paper-models.{json,txt} (INSITU_MCU_FIG10A_OUT: another folder).
INSITU_MCU_FIG10A_SCHEMES=paper-73kb,paper-49kb,paper-74kb: the three networks' schemes (default:
insitu train's, the largest released scheme whose heap fits 256 KB).
"""

import json
import os
import time
from pathlib import Path

import pytest

from insitu.io import atomic_write, atomic_write_json
from insitu.mcu.board_runs import (HEAP_BYTES_PER_CALL, HEAP_MARGIN, RUNTIME_HEAP_BYTES, Prepared, default_scheme,
                                   fits_heap, runtime_heap_bytes)
from insitu.sparse import DEFAULT_LR, HEAD_LR_FACTOR
from insitu.sparse.compiler import Options, compile_training, live_peak
from insitu.sparse.models import PAPER_MODELS
from insitu.sparse.scheme import full_update

pytestmark = pytest.mark.benchmark

ROOT = Path(__file__).resolve().parents[2]
HEAP = 262_144
TARGET_RATIO = 20.0


TWIN_HEAP = 1 << 20


def _plan(prep: Prepared, scheme, reorder: bool, measure: bool) -> dict:
    options = Options(lr=DEFAULT_LR, reorder=reorder, lr_scale={prep.graph.convs[-1].name: HEAD_LR_FACTOR})
    c = compile_training(prep.graph, scheme, prep.grad_scales, options)
    heap = c.arena_bytes + runtime_heap_bytes(c)
    out = {"arena_bytes": c.arena_bytes, "heap_bytes": heap, "fits_256k": fits_heap(heap, HEAP),
           "calls": sum(len(v) for v in c.calls.values()), "patches": c.stats["patches"],
           "memory_plan": c.stats["bytes_by_kind"], "live_peak": c.stats["live_peak"],
           # What the peak would be without the input (c.train_ops: the plan's timeline less argmax,
           # the same live sets).
           "live_peak_without": {"+".join(kinds): live_peak(c.buffers, c.train_ops, kinds)["bytes"]
                                 for kinds in (("input",),)}}
    if measure and fits_heap(heap, TWIN_HEAP):
        out["measured_peak_heap_bytes"] = _measure(prep, c)
    return out


def _measure(prep: Prepared, compiled) -> int:
    """The firmware's peak heap running ``compiled`` on the Cortex-M7 twin (1 MiB heap)."""
    import copy
    import tempfile

    from insitu.mcu.board_runs import run_on_device
    from insitu.mcu.twin import McuTwin

    run = copy.copy(prep)
    run.compiled = compiled
    with tempfile.TemporaryDirectory(prefix="fig10a-") as folder, \
            McuTwin(Path(folder) / "flash", heap_bytes=TWIN_HEAP, twin="qemu") as twin:
        assert twin.port is not None                # (started)
        return int(run_on_device(run, twin.port, 2, 1, 0, lambda n: None)["peak_heap_bytes"])


def test_fig10a_full_vs_sparse_vs_sparse_reordered():
    out = Path(os.environ.get("INSITU_MCU_FIG10A_OUT") or ROOT / "docs" / "results" / "mcu")
    runs = os.environ.get("INSITU_MCU_FIG10A_RUNS")
    measure = os.environ.get("INSITU_MCU_FIG10A_MEASURE") == "1"
    started = time.perf_counter()
    rows = []
    schemes = dict(zip(PAPER_MODELS, os.environ["INSITU_MCU_FIG10A_SCHEMES"].split(","))) \
        if os.environ.get("INSITU_MCU_FIG10A_SCHEMES") else {}
    for model in PAPER_MODELS:
        scheme_name = schemes.get(model) or default_scheme(model, HEAP)
        prep = Prepared(model, "digits", scheme_name, DEFAULT_LR, 0,
                        lr_scale={"classifier": HEAD_LR_FACTOR})
        row = {"model": model, "scheme": scheme_name, "scheme_text": prep.scheme.describe()}
        run = Path(runs or "/nonexistent") / f"train-{model}.json"
        if run.is_file():
            got = json.loads(run.read_text())
            if got.get("scheme_text") == row["scheme_text"] and got.get("planned_peak_bytes"):
                row["measured"] = {k: got[k] for k in ("peak_heap_bytes", "planned_peak_bytes", "predicted_heap_bytes",
                                                       "samples", "test_samples", "accuracy_before", "accuracy_after",
                                                       "train_seconds", "host_sim_agreement")}
                row["measured"]["board_time"] = got.get("board_time")
        row.update({"full": _plan(prep, full_update(prep.graph), False, measure),
                    "full_reorder": _plan(prep, full_update(prep.graph), True, measure),
                    "sparse": _plan(prep, prep.scheme, False, measure),
                    # (the train run, where given, measured this program at the board's heap)
                    "sparse_reorder": _plan(prep, prep.scheme, True, measure and "measured" not in row)})
        full = row["full"]["arena_bytes"]
        row["ratio_sparse"] = full / row["sparse"]["arena_bytes"]
        row["ratio_sparse_reorder"] = full / row["sparse_reorder"]["arena_bytes"]
        rows.append(row)
        print(f"[{time.perf_counter() - started:6.0f} s] {model}: {json.dumps(row)[:300]}", flush=True)
    text = format_table(rows)
    print(text)
    atomic_write_json(out / "fig10a-paper-models.json", {"heap_bytes": HEAP, "margin": HEAP_MARGIN,
                                                          "target_ratio": TARGET_RATIO, "rows": rows})
    atomic_write(out / "fig10a-paper-models.txt", text)
    assert len(rows) == len(PAPER_MODELS)


def format_table(rows) -> str:
    k = lambda b: f"{b / 1024:,.0f} KB"
    lines = ["Tiny Training Fig. 10(a), planned by insitu's training compiler (arena / whole heap on the "
             f"Cortex-M7 twin: arena + {RUNTIME_HEAP_BYTES:,} B + {HEAP_BYTES_PER_CALL} B a call); digits head, "
             "lr 0.01, classifier 5x",
             "",
             f"{'network':<16}{'scheme':<12}{'full':>20}{'full+reorder':>20}{'sparse':>20}{'sparse+reorder':>20}"
             f"{'full/sparse':>13}{'full/(sp+re)':>14}  fits 256 KB (sparse+reorder)"]
    for r in rows:
        cells = [f"{k(r[c]['arena_bytes'])} / {k(r[c]['heap_bytes'])}" for c in ("full", "full_reorder", "sparse",
                                                                                 "sparse_reorder")]
        lines.append(f"{r['model']:<16}{r['scheme']:<12}" + "".join(f"{c:>20}" for c in cells)
                     + f"{r['ratio_sparse']:>12.1f}x{r['ratio_sparse_reorder']:>13.1f}x  "
                     + ("yes" if r["sparse_reorder"]["fits_256k"] else "no"))
    lines += ["", "what the sparse + reorder arena holds at its peak (the op with the most bytes live; "
              "param: the trained weights and biases, input: the image; an arena of full / "
              f"{TARGET_RATIO:g} would meet the {TARGET_RATIO:g}x ratio):"]
    for r in rows:
        peak = r["sparse_reorder"]["live_peak"]
        kinds = sorted(peak["by_kind"].items(), key=lambda kv: -kv[1])
        lines.append(f"  {r['model']}: {peak['bytes']:,} B live at {peak['node']} (arena "
                     f"{r['sparse_reorder']['arena_bytes']:,} B): " + ", ".join(f"{kind} {n:,}" for kind, n in kinds)
                     + f"; full / {TARGET_RATIO:g} = {r['full']['arena_bytes'] / TARGET_RATIO:,.0f} B")
        lines.append("    live at the peak without " + "; without ".join(
            f"{kinds.replace('+', ' and ')}: {n:,} B ({r['full']['arena_bytes'] / n:.1f}x)"
            for kinds, n in r["sparse_reorder"]["live_peak_without"].items()))
    lines += ["", "measured peak heap on the Cortex-M7 twin (1 MiB heap, 2 samples; where the predicted heap fits it):"]
    for r in rows:
        got = [f"{c} {r[c]['measured_peak_heap_bytes']:,} B (predicted {r[c]['heap_bytes']:,} B)"
               for c in ("full", "full_reorder", "sparse", "sparse_reorder") if "measured_peak_heap_bytes" in r[c]]
        lines.append(f"  {r['model']}: " + ("; ".join(got) if got else "not run (INSITU_MCU_FIG10A_MEASURE=1 runs them)"))
    lines += ["", "measured on the Cortex-M7 twin (insitu train ... --samples N: the same sparse + reorder program):"]
    for r in rows:
        m = r.get("measured")
        if m:
            lines.append(f"  {r['model']}: peak heap {m['peak_heap_bytes']:,} B (predicted {m['predicted_heap_bytes']:,} B, "
                         f"arena {m['planned_peak_bytes']:,} B); {m['samples']} samples, accuracy on "
                         f"{m['test_samples']} test samples {m['accuracy_before']:.3f} -> {m['accuracy_after']:.3f}, "
                         f"host simulation agreement {m['host_sim_agreement']:.3f}"
                         + (f", {1000 * m['board_time']['train']['seconds_per_sample']:,.0f} ms a training sample "
                            "on the board" if m.get("board_time") else ""))
        else:
            lines.append(f"  {r['model']}: not measured (no train-{r['model']}.json run given)")
    return "\n".join(lines) + "\n"

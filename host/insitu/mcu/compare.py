"""`insitu mcu compare`: sparse update vs. the paper's baselines at equal memory (tiny-training
Figure 9 and §4, "Sparse update obtains better accuracy at lower memory").

For each memory budget (bytes of the compiler's planned arena) four kinds of scheme are trained
on the host simulator (bit-exact with the firmware), each on the same samples in the same order
and scored on the same test samples (:func:`insitu.sparse.contributions.score_schemes`):

* **last layer**: the classifier alone (``classifier``);
* **bias + last layer**: ``bias-K``, the biases of the last K layers and the classifier, with the
  largest K whose plan fits the budget;
* **last k layers**: ``last-K``, weights and biases of the last K layers, the largest K that fits;
* **sparse (searched)**: the scheme the search of eq. 5 finds under the budget
  (:func:`insitu.sparse.search.run_search`; its contribution analysis is cached).

A kind that has no scheme within the budget is reported as such (``fits: false`` and why), never
dropped. Beside them, the memory table of the paper's Figure 10(a): the planned arena of the full
update without reordering (the paper's baseline: every gradient kept until the update), of the
full update with reordering, and of each budget's searched scheme, with the ratios. With
``measure_heap`` each of those programs is also run on a twin to find the smallest MicroPython
heap it trains in (:func:`insitu.mcu.minheap.find_min_heap`), and the ratios are taken of the
measured heaps too: the check of the target "the searched scheme's peak memory is at least
:data:`TARGET_RATIO` times below a full update of the same model, each measured".
"""

from __future__ import annotations

import contextlib
import math
import tempfile
import time
from typing import Callable

import numpy as np

from insitu.checks import check_int, format_size, parse_size
from insitu.errors import InsituError, UsageError
from insitu.io import save_figure
from insitu.mcu.board_runs import predicted_heap_bytes
from insitu.sparse.compiler import Options, compile_training
from insitu.sparse.contributions import Bundle, lr_scale_of, score_schemes, with_lr_scale
from insitu.sparse.memory import MemoryModel, canonical, scheme_key
from insitu.sparse.scheme import Scheme, bias_only, classifier_only, full_update, last_k_layers
from insitu.sparse.search import DEFAULT_EVAL_SAMPLES, check_analysis_options, check_lr_scale, run_search

__all__ = ["METHODS", "TARGET_RATIO", "HEAP_SAMPLES", "parse_budgets", "budget_label",
           "measure_heap_of", "largest_fitting", "run_compare", "rates_text", "tables", "scheme_lines", "seed_lines",
           "format_text", "plot_compare"]

#: The methods of Figure 9, in the order they are reported: (key, label).
METHODS = (("classifier", "last layer"), ("bias", "bias + last layer"), ("last", "last k layers"),
           ("sparse", "sparse (searched)"))
#: The issue's target: full update (no reordering) / searched sparse scheme, measured heaps.
TARGET_RATIO = 7.0
#: Training samples each heap probe runs (as `insitu mcu minheap`'s default).
HEAP_SAMPLES = 2
#: The bisection's bounds: these times the predicted heap (the low one at least the arena).
HEAP_HIGH_FACTOR = 1.5
LOW_FACTOR = 0.9
DEFAULT_BOARD = "stm32f746-disco-sim"


def parse_budgets(text) -> list[int]:
    """``"48K,64K,96K"`` (or a list of sizes) -> sorted distinct byte counts; empty is an error."""
    items = [p.strip() for p in text.split(",")] if isinstance(text, str) else list(text)
    if not items or all(p == "" for p in items):
        raise UsageError("budgets: give at least one memory budget (e.g. 48K,64K,96K)")
    if any(p == "" for p in items):
        raise UsageError(f"budgets: an empty item in {text!r} (use comma-separated sizes: 48K,64K,96K)")
    return sorted({parse_size(p) for p in items})


def budget_label(budget: int) -> str:
    """``48.0 KiB`` for whole KiB, else the bytes (two budgets never print alike)."""
    return format_size(budget) if budget % 1024 == 0 else f"{budget:,} B"


def largest_fitting(memory_fn, graph, make, budget: int) -> tuple[int, int] | None:
    """``(K, arena)`` of the largest K in 1..L whose scheme ``make(graph, K)`` plans within
    ``budget`` (every K is planned: the arena need not grow with K), or None."""
    best = None
    for k in range(1, len(graph.convs) + 1):
        arena = memory_fn(make(graph, k))
        if arena <= budget:
            best = (k, int(arena))
    return best


# --------------------------------------------------------------------------- scoring in parallel

_BUNDLE: dict = {}


def _init_scorer(bundle) -> None:
    _BUNDLE["bundle"] = bundle


def _score_one(scheme_json: dict, train_samples: int, eval_samples: int, seed: int) -> tuple[float, int]:
    return score_schemes(_BUNDLE["bundle"], [Scheme.from_json(scheme_json)], train_samples=train_samples,
                         eval_samples=eval_samples, seed=seed)[0]


def _score_all(bundle, schemes: dict, train_samples: int, eval_samples: int, seed: int, workers: int,
               advance) -> dict:
    """``{key: (accuracy, arena)}`` of ``schemes`` (``{key: Scheme}``), each trained by
    :func:`score_schemes` on the same samples; ``workers`` processes (the deepest first)."""
    keys = sorted(schemes, key=lambda k: -k[0])
    out: dict = {}
    if workers <= 1 or len(keys) <= 1:
        for key in keys:
            out[key] = score_schemes(bundle, [schemes[key]], train_samples=train_samples,
                                     eval_samples=eval_samples, seed=seed)[0]
            advance(1)
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=min(int(workers), len(keys)), initializer=_init_scorer,
                             initargs=(bundle,)) as pool:
        futures = {pool.submit(_score_one, schemes[k].to_json(), train_samples, eval_samples, seed): k
                   for k in keys}
        for fut in as_completed(futures):
            out[futures[fut]] = fut.result()
            advance(1)
    return out


# --------------------------------------------------------------------------- the comparison

def _ratio(a, b):
    return float(a) / float(b) if a and b else None


def run_compare(model: str, task: str, budgets, *, prepare: Callable[[str, str, float, int], Bundle],
                train_samples: int = 500, eval_samples: int | None = None, lr: float = 0.05, seed: int = 0,
                evaluations: int = 2000, workers: int = 1, measure_heap: bool = False, board_time: bool = False,
                board: str = DEFAULT_BOARD,
                lr_scale: dict[str, float] | None = None, sample_seeds=(), progress_factory=None,
                say=None) -> dict:
    """The comparison of Figure 9 at each of ``budgets`` (bytes, or sizes as ``parse_budgets``
    takes them) and the memory table; returns a JSON-serializable dict (see the module doc).
    ``lr_scale``: per-layer factors on ``lr`` (``{"classifier": 5}``) every scheme, the search's
    analysis included, trains with (None: the prepared bundle's; by default one rate).
    ``sample_seeds``: more sample orders (seeds of the training stream) every chosen scheme is
    also trained in, after the search at ``seed``'s; each program then carries
    ``accuracy_by_seed`` and ``accuracy_mean`` beside ``accuracy`` (``seed``'s): one order's
    accuracy varies by points between orders.
    ``board_time``: each program's training step measured on the Cortex-M7 twin
    (:func:`insitu.mcu.latency.measure_board_time`): ``board_ms_per_sample`` in every row whose
    program fits the twin's largest heap.
    ``prepare(model, task, lr, seed)``: what every scheme trains on (as for
    :func:`insitu.sparse.search.run_search`), called once the arguments are checked."""
    started = time.perf_counter()
    budgets = parse_budgets(budgets)
    train_samples, evaluations, workers, lr = check_analysis_options(
        model, task, train_samples, evaluations, workers, lr)
    lr_scale = check_lr_scale(lr_scale)
    orders = [int(seed)] + [check_int("sample seed", s, 0) for s in dict.fromkeys(sample_seeds) if s != seed]
    if measure_heap:
        from insitu.boards import get_board

        spec = get_board(board)
        if not spec.is_twin or spec.mcu is None:
            raise UsageError(f"{board!r} is not a simulated microcontroller: the heap is measured on a twin "
                             "(e.g. stm32f746-disco-sim)")
    say = say or (lambda msg: None)
    progress_factory = progress_factory or (lambda what, total: contextlib.nullcontext(lambda n=1: None))

    bundle = prepare(model, task, lr, seed)
    graph = bundle.graph
    check_lr_scale(lr_scale, [c.name for c in graph.convs], model=model)
    bundle = with_lr_scale(bundle, lr_scale)
    lr_scale = lr_scale_of(bundle)
    n_test = len(bundle.y_test)
    eval_samples = min(DEFAULT_EVAL_SAMPLES, n_test) if eval_samples is None else eval_samples
    eval_samples = check_int("eval samples", eval_samples, 1, n_test, f"{task}'s test samples")
    memory = MemoryModel(graph, bundle.grad_scales, lr, lr_scale=lr_scale)
    floor = memory(classifier_only(graph))
    if budgets[0] < floor:
        raise UsageError(f"budget {budgets[0]:,} B ({format_size(budgets[0])}) is below what any scheme needs: "
                         f"training the classifier of {model} alone plans {floor:,} B ({format_size(floor)})")

    # Every scheme to train, by its canonical key (a scheme chosen twice is trained once).
    schemes: dict = {}

    def add(scheme) -> tuple:
        key = scheme_key(canonical(graph, scheme))
        schemes.setdefault(key, scheme)
        return key

    full = full_update(graph)
    full_key = add(full)
    per_budget = []
    for budget in budgets:
        entries: dict = {}
        entries["classifier"] = {"preset": "classifier", "key": add(classifier_only(graph))}
        for kind, make in (("bias", bias_only), ("last", last_k_layers)):
            fit = largest_fitting(memory, graph, make, budget)
            if fit is None:
                entries[kind] = {"why": f"no {kind}-K fits {budget:,} B"}
            else:
                entries[kind] = {"preset": f"{kind}-{fit[0]}", "k": fit[0], "key": add(make(graph, fit[0]))}
        say(f"search under {format_size(budget)} ({budget:,} B)")
        search = None
        try:
            search = run_search(model, task, budget, prepare=lambda *_: bundle, evaluations=evaluations,
                                train_samples=train_samples, eval_samples=eval_samples, lr=lr, seed=seed,
                                workers=workers, validate=False, lr_scale=lr_scale,
                                progress_factory=progress_factory, say=say)
        except UsageError:
            raise
        except InsituError as exc:                       # e.g. no sampled scheme fits a tight budget
            entries["sparse"] = {"why": f"the search found no scheme within the budget: {exc}"}
        if search is not None:
            entries["sparse"] = {"preset": None, "key": add(Scheme.from_json(search["scheme"])),
                                 "search": {"scheme_from": search["scheme_from"],
                                            "objective": float(search["objective"]),
                                            "predicted_accuracy": float(
                                                search["contributions"]["reference_accuracy"] + search["objective"]),
                                            "contributions": search["contributions"]["path"],
                                            "contributions_cached": bool(search["contributions"]["cached"]),
                                            "seconds": float(search["seconds"])}}
        per_budget.append((budget, entries))

    # Compile each scheme for real: its arena (the plan) and the heap predicted for it.
    compiled = {key: compile_training(graph, s, bundle.grad_scales, Options(lr=lr, lr_scale=lr_scale))
                for key, s in schemes.items()}
    full_plain = compile_training(graph, full, bundle.grad_scales, Options(lr=lr, reorder=False, lr_scale=lr_scale))
    say(f"training {len(schemes)} schemes on {train_samples} samples (test: {eval_samples})")
    by_seed = {}
    for order in orders:
        if order != seed:
            say(f"training {len(schemes)} schemes in the sample order of seed {order}")
        with progress_factory(f"training {len(schemes)} schemes", len(schemes)) as advance:
            by_seed[order] = _score_all(bundle, schemes, train_samples, eval_samples, order, workers, advance)
        for key, (_, arena) in by_seed[order].items():
            if arena != compiled[key].arena_bytes:
                raise InsituError(f"{compiled[key].scheme.describe()}: trained with an arena of {arena:,} B, "
                                  f"compiled with {compiled[key].arena_bytes:,} B")

    def program(key) -> dict:
        c = compiled[key]
        out = {"scheme": c.scheme.to_json(), "scheme_text": c.scheme.describe(),
               "accuracy": float(by_seed[seed][key][0]), "arena_bytes": int(c.arena_bytes),
               "predicted_heap_bytes": int(predicted_heap_bytes(c))}
        if len(orders) > 1:
            accuracies = [float(by_seed[o][key][0]) for o in orders]
            out.update(accuracy_by_seed={str(o): a for o, a in zip(orders, accuracies)},
                       accuracy_mean=float(np.mean(accuracies)))
        return out

    rows = []
    for budget, entries in per_budget:
        methods = {}
        for kind, label in METHODS:
            e = entries[kind]
            if "key" not in e:
                methods[kind] = {"method": label, "fits": False, "why": e["why"], "preset": None,
                                 "scheme": None, "scheme_text": None, "accuracy": None, "arena_bytes": None,
                                 "predicted_heap_bytes": None}
                continue
            m = {"method": label, "fits": True, "why": None, "preset": e["preset"], **program(e["key"])}
            if "search" in e:
                m["search"] = e["search"]
            if m["arena_bytes"] > budget:                # the searches check this; a plan must not drift
                raise InsituError(f"{label} under {budget:,} B: {m['scheme_text']} plans {m['arena_bytes']:,} B")
            methods[kind] = m
        rows.append({"budget_bytes": int(budget), "budget": budget_label(budget), "methods": methods})

    # The memory table (Figure 10(a)): full update without / with reordering, each searched scheme.
    # Reordering moves each update next to its gradient (a different memory plan); the arithmetic
    # is the same, so both full rows carry the accuracy of the one full-update training.
    mem_rows = [{"name": "full update, no reordering", "kind": "full-no-reorder", "budget_bytes": None,
                 **program(full_key), "arena_bytes": int(full_plain.arena_bytes),
                 "predicted_heap_bytes": int(predicted_heap_bytes(full_plain))},
                {"name": "full update", "kind": "full", "budget_bytes": None, **program(full_key)}]
    programs = [full_plain, compiled[full_key]]          # the program of each memory row
    for row, (_, entries) in zip(rows, per_budget):
        sparse = row["methods"]["sparse"]
        if not sparse["fits"]:
            continue
        mem_rows.append({"name": f"sparse under {row['budget']}", "kind": "sparse",
                         "budget_bytes": row["budget_bytes"],
                         **{k: sparse[k] for k in ("scheme", "scheme_text", "accuracy", "arena_bytes",
                                                    "predicted_heap_bytes")}})
        programs.append(compiled[entries["sparse"]["key"]])

    if measure_heap:
        x, y = bundle.x_train[:HEAP_SAMPLES], bundle.y_train[:HEAP_SAMPLES]
        measured: dict = {}
        # One flash folder: the firmware runtime is flashed once, each program's model over it.
        with tempfile.TemporaryDirectory(prefix="insitu-compare-") as flash_dir:
            for r, c in zip(mem_rows, programs):
                key = (scheme_key(canonical(graph, c.scheme)), c.arena_bytes, c.model_id)
                if key not in measured:
                    say(f"measuring the smallest heap of {r['name']} (arena {c.arena_bytes:,} B) on {board}")
                    measured[key] = measure_heap_of(c, x, y, board, say, flash_dir=flash_dir)
                r.update(measured[key])
                r["heap_error"] = (r["min_heap_bytes"] - r["predicted_heap_bytes"]) / r["predicted_heap_bytes"]

    if board_time:
        _add_board_time(rows, mem_rows, programs, compiled, per_budget, bundle, board, say)

    base, full_row = mem_rows[0], mem_rows[1]
    for r in mem_rows:
        r["ratio_planned_vs_full_no_reorder"] = _ratio(base["arena_bytes"], r["arena_bytes"])
        r["ratio_planned_vs_full"] = _ratio(full_row["arena_bytes"], r["arena_bytes"])
        if measure_heap:
            ratio = _ratio(base["min_heap_bytes"], r["min_heap_bytes"])
            assert ratio is not None                        # measured heaps are > 0 bytes
            r["ratio_measured_vs_full_no_reorder"] = ratio
            r["ratio_measured_vs_full"] = _ratio(full_row["min_heap_bytes"], r["min_heap_bytes"])
            r["target_met"] = (ratio >= TARGET_RATIO) if r["kind"] == "sparse" else None
    return {
        "model": model, "task": task, "lr": float(lr), "lr_scale": lr_scale, "seed": int(seed),
        "sample_seeds": orders,
        "train_samples": train_samples,
        "eval_samples": eval_samples, "evaluations": evaluations, "budgets": [int(b) for b in budgets],
        "classifier_arena_bytes": int(floor), "methods": [{"key": k, "label": label} for k, label in METHODS],
        "rows": rows,
        "memory": {"rows": mem_rows, "measured": bool(measure_heap), "board": board if measure_heap else None,
                   "heap_samples": HEAP_SAMPLES if measure_heap else None, "target_ratio": TARGET_RATIO},
        "schemes_trained": len(schemes),
        "seconds": time.perf_counter() - started,
    }


def _add_board_time(rows, mem_rows, programs, compiled, per_budget, bundle, board, say) -> None:
    """``board_ms_per_sample`` (training, on the board at its clock) of every row's program that
    the twin's largest heap holds; None where it does not (the full updates of large networks)."""
    from insitu.mcu import qemu
    from insitu.mcu.latency import STEPS, measure_board_time

    x, y = bundle.x_train[:STEPS], bundle.y_train[:STEPS]
    measured: dict[str, float | None] = {}

    def ms(c) -> float | None:
        if c.model_id not in measured:
            if predicted_heap_bytes(c) > qemu.max_heap_bytes():
                measured[c.model_id] = None
            else:
                say(f"counting the board's time of {c.scheme.describe()} on the Cortex-M7 twin")
                bt = measure_board_time(c, x, y, board)
                measured[c.model_id] = round(1000 * bt["train"]["seconds_per_sample"], 3)
        return measured[c.model_id]

    for row, (_, entries) in zip(rows, per_budget):
        for kind, m in row["methods"].items():
            m["board_ms_per_sample"] = ms(compiled[entries[kind]["key"]]) if m["fits"] else None
    for r, c in zip(mem_rows, programs):
        r["board_ms_per_sample"] = ms(c)


def measure_heap_of(compiled, x_codes, labels, board: str = DEFAULT_BOARD, say=None,
                    flash_dir: str | None = None) -> dict:
    """The smallest heap ``compiled`` trains in on the twin (:func:`find_min_heap`), bracketed by
    ``[max(arena, LOW_FACTOR * predicted), HEAP_HIGH_FACTOR * predicted]``: a probe far below the
    prediction is a heap the firmware cannot even start in, which costs a link timeout, not a quick
    refusal. When no probe of that bracket fails, its low end was not below the minimum, and the
    bisection is redone from the arena. ``flash_dir``: the twin's flash folder (as
    :func:`find_min_heap`'s)."""
    from insitu.mcu.minheap import find_min_heap
    from insitu.mcu.board_runs import device_inputs, firmware_files

    say = say or (lambda msg: None)
    arena, predicted = int(compiled.arena_bytes), int(predicted_heap_bytes(compiled))
    high = max(int(math.ceil(HEAP_HIGH_FACTOR * predicted / 16)) * 16, arena + 4096)
    files = firmware_files(compiled)
    x_codes = device_inputs(compiled, x_codes)
    started = time.perf_counter()
    low = max(arena, int(LOW_FACTOR * predicted) // 16 * 16)
    found, probes = find_min_heap(files, x_codes, labels, low, high, board=board, flash_dir=flash_dir)
    bracketed = low == arena or any(not p.ok for p in probes)
    if not bracketed:
        say(f"  every probe down to {low:,} B trained: bisecting again from the arena ({arena:,} B)")
        found, more = find_min_heap(files, x_codes, labels, arena, found, board=board, flash_dir=flash_dir)
        probes += more
    say(f"  smallest heap {found:,} B (predicted {predicted:,} B; {len(probes)} probes)")
    return {"min_heap_bytes": int(found), "probes": len(probes), "heap_bracket": [low if bracketed else arena, high],
            "heap_seconds": time.perf_counter() - started}


# --------------------------------------------------------------------------- reports

def _kb(n) -> str:
    return "-" if n is None else f"{n:,} B"


def _ms(row) -> str:
    """A row's training time per sample on the board (counted on the twin), or "-"."""
    v = row.get("board_ms_per_sample")
    return "-" if v is None else f"{v:,.1f} ms"


def _x(r) -> str:
    return "-" if r is None else f"{r:.1f}x"


def _short(name: str) -> str:
    return name.replace("full update, no reordering", "full, no reorder").replace("sparse under ", "sparse @ ")


def rates_text(result: dict) -> str:
    """`` (classifier 5x)``: the per-layer lr factors of a result, if any."""
    scale = result.get("lr_scale") or {}
    return f" ({', '.join(f'{name} {f:g}x' for name, f in scale.items())})" if scale else ""


def tables(result: dict) -> list:
    """The report as rich tables: accuracy at equal memory (Fig. 9), planned memory (Fig. 10(a))
    and, when measured, the smallest heaps."""
    from rich.table import Table

    t = Table(title=f"{result['model']} on {result['task']}: accuracy at equal memory (planned arena <= budget; "
                    f"{result['train_samples']} training / {result['eval_samples']} test samples, "
                    f"lr {result['lr']:g}{rates_text(result)})")
    timed = any("board_ms_per_sample" in m for row in result["rows"] for m in row["methods"].values())
    for col in ("budget", "method", "scheme", "arena", "heap (pred.)", "accuracy") + (("ms / sample",) if timed else ()):
        t.add_column(col, justify="left" if col in ("budget", "method", "scheme") else "right", no_wrap=True)
    for row in result["rows"]:
        for i, (kind, _) in enumerate(METHODS):
            m = row["methods"][kind]
            budget = row["budget"] if i == 0 else ""
            if not m["fits"]:
                t.add_row(budget, m["method"], "none found" if kind == "sparse" else "does not fit", "-", "-", "-",
                          *(("-",) if timed else ()))
                continue
            t.add_row(budget, m["method"], m["preset"] or "searched", _kb(m["arena_bytes"]),
                      _kb(m["predicted_heap_bytes"]), f"{m['accuracy']:.3f}", *((_ms(m),) if timed else ()))
        t.add_section()
    mem = result["memory"]
    p = Table(title="planned peak (arena): full update vs. searched sparse schemes "
                    "(full/x: the full update's over the row's)")
    for col in ("scheme", "accuracy", "arena", "full (no reorder)/x", "full/x", "heap (pred.)") + (
            ("ms / sample",) if timed else ()):
        p.add_column(col, justify="left" if col == "scheme" else "right", no_wrap=col == "scheme")
    for r in mem["rows"]:
        p.add_row(_short(r["name"]), f"{r['accuracy']:.3f}", _kb(r["arena_bytes"]),
                  _x(r["ratio_planned_vs_full_no_reorder"]), _x(r["ratio_planned_vs_full"]),
                  _kb(r["predicted_heap_bytes"]), *((_ms(r),) if timed else ()))
    out = [t, p]
    if mem["measured"]:
        m = Table(title=f"measured: smallest heap that trains on {mem['board']} "
                        f"({mem['heap_samples']} samples, then one prediction)")
        for col in ("scheme", "heap (pred.)", "min heap", "error", "full (no reorder)/x", "full/x",
                    f">= {mem['target_ratio']:g}x"):
            m.add_column(col, justify="left" if col == "scheme" else "right", no_wrap=col == "scheme")
        for r in mem["rows"]:
            met = r.get("target_met")
            m.add_row(_short(r["name"]), _kb(r["predicted_heap_bytes"]), _kb(r["min_heap_bytes"]),
                      f"{100 * r['heap_error']:+.1f} %", _x(r["ratio_measured_vs_full_no_reorder"]),
                      _x(r["ratio_measured_vs_full"]), "" if met is None else ("yes" if met else "NO"))
        out.append(m)
    return out


def scheme_lines(result: dict) -> list[str]:
    """What each searched scheme (and the full update) trains, one line each."""
    lines = [f"{r['name']}: {r['scheme_text']}" for r in result["memory"]["rows"][1:2]]
    for row in result["rows"]:
        for kind, _ in METHODS:
            m = row["methods"][kind]
            what = m["scheme_text"] if m["fits"] else m["why"]
            if kind != "classifier" and (kind == "sparse" or not m["fits"]):
                lines.append(f"{m['method']} under {row['budget']}: {what}")
    return lines


def format_text(result: dict, width: int = 200) -> str:
    """The tables as plain text (for a results file)."""
    import io

    from rich.console import Console

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=False, color_system=None)
    for table in tables(result):
        console.print(table)
    for line in scheme_lines(result) + seed_lines(result):
        console.print(line, soft_wrap=True)
    return buf.getvalue()


def seed_lines(result: dict) -> list[str]:
    """Each method's accuracy in every sample order (``sample_seeds``), and the mean; none for one order."""
    seeds = result.get("sample_seeds", [result["seed"]])
    if len(seeds) < 2:
        return []

    def line(label: str, m: dict) -> str:
        each = ", ".join(f"{100 * m['accuracy_by_seed'][str(s)]:.1f}" for s in seeds)
        return f"  {label}: mean {100 * m['accuracy_mean']:.1f} % ({each})"

    lines = ["", f"accuracy in the sample orders of seeds {', '.join(map(str, seeds))} (%):",
             line("full update", result["memory"]["rows"][1])]
    for row in result["rows"]:
        lines += [line(f"{row['budget']} {m['method']} ({m['preset'] or 'searched'})", m)
                  for kind, _ in METHODS if (m := row["methods"][kind])["fits"]]
    return lines


def plot_compare(result: dict, path) -> None:
    """Grouped bars as Figure 9 (accuracy of each method at each budget) beside the memory of the
    full update and of the searched schemes (Figure 10(a)), as a PNG (matplotlib, Agg)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    mem = result["memory"]["rows"]
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(12, 4.8), dpi=120, gridspec_kw={"width_ratios": [3, 2]})
    n = len(METHODS)
    width = 0.8 / n
    xs = np.arange(len(rows))
    for j, (kind, label) in enumerate(METHODS):
        pos = xs - 0.4 + width * (j + 0.5)
        ms = [r["methods"][kind] for r in rows]
        ax.bar(pos, [100 * m["accuracy"] if m["fits"] else 0 for m in ms], width, label=label, color=f"C{j}")
        for p, m in zip(pos, ms):
            text = (f"{m['preset'] or 'searched'}  {m['arena_bytes'] / 1024:.1f}K  {100 * m['accuracy']:.1f}%"
                    if m["fits"] else ("none found" if kind == "sparse" else "does not fit"))
            ax.text(p, (100 * m["accuracy"] if m["fits"] else 0) + 1, text, ha="center", va="bottom", fontsize=6,
                    rotation=90)
    full = mem[1]
    ax.axhline(100 * full["accuracy"], color="0.4", ls="--", lw=1,
               label=f"full update ({full['arena_bytes'] / 1024:.1f}K)")
    ax.set_xticks(xs, [r["budget"] for r in rows])
    ax.set_xlabel("memory budget (planned arena)")
    ax.set_ylabel("accuracy (%)")
    ax.set_ylim(0, 130)
    ax.set_title(f"{result['model']} on {result['task']}: accuracy at equal memory "
                 f"({result['train_samples']} samples, lr {result['lr']:g}{rates_text(result)})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", ncol=3)
    ax.grid(axis="y", alpha=0.3)

    labels = [_short(r["name"]).replace(", ", "\n").replace(" @ ", "\n") for r in mem]
    xm = np.arange(len(mem))
    measured = result["memory"]["measured"]
    w = 0.4 if measured else 0.6
    bx.bar(xm - (w / 2 if measured else 0), [r["arena_bytes"] / 1024 for r in mem], w, label="planned arena")
    if measured:
        bx.bar(xm + w / 2, [r["min_heap_bytes"] / 1024 for r in mem], w, label="measured smallest heap")
    for x, r in zip(xm, mem):
        if r["kind"] != "sparse":
            continue
        text = f"{r['ratio_planned_vs_full_no_reorder']:.1f}x"
        if measured:
            text += f"\n{r['ratio_measured_vs_full_no_reorder']:.1f}x"
        top = max(r["arena_bytes"], r.get("min_heap_bytes") or 0) / 1024
        bx.text(x, top, text, ha="center", va="bottom", fontsize=7)
    bx.set_xticks(xm, labels, fontsize=7)
    bx.set_ylabel("KiB")
    bx.set_ylim(0, 1.15 * max(max(r["arena_bytes"], r.get("min_heap_bytes") or 0) for r in mem) / 1024)
    bx.set_title("peak memory; full (no reorder) / sparse: planned" + (", measured" if measured else ""),
                 fontsize=9)
    bx.legend(fontsize=7)
    bx.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    try:
        save_figure(fig, path, dpi=100)
    finally:
        plt.close(fig)

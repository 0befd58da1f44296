"""`insitu mcu search`: the sparse-update scheme search (tiny-training §2.2, eq. 5, appendix D).

Four parts, one module each:

1. **Memory** (:mod:`insitu.sparse.memory`): the planned peak of a scheme, the compiler's arena.
2. **Contribution analysis** (:mod:`insitu.sparse.contributions`): the accuracy each layer's bias
   and weights at each ratio add, measured on the host simulator.
3. **Search** (:mod:`insitu.sparse.objective`, :mod:`insitu.sparse.evolution`,
   :mod:`insitu.sparse.baselines`): maximize the summed contributions within the memory budget.
4. **Curves** (:mod:`insitu.sparse.curves`): best objective against schemes sampled (Fig. 13).

This module runs them in order for a model and a task (:func:`run_search`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from typing import Callable

from insitu.checks import check_int, check_number, format_size, parse_size
from insitu.errors import InsituError, UsageError
from insitu.sparse.baselines import random_search
from insitu.sparse.contributions import (Bundle, contribution_configs, load_or_analyze, lr_scale_of, ratio_label,
                                         score_schemes, with_lr_scale)
from insitu.sparse.evolution import evolutionary_search
from insitu.sparse.memory import MemoryModel, min_memory, scheme_key
from insitu import resources
from insitu.sparse.model_source import check_model
from insitu.sparse.objective import SearchResult
from insitu.sparse.scheme import RATIOS, Scheme
from insitu.sparse.tasks import check_task

__all__ = ["DEFAULT_EVALUATIONS", "DEFAULT_TRAIN_SAMPLES", "DEFAULT_EVAL_SAMPLES", "DEFAULT_KEEP",
           "DEFAULT_MIN_DISTANCE", "check_lr_scale", "compare", "run_search", "validate_candidates"]

DEFAULT_EVALUATIONS = 5000
DEFAULT_TRAIN_SAMPLES = 500
DEFAULT_EVAL_SAMPLES = 500
#: Candidates of each search validated by training (the shortlist of :func:`objective.shortlist`).
DEFAULT_KEEP = 8
#: Genes in which the shortlisted candidates differ pairwise (where the evaluated schemes allow).
DEFAULT_MIN_DISTANCE = 4


def validate_candidates(candidates, score: Callable[[list], list]) -> tuple[list[dict], int]:
    """Train each candidate (:class:`~insitu.sparse.objective.Candidate`, best predicted first)
    with ``score(schemes) -> [accuracy, ...]`` and pick the one that trains best (ties: the
    better predicted, i.e. the earlier). Returns ``(rows, index of the pick)``; a row holds the
    scheme's JSON and text, its eq. 5 objective (Σ Δacc), planned memory and trained accuracy.

    Eq. 5 adds contributions each measured alone and overpredicts schemes whose many layers'
    weights train together; the short training is the measurement the sum only predicts."""
    candidates = list(candidates)
    if not candidates:
        raise InsituError("validation: no candidate to train")
    accuracies = [float(a) for a in score([c.scheme for c in candidates])]
    if len(accuracies) != len(candidates):
        raise InsituError(f"validation: {len(accuracies)} accuracies for {len(candidates)} candidates")
    rows = [{**c.to_json(), "accuracy": a} for c, a in zip(candidates, accuracies)]
    pick = max(range(len(rows)), key=lambda i: (accuracies[i], -i))
    return rows, pick


def compare(contrib, memory_fn, budget: int, evaluations: int, seed: int = 0,
            progress=None) -> dict[str, SearchResult]:
    """Both searches with the same number of evaluations (and seed)."""
    return {"evolutionary": evolutionary_search(contrib, memory_fn, budget, evaluations, seed, progress=progress),
            "random": random_search(contrib, memory_fn, budget, evaluations, seed, progress=progress)}


def check_analysis_options(model: str, task: str, train_samples, evaluations, workers, lr):
    """The options every contribution analysis takes (the search's and the comparison's), checked
    before any work: ``(train_samples, evaluations, workers, lr)``, or a UsageError naming one."""
    check_model(model)                                 # unknown model, bad .onnx file: UsageError
    check_task(task)
    return (check_int("train samples", train_samples), check_int("evaluations", evaluations),
            check_int("workers", workers), check_number("lr", lr))


def check_lr_scale(lr_scale, layers=None, *, model: str = "the model",
                   option: str = "lr scale") -> dict[str, float] | None:
    """Per-layer learning-rate factors ``{layer: factor}`` (:attr:`insitu.sparse.compiler.Options.lr_scale`)
    checked, the one rule for the library and the CLI: each factor a positive finite number (a
    string such as ``"5"`` is read as one) and, with ``layers`` (``model``'s layer names), a layer
    the model has; a UsageError naming ``option`` and the item otherwise. None stays None (the
    bundle's own)."""
    import math

    if lr_scale is None:
        return None
    if not isinstance(lr_scale, Mapping):
        raise UsageError(f"{option} must map layer names to factors, got {lr_scale!r}")
    scale: dict[str, float] = {}
    for name, value in lr_scale.items():
        name = str(name)
        if layers is not None and name not in layers:
            raise UsageError(f"{option} {name}={value}: {model} has no layer {name!r}; its layers: "
                             f"{', '.join(layers)}")
        try:
            factor = math.nan if isinstance(value, bool) else float(value)
        except (TypeError, ValueError):
            factor = math.nan
        if not math.isfinite(factor) or factor <= 0:
            raise UsageError(f"{option} {name}={value}: the factor must be a positive number")
        scale[name] = factor
    return scale


def run_search(model: str, task: str, budget, *, prepare: Callable[[str, str, float, int], Bundle],
               evaluations: int = DEFAULT_EVALUATIONS,
               train_samples: int = DEFAULT_TRAIN_SAMPLES, eval_samples: int | None = None, lr: float = 0.05,
               seed: int = 0, workers: int = 1, cache_dir=None, refresh: bool = False, validate: bool = True,
               keep: int = DEFAULT_KEEP, min_distance: int = DEFAULT_MIN_DISTANCE, validate_random: bool = True,
               analysis_seed: int | None = None, lr_scale: dict[str, float] | None = None,
               progress_factory=None, say=None) -> dict:
    """`insitu mcu search`: contribution analysis of ``model`` on ``task`` (cached), then the
    evolutionary and random searches of eq. 5 under ``budget`` bytes with the same number of
    evaluations. Returns the report as a dict (``scheme`` holds the searched scheme's JSON); with
    ``validate``, ``validation`` holds the accuracy each search's scheme really reaches when
    trained as the analysis's configurations were (the sum of contributions only predicts it).

    Validation by training: each search keeps ``keep`` distinct feasible schemes it evaluated
    (the best predicted, pairwise ``min_distance`` genes apart where it can:
    :func:`insitu.sparse.objective.shortlist`); each is trained as the analysis trains a
    configuration (same samples and lr, the sample order of ``seed``) and the one that trains best
    is the search's pick (``validation[name]``: every candidate's predicted and trained accuracy,
    the pick, and the best-predicted scheme's ``plain`` result). ``validate_random=False`` trains
    only random search's best-predicted scheme (the plain baseline). ``keep=1``: each search's
    best-predicted scheme alone, as before. The reported ``scheme`` is then the pick that trains
    best (evolutionary on a tie); without ``validate``, the best predicted.

    ``analysis_seed`` (default ``seed``): the seed of the prepared head and of the contribution
    analysis (cached per seed); ``seed`` then only changes the searches' draws and the validation
    training's sample order.
    ``lr_scale``: per-layer factors on ``lr`` (``{"classifier": 5}``; the analysis, the searches'
    plans and the validation all train with them, and they are part of the analysis's cache key);
    None: the prepared bundle's (by default none: one rate for every layer).
    ``prepare(model, task, lr, seed)``: the :class:`Bundle` the analysis trains on (the platform
    prepares the model's new head and the task's samples as its training loop would), called once
    the arguments are checked."""
    budget = parse_size(budget)
    train_samples, evaluations, workers, lr = check_analysis_options(
        model, task, train_samples, evaluations, workers, lr)
    lr_scale = check_lr_scale(lr_scale)
    say = say or (lambda msg: None)
    progress_factory = progress_factory or (lambda what, total: contextlib.nullcontext(lambda n=1: None))

    keep = check_int("keep", keep)
    min_distance = check_int("min distance", min_distance, 0)
    analysis_seed = seed if analysis_seed is None else check_int("analysis seed", analysis_seed, 0)
    started = time.perf_counter()
    bundle = prepare(model, task, lr, analysis_seed)
    check_lr_scale(lr_scale, [c.name for c in bundle.graph.convs], model=model)
    bundle = with_lr_scale(bundle, lr_scale)
    lr_scale = lr_scale_of(bundle)
    memory = MemoryModel(bundle.graph, bundle.grad_scales, lr, lr_scale=lr_scale)
    floor = min_memory(bundle.graph, memory)
    if budget < floor:
        raise UsageError(f"budget {budget:,} B is below what any scheme needs: training the classifier of "
                         f"{model} alone plans {floor:,} B ({format_size(floor)})")
    n_test = len(bundle.y_test)
    eval_samples = min(DEFAULT_EVAL_SAMPLES, n_test) if eval_samples is None else eval_samples
    eval_samples = check_int("eval samples", eval_samples, 1, n_test, f"{task}'s test samples")
    folder = cache_dir if cache_dir is not None else resources.cache_dir("mcu", "contributions")
    configs = len({scheme_key(s) for _, s in contribution_configs(bundle.graph)})
    with progress_factory(f"contribution analysis ({configs} trainings)", configs) as advance:
        contrib, path, cached = load_or_analyze(bundle, model, task, train_samples, eval_samples, analysis_seed,
                                                workers, folder, refresh, advance)
    say(f"contributions {'from the cache' if cached else 'measured'}: {path}")
    table = contrib.table()
    results = {}
    for name, fn in (("evolutionary", evolutionary_search), ("random", random_search)):
        with progress_factory(f"{name} search", evaluations) as advance:
            results[name] = fn(table, memory, budget, evaluations, seed, progress=advance,
                               keep=keep if validate else 1, min_distance=min_distance)
    # The winners compiled by the real compiler (the plans the search used are its own passes).
    checked = {name: memory.compile(r.scheme) for name, r in results.items()}
    for name, r in results.items():
        if checked[name] != r.memory:
            raise InsituError(f"{name} search: the compiler plans {checked[name]:,} B for {r.scheme.describe()}, "
                              f"the search's plan said {r.memory:,} B; rerun (the fast plan is now off)")
    best = max(results.values(), key=lambda r: (r.objective, r.method == "evolutionary"))
    best_scheme, best_from = best.scheme, best.method
    validation = None
    if validate:
        # Eq. 5 assumes contributions add up; train each search's shortlist as the analysis trained
        # each configuration, keep what really trains best (schemes shared by both trained once).
        trained: dict = {}

        def score(schemes):
            todo = [s for s in dict.fromkeys(scheme_key(s) for s in schemes) if s not in trained]
            by_key = {scheme_key(s): s for s in schemes}
            if todo:
                with progress_factory(f"validation ({len(todo)} trainings)", len(todo)) as advance:
                    for key in todo:
                        (acc, _), = score_schemes(bundle, [by_key[key]], train_samples=train_samples,
                                                  eval_samples=eval_samples, seed=seed)
                        trained[key] = acc
                        advance(1)
            return [trained[scheme_key(s)] for s in schemes]

        say("training the searches' candidates to check the sum of contributions")
        validation = {}
        for name, r in results.items():
            cands = r.candidates if (name == "evolutionary" or validate_random) else r.candidates[:1]
            rows, pick = validate_candidates(cands, score)
            plain = next(row for row in rows if row["scheme"] == r.scheme.to_json())
            validation[name] = {"accuracy": rows[pick]["accuracy"], "objective": rows[pick]["objective"],
                                "predicted": contrib.reference_accuracy + rows[pick]["objective"],
                                "scheme": rows[pick]["scheme"], "scheme_text": rows[pick]["scheme_text"],
                                "memory_bytes": rows[pick]["memory_bytes"], "pick": pick,
                                "plain": {"accuracy": plain["accuracy"], "objective": plain["objective"],
                                          "predicted": contrib.reference_accuracy + plain["objective"]},
                                "candidates": [{**row, "predicted": contrib.reference_accuracy + row["objective"]}
                                               for row in rows],
                                "validated": len(rows), "reference_accuracy": contrib.reference_accuracy}
            planned = memory.compile(Scheme.from_json(rows[pick]["scheme"]))
            if planned != rows[pick]["memory_bytes"]:
                raise InsituError(f"{name} search: the compiler plans {planned:,} B for {rows[pick]['scheme_text']}, "
                                  f"the search's plan said {rows[pick]['memory_bytes']:,} B; rerun")
        from_ = max(validation, key=lambda n: (validation[n]["accuracy"], n == "evolutionary"))
        best_scheme, best_from = Scheme.from_json(validation[from_]["scheme"]), from_
        best_objective, best_memory = validation[from_]["objective"], validation[from_]["memory_bytes"]
    else:
        best_objective, best_memory = best.objective, best.memory
    L = len(contrib.layers)
    return {
        "model": model, "task": task, "budget_bytes": budget, "lr": float(lr), "lr_scale": lr_scale,
        "seed": int(seed),
        "min_memory_bytes": floor,
        "contributions": {"path": path, "cached": cached, "reference_accuracy": contrib.reference_accuracy,
                          "delta_bias": {str(k): contrib.delta_bias(k) for k in range(1, L + 1)},
                          "delta_weight": {n: {ratio_label(r): contrib.delta_weight(n, r) for r in RATIOS}
                                           for n in contrib.layers[:-1]},
                          "memory": contrib.memory, "seconds": contrib.seconds,
                          "train_samples": int(train_samples), "eval_samples": int(eval_samples)},
        "searches": {name: r.to_json() for name, r in results.items()},
        "validation": validation,
        "scheme": best_scheme.to_json(),
        "scheme_text": best_scheme.describe(),
        "scheme_from": best_from,
        "objective": best_objective,
        "memory_bytes": best_memory,
        "analysis_seed": int(analysis_seed), "keep": int(keep) if validate else 1, "min_distance": int(min_distance),
        "memory": {"plans": memory.compiles, "queries": memory.queries, "plan_seconds": memory.compile_seconds,
                   "fast_plan": memory.fallback is None, "fallback": memory.fallback},
        "seconds": time.perf_counter() - started,
    }

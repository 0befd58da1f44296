"""`insitu mcu import`: a model (an ONNX file or a built-in name) as the MCU path sees it: its int8
graph (layers, MACs, parameters) and its memory on a board, planned by the training compiler for
inference and for a sparse-update scheme on a task, against the board's heap (the check a
training run makes before flashing, :func:`insitu.mcu.board_runs.check_fits`)."""

from __future__ import annotations

from insitu.boards import get_board
from insitu.errors import UsageError
from insitu.mcu.board_runs import (HEAP_MARGIN, Prepared, check_fits, check_scheme, default_lr_scale, default_scheme,
                                   fits_heap, predicted_heap_bytes, runtime_heap_bytes)
from insitu.sparse import DEFAULT_LR

__all__ = ["model_report"]


def model_report(model: str, task: str = "digits", board: str = "stm32f746-disco-sim", scheme: str | None = None,
                 lr: float = DEFAULT_LR, seed: int = 0) -> dict:
    """The graph of ``model`` (as imported: its own classifier) and its memory on ``board``: the
    inference program's, and the training program of ``scheme`` (default :func:`default_scheme`)
    with a new head for ``task`` (calibrated and compiled as `insitu train --algo sparse` does, at
    its default rates: ``lr`` and the classifier at 5x)."""
    from insitu.sparse.model_source import check_model
    from insitu.sparse.onnx_io import INPUT_CONVENTION
    from insitu.sparse.summary import graph_summary, inference_plan
    from insitu.sparse.tasks import check_task

    check_model(model)
    check_task(task)
    spec = get_board(board)
    if spec.mcu is None:
        raise UsageError(f"{board!r} is not a microcontroller board (e.g. stm32f746-disco-sim)")
    heap = int(spec.mcu["training_budget_bytes"])
    scheme = scheme or default_scheme(model, heap)
    check_scheme(model, scheme)
    prep = Prepared(model, task, scheme, lr, seed,        # the task's images calibrate a foreign model
                    lr_scale=default_lr_scale(model))
    graph = prep.model_graph                              # as imported: its own classifier
    compiled = prep.compiled
    infer = inference_plan(graph)
    infer_heap = infer["arena_bytes"] + runtime_heap_bytes(infer["calls"])
    try:
        check_fits(compiled, heap)
        why = None
    except UsageError as exc:
        why = str(exc)
    return {
        "model": str(model), "source": graph.meta.get("source"), "calibration": graph.meta.get("calibration"),
        "input": {"shape": list(graph.tensors[graph.input].shape), "convention": INPUT_CONVENTION},
        **graph_summary(graph),
        "board": spec.name, "heap_bytes": heap, "heap_margin": HEAP_MARGIN,
        "inference": {"arena_bytes": infer["arena_bytes"], "predicted_heap_bytes": infer_heap,
                      "fits": fits_heap(infer_heap, heap)},
        "training": {"dataset": task, "classes": prep.graph.num_classes, "scheme": compiled.scheme.to_json(),
                     "scheme_text": compiled.scheme.describe(), "arena_bytes": compiled.arena_bytes,
                     "predicted_heap_bytes": predicted_heap_bytes(compiled), "blob_bytes": len(compiled.blob),
                     "memory_plan": compiled.stats["bytes_by_kind"], "fits": why is None, "why": why},
        "fits": why is None,
    }


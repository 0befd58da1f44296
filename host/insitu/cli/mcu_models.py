"""`insitu mcu import` and `insitu mcu export`: ONNX models on the MCU path (commands of `insitu mcu`)."""

from __future__ import annotations

import click

from insitu.cli.output import console

INPUT_NOTE = ("The ONNX model takes one NCHW float input (1 or 3 channels, fixed height and width) in insitu's "
              "range: a uint8 pixel p is (p - 128) / 128.")


@click.command("import")
@click.argument("model", metavar="FILE.onnx")
@click.option("--dataset", "task", default="digits", show_default=True,
              help="The task the training memory is planned for (its classes make the new head; a model "
                   "without insitu's scales is calibrated on its training images).")
@click.option("--board", default="stm32f746-disco-sim", show_default=True,
              help="The microcontroller board whose heap the model is checked against.")
@click.option("--scheme", default=None,
              help="Sparse-update scheme of the training plan, as `insitu train --scheme` takes it "
                   "[default: bias-6, or the biases of every layer of a smaller model; the paper's networks: the "
                   "largest of their released schemes paper-49kb ... paper-148kb that fits the heap].")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
def import_command(model, task, board, scheme, as_json):
    """Import a float ONNX CNN as insitu's int8 graph and show it: its layers (op, shapes, stride,
    groups, activation), MACs and parameters, and its memory on the board as the training
    compiler plans it, for inference and for training a sparse-update scheme, against the
    board's heap.

    Operators: Conv (groups 1 or depthwise), BatchNormalization (folded), Relu, Clip(0, 6),
    Add (residual), GlobalAveragePool, Flatten/Reshape, Gemm or MatMul(+Add) as the classifier,
    Identity, Dropout. The same FILE.onnx works as --model of `insitu train --algo sparse`,
    `insitu mcu search`, `insitu mcu compare` and `insitu mcu minheap`.

    The input convention: a uint8 pixel p is (p - 128) / 128 (one NCHW float input with 1 or
    3 channels, fixed height and width); fold another normalization into the first conv.

    \b
    Example:
      insitu mcu export --model mbv2-tiny tiny.onnx
      insitu mcu import tiny.onnx --dataset digits
      insitu train --board stm32f746-disco-sim --algo sparse --model tiny.onnx --samples 100
    """
    from insitu.cli.output import emit_json, print_table, report
    from insitu.mcu.model_report import model_report

    result = model_report(model, task, board, scheme)
    if as_json:
        emit_json(result)
        return
    from rich.table import Table

    src = result["source"] or {}
    t = Table(title=f"{model}: input {tuple(result['input']['shape'])}, {result['classes']} classes"
                    + (f" (sha256 {src['sha256'][:12]})" if src else ""))
    for col in ("layer", "op", "in", "out", "k", "stride", "groups", "act", "MACs", "params"):
        t.add_column(col, justify="left" if col in ("layer", "op", "in", "act") else "right")
    for r in result["layers"]:
        t.add_row(r["name"], r["op"], " + ".join("x".join(map(str, s)) for s in r["inputs"]),
                  "x".join(map(str, r["out"])), str(r.get("kernel", "")), str(r.get("stride", "")),
                  str(r.get("groups", "")), r.get("act", ""), f"{r['macs']:,}", f"{r['params']:,}")
    print_table(t)
    inf, tr = result["inference"], result["training"]
    cal = result["calibration"]
    report.print(f"{result['macs']:,} MACs a forward, {result['params']:,} parameters "
                 f"({result['parameter_bytes']:,} B as int8 weights and int32 biases)", soft_wrap=True)
    if cal:
        how = cal.get("from") or f"calibrated on {cal['samples']} {task} training images"
        report.print(f"activation scales: {how}", soft_wrap=True)
    report.print(f"{result['board']} heap {result['heap_bytes']:,} B (a {result['heap_margin']:.0%} margin kept):",
                 soft_wrap=True)
    report.print(f"  inference: arena {inf['arena_bytes']:,} B, heap needed {inf['predicted_heap_bytes']:,} B: "
                 f"{'fits' if inf['fits'] else 'does not fit'}", soft_wrap=True)
    report.print(f"  training {tr['scheme_text']} on {task} ({tr['classes']} classes, a new head): arena "
                 f"{tr['arena_bytes']:,} B, heap needed {tr['predicted_heap_bytes']:,} B: "
                 f"{'fits' if tr['fits'] else 'does not fit'}", soft_wrap=True)
    if tr["why"]:
        console.print(f"[yellow]{tr['why']}[/]", soft_wrap=True)
    report.print(INPUT_NOTE, soft_wrap=True)


@click.command("export")
@click.argument("out", metavar="OUT.onnx", type=click.Path(dir_okay=False))
@click.option("--model", default="mbv2-28", show_default=True,
              help="The model whose int8 graph is written: a built-in one (pretrained once, cached) or an ONNX "
                   "file (then written with insitu's scales, calibrated on --dataset if it has none).")
@click.option("--dataset", "task", default="digits", show_default=True,
              help="Calibration images for an ONNX --model without insitu's scales.")
@click.option("--json", "as_json", is_flag=True, help="Print {path, model, sha256, bytes, digest} as JSON.")
def export_command(out, model, task, as_json):
    """Write a model's int8 graph as a float ONNX model (Conv, Relu/Clip, Add, GlobalAveragePool,
    Flatten, Gemm; opset 13), its activation and weight scales in the file's metadata, so that
    `insitu mcu import OUT.onnx` and `--model OUT.onnx` give back the identical int8 graph.

    \b
    Example:
      insitu mcu export --model mbv2-28 mbv2-28.onnx
      python -c "import onnxruntime as ort; print(ort.InferenceSession('mbv2-28.onnx').get_inputs())"
    """
    from insitu.cli.output import emit_json, report
    from insitu.io import check_writable
    from insitu.sparse.contributions import graph_digest
    from insitu.sparse.model_source import (calibration_images, check_model, is_model_file, model_graph,
                                            model_input_shape)
    from insitu.sparse.onnx_io import export_onnx, file_sha256

    check_model(model)
    check_writable(out, "OUT.onnx")
    calib = None
    if is_model_file(model):
        from insitu.sparse.tasks import check_task, load_task

        check_task(task)
        channels, height, _ = model_input_shape(model)
        calib = calibration_images(load_task(task, height, channels)[0])
    graph = model_graph(model, calib)
    path = export_onnx(graph, out)
    result = {"path": str(path), "model": model, "sha256": file_sha256(path), "bytes": path.stat().st_size,
              "digest": graph_digest(graph)}
    if as_json:
        emit_json(result)
        return
    report.print(f"{model} written to {path} ({result['bytes']:,} B, sha256 {result['sha256'][:12]}): "
                 f"insitu mcu import {path}", soft_wrap=True)

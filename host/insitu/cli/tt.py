"""`insitu tt`: tensor-train training (the TT paper's FashionMNIST experiment) and its PE schedule."""

from __future__ import annotations

import contextlib
import re

import click

from insitu.cli.options import option, resolve_config, run_folder, run_options
from insitu.cli.output import (emit_json, per_run_path, progress, report, usage_errors,
                               write_json)
from insitu.checks import check_int
from insitu.errors import UsageError
from insitu.io import check_writable
from insitu.tt.experiment import VARIANTS


@click.group("tt")
def command():
    """Tensor-train training with a rank-adaptive prior and 4-bit factors.

    \b
    Examples:
      insitu tt train --variant fixed-prior --epochs 10 --json
      insitu tt train --variant all --epochs 10 --plot tt.png --out tt.json
      insitu tt train --dataset folder:my-images --input-size 20x20 --epochs 5   # your images
      insitu tt report fixed.json fixed-prior.json --plot tt.png
      insitu tt schedule --batch-size 64
    """


def tt_shape_options(prefix: str = ""):
    """``--tt-modes`` and ``--input-size``: the TT network's shape for the dataset (docs/tt.md),
    options of `insitu tt train` and `insitu train --algo tt` (``prefix``: ``"tt: "`` there)."""
    def decorate(fn):
        fn = click.option("--input-size", default=None, metavar="HxW[xC]",
                          help=f"{prefix}bring the images to HxW first (C: 1 grey, 3 RGB; default: as "
                               "they are) by the data's one resampling rule; images are resized only "
                               "when asked.")(fn)
        return click.option("--tt-modes", default=None, metavar="I1,...,Id",
                            help=f"{prefix}the first TT layer's input modes (paper: 4, tiny: 3; the "
                                 "last 16, the PEs' lanes). Default: the most balanced that fit the "
                                 "PEs.")(fn)
    return decorate


def parse_shape_options(params: dict) -> dict:
    """``{"tt_modes": ..., "input_size": ...}`` parsed from the options' text (exit 2 if bad)."""
    from insitu.tt.network import parse_input_size, parse_modes

    return {name: None if params[name] is None else usage_errors(parse, params[name])
            for name, parse in (("tt_modes", parse_modes), ("input_size", parse_input_size))}


def _int_list(text: str, option: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UsageError(f"{option} takes comma-separated integers, got {text!r}") from None


@command.command("train")
@click.option("--variant", type=click.Choice([*VARIANTS, "all"]), default="fixed-prior",
              show_default=True, help="dense: vanilla float network; float/fixed: TT cores in float "
              "or 4-bit fixed point; -prior: with the rank-adaptive prior (all: the five).")
@click.option("--epochs", type=int, default=10, show_default=True)
@click.option("--batch-size", type=int, default=64, show_default=True)
@click.option("--lr", type=float, default=1e-3, show_default=True, help="Adam learning rate.")
@click.option("--lr-schedule", type=click.Choice(["cosine", "constant"]), default="cosine",
              show_default=True, help="cosine: anneal the learning rate to 0 over the epochs.")
@click.option("--rank", type=int, default=16, show_default=True, help="Initial TT rank.")
@click.option("--prune-threshold", type=float, default=0.01, show_default=True,
              help="Prune a rank slice whose lambda is below this fraction of its core's largest.")
@click.option("--prior-weight", type=float, default=5.0, show_default=True,
              help="Multiplier of the prior term g / N (5 is tuned for 60,000 samples: lower it "
                   "on small datasets, docs/tt.md).")
@option("--train-size", "train_size", aliases=("--train-samples",), type=int, default=None,
        help="Train on a subset of this many samples of the training set (default: all).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--dataset", default="fashion-mnist", show_default=True,
              help="Dataset (see `insitu data list`), or your files: folder:DIR, npz:FILE, csv:FILE.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder with the dataset's IDX files.")
@tt_shape_options()
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of accuracy and TT ranks per epoch.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the result JSON.")
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="Checkpoint (.npz) written after every epoch and resumed from if it exists; "
                   "with --variant all, one file per variant.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@run_options
@click.pass_context
def train(ctx, **_):
    """Train the two-layer TT network on FashionMNIST (the paper's Table 1), or any dataset.

    The network's tensor modes follow the dataset (docs/tt.md): a shape the PEs cannot take is
    refused before training, naming the limit.

    Options also come from a --config TOML file and KEY=VALUE arguments; --run-dir keeps the run
    (config, result, curve, checkpoints, plot) for `insitu runs compare`.
    """
    from insitu.tt.experiment import TTTrainConfig, prepare_data
    from insitu.tt.report import format_table

    resolve_config(ctx)
    p = ctx.params
    variant, epochs, train_size, plot, out, checkpoint = (p["variant"], p["epochs"], p["train_size"],
                                                          p["plot"], p["out"], p["checkpoint"])
    folder = run_folder(ctx, "insitu tt train")
    if folder is not None:
        checkpoint = checkpoint or str(folder.checkpoint)
        plot = plot or str(folder.file("plot.png"))

    variants = list(VARIANTS) if variant == "all" else [variant]
    configs = [TTTrainConfig(variant=v, epochs=epochs, batch_size=p["batch_size"], lr=p["lr"],
                             lr_schedule=p["lr_schedule"], rank=p["rank"],
                             prune_threshold=p["prune_threshold"], prior_weight=p["prior_weight"],
                             train_samples=train_size, seed=p["seed"], dataset=p["dataset"],
                             data_dir=p["data_dir"], **parse_shape_options(p)) for v in variants]
    datasets = [usage_errors(prepare_data, config)[0] for config in configs]
    for path, what in ((plot, "--plot"), (out, "--out"), (checkpoint, "--checkpoint")):
        if path:
            check_writable(path, what, plot=what == "--plot")     # before the training (exit 2)
    if folder is not None and folder.complete:
        payload = folder.already_complete()
        results = payload["results"] if "results" in payload else [payload]
        if p["plot"]:                         # a figure asked now: drawn from the kept results
            from insitu.tt.report import plot_history
            plot_history(results, p["plot"])
    else:
        payload = _train_variants(configs, datasets, epochs, train_size, checkpoint, plot, folder)
        results = payload["results"] if "results" in payload else [payload]

    if out:
        write_json(out, payload, "--out")
    if p["as_json"]:
        emit_json(payload)
    else:
        click.echo(format_table(results))


def _train_variants(configs, datasets, epochs, train_size, checkpoint, plot, folder) -> dict:
    """Train each variant; the result is kept in the run folder before the figure is drawn, so a
    figure that fails loses nothing."""
    from insitu.harness import say
    from insitu.runs import summary_row
    from insitu.tt.experiment import run_tt_training
    from insitu.tt.report import plot_history

    results = []
    with (folder.running() if folder else contextlib.nullcontext()):
        for config, data in zip(configs, datasets):
            total = epochs * (train_size or len(data.y_train))
            with progress(f"tt {config.variant}", total=total) as advance:
                results.append(run_tt_training(config, advance=advance, say=say,
                                               checkpoint=per_run_path(checkpoint, config.variant,
                                                                       several=len(configs) > 1)))
        payload = results[0] if len(results) == 1 else {"results": results}
        rows = [summary_row(r["variant"], r) for r in results]
        if folder:
            folder.finish(payload, rows)
    if plot:
        plot_history(results, plot)
        if folder:
            folder.finish(payload, rows)
    return payload


def _is_result(run) -> bool:
    from insitu.tt.report import PAPER_TABLE1

    keys = ("variant", "history", "train_accuracy", "test_accuracy", "parameters", "memory_bits",
            "memory_reduction", "epochs", "seconds")
    return isinstance(run, dict) and all(k in run for k in keys) and run["variant"] in PAPER_TABLE1


@command.command("report")
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write one PNG of accuracy and TT ranks per epoch for all the runs.")
def report_cmd(results, plot):
    """Table 1 from result files of `insitu tt train --out` (variants run separately, in parallel)."""
    import json

    from insitu.tt.report import format_table, plot_history

    runs = []
    for path in results:
        try:
            with open(path) as fh:
                payload = json.load(fh)
        except (OSError, json.JSONDecodeError) as exc:
            raise UsageError(f"cannot read result {path}: {exc}") from None
        found = payload.get("results", [payload]) if isinstance(payload, dict) else None
        if not found or not all(_is_result(r) for r in found):
            raise UsageError(f"{path} is not a result of `insitu tt train --out`")
        runs += found
    if plot:
        check_writable(plot, "--plot", plot=True)
        plot_history(runs, plot)
    click.echo(format_table(runs))


@command.command("schedule")
@click.option("--in-modes", default="7,4,2,16", show_default=True)
@click.option("--out-modes", default="4,4,2,16", show_default=True)
@click.option("--ranks", default="16", show_default=True,
              help="One rank for every internal rank, or the d-1 internal ranks.")
@option("--batch-size", "batch", aliases=("--batch",), type=int, default=1, show_default=True)
@click.option("--first-layer/--not-first-layer", default=True, show_default=True,
              help="A first layer needs no input gradient.")
@click.option("--json", "as_json", is_flag=True, help="Print the ops as JSON.")
def schedule(in_modes, out_modes, ranks, batch, first_layer, as_json):
    """The PE1/PE2/PE3 ops of one training step of a TT layer, with sizes and MACs."""
    from insitu.tt.schedule import layer_schedule, macs_by_kind

    rank_list = _int_list(ranks, "--ranks")
    check_int("--batch-size", batch)
    try:
        ops = layer_schedule(_int_list(in_modes, "--in-modes"), _int_list(out_modes, "--out-modes"),
                             rank_list[0] if len(rank_list) == 1 else rank_list, batch,
                             input_grad=not first_layer)
    except ValueError as exc:            # the schedule names its arguments; say the options
        message = re.sub(r"\b(in|out)_modes\b", r"--\1-modes", str(exc))
        raise UsageError(re.sub(r"^(TT )?ranks\b", "--ranks", message)) from None
    if as_json:
        emit_json({"ops": [op.describe() for op in ops], "macs_by_kind": macs_by_kind(ops),
                   "macs": sum(op.macs for op in ops)})
        return
    for op in ops:
        click.echo(str(op))
    totals = macs_by_kind(ops)
    report.print("MACs: " + ", ".join(f"{k} {v:,}" for k, v in totals.items())
                 + f", total {sum(totals.values()):,}")


@command.command("bench")
@option("--batch-size", "batch", aliases=("--batch",), type=int, default=64, show_default=True)
@click.option("--steps", type=int, default=5, show_default=True, help="Steps per timed pass.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
def bench(batch, steps, as_json):
    """Training samples per second of the float and fixed-point executors, MACs per sample."""
    from insitu.tt.bench import format_bench, run_bench
    from insitu.tt.experiment import TTTrainConfig
    from insitu.tt.network import tt_shape

    check_int("--steps", steps)
    usage_errors(TTTrainConfig(variant="fixed", batch_size=batch).validate)
    usage_errors(tt_shape, (28, 28), 10, batch=batch)          # the paper's network fits the PEs
    result = run_bench(batch=batch, steps=steps)
    if as_json:
        emit_json(result)
    else:
        click.echo(format_bench(result))

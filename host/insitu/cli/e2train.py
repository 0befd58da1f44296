"""`insitu e2train`: E²-Train (SMD, SLU, PSG) against 32-bit SGD on a small ResNet."""

from __future__ import annotations

import contextlib
from pathlib import Path

import click

from insitu.cli.options import option, resolve_config, run_folder, run_options
from insitu.cli.output import console, emit_json, print_table, progress, usage_errors
from insitu.cli.power import measured, meter_options
from insitu.errors import UsageError


@click.group("e2train")
def command():
    """E²-Train: energy-efficient training by stochastic mini-batch dropping (SMD), selective
    layer update (SLU) and predictive sign gradients (PSG), compared with 32-bit float SGD.

    \b
    Examples:
      insitu e2train run --techniques smd,slu,psg --epochs 6 --json
      insitu e2train run --ablation --epochs 6 --out-dir e2 --plot e2/accuracy_energy.png
      insitu e2train run --techniques psg --meter synthetic:sine --power-out e2/power.csv
      insitu e2train run --dataset folder:my_images --train-size 800 --test-samples 200
    """


def _fmt(value, spec=".3f", scale=1.0):
    return "-" if value is None else format(scale * value, spec)


@command.command("run")
@click.option("--techniques", default="smd,slu,psg", show_default=True,
              help="Comma-separated E2-Train techniques of the row to train: smd, slu, psg "
                   "('none': the baseline only). The 32-bit SGD baseline always runs too.")
@click.option("--ablation", is_flag=True,
              help="Train every technique alone and all three (the paper's Fig. 4 / Tables 2-3 rows) "
                   "instead of --techniques.")
@click.option("--epochs", type=int, default=6, show_default=True,
              help="Epochs of the baseline and of the rows without SMD (see --smd-energy-ratio).")
@click.option("--batch-size", type=int, default=64, show_default=True)
@option("--train-size", "train_size", aliases=("--train-samples",), type=int, default=10000,
        show_default=True, help="Training images used (a fixed random subset of the dataset).")
@click.option("--test-samples", type=int, default=2000, show_default=True,
              help="Test images scoring every row (a fixed random subset).")
@click.option("--lr", type=float, default=0.1, show_default=True,
              help="SGD learning rate (baseline, SMD, SLU).")
@click.option("--psg-lr", type=float, default=0.01, show_default=True,
              help="SignSGD learning rate (rows with PSG).")
@click.option("--smd-p", type=float, default=0.5, show_default=True,
              help="SMD: the probability that a mini-batch is dropped, in [0, 1].")
@click.option("--smd-energy-ratio", type=float, default=2 / 3, show_default="0.67",
              help="SMD: its training budget as a fraction of the baseline's batches; SMD rows run "
                   "epochs * ratio / (1 - p) epochs (the paper: 0.67). 1 - p keeps the epochs.")
@click.option("--beta", type=float, default=0.05, show_default=True,
              help="PSG: adaptive threshold ratio, in (0, 1); tau = beta * max |g_msb| per layer.")
@click.option("--slu-alpha", type=float, default=2.0, show_default=True,
              help="SLU: weight of the FLOP regulariser (eq. 1): how hard the gates are pushed "
                   "towards --slu-target.")
@click.option("--slu-target", type=float, default=0.4, show_default=True,
              help="SLU: the fraction of gated-block MACs to skip, in [0, 1] (the gates learn which).")
@click.option("--width", type=int, default=8, show_default=True, help="Channels of the first ResNet stage.")
@click.option("--blocks-per-stage", type=int, default=2, show_default=True,
              help="Residual blocks per stage (ResNet-(6n+2)).")
@click.option("--downsample", type=int, default=2, show_default=True,
              help="Average-pool the images by this factor before the ResNet (2: 28x28 -> 14x14, "
                   "4x cheaper; 1 keeps small images whole).")
@click.option("--dataset", default="fashion-mnist", show_default=True,
              help="Images: a built-in dataset (see `insitu data list`) or your files, folder:DIR or "
                   "npz:FILE; RGB images are 3 input channels.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder with a built-in dataset's IDX files (MNIST needs one).")
@click.option("--seed", type=int, default=0, show_default=True)
@option("--out-dir", "out_dir", aliases=("--out",), type=click.Path(file_okay=False, path_type=Path),
        default=None, help="Folder for e2train.json and rows/<row>-<key>.json (+ .npz weights); finished rows "
                   "are reused by any run with the same settings for them, and the row in progress "
                   "keeps a checkpoint there (Ctrl-C, then the same command resumes it).")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG: accuracy vs estimated energy per row, and test accuracy vs "
                   "cumulative energy over training.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@meter_options
@run_options
@click.pass_context
def run(ctx, **_):
    """Train the 32-bit SGD baseline and E2-Train rows on a small ResNet; print accuracy,
    baseline accuracy, computational saving (counted MACs) and energy saving (estimated from a
    bit-width-aware per-operation energy table; measured too with --meter).

    Options also come from a --config TOML file and KEY=VALUE arguments; --run-dir keeps the run
    (config, result, one curve per row, rows, plot, power trace) for `insitu runs compare`.
    """
    from insitu.e2train import experiment
    from insitu.runs import summary_row

    resolve_config(ctx)
    p = ctx.params
    (techniques, ablation, epochs, batch_size, train_size, test_samples, lr, psg_lr, smd_p,
     smd_energy_ratio, beta, slu_alpha, slu_target, width, blocks_per_stage, downsample, dataset,
     data_dir, seed, out_dir, plot, as_json, meter, power_out) = (p[k] for k in (
        "techniques", "ablation", "epochs", "batch_size", "train_size", "test_samples", "lr", "psg_lr",
        "smd_p", "smd_energy_ratio", "beta", "slu_alpha", "slu_target", "width", "blocks_per_stage",
        "downsample", "dataset", "data_dir", "seed", "out_dir", "plot", "as_json", "meter",
        "power_out"))
    folder = run_folder(ctx, "insitu e2train run")
    if folder is not None:
        out_dir = Path(out_dir) if out_dir else folder.path
        plot = plot or folder.file("plot.png")

    rows = list(experiment.ABLATION_ROWS) if ablation else []
    if not ablation and techniques.strip().lower() not in ("none", ""):
        rows = [usage_errors(experiment.parse_techniques, techniques)]
    config = usage_errors(experiment.E2Config, epochs=epochs, batch_size=batch_size,
                          train_samples=train_size, test_samples=test_samples, lr=lr, psg_lr=psg_lr,
                          smd_p=smd_p, smd_energy_ratio=smd_energy_ratio, beta=beta, slu_alpha=slu_alpha,
                          slu_target=slu_target, width=width, blocks_per_stage=blocks_per_stage,
                          downsample=downsample, dataset=dataset, data_dir=data_dir, seed=seed)
    if "slu" in {t for r in rows for t in r} and blocks_per_stage < 1:
        raise UsageError("SLU gates residual blocks, and a ResNet with --blocks-per-stage 0 has none; "
                         "use --blocks-per-stage 1 or more, or leave slu out of --techniques")
    from insitu.io import check_writable

    if plot:
        check_writable(plot, "--plot", plot=True)             # before the training (exit 2)
    if folder is not None and folder.complete:
        result = folder.already_complete()
        if as_json:
            emit_json(result)
        else:
            _print_table(result)
        return
    if out_dir:
        check_writable(Path(out_dir) / "e2train.json", "--out-dir")
    data = usage_errors(experiment.load_data, config)         # a dataset it cannot take: exit 2

    def work():
        total = experiment.total_samples(config, rows)
        with progress("e2train", total=total, enabled=not as_json) as advance:
            return usage_errors(experiment.run_experiment, config, rows, out_dir, advance,
                                log=lambda msg: console.print(f"[yellow]{msg}[/]"), data=data)

    with (folder.running() if folder else contextlib.nullcontext()):
        summary = measured(meter, power_out, work, run_dir=folder.path if folder else None)
        _attach_measured(summary)
        headline = summary["rows"][-1]
        result = {"row": headline["row"], "accuracy": headline["accuracy"],
                  "baseline_accuracy": summary["baseline_accuracy"],
                  "computational_saving": headline["computational_saving"],
                  "energy_saving": headline["energy_saving"],
                  "measured_energy_saving": headline.get("measured_energy_saving"),
                  **{k: summary[k] for k in ("rows", "config")}}
        if "power" in summary:
            result["power"] = summary["power"]
        summary_rows = [summary_row(r["row"], r) for r in summary["rows"]]
        if folder:
            folder.finish(result, summary_rows)
    if plot:               # drawn once the result is kept: a figure that fails loses nothing
        from insitu.e2train.plot import plot_experiment
        plot_experiment(summary, plot)
        result["plot"] = str(plot)
        if folder:
            folder.finish(result, summary_rows)
    if as_json:
        emit_json(result)
        return
    _print_table(summary)


def _attach_measured(summary: dict) -> None:
    """Measured energy per row from the meter's phases (rows reused from --out-dir were not measured)."""
    by_phase = summary.get("power", {}).get("by_phase", {})
    base = by_phase.get("sgd32", {}).get("energy_j")
    for row in summary["rows"]:
        measured_j = by_phase.get(row["row"], {}).get("energy_j")
        row["measured_energy_j"] = measured_j
        row["measured_energy_saving"] = (1 - measured_j / base) if measured_j is not None and base else None


def _print_table(summary: dict) -> None:
    from rich.table import Table

    cfg = summary["config"]
    table = Table(title=f"E2-Train vs 32-bit SGD: ResNet-{6 * cfg['blocks_per_stage'] + 2} "
                        f"(width {cfg['width']}) on {cfg['dataset']}, {cfg['epochs']} epochs")
    for col in ("row", "acc. %", "loss pts", "comp. sav. %", "energy sav. %", "est. J", "meas. sav. %",
                "PSG pred.", "SLU skip", "epochs", "dropped", "s"):
        table.add_column(col, justify="left" if col == "row" else "right")
    for r in summary["rows"]:
        table.add_row(r["row"], _fmt(r["accuracy"], ".2f", 100), _fmt(r["accuracy_loss"], "+.2f", 100),
                      _fmt(r["computational_saving"], ".1f", 100), _fmt(r["energy_saving"], ".1f", 100),
                      _fmt(r["energy_j"], ".3g"), _fmt(r.get("measured_energy_saving"), ".1f", 100),
                      _fmt(r["psg_predicted_fraction"], ".2f"), _fmt(r["slu_skip_ratio"], ".2f"),
                      str(r["epochs"]), f"{r['dropped_batches']}/{r['batches']}", f"{r['train_seconds']:.0f}")
    print_table(table)

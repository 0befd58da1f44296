"""`insitu train`: on-device training on a board or its simulated twin."""

from __future__ import annotations

import contextlib
import dataclasses

import click

from insitu.cli.options import check_outputs, resolve_config, run_folder, run_options
from insitu.cli.output import emit_json, progress, report, write_json
from insitu.cli.power import measured, meter_options
from insitu.cli.tt import parse_shape_options, tt_shape_options
from insitu.training import ALGORITHMS, TrainConfig, applies, prepare, train


def checked_config(ctx: click.Context) -> tuple[TrainConfig, set[str]]:
    """The run's config from the parsed options, with the algorithm's defaults filled in, and the
    names the user set; checked before any work (data, pre-training, a board, a meter): the
    options apply and are sound. `insitu deploy` runs the same checks on a bundle's train
    arguments."""
    given = resolve_config(ctx)
    params = ctx.params
    if params["heap"] is not None:
        from insitu.checks import parse_size

        params["heap"] = parse_size(params["heap"])
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    # --tt-modes and --input-size stay text in the params (a run folder's config.toml keeps them so)
    config = TrainConfig(**{**{k: v for k, v in params.items() if k in fields}, **parse_shape_options(params)})
    config, _ = prepare(config, given)
    return config, given


def resolved_defaults(ctx: click.Context, config: TrainConfig) -> dict:
    """The values the algorithm chose for the options left at their default (None, or empty for a
    repeatable option such as sparse's --lr-scale): a run folder's config holds what ran
    (``lr 0.05``), so the same run asked explicitly is the same."""
    return {k: getattr(config, k) for k, v in ctx.params.items()
            if v in (None, ()) and getattr(config, k, None) not in (None, ())}


def _algo_help() -> str:
    return "; ".join(f"{a.name}: {a.summary}" for a in ALGORITHMS.values())


@click.command("train")
@click.option("--board", default=TrainConfig.board, show_default=True,
              help="Board or simulated twin (see `insitu boards`).")
@click.option("--algo", default=TrainConfig.algo, show_default=True,
              help=f"Training algorithm. {_algo_help()}.")
@click.option("--dataset", default=None,
              help="Dataset (see `insitu data list`), or your files: folder:DIR (a sub-folder of "
                   "images per class), npz:FILE, csv:FILE (docs/own-data.md); sparse: also the "
                   "adaptation task fashion-shift. Default: fashion-mnist, sparse: digits.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help="Folder with the dataset's IDX files (default: where Debian installs it).")
@click.option("--model", default=None,
              help="Network: sgd: mlp (default), cnn; tt: paper (default), tiny; lrt: cnn (default), mlp; "
                   "sparse: mbv2-28 (default), mbv2-tiny, the Tiny Training paper's 128x128 RGB mbv2-w0.35, "
                   "proxyless-w0.3, mcunet-5fps, or your FILE.onnx (`insitu mcu import`).")
@click.option("--samples", type=int, default=TrainConfig.samples, show_default=True,
              help="Training samples to stream (60000 is one FashionMNIST epoch).")
@click.option("--batch-size", type=int, default=None,
              help="Samples per step (default: sgd 32, tt 64, lrt 100 per weight update).")
@click.option("--lr", type=float, default=None, help="Learning rate (default: the algorithm's).")
@click.option("--seed", type=int, default=TrainConfig.seed, show_default=True)
@click.option("--checkpoint", type=click.Path(dir_okay=False), default=None,
              help="Checkpoint file: resumed from if it exists, rewritten atomically as training goes.")
@click.option("--checkpoint-every", type=int, default=TrainConfig.checkpoint_every, show_default=True,
              help="Samples between checkpoints.")
@click.option("--mode", type=click.Choice(["fast", "rtl", "rtl-amaranth"]), default=TrainConfig.mode,
              show_default=True,
              help="FPGA twins: serve the accelerator from the bit-exact functional model (fast), from "
                   "its RTL compiled with Verilator (rtl: exact cycles, ~300k cycles/s, about a minute "
                   "per batch-64 step of the paper network; built once, ~1 min, cached), or from its "
                   "RTL in Amaranth's simulator (rtl-amaranth: the reference, ~1500 cycles/s; use "
                   "--model tiny).")
@click.option("--bitstream", type=click.Path(dir_okay=False), default=None,
              help="Real FPGA boards: the overlay .bit (its .hwh beside it).")
@click.option("--rank", type=int, default=None, help="tt: TT rank (paper 16, tiny 4); lrt: SKS rank (4).")
@tt_shape_options("tt: ")
@click.option("--prior-weight", type=float, default=None,
              help="tt: the multiplier of the rank-adaptive prior g/N (default 5, tuned for 60,000 "
                   "samples; lower it on small datasets, docs/tt.md).")
@click.option("--env", type=click.Choice(["control", "shift"]), default=TrainConfig.env, show_default=True,
              help="lrt: the online environment (docs/lrt.md).")
@click.option("--test-samples", type=int, default=None,
              help="tt/lrt/sparse: test samples to evaluate (default: tt all, lrt 1000, sparse 200).")
@click.option("--scheme", default=None,
              help="sparse: the update scheme: bias-K, last-K, classifier, full, paper-BUDGET (the paper's "
                   'networks: its released schemes, paper-49kb ... paper-148kb), or JSON '
                   '{"bias_k": K, "weights": {"layer": ratio}} (default bias-6, or the biases of every layer '
                   "of a model with fewer; the paper's networks: the largest released scheme that fits the heap).")
@click.option("--port", default=None,
              help="sparse: the board's serial port (a real board, or a twin from `insitu mcu emulate`).")
@click.option("--flash-dir", type=click.Path(file_okay=False), default=None,
              help="sparse on a twin: the twin's flash folder (kept: a rerun resumes from the device's "
                   "checkpoint; default: a temporary folder).")
@click.option("--heap", default=None,
              help="sparse on a twin: its heap, bytes or with K/M (default: the board's training budget, 256K).")
@click.option("--twin", type=click.Choice(["qemu", "unix"]), default=None,
              help="sparse on a -sim board: the twin started: qemu, MicroPython on an emulated "
                   "Cortex-M7 (default; 32-bit, the board's heap), or unix, the MicroPython unix port "
                   "(faster, 64-bit).")
@click.option("--lr-scale", "lr_scale", multiple=True, metavar="LAYER=FACTOR",
              help="sparse: a layer's learning rate as a factor on --lr, repeatable (--lr-scale "
                   "classifier=5: the new head 5x); a layer the model does not have is refused with "
                   "the list of its layers. Default: the classifier (the model's last layer) 5x; "
                   "given, it replaces the default.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Also write the result JSON here.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Draw the run's curve (loss, train and test accuracy against samples) as a PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@meter_options
@run_options
@click.pass_context
def command(ctx, board, algo, dataset, data_dir, model, samples, batch_size, lr, seed, checkpoint,
            checkpoint_every, mode, bitstream, rank, env, test_samples, scheme, port, flash_dir, heap,
            twin, lr_scale, out, plot, as_json, meter, power_out, config, run_dir, overrides,
            tt_modes, input_size, prior_weight):
    """Train a network on a board, or on its simulated twin (the default, ultra96v2-sim).

    The result has a curve (loss and accuracy at regular points); options come from the command
    line, a --config TOML file and KEY=VALUE arguments; --run-dir keeps everything of the run.

    \b
    Examples:
      insitu train --samples 6000 --json
      insitu train --board ultra96v2-sim --dataset digits --model cnn
      insitu train --dataset folder:my-images --model cnn --samples 2000   # your own images
      insitu train --checkpoint run.ckpt.npz     # interrupt it, run again: it resumes
      insitu train --run-dir runs/a lr=0.1 --plot a.png     # a run folder; insitu runs compare
      insitu train --config runs/a/config.toml seed=1 --run-dir runs/b
      insitu train --algo tt --samples 6000 --json             # TT training on the twin's PEs
      insitu train --algo tt --mode rtl --samples 64 --json     # one step on the compiled RTL
      insitu train --algo tt --dataset folder:my-images --input-size 20x20 --samples 6000
      insitu train --algo tt --model tiny --mode rtl-amaranth --samples 4 --batch-size 4 --test-samples 8
      insitu train --algo lrt --env shift --samples 2000 --json
      insitu train --board ultra96v2 --bitstream insitu_ultra96v2.bit --algo tt   # on the board
      insitu train --board stm32f746-disco-sim --algo sparse --samples 500 --json   # MCU twin
      insitu train --board stm32f746-disco-sim --algo sparse --twin unix            # faster twin
      insitu train --board stm32f746-disco --port /dev/ttyACM0 --algo sparse --scheme bias-6
    """
    config, given = checked_config(ctx)
    params = ctx.params
    check_outputs(ctx, "out", "plot", "checkpoint", "power_out")
    folder = run_folder(ctx, "insitu train", lambda name: applies(config, name),
                        resolved=resolved_defaults(ctx, config))
    if folder is not None and folder.complete:
        result = folder.already_complete()
    else:
        if folder is not None and config.checkpoint is None and applies(config, "checkpoint"):
            config = dataclasses.replace(config, checkpoint=str(folder.checkpoint))
        with (folder.running() if folder else contextlib.nullcontext()):
            with progress(f"training on {config.board}", total=config.samples) as advance:
                # meter and power_out may come from --config or KEY=VALUE: read the resolved values.
                result = measured(params["meter"], params["power_out"],
                                  lambda: train(config, advance, given),
                                  run_dir=folder.path if folder else None)
            if folder:
                folder.finish(result)
        # The result is kept before the figure is drawn: a figure that fails loses nothing.
        if folder:
            draw_curve(result, folder.file("plot.png"), config)
            folder.finish(result)
    if out:
        write_json(out, result, "--out")
    if plot:                        # after --out is written; then --out names the figure too
        draw_curve(result, plot, config)
        if out:
            write_json(out, result, "--out")
    if as_json:
        emit_json(result)
    if not as_json:
        line = (f"[bold]{result['board']}[/] {result['algo']}: {result['samples']} samples in "
                f"{result['seconds']:.1f} s, test accuracy [green]{result['accuracy']:.4f}[/]")
        if "pl_cycles" in result:
            line += (f"; accelerator {result['pl_cycles']:,} cycles "
                     f"({result['seconds_at_board_clock']:.4f} s at its clock), "
                     f"energy {result['energy_j']:.4g} J ({result['energy']['source']})")
        if "peak_heap_bytes" in result:
            line += (f"; before {result['accuracy_before']}, host simulation "
                     f"{result['host_sim_accuracy_after']:.4f}; heap peak {result['peak_heap_bytes']:,} B "
                     f"(planned arena {result['planned_peak_bytes']:,} B); {result['code']} kernels")
            if result.get("board_time"):
                from insitu.mcu.board_time import describe

                line += f"; {describe(result['board_time'])}"
        if "max_writes_per_cell" in result:
            line += f"; at most {result['max_writes_per_cell']} writes per cell"
        report.print(line)


def draw_curve(result: dict, path, config: TrainConfig) -> None:
    """Draw the result's curve into ``path`` and name the figure in the result."""
    from insitu.runs import plot_curves

    result["plot"] = str(plot_curves({config.algo: result.get("curve", [])}, path,
                                     title=f"insitu train --algo {config.algo} on {config.board}"))

"""`insitu mcu`: the microcontroller's tools; `insitu mcu emulate` runs a simulated board."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path

import click

from insitu.cli.options import option
from insitu.cli.output import console
from insitu.errors import InsituError, UsageError
from insitu.resources import cache_dir
from insitu.sparse import DEFAULT_LR


def default_flash_dir(board: str) -> Path:
    """Where a twin keeps its flash between runs, like a board's flash across power cycles."""
    return cache_dir(board, "flash")



def _search_bundle(model: str, task: str, lr: float, seed: int):
    """What the scheme search and the comparison train on: the model's new head for the task and
    its samples, prepared as `insitu train --algo sparse` prepares them, in its sample order."""
    from insitu.mcu.board_runs import Prepared
    from insitu.sparse.contributions import Bundle
    from insitu.training import sample_order

    return Bundle.from_prepared(Prepared(model, task, "classifier", lr, seed), lr, sample_order)

#: --model of the commands that train: a built-in name or an ONNX file.
MODEL_HELP = ("The model: a built-in pretrained one (mbv2-28, mbv2-tiny; the Tiny Training paper's 128x128 RGB "
              "mbv2-w0.35, proxyless-w0.3, mcunet-5fps) or FILE.onnx, a float CNN taking pixels p as "
              "(p - 128) / 128 (see `insitu mcu import --help`).")

#: How the contribution analysis (insitu.sparse) names its arguments, and their options here.
_ANALYSIS_NAMES = (("train samples", "--train-size"), ("eval samples", "--test-samples"),
                   ("evaluations", "--evaluations"), ("workers", "--workers"), ("lr scale", "--lr-scale"),
                   ("lr", "--lr"), ("unknown task", "--dataset: unknown task"),
                   ("unknown model", "--model: unknown model"))


def _as_options(fn, *args, **kwargs):
    """Run an analysis call; its usage errors name the options of this command (``--train-size
    must be...``, not ``train samples must be...``)."""
    try:
        return fn(*args, **kwargs)
    except UsageError as exc:
        message = str(exc)
        for name, spelled in _ANALYSIS_NAMES:
            if message.startswith(name + " "):
                message = spelled + message[len(name):]
                break
        raise UsageError(message) from None


def _check_analysis(model, dataset, train_size, test_samples, evaluations, workers, lr, lr_scale=()):
    """The analysis's options, checked before any work (exit 2, naming the option); returns the
    per-layer lr factors of ``--lr-scale`` as ``{layer: factor}`` (when not given, the default:
    the classifier at 5x, :func:`insitu.mcu.board_runs.default_lr_scale`)."""
    from insitu.checks import check_int
    from insitu.mcu.board_runs import default_lr_scale, parse_lr_scale
    from insitu.sparse.search import check_analysis_options

    _as_options(check_analysis_options, model, dataset, train_size, evaluations,
                workers if workers is not None else 1, lr)
    if test_samples is not None:
        check_int("--test-samples", test_samples)
    return parse_lr_scale(model, lr_scale) if lr_scale else default_lr_scale(model)


#: The repeatable per-layer learning-rate option of the commands that train schemes.
lr_scale_option = click.option(
    "--lr-scale", "lr_scale", multiple=True, metavar="LAYER=FACTOR",
    help="A layer's learning rate as a factor on --lr, repeatable (--lr-scale classifier=5: the new head "
         "5x); every training (the analysis's too: cached per factors) uses it. A layer the model "
         "does not have is refused with the list of its layers. Default: the classifier (the model's "
         "last layer) 5x; given, it replaces the default (classifier=1: one rate for every layer).")


@click.group("mcu")
def command():
    """Microcontroller (MicroPython) boards: simulated twins and tools.

    \b
      insitu mcu emulate            a simulated STM32F746 board on a serial port
      insitu mcu build-twin         build (once) the Cortex-M7 twin's MicroPython
      insitu mcu search             a sparse-update scheme under a memory budget
      insitu mcu minheap            the smallest heap a compiled scheme trains in
      insitu mcu compare            bias / last layers / searched schemes at equal memory (Fig. 9)
      insitu mcu import FILE.onnx   an ONNX model as the int8 graph: layers, MACs, memory on the board
      insitu mcu export OUT.onnx    a model's int8 graph as a float ONNX file (--model mbv2-28)
    """


@command.command("emulate")
@click.option("--board", default="stm32f746-disco-sim", show_default=True,
              help="The twin to run (a simulated microcontroller board).")
@click.option("--flash-dir", type=click.Path(file_okay=False),
              help="Folder that is the board's flash (kept across runs) "
                   "[default: ~/.cache/insitu/BOARD/flash].")
@click.option("--heap", help="MicroPython heap, in bytes or with K/M (256K) "
                             "[default: the board's training budget, 256K on stm32f746-disco].")
@click.option("--twin", "twin_kind", type=click.Choice(["qemu", "unix"]), default="qemu", show_default=True,
              help="qemu: MicroPython on an emulated Cortex-M7 (32-bit, single-precision floats, "
                   "flash in FLASH_DIR/insitu-flash.img); unix: the MicroPython unix port (faster, "
                   "64-bit, flash = the folder).")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON line (port, board, twin, heap_bytes, flash_dir, pid) when ready.")
def emulate(board, flash_dir, heap, twin_kind, as_json):
    """Run a simulated board on a serial port (a pseudo-terminal) with the board's heap, until
    Ctrl-C or SIGTERM: MicroPython built for an emulated Cortex-M7 (QEMU), or with --twin unix
    the MicroPython unix port.

    Use the printed port as a board's: `mpremote connect PORT ...`, `insitu flash --board
    stm32f746-disco-sim --port PORT`. Ctrl-D soft-resets it, as on a board; `kill -USR1 PID`
    presses its reset button (a hard reset: RAM lost, flash kept).

    \b
    Example:
      insitu mcu emulate --heap 320K --flash-dir ./flash
      mpremote connect PORT exec "import sys; print(sys.implementation._machine)"
    """
    from insitu.boards import get_board
    from insitu.checks import parse_size
    from insitu.mcu.twin import McuTwin

    spec = get_board(board)
    if not spec.is_twin or spec.mcu is None:
        hint = f"; use --board {board}-sim" if spec.mcu is not None else ""
        raise UsageError(f"{board!r} is not a simulated microcontroller board{hint}")
    flash_dir = Path(flash_dir) if flash_dir else default_flash_dir(board)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    twin_log = logging.getLogger("insitu.mcu.twin")
    twin_log.addHandler(handler)
    twin_log.setLevel(logging.INFO)

    stop, reset = threading.Event(), threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, lambda *_: reset.set())
    twin = McuTwin(flash_dir, parse_size(heap) if heap else None, board=board, twin=twin_kind,
                   say=lambda text: click.echo(text, err=True))
    twin.start()
    try:
        if as_json:
            click.echo(json.dumps({"port": twin.port, "board": board, "twin": twin.twin,
                                   "heap_bytes": twin.heap_bytes,
                                   "flash_dir": str(twin.flash_dir), "pid": os.getpid(),
                                   "micropython_pid": twin.pid}))
        else:
            click.echo(twin.port)
            console.print(f"{board} ({twin.twin} twin): heap {twin.heap_bytes} bytes, flash {twin.flash_dir}; "
                          f"Ctrl-C stops it, kill -USR1 {os.getpid()} resets it")
        sys.stdout.flush()
        while not stop.wait(0.2):
            if not twin.running:
                raise InsituError(f"the simulated board on {twin.port} stopped (see above)")
            if reset.is_set():
                reset.clear()
                twin.reset()
    finally:
        twin.stop()


def _twin_ready(twin_kind: str) -> None:
    """The twin's tools are there and, for the Cortex-M7 twin, its firmware is built (once)."""
    if twin_kind == "qemu":
        from insitu.mcu import qemu

        qemu.firmware(lambda text: click.echo(text, err=True))
    else:
        from insitu.mcu.twin import find_tool

        find_tool("micropython")


@command.command("build-twin")
@click.option("--json", "as_json", is_flag=True, help="Print {firmware, source, key} as JSON.")
def build_twin(as_json):
    """Build the Cortex-M7 twin's MicroPython (v1.28.0 for QEMU's mps2-an500 as an STM32F746-like
    board) if its cached copy is missing or stale, and print where it is.

    The first use of the twin does the same; `bash scripts/setup.sh --mcu` runs this. The source is
    $INSITU_MICROPYTHON_SRC (a release archive or tree), else the project's vendored archive.
    """
    from insitu.mcu import qemu

    elf = qemu.firmware(lambda text: click.echo(text, err=True))
    source = qemu.source_archive()
    if as_json:
        click.echo(json.dumps({"firmware": str(elf), "source": str(source), "key": elf.parent.name}))
    else:
        click.echo(str(elf))


@command.command("build-kernels")
@click.option("--json", "as_json", is_flag=True, help="Print {module, arch, bytes} as JSON.")
def build_kernels(as_json):
    """Build the C training kernels for the STM32F746 (tte_native.mpy: a MicroPython native module
    for armv7emsp, Thumb-2 with the DSP extension) if its cached copy is missing or stale, and
    print where it is.

    `insitu train` and `insitu flash` deploy it by themselves to a device whose .mpy arch is
    armv7emsp; a board running stock MicroPython v1.28 takes it as a file:

    \b
      mpremote cp $(insitu mcu build-kernels) :tte_native.mpy
    """
    from insitu.mcu import native

    module = native.native_mpy(lambda text: click.echo(text, err=True))
    if as_json:
        click.echo(json.dumps({"module": str(module), "arch": native.ARCH, "bytes": module.stat().st_size}))
    else:
        click.echo(str(module))


# --------------------------------------------------------------------------- insitu mcu search

@command.command("search")
@click.option("--model", default="mbv2-28", show_default=True, help=MODEL_HELP)
@option("--dataset", "dataset", aliases=("--task",), default="digits", show_default=True,
        help="The adaptation task (digits, fashion-shift), or your images: folder:DIR, npz:FILE.")
@click.option("--budget", required=True,
              help="Memory budget of the training arena, in bytes or with K/M (128K = 131072 B).")
@click.option("--evaluations", type=int, default=5000, show_default=True,
              help="Schemes each search samples (memory planned); the same for both searches.")
@option("--train-size", "train_size", aliases=("--train-samples",), type=int, default=500,
        show_default=True, help="Contribution analysis: training samples per configuration.")
@option("--test-samples", "test_samples", aliases=("--eval-samples",), type=int, default=None,
        help="Contribution analysis: test samples scoring each configuration [default: 500 or all].")
@click.option("--lr", type=float, default=DEFAULT_LR, show_default=True,
              help="Learning rate (as insitu train's; the classifier's: see --lr-scale).")
@lr_scale_option
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--workers", type=int, default=None,
              help="Processes training the analysis's configurations [default: the CPU count].")
@click.option("--refresh", is_flag=True, help="Redo the contribution analysis even if it is cached.")
@click.option("--validate/--no-validate", default=True, show_default=True,
              help="Train each search's candidates as the analysis trains a configuration and pick the one "
                   "that trains best (eq. 5 only predicts accuracy as a sum of contributions).")
@click.option("--keep", type=int, default=8, show_default=True,
              help="Candidates of each search validated by training (1: its best-predicted scheme alone).")
@click.option("--min-distance", "min_distance", type=int, default=4, show_default=True,
              help="Genes (bias depth, layer ratios) in which the validated candidates differ pairwise, "
                   "where the evaluated schemes allow (0: the plain top --keep).")
@click.option("--out", type=click.Path(dir_okay=False), default=None,
              help="Write the searched scheme's JSON here (what `insitu train --scheme` takes).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write the best-so-far curves of both searches here (PNG).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole report as JSON.")
def search(model, dataset, budget, evaluations, train_size, test_samples, lr, lr_scale, seed, workers, refresh,
           validate, keep, min_distance, out, plot, as_json):
    """Search a sparse-update scheme under a memory budget (tiny-training §2.2, eq. 5).

    Runs the contribution analysis on the host simulator (each bias depth and each layer's
    weights at each ratio trained on the same samples; cached under the insitu cache), then an
    evolutionary and a random search maximizing the summed contributions with the compiler's
    planned memory within --budget, with the same number of evaluations. With --validate, each
    search's --keep best distinct candidates are trained (500 samples by default, as the analysis)
    and the one that trains best is its pick; the scheme written is the better of the two picks.

    \b
    Example:
      insitu mcu search --budget 128K --out scheme.json --plot curve.png
      insitu mcu search --budget 64K --lr 0.01 --lr-scale classifier=5 --train-size 4314
      insitu train --board stm32f746-disco-sim --algo sparse --scheme "$(cat scheme.json)"
    """
    from insitu.checks import format_size, parse_size
    from insitu.cli.output import emit_json, print_table, progress, report, write_json
    from insitu.io import check_writable
    from insitu.sparse.curves import plot_curves
    from insitu.sparse.objective import SearchResult
    from insitu.sparse.scheme import Scheme
    from insitu.sparse.search import run_search

    budget_bytes = parse_size(budget)
    scale = _check_analysis(model, dataset, train_size, test_samples, evaluations, workers, lr, lr_scale)
    from insitu.checks import check_int

    check_int("--keep", keep)
    check_int("--min-distance", min_distance, 0)
    for path, what in ((out, "--out"), (plot, "--plot")):
        if path:
            check_writable(path, what, plot=what == "--plot")
    workers = workers if workers is not None else max(1, os.cpu_count() or 1)
    result = _as_options(run_search, model, dataset, budget_bytes, prepare=_search_bundle,
                         evaluations=evaluations, train_samples=train_size, eval_samples=test_samples,
                         lr=lr, seed=seed, workers=workers, refresh=refresh,
                         validate=validate, keep=keep, min_distance=min_distance, lr_scale=scale,
                         progress_factory=lambda what, total: progress(what, total),
                         say=lambda msg: console.print(msg))
    if out:
        write_json(out, result["scheme"], "--out")
    if plot:
        curves = [SearchResult(name, Scheme.from_json(r["scheme"]), r["objective"], r["memory_bytes"], r["curve"],
                               r["evaluations"], r["feasible"], r["seconds"], r["budget_bytes"])
                  for name, r in result["searches"].items()]
        try:
            plot_curves(curves, plot, f"{model} on {dataset}, budget {format_size(budget_bytes)}")
        except OSError as exc:
            raise InsituError(f"cannot write --plot {plot}: {exc.strerror}") from None
    if as_json:
        emit_json(result)
        return
    from rich.table import Table

    c = result["contributions"]
    t = Table(title=f"contributions (accuracy points vs. classifier only {c['reference_accuracy']:.3f}; "
                    f"{c['train_samples']} training / {c['eval_samples']} test samples)")
    t.add_column("k", justify="right")
    t.add_column("layer")
    t.add_column("Δacc_b[:k]", justify="right")
    for r in ("0.125", "0.25", "0.5", "1"):
        t.add_column(f"W@{r}", justify="right")
    layers = list(c["delta_weight"]) + [None]
    L = len(layers)
    for i, name in enumerate(layers):
        k = L - i
        cells = [f"{100 * v:+.1f}" for v in c["delta_weight"][name].values()] if name else ["", "", "", ""]
        t.add_row(str(k), name or "classifier", f"{100 * c['delta_bias'][str(k)]:+.1f}", *cells)
    print_table(t)
    s = Table(title=f"search under {format_size(budget_bytes)} ({result['budget_bytes']:,} B; Σ Δacc in points, "
                    f"{evaluations} evaluations each; trained: the best-predicted scheme and the pick of "
                    f"{result['keep']} candidates validated by training)")
    checked = result["validation"] or {}
    for col in ("search", "Σ Δacc", "arena", "feasible", "seconds", "best predicted: trained", "pick: Σ Δacc",
                "pick: trained"):
        s.add_column(col, justify="left" if col == "search" else "right")
    for name, r in result["searches"].items():
        v = checked.get(name)
        s.add_row(name, f"{100 * r['objective']:+.2f}", f"{r['memory_bytes']:,} B", str(r["feasible"]),
                  f"{r['seconds']:.1f}", f"{v['plain']['accuracy']:.3f}" if v else "-",
                  f"{100 * v['objective']:+.2f}" if v else "-", f"{v['accuracy']:.3f}" if v else "-")
    print_table(s)
    for name, v in checked.items():
        ct = Table(title=f"{name} search: candidates validated by training (* the pick)")
        for col in ("", "Σ Δacc", "predicted", "trained", "arena", "scheme"):
            ct.add_column(col, justify="left" if col in ("", "scheme") else "right")
        for i, row in enumerate(v["candidates"]):
            ct.add_row("*" if i == v["pick"] else "", f"{100 * row['objective']:+.2f}", f"{row['predicted']:.3f}",
                      f"{row['accuracy']:.3f}", f"{row['memory_bytes']:,} B", row["scheme_text"])
        print_table(ct)
    for name, v in checked.items():
        if v["accuracy"] < v["reference_accuracy"]:
            console.print(f"[yellow]warning[/]: the {name} scheme reaches {v['accuracy']:.3f}, below the classifier "
                          f"alone ({v['reference_accuracy']:.3f}): its contributions do not add up (training "
                          "several layers' weights at this --lr can diverge); try a lower --lr")
    for name, r in result["searches"].items():
        v = checked.get(name)
        report.print(f"{name}: {v['scheme_text'] if v else r['scheme_text']}", soft_wrap=True)
    report.print(f"scheme ({result['scheme_from']}): {json.dumps(result['scheme'])}", soft_wrap=True)
    if out:
        report.print(f"written to {out}: insitu train --algo sparse --scheme \"$(cat {out})\"", soft_wrap=True)


@command.command("minheap")
@click.option("--board", default="stm32f746-disco-sim", show_default=True,
              help="The twin to probe (a simulated microcontroller board).")
@click.option("--model", default="mbv2-28", show_default=True, help=MODEL_HELP)
@click.option("--dataset", "task", default="digits", show_default=True,
              help="The adaptation task (digits, fashion-shift, fashion-mnist), or your images: folder:DIR, npz:FILE.")
@click.option("--scheme", default=None,
              help="Sparse-update scheme, as `insitu train --scheme` takes it [default: bias-6, or the "
                   "biases of every layer of a smaller model].")
@click.option("--lr", type=float, default=DEFAULT_LR, show_default=True)
@lr_scale_option
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--samples", type=int, default=2, show_default=True,
              help="Training samples each probe runs (then one evaluation).")
@click.option("--high", default=None,
              help="Largest heap tried, bytes or with K/M [default: the board's training budget].")
@click.option("--twin", "twin_kind", type=click.Choice(["qemu", "unix"]), default="qemu", show_default=True,
              help="The twin probed: the emulated Cortex-M7 (32-bit, as the board) or the unix port.")
@click.option("--json", "as_json", is_flag=True, help="Print the result (and every probe) as JSON.")
def minheap(board, model, task, scheme, lr, lr_scale, seed, samples, high, twin_kind, as_json):
    """Find the smallest MicroPython heap the compiled training program runs in.

    Compiles the scheme, flashes it to a twin once, then bisects over the twin's heap: each probe
    starts the firmware, trains --samples samples and evaluates one. Prints the measured minimum
    beside the planner's prediction (arena + runtime).

    \b
    Example:
      insitu mcu minheap --model mbv2-tiny --scheme bias-4
    """
    from insitu.boards import get_board
    from insitu.cli.output import emit_json, report
    from insitu.mcu.minheap import find_min_heap
    from insitu.checks import parse_size
    from insitu.mcu.board_runs import (Prepared, default_lr_scale, device_inputs, firmware_files, parse_lr_scale,
                                       predicted_heap_bytes)

    spec = get_board(board)
    if not spec.is_twin or spec.mcu is None:
        raise UsageError(f"{board!r} is not a simulated microcontroller: minheap bisects a twin's heap "
                         "(e.g. --board stm32f746-disco-sim)")
    if samples < 1:
        raise UsageError(f"--samples must be at least 1, got {samples}")
    from insitu.sparse.model_source import check_model
    from insitu.sparse.tasks import check_task

    _as_options(check_model, model)
    check_task(task)
    scale = parse_lr_scale(model, lr_scale) if lr_scale else default_lr_scale(model)
    high_bytes = parse_size(high) if high else spec.mcu["training_budget_bytes"]
    if twin_kind == "qemu":
        from insitu.mcu import qemu

        qemu.check_heap(high_bytes)
    from insitu.mcu.board_runs import check_scheme, default_scheme

    scheme = scheme or default_scheme(model, int(spec.mcu["training_budget_bytes"]))
    check_scheme(model, scheme)      # milliseconds, before the twin's build and the pre-training
    _twin_ready(twin_kind)           # before the model's pre-training, which may take minutes
    prep = Prepared(model, task, scheme, lr, seed, lr_scale=scale)
    compiled = prep.compiled
    low = compiled.arena_bytes
    if high_bytes <= low:
        raise UsageError(f"--high {high_bytes:,} B is not above the planned arena of {low:,} B")
    say = (lambda p: None) if as_json else (
        lambda p: console.print(f"heap {p.heap_bytes:>9,} B: {'trains' if p.ok else 'fails (' + p.why + ')'}"))
    found, probes = find_min_heap(firmware_files(compiled), device_inputs(compiled, prep.x_train[:samples]), prep.y_train[:samples],
                                  low, high_bytes, board=board, log=say, twin=twin_kind)
    predicted = predicted_heap_bytes(compiled)
    result = {"board": board, "twin": twin_kind, "model": model, "dataset": task, "lr": lr,
              "lr_scale": scale, "scheme": compiled.scheme.to_json(),
              "scheme_text": compiled.scheme.describe(), "planned_peak_bytes": compiled.arena_bytes,
              "predicted_heap_bytes": predicted, "min_heap_bytes": found,
              "error": (found - predicted) / predicted,
              "probes": [{"heap_bytes": p.heap_bytes, "ok": p.ok, "peak": p.peak, "why": p.why} for p in probes]}
    if as_json:
        emit_json(result)
        return
    report.print(f"{compiled.scheme.describe()}: smallest heap that trains {found:,} B; predicted {predicted:,} B "
                 f"(arena {compiled.arena_bytes:,} B + runtime), {100 * result['error']:+.1f} %", soft_wrap=True)


@command.command("compare")
@click.option("--model", default="mbv2-28", show_default=True, help=MODEL_HELP)
@option("--dataset", "dataset", aliases=("--task",), default="digits", show_default=True,
        help="The adaptation task (digits, fashion-shift), or your images: folder:DIR, npz:FILE.")
@click.option("--budgets", required=True,
              help="Comma-separated memory budgets of the training arena, bytes or with K/M (48K,64K,96K).")
@option("--train-size", "train_size", aliases=("--train-samples",), type=int, default=500,
        show_default=True,
        help="Training samples of every scheme (and of the search's contribution analysis).")
@option("--test-samples", "test_samples", aliases=("--eval-samples",), type=int, default=None,
        help="Test samples scoring every scheme [default: 500 or all].")
@click.option("--lr", type=float, default=DEFAULT_LR, show_default=True,
              help="Learning rate (as insitu train's; the classifier's: see --lr-scale).")
@lr_scale_option
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--evaluations", type=int, default=2000, show_default=True,
              help="Schemes each search samples per budget (memory planned).")
@click.option("--workers", type=int, default=None,
              help="Processes training schemes (and the analysis's configurations) [default: the CPU count].")
@click.option("--measure-heap", is_flag=True,
              help="Also measure the smallest heap of the full update and of each searched scheme on a twin "
                   "(tens of seconds per program).")
@click.option("--board-time/--no-board-time", default=True, show_default=True,
              help="Count each program's training step on the Cortex-M7 twin: the board's ms per sample "
                   "(a few seconds per program).")
@click.option("--board", default="stm32f746-disco-sim", show_default=True,
              help="The twin --measure-heap and --board-time run on (a simulated microcontroller board).")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write the whole result here (JSON).")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write grouped bars of accuracy per method and budget, and the memory, here (PNG).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole result as JSON.")
def compare(model, dataset, budgets, train_size, test_samples, lr, lr_scale, seed, evaluations, workers,
            measure_heap, board_time, board, out, plot, as_json):
    """Sparse update vs. the paper's baselines at equal memory (tiny-training Fig. 9).

    For each budget: the classifier alone ("last layer"), the biases of the last K layers with the
    largest K that fits ("bias + last layer"), the last K layers' weights and biases with the largest
    K that fits ("last k layers") and the scheme `insitu mcu search` finds ("sparse (searched)"),
    all trained on the host simulator on the same samples. Then the peak memory of the full update
    (without and with reordering) against each searched scheme: planned, and with --measure-heap
    the smallest heap each trains in on a twin.

    \b
    Example:
      insitu mcu compare --budgets 48K,64K,96K --measure-heap --plot fig9.png --out fig9.json
      insitu mcu compare --budgets 32K,48K,64K --lr 0.01 --lr-scale classifier=5 --train-size 4314
    """
    from insitu.cli.output import emit_json, print_table, progress, report, write_json
    from insitu.io import check_writable
    from insitu.mcu.compare import parse_budgets, plot_compare, run_compare, scheme_lines, tables

    budget_list = parse_budgets(budgets)
    scale = _check_analysis(model, dataset, train_size, test_samples, evaluations, workers, lr, lr_scale)
    for path, what in ((out, "--out"), (plot, "--plot")):
        if path:
            check_writable(path, what, plot=what == "--plot")
    if measure_heap or board_time:
        _twin_ready("qemu")          # before minutes of training, not after them
    workers = workers if workers is not None else max(1, os.cpu_count() or 1)
    result = _as_options(run_compare, model, dataset, budget_list, prepare=_search_bundle,
                         train_samples=train_size, eval_samples=test_samples, lr=lr, seed=seed,
                         evaluations=evaluations, workers=workers, measure_heap=measure_heap,
                         board_time=board_time, board=board,
                         lr_scale=scale, progress_factory=lambda what, total: progress(what, total),
                         say=(lambda msg: None) if as_json else (lambda msg: console.print(msg)))
    if out:
        write_json(out, result, "--out")
    if plot:
        try:
            plot_compare(result, plot)
        except OSError as exc:
            raise InsituError(f"cannot write --plot {plot}: {exc.strerror}") from None
    if as_json:
        emit_json(result)
        return
    for table in tables(result):
        print_table(table)
    for line in scheme_lines(result):
        report.print(line, soft_wrap=True)
    for r in result["memory"]["rows"]:
        if r.get("target_met") is False:
            console.print(f"[yellow]warning[/]: {r['name']} is only {r['ratio_measured_vs_full_no_reorder']:.1f}x "
                          f"below the full update (measured), not {result['memory']['target_ratio']:g}x")


def _register_model_commands() -> None:
    from insitu.cli import mcu_models

    command.add_command(mcu_models.import_command)
    command.add_command(mcu_models.export_command)


_register_model_commands()

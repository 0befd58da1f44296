"""`insitu power`: power traces and energy of a run, from a meter (`--meter SPEC`).

Also the two pieces `insitu train --meter` is built from: :func:`meter_options` (its options) and
:func:`measured` (training under a recorder).
"""

from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path
from typing import Callable, TypeVar, cast

import click

from insitu.cli import _Group       # the main group's error messages, also when run on its own
from insitu.cli.options import option
from insitu.cli.output import console, emit_json, report
from insitu.errors import InsituError, UsageError

T = TypeVar("T")

METER_HELP = ("Power meter spec: synthetic:WATTS[@HZ] or synthetic:sine (generated, no instrument), "
              "visa:RESOURCE (a SCPI instrument), powershield:PORT (STM32 LPM01A), "
              "pynq-rails[:RAIL,...][@HZ] (on a PYNQ board).")

#: The trace's name in a run folder (``--run-dir DIR``): DIR/power.csv, DIR/power.json, DIR/power.phases.jsonl.
RUN_DIR_TRACE = "power.csv"


@click.group("power", cls=_Group)
def command():
    """Power and energy of a run, measured with a power meter.

    \b
      insitu power record --meter SPEC --trace run.csv -- COMMAND...
      insitu power record --meter SPEC --run-dir runs/a -- COMMAND...
      insitu power emulate          a simulated PowerShield (LPM01A) on a serial port
    """


def _check_out(out: str | Path, what: str) -> Path:
    """The trace ``out``: a CSV path that can be written and that neither exists nor has sidecars
    (record, phase markers) that do: a trace is never overwritten."""
    from insitu.measure.record import check_new, sidecar_paths

    path = Path(out)
    if path.suffix.lower() in (".json", ".jsonl"):
        raise UsageError(f"{what} {out} is the trace (CSV); the record goes beside it "
                         f"({sidecar_paths(path.with_suffix('.csv'))[0].name}): give e.g. "
                         f"{path.with_suffix('.csv')}")
    _check_path(path, what)
    check_new(path, what)
    return path


def _run_dir_trace(run_dir: str | Path) -> Path:
    """DIR/power.csv of a run folder, the folder created (a :class:`UsageError` when it cannot be)."""
    folder = Path(run_dir)
    if folder.exists() and not folder.is_dir():
        raise UsageError(f"--run-dir {folder} is a file, not a folder")
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create --run-dir {folder}: {exc.strerror}") from None
    return folder / RUN_DIR_TRACE


def _check_path(path: Path, what: str, plot: bool = False) -> None:
    from insitu.io import check_writable

    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UsageError(f"cannot write {what} {path}: {parent} is a file, not a folder")
            break
    try:
        check_writable(path, what, plot=plot)
    except InsituError as exc:
        raise UsageError(str(exc)) from None


def _check_plot(plot: str | None) -> None:
    if plot:
        _check_path(Path(plot), "--plot", plot=True)


def _warn(message: str) -> None:
    console.print(f"[yellow]warning:[/] {message}")


def _plot(record: dict, plot: str) -> None:
    from insitu.measure.record import load_csv, plot_record

    if not record["samples"]:
        _warn(f"no samples were recorded: no figure written to {plot}")
        return
    trace = load_csv(record["csv"])
    plot_record(record, trace["t"], trace["watts"], plot)


def _training_line(record: dict) -> str | None:
    """'energy per training sample: X J (the train phase: E J / N samples)', or None."""
    per = record.get("energy_per_training_sample_j")
    if per is None:
        return None
    return (f"energy per training sample: {per:.4g} J (the train phase alone: "
            f"{record['training_energy_j']:.4g} J / {record['training_samples']} samples)")


def _report(record: dict) -> None:
    from rich.table import Table

    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    rate = record.get("sample_rate_hz")
    colour = "green" if record["complete"] else "yellow"
    report.print(f"[bold]{record['meter'].get('meter', 'meter')}[/]: [green]{record['energy_j']:.6g} J[/] "
                 f"in {record['duration_s']:.4g} s, mean {num(record['mean_w'], '.4g')} W "
                 f"({record['samples']} samples{f' at {rate:.4g} Hz' if rate else ''}); "
                 f"[{colour}]{record['message']}[/] -> {record['csv']}")
    training = _training_line(record)
    if training:
        report.print(training)
    if record["phases"]:
        table = Table("phase", "start s", "stop s", "energy J", "mean W", "samples", "J/sample")
        for p in record["phases"]:
            table.add_row(p["name"] + ("" if p["complete"] else " (cut)"), num(p["start"], ".3f"),
                          num(p["stop"], ".3f"), num(p["energy_j"], ".5g"), num(p["mean_w"], ".4g"),
                          num(p["samples"], "d"), num(p["energy_per_sample_j"], ".4g"))
        report.print(table)


@command.command("record", context_settings={"ignore_unknown_options": True,
                                             "allow_interspersed_args": False})
@click.option("--meter", "meter_spec", required=True, metavar="SPEC", help=METER_HELP)
@option("--trace", aliases=("--out",), type=click.Path(dir_okay=False), default=None, metavar="FILE.csv",
        help="The power trace, CSV (host_time,t,watts,volts,amps), written as samples arrive; the "
             "record (FILE.json) and the phase markers (FILE.phases.jsonl) go beside it. Never "
             "overwritten: an existing trace, record or marker file is refused. Or --run-dir. "
             "Without either: power.csv, or power-1.csv, ... when it exists.")
@click.option("--run-dir", type=click.Path(file_okay=False), default=None, metavar="DIR",
              help="A run folder (created) for DIR/power.csv, DIR/power.json and "
                   "DIR/power.phases.jsonl, instead of --trace.")
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG of the trace with the phases shaded.")
@click.option("--json", "as_json", is_flag=True,
              help="Print the record as JSON, alone on stdout (COMMAND's standard output goes to stderr).")
@click.argument("cmd", metavar="-- COMMAND...", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def record(ctx, meter_spec, trace, run_dir, plot, as_json, cmd):
    """Record power while COMMAND runs; energy in total and per phase.

    COMMAND runs as a subprocess with INSITU_PHASE_FILE set: phases it marks
    (insitu.measure.phases.phase; every `insitu train` algorithm marks `train` around its training
    steps and `test` around its evaluations) are aligned to the trace and get their own energy.
    The energy per training sample is the `train` phase's energy over its samples
    (energy_per_training_sample_j), never the whole run's. Ctrl-C, a crash of COMMAND or a meter
    that disconnects keep the trace recorded so far (the record says `complete: false` and why it
    ended). The exit status is COMMAND's (130 when interrupted; 1 when only the meter failed).

    \b
    Examples:
      insitu power record --meter synthetic:sine --trace run.csv -- sleep 3
      insitu power record --meter synthetic:sine --run-dir runs/sgd --json -- insitu train --samples 600
      insitu power record --meter powershield:/dev/ttyACM0 --trace run.csv --plot run.png --json \\
          -- insitu train --board stm32f746-disco --port /dev/ttyACM1 --algo sparse
    """
    from insitu.measure.record import exit_code_of

    if not cmd:
        raise UsageError("give the command to measure after --, e.g. "
                         "insitu power record --meter synthetic:2 --trace run.csv -- sleep 1")
    if trace is not None and run_dir is not None:
        raise UsageError("give one of --trace FILE.csv (the power trace; its record and phase markers "
                         "go beside it) or --run-dir DIR (DIR/power.csv, DIR/power.json, "
                         "DIR/power.phases.jsonl), not both")
    if trace is None and run_dir is None:
        from insitu.measure.record import free_trace

        trace = str(free_trace(RUN_DIR_TRACE))       # power.csv, else power-1.csv...: never overwritten
    what = "--trace" if trace is not None else "--run-dir"
    folder = None
    if run_dir is not None:             # a run folder of its own, for `insitu runs compare`
        from insitu.runs import RunFolder

        folder = RunFolder(run_dir, "insitu power record", {"meter": meter_spec, "command": list(cmd)})
    if folder is not None and folder.complete:
        result = folder.already_complete()
    else:
        result = _record(meter_spec, cmd, trace, run_dir, what, plot, folder, as_json)
    if as_json:
        emit_json(result)
    else:
        _report(result)
    ctx.exit(exit_code_of(result))


def _record(meter_spec, cmd, trace, run_dir, what, plot, folder, as_json) -> dict:
    """Record ``cmd`` under the meter; the result is kept (in its run folder) before the figure
    is drawn, so a figure that fails loses nothing."""
    from insitu.measure.meters import open_meter
    from insitu.measure.record import exit_code_of, run_command

    path = _check_out(trace if trace is not None else _run_dir_trace(str(run_dir)), what)
    _check_plot(plot)
    if shutil.which(cmd[0]) is None:
        raise UsageError(f"command not found: {cmd[0]!r} (give a program on PATH or a path to one)")
    meter = open_meter(meter_spec)
    console.print(f"recording {meter.name} into {path} while running: {' '.join(cmd)}")

    def keep(result: dict) -> None:
        if folder:
            from insitu.runs import summary_row

            code = exit_code_of(result)
            folder.finish(result, [summary_row("", {"energy_j": result["energy_j"],
                                                    "seconds": result["duration_s"]})],
                          status={0: "complete", 130: "interrupted"}.get(code, "failed"),
                          message=None if code == 0 else result.get("message"))

    with (folder.running() if folder else contextlib.nullcontext()):
        # With --json, stdout is the record alone: the command's output goes to stderr.
        result = run_command(meter, list(cmd), path, notify=_warn, what=what,
                             stdout=_stderr_fd() if as_json else None)
        keep(result)
    if plot:
        _plot(result, plot)
        result["plot"] = plot
        keep(result)
    return result


def _stderr_fd() -> int:
    """This process's stderr as a file descriptor, for a subprocess's output (2 when sys.stderr
    has none, as under click's test runner)."""
    import sys

    try:
        return sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return 2


# ------------------------------------------------------------------------- insitu train --meter

def meter_options(fn):
    """The options of a command that can run under a power meter: ``--meter`` and ``--power-out``
    (the command's function gets ``meter`` and ``power_out``; pass them to :func:`measured`)."""
    fn = click.option("--power-out", type=click.Path(dir_okay=False), default=None,
                      help="With --meter: the power trace CSV, new (an existing trace, record or "
                           "marker file is refused) [default: the first free of power.csv, "
                           "power-1.csv, ...; in the --run-dir folder the same way]; the record (.json) and "
                           "phase markers (.phases.jsonl) go beside it.")(fn)
    return click.option("--meter", default=None, metavar="SPEC",
                        help="Record power while the command runs: " + METER_HELP)(fn)


def measured(meter_spec: str | None, power_out: str | None, fn: Callable[[], T],
             run_dir: str | Path | None = None) -> T:
    """``fn()``, under the meter ``meter_spec`` when one is given, and a dict value gets the
    record as ``power``; without a meter, ``fn()``.

    The trace goes to ``power_out``, else to ``run_dir``/power.csv, else to the first free name of
    power.csv, power-1.csv, power-2.csv... (said on stderr); never over an existing trace or
    sidecar (an explicit path that exists is a :class:`UsageError`). The meter and the output are
    checked before ``fn`` starts."""
    if not meter_spec:
        if power_out:
            raise UsageError("--power-out needs --meter SPEC (the meter to record)")
        return fn()
    from insitu.measure.meters import open_meter
    from insitu.measure.record import free_trace, measure_call

    chosen = None
    if power_out:
        what, path = "--power-out", _check_out(power_out, "--power-out")
    elif run_dir is not None:
        # A run folder run again (resumed, or a sweep's point) keeps its earlier traces.
        what, path = "--run-dir", _check_out(free_trace(_run_dir_trace(run_dir)), "--run-dir")
    else:
        what, path = "--power-out", free_trace(RUN_DIR_TRACE)
        _check_out(path, "--power-out")
        if path.name != RUN_DIR_TRACE:
            chosen = f" (not {RUN_DIR_TRACE}: another run's files are there; --power-out FILE.csv chooses)"
    meter = open_meter(meter_spec)
    console.print(f"recording {meter.name} into {path}{chosen or ''}")
    value, rec = measure_call(meter, path, fn, notify=_warn, what=what)
    value = cast(T, value)                      # what fn() returned
    if isinstance(value, dict):
        value["power"] = rec
    phases = ", ".join(f"{name} {p['energy_j']:.4g} J"
                       + (f" ({p['energy_per_sample_j']:.3g} J/sample)" if p["energy_per_sample_j"] else "")
                       for name, p in rec["by_phase"].items())
    console.print(f"power: {rec['energy_j']:.4g} J in {rec['duration_s']:.3g} s "
                  f"(mean {rec['mean_w'] or 0:.4g} W){'; ' + phases if phases else ''} -> {path}")
    training = _training_line(rec)
    if training:
        console.print(training)
    return value


@command.command("emulate")
@click.option("--current", "current_ma", type=float, default=10.0, show_default=True,
              help="The load current the simulated PowerShield measures, in mA.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON line (port, current_ma) when ready.")
def emulate(current_ma, as_json):
    """Run a simulated X-NUCLEO-LPM01A PowerShield on a serial port (a pseudo-terminal) until
    Ctrl-C: the same ASCII protocol as the board, measuring a constant load current.

    \b
    Example:
      insitu power emulate &            # prints its port
      insitu power record --meter powershield:PORT --trace run.csv -- insitu train --samples 500
    """
    import signal
    import threading

    from insitu.measure.powershield_twin import PowerShieldTwin

    if not current_ma > 0:
        raise UsageError(f"--current must be positive (mA), got {current_ma}")
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    with PowerShieldTwin(lambda t: current_ma * 1e-3) as twin:
        if as_json:
            print(json.dumps({"port": twin.port, "current_ma": current_ma}), flush=True)
        else:
            console.print(f"simulated PowerShield on {twin.port} ({current_ma:g} mA); Ctrl-C stops it")
        while not done.wait(0.2):
            pass

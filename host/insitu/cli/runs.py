"""`insitu runs`: run folders (written with --run-dir), compared across commands and algorithms."""

from __future__ import annotations

import click

from insitu.cli.options import check_outputs
from insitu.cli.output import emit_json, print_table, report


@click.group("runs")
def command():
    """Run folders, written by any training or measurement command given --run-dir DIR.

    \b
      insitu runs compare DIR...    one table (and figure) across runs of any algorithm
    """


def _cell(value, fmt: str = ".4g") -> str:
    if value is None:
        return "-"
    return format(value, fmt) if isinstance(value, float) else str(value)


def _seconds(value) -> str:
    """Seconds to a tenth from 10 s up, three significant digits below (never 0.0 for a run)."""
    if value is None:
        return "-"
    return f"{value:.1f}" if value >= 10 else f"{value:.3g}"


@command.command("compare")
@click.argument("folders", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option("--plot", type=click.Path(dir_okay=False), default=None,
              help="Draw the runs' curves (loss, accuracy against samples) into one PNG.")
@click.option("--json", "as_json", is_flag=True, help="Print the comparison as JSON.")
@click.pass_context
def compare(ctx, folders, plot, as_json):
    """Compare run folders: samples, seconds, final loss, accuracy and energy of each run, with the
    options that differ between them (`-`: the run's command has no such option). A folder of a command that trained several runs (tt train
    --variant all, lrt adapt --scheme all) gives one row per run.

    \b
    Examples:
      insitu train --run-dir runs/lr01 lr=0.01 && insitu train --run-dir runs/lr1 lr=0.1
      insitu runs compare runs/lr01 runs/lr1 --plot curves.png
      insitu runs compare runs/* --json
    """
    from insitu.runs import compare as compare_runs, plot_curves

    check_outputs(ctx, "plot")
    table = compare_runs(folders)
    if plot:
        table["plot"] = str(plot_curves({r["run"]: r["curve"] for r in table["runs"]}, plot,
                                        title="insitu runs compare"))
    if as_json:
        emit_json(table)
        return
    from rich.table import Table

    grid = Table(title="runs")
    columns = ["run", "command", "algo", "status", "samples", "seconds", "final loss", "accuracy",
               "energy J", *table["differing"]]
    for name in columns:
        grid.add_column(name, justify="left" if name in ("run", "command", "algo", "status") else "right")
    for r in table["runs"]:
        grid.add_row(r["run"], r["command"], _cell(r["algo"]), r["status"], _cell(r["samples"]),
                     _seconds(r["seconds"]),
                     _cell(r["final_loss"]), _cell(r["accuracy"]), _cell(r["energy_j"]),
                     *(_cell(r["config"].get(k)) for k in table["differing"]))
    print_table(grid)
    if plot:
        report.print(f"curves: {table['plot']}")

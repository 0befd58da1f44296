"""`insitu sweep`: a grid of experiment runs, locally or on Ray, resumable, tabulated, drawn."""

from __future__ import annotations

from pathlib import Path

import click

from insitu.cli.output import console, emit_json, progress, report


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@click.command("sweep")
@click.argument("config_path", metavar="CONFIG.toml",
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Folder for the points, points.csv, sweep.json and heat maps "
                   "[default: CONFIG's name + '-sweep' in the current folder].")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Points run at once [default: the CPU count locally, the whole cluster on Ray].")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="Run the points on this existing Ray cluster (host:port, or 'auto'); "
                   "needs pip install 'insitu[ray]'.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary and table as JSON.")
def command(config_path, out, workers, ray_address, as_json):
    """Run a parameter grid (e.g. the LRT paper's figure 6: learning rate x dense batch size,
    no-norm vs max-norm), resumably: finished points are kept in OUT/points and not rerun.
    CONFIG.toml names the experiment, its fixed parameters, the grid axes, the seeds and the
    metrics to tabulate (see examples/sweeps/lrt_fig6.toml). Writes a table (--json for
    machines), OUT/points.csv, OUT/sweep.json and one heat map per metric and panel.

    \b
    Examples:
      insitu sweep examples/sweeps/lrt_fig6.toml --out fig6
      insitu sweep examples/sweeps/lrt_fig6.toml --out fig6 --ray-address HEAD:6379 --json
    """
    import insitu.lrt.sweep_points  # noqa: F401 - registers lrt.adapt, the experiment configs name
    from insitu.measure.sweep import grid_points, load_config, run_sweep

    config = load_config(config_path)
    out = out or Path(f"{config_path.stem}-sweep")
    total = len(grid_points(config))
    with progress(f"sweep {config.name}", total=total) as advance:
        summary = run_sweep(config, out, workers=workers, ray_address=ray_address,
                            advance=advance, log=lambda msg: console.print(f"[yellow]{msg}[/]"))
    if as_json:
        emit_json(summary)
        return
    from rich.table import Table

    table = Table(title=f"{summary['name']} ({summary['run']}, seeds {summary['seeds']})")
    axes = list(summary["grid"])
    for name in axes:
        table.add_column(name, justify="right")
    several = len(summary["seeds"]) > 1
    for metric in summary["metrics"]:
        table.add_column(metric + (" (mean ± sd)" if several else ""), justify="right",
                         overflow="fold")
    for row in summary["table"]:
        cells = [_fmt(row[a]) for a in axes]
        for metric in summary["metrics"]:
            cell = _fmt(row[metric])
            if several and row[metric] is not None:
                cell += f" ± {row[metric + '_std']:.2g}"
            cells.append(cell)
        table.add_row(*cells)
    report.print(table)
    report.print(f"{summary['points']} points: {summary['ran']} run, {summary['skipped']} already "
                 f"done ({summary['seconds']:.0f} s, {summary['backend']})")
    report.print(f"CSV: {summary['csv']}")
    for path in summary["heatmaps"]:
        report.print(f"heat map: {path}")

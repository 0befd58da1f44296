"""`insitu sweep`: a grid of experiment runs or of insitu training commands, locally or on Ray,
resumable, tabulated, drawn."""

from __future__ import annotations

from pathlib import Path

import click

from insitu.cli.options import NOT_CONFIG, cast_value, option
from insitu.cli.output import console, emit_json, progress, report
from insitu.errors import UsageError

#: Options of a command a sweep point may not set: the sweep gives each point its run folder
#: (where the command writes its result, curve, checkpoint, plot and power trace) and reads the
#: result from its --json output.
_PER_POINT = {"checkpoint", "power_out", "counts"}


def command_spec(name: str):
    """The :class:`insitu.measure.sweep.Command` of ``insitu NAME`` (e.g. "tt train"), from its
    click options: the keys a sweep config may set, their types, which are paths."""
    from insitu.cli import main
    from insitu.measure.sweep import Command

    cmd = main
    for word in name.split():
        cmd = cmd.commands.get(word) if isinstance(cmd, click.Group) else None
        if cmd is None:
            raise UsageError(f"`insitu {name}` is not a command of this insitu")
    names = {p.name for p in cmd.params}
    if not {"config", "run_dir"} <= names:
        raise UsageError(f"`insitu {name}` does not take --config and --run-dir yet, which a sweep "
                         "of it needs (one run folder per point)")
    ctx = click.Context(cmd, info_name=name)
    options, refused, paths, by_key = {}, {}, [], {}
    for param in cmd.params:
        if not isinstance(param, click.Option) or not param.name or param.name in ("config", "run_dir"):
            continue
        key = param.name.replace("_", "-")
        by_key[key] = param
        for spelling in (param.name, key, *(o.lstrip("-") for o in param.opts)):
            options[spelling] = key
        if param.name in NOT_CONFIG or param.name in _PER_POINT:
            refused[key] = (f"the sweep runs each point with --run-dir OUT/points/<key> --json, and "
                            f"the point writes its outputs there; --{key} is not a sweep key")
        elif isinstance(param.type, click.Path):
            paths.append(key)

    def cast(key: str, value):
        try:
            return cast_value(ctx, by_key[key], value)
        except click.BadParameter as exc:
            raise ValueError(exc.message) from None

    return Command(name=name, options=options, cast=cast, paths=tuple(paths), refused=refused,
                   seed="seed" in names)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


@click.command("sweep")
@click.argument("config_path", metavar="CONFIG.toml",
                type=click.Path(exists=True, dir_okay=False, path_type=Path))
@option("--out-dir", aliases=("--out",), type=click.Path(file_okay=False, path_type=Path), default=None,
        help="Folder for the points (a command sweep: one run folder per point, OUT/points/<key>), "
             "points.csv, sweep.json and heat maps [default: CONFIG's name + '-sweep' in the "
             "current folder].")
@click.option("--workers", type=click.IntRange(min=1), default=None,
              help="Points run at once [default: the CPU count locally, the whole cluster on Ray].")
@click.option("--ray-address", default=None, metavar="ADDR",
              help="Run the points on this existing Ray cluster (host:port, or 'auto'); "
                   "needs pip install 'insitu[ray]'.")
@click.option("--json", "as_json", is_flag=True, help="Print the summary and table as JSON.")
def command(config_path, out_dir, workers, ray_address, as_json):
    """Run a parameter grid (e.g. the LRT paper's figure 6: learning rate x dense batch size,
    no-norm vs max-norm), resumably: finished points are kept in OUT/points and not rerun.
    CONFIG.toml names the experiment (run = "lrt.adapt") or an insitu training command
    (command = "train", "tt train", "lrt adapt", "e2train run"), the fixed parameters or options,
    the grid axes, the seeds and the metrics to tabulate (see examples/sweeps/). A command sweep
    runs `insitu COMMAND --config POINT.toml --run-dir OUT/points/<key> --json` per point and
    seed; its keys are checked against the command's options before anything runs, and a point
    that fails does not stop the others. Writes a table (--json for machines), OUT/points.csv,
    OUT/sweep.json and one heat map per metric and panel.

    \b
    Examples:
      insitu sweep examples/sweeps/train_lr.toml --out-dir lr
      insitu runs compare lr/points/* --json        # a command sweep's run folders
      insitu sweep examples/sweeps/lrt_fig6.toml --out-dir fig6
      insitu sweep examples/sweeps/lrt_fig6.toml --out-dir fig6 --ray-address HEAD:6379 --json
    """
    import insitu.lrt.sweep_points  # noqa: F401 - registers lrt.adapt, the experiment configs name
    from insitu.measure.sweep import grid_points, load_config, run_sweep

    config = load_config(config_path, commands=command_spec)
    out = out_dir or Path(f"{config_path.stem}-sweep")
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

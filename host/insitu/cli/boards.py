"""`insitu boards`: the boards insitu targets and their simulated twins."""

from __future__ import annotations

import click
from rich.table import Table

from insitu.boards import load_boards
from insitu.cli.output import emit_json, print_table


@click.command("boards")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def command(as_json: bool):
    """List the boards and their simulated twins (<board>-sim) with their resources.

    A twin runs the same code path as its board, on this machine: `insitu train --board NAME-sim`.
    """
    boards = [b.describe() for b in load_boards().values()]
    if as_json:
        emit_json(boards)
        return
    table = Table(title="insitu boards")
    for col in ("name", "kind", "twin of", "part", "resources", "cpu"):
        table.add_column(col)
    for b in boards:
        if b["kind"] == "fpga-soc":
            res = f"{b['lut']} LUT, {b['ff']} FF, {b['dsp']} DSP, {b['bram18']} BRAM18"
        else:
            res = f"{b['sram_bytes'] // 1024} KB SRAM, {b['flash_bytes'] // 1024} KB flash"
        table.add_row(b["name"], b["kind"], b["twin_of"] or "-", b["part"], res,
                      f"{b['cpu']} @ {b['cpu_hz'] / 1e6:g} MHz")
    print_table(table)

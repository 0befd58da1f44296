"""`insitu doctor`: is everything a user needs here, and if not, how to get it."""

from __future__ import annotations

import sys

import click
from rich.table import Table

from insitu.cli.output import emit_json, print_table, report
from insitu.doctor import as_dicts, run_checks


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the checks as JSON.")
def command(as_json: bool):
    """Check the toolchain: Python and NumPy, Amaranth and Yosys, Icarus Verilog, cocotb, pynq,
    the MicroPython interpreter, mpremote, mpy-cross, instruments and datasets.

    Each missing piece is printed with the command that installs it. Exits 1 if anything is missing.
    """
    checks = run_checks()
    if as_json:
        emit_json({"ok": all(c.ok for c in checks), "checks": as_dicts(checks)})
    else:
        table = Table(title="insitu doctor")
        for col in ("", "tool", "needed for", "found / fix"):
            table.add_column(col)
        for c in checks:
            mark = "[green]ok[/]" if c.ok else "[red]missing[/]"
            table.add_row(mark, c.name, c.needed_for, c.detail if c.ok else f"{c.detail}\n[bold]fix:[/] {c.fix}")
        print_table(table)
        missing = [c for c in checks if not c.ok]
        report.print("[green]everything is in place[/]" if not missing
                     else f"[red]{len(missing)} missing[/]: run the fixes above, or `bash scripts/setup.sh`")
    if not all(c.ok for c in checks):
        sys.exit(1)

"""`insitu data`: the datasets insitu trains on, where they are and what is in them."""

from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape
from rich.table import Table

from insitu.cli.output import emit_json, print_table, report
from insitu.data import dataset_info, list_datasets


@click.group("data")
def command():
    """Datasets: which ones are available here and what is in them.

    \b
    Known datasets:
      fashion-mnist  FashionMNIST, 60000/10000 28x28 images; Debian package dataset-fashion-mnist
                     (/usr/share/datasets/fashion-mnist), or --data-dir DIR
      mnist          MNIST, 60000/10000 28x28 images; not packaged: download the four IDX files
                     and pass --data-dir DIR
      digits         scikit-learn's 8x8 digits, always available (stratified 80/20 split)
    """


@command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list instead of a table.")
def list_command(as_json: bool):
    """List the known datasets and whether each can be loaded here without --data-dir."""
    rows = list_datasets()
    if as_json:
        emit_json(rows)
        return
    table = Table(title="insitu datasets")
    table.add_column("name", no_wrap=True)
    table.add_column("available")
    table.add_column("source / what to do", overflow="fold")
    table.add_column("description")
    for row in rows:
        table.add_row(row["name"], "[green]yes[/]" if row["available"] else "[yellow]no[/]",
                      escape(row["hint"] or row["source"]), escape(row["description"]))
    print_table(table)


@command.command("info")
@click.argument("name", metavar="NAME")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory holding the four IDX files (train-images-idx3-ubyte[.gz], "
                   "train-labels-idx1-ubyte[.gz], t10k-...); overrides the default location.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON document instead of a table.")
def info_command(name: str, data_dir: Path | None, as_json: bool):
    """Load dataset NAME, check it fully, and print its splits, shape and classes.

    NAME is one of: fashion-mnist, mnist, digits (see `insitu data list`). Exits 1 if files are
    missing or corrupt (the message names the file), 2 for an unknown NAME.
    """
    info = dataset_info(name, data_dir)
    if as_json:
        emit_json(info)
        return
    table = Table(title=f"dataset {info['name']}", show_header=False)
    table.add_column("field", style="bold")
    table.add_column("value")
    splits = ", ".join(f"{split} {count}" for split, count in info["splits"].items())
    shape = "x".join(str(n) for n in info["sample_shape"])
    table.add_row("description", escape(info["description"]))
    table.add_row("splits", splits)
    table.add_row("sample shape", f"{shape} {info['dtype']} (labels {info['label_dtype']})")
    table.add_row("classes", f"{info['num_classes']}: " + escape(", ".join(info["class_names"])))
    table.add_row("source", escape(info["source"]))
    print_table(table)


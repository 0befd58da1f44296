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

    \b
    Your own data, wherever --dataset is taken (docs/own-data.md):
      folder:DIR     one sub-folder of PNG/JPEG/BMP images per class (or DIR/train/, DIR/test/)
      npz:FILE       arrays x_train, y_train, x_test, y_test (or x, y)
      csv:FILE       a table with a header row and a label column
    `insitu data info SPEC` shows what the files become.
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

    NAME is one of: fashion-mnist, mnist, digits (see `insitu data list`), or your files:
    folder:DIR, npz:FILE, csv:FILE. Exits 1 if a built-in dataset's files are missing or
    corrupt, 2 for an unknown NAME or a file of yours that cannot be used (the message names
    the file and what is wrong).

    \b
    Examples:
      insitu data info digits
      insitu data info folder:my-images --json
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
    what = {1: "grey images", 3: "RGB images", None: "features"}[info["channels"]]
    table.add_row("sample shape", f"{shape} {info['dtype']} {what} (labels {info['label_dtype']})")
    counts = info["train_per_class"]
    table.add_row("classes", f"{info['num_classes']}: " + escape(", ".join(
        f"{name} ({count})" for name, count in zip(info["class_names"], counts))) + " train samples")
    table.add_row("source", escape(info["source"]))
    print_table(table)


@command.command("export")
@click.argument("name", metavar="NAME")
@click.argument("out", metavar="OUT", type=click.Path(path_type=Path))
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The built-in dataset's IDX folder, as for `data info`.")
@click.option("--samples", type=int, default=None,
              help="Write the first N train samples (and N/4 test samples); default: all.")
@click.option("--size", type=int, default=None, help="Resample images to SIZE x SIZE (the data's one rule).")
def export_command(name: str, out: Path, data_dir: Path | None, samples: int | None, size: int | None):
    """Write dataset NAME as files of your own: an image folder (OUT/train/<class>/N.png and
    OUT/test/...) or, when OUT ends in .npz, arrays x_train, y_train, x_test, y_test,
    class_names. The layout `--dataset folder:OUT` / `npz:OUT` reads (docs/own-data.md). An
    existing OUT is refused.

    \b
    Examples:
      insitu data export digits my-images --size 32
      insitu data export digits digits.npz
    """
    from insitu.data import load_dataset
    from insitu.data.files import write_folder, write_npz
    from insitu.errors import UsageError

    if out.exists():
        raise UsageError(f"{out} exists; give a new folder or file name")
    if samples is not None and samples < 1:
        raise UsageError(f"--samples must be an integer >= 1, got {samples}")
    if size is not None and size < 1:
        raise UsageError(f"--size must be an integer >= 1, got {size}")
    ds = load_dataset(name, data_dir)
    if size:
        if ds.kind != "images":
            raise UsageError(f"--size applies to images; {name} holds feature vectors")
        ds = ds.fit_images((size, size))
    write = write_npz if out.suffix.lower() == ".npz" else write_folder
    count = write(ds, out, samples)
    report.print(f"wrote {count:,} samples of {name} to {escape(str(out))}")

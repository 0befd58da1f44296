"""`insitu flash`: deploy the firmware (and a compiled model) to a microcontroller board."""

from __future__ import annotations

from pathlib import Path

import click

from insitu.cli.output import console, emit_json, report
from insitu.errors import UsageError


@click.command("flash")
@click.option("--board", default="stm32f746-disco", show_default=True,
              help="The board on PORT: stm32f746-disco, or stm32f746-disco-sim for a twin "
                   "started by `insitu mcu emulate`.")
@click.option("--port", required=True, help="The board's serial port (/dev/ttyACM0, or the path "
                                            "`insitu mcu emulate` printed).")
@click.option("--model-dir", type=click.Path(exists=True, file_okay=False),
              help="Also deploy every file in this folder (a compiled model).")
@click.option("--source", is_flag=True,
              help="Deploy .py sources instead of .mpy cross-compiled for the board's CPU.")
@click.option("--json", "as_json", is_flag=True, help="Print the deployed files as JSON.")
@click.argument("files", nargs=-1, type=click.Path(exists=True, dir_okay=False))
def command(board, port, model_dir, source, as_json, files):
    """Copy FILES (default: the insitu firmware runtime, firmware/*.py) to the board's flash.

    Python modules are cross-compiled with mpy-cross for the CPU the board reports (Cortex-M7:
    armv7emsp; the twin: x64). Every file is written to a temporary name, checked by SHA-256 on
    the board, then renamed: a failed flash keeps the old files. A file the board already holds
    with the same SHA-256 is not sent again.

    \b
    Examples:
      insitu flash --port /dev/ttyACM0
      insitu flash --board stm32f746-disco-sim --port /tmp/insitu-twin-XXXX/tty --model-dir out/model
    """
    from insitu.mcu.flash import firmware_files, flash

    if len({Path(f).name for f in files}) < len(files):
        raise UsageError("two FILES have the same name; the board's flash is one folder")
    deploy: dict[str, bytes | Path] = dict({Path(f).name: Path(f) for f in files} if files
                                           else firmware_files())
    if model_dir:
        for path in sorted(Path(model_dir).iterdir()):
            if path.is_file():
                deploy[path.name] = path
    if not as_json:
        console.print(f"flashing {len(deploy)} files to {board} on {port}")
    result = flash(port, deploy, compile_mpy=not source, board=board)
    if as_json:
        emit_json({"board": board, **result})
        return
    for f in result["files"]:
        kept = "" if f["sent"] else "  (already there)"
        report.print(f"  {f['name']:<28} {f['bytes']:>8} bytes  sha256 {f['sha256'][:16]}{kept}")
    arch = f", .mpy for {result['arch']}" if result["arch"] else ", sources"
    console.print(f"flashed {len(result['files'])} files to {port}{arch}")

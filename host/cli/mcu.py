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

from insitu.cli.output import console
from insitu.errors import InsituError, UsageError


def default_flash_dir(board: str) -> Path:
    """Where a twin keeps its flash between runs, like a board's flash across power cycles."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "insitu" / board / "flash"


@click.group("mcu")
def command():
    """Microcontroller (MicroPython) boards: simulated twins and tools.

    \b
      insitu mcu emulate            a simulated STM32F746 board on a serial port
    """


@command.command("emulate")
@click.option("--board", default="stm32f746-disco-sim", show_default=True,
              help="The twin to run (a simulated microcontroller board).")
@click.option("--flash-dir", type=click.Path(file_okay=False),
              help="Folder that is the board's flash (kept across runs) "
                   "[default: ~/.cache/insitu/BOARD/flash].")
@click.option("--heap", help="MicroPython heap, in bytes or with K/M (256K) "
                             "[default: the board's training budget, 256K on stm32f746-disco].")
@click.option("--json", "as_json", is_flag=True,
              help="Print one JSON line (port, board, heap_bytes, flash_dir, pid) when ready.")
def emulate(board, flash_dir, heap, as_json):
    """Run a simulated board: the MicroPython unix port on a serial port (a pseudo-terminal)
    with the board's heap, until Ctrl-C or SIGTERM.

    Use the printed port as a board's: `mpremote connect PORT ...`, `insitu flash --board
    stm32f746-disco-sim --port PORT`. Ctrl-D or a program's exit soft-resets it, as on a board;
    `kill -USR1 PID` presses its reset button (a hard reset: RAM lost, flash kept).

    \b
    Example:
      insitu mcu emulate --heap 320K --flash-dir ./flash
    """
    from insitu.boards import get_board
    from insitu.mcu.twin import McuTwin, parse_size

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
    twin = McuTwin(flash_dir, parse_size(heap) if heap else None, board=board)
    twin.start()
    try:
        if as_json:
            click.echo(json.dumps({"port": twin.port, "board": board, "heap_bytes": twin.heap_bytes,
                                   "flash_dir": str(twin.flash_dir), "pid": os.getpid(),
                                   "micropython_pid": twin.pid}))
        else:
            click.echo(twin.port)
            console.print(f"{board}: heap {twin.heap_bytes} bytes, flash {twin.flash_dir}; "
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

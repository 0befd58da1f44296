"""Opening a board's accelerator: the PYNQ device it runs on, a real board's or a twin's.

The driver (:mod:`insitu.fpga.driver`) runs on any ``pynq.Device``; this module chooses which:
on an FPGA board, the one its PYNQ image probes; for a ``-sim`` board, a
:class:`~insitu.fpga.twin.TwinDevice`, loading the twin overlay written for it (or one given).

The board -> accelerator mapping: :func:`accelerator_params` is a board's (or its twin's)
accelerator parameters (the defaults with its board file's ``[accelerator]`` overrides; defined
in :mod:`insitu.boards` beside the schema that checks them, so that ``insitu.rtl`` can read it
without pynq), :func:`pl_clock_hz` its PL clock. A twin overlay is written with both; the
accelerator's figures convert cycles to seconds at the clock :func:`open_board` finds: on a board
the PL clock 0 the PS runs (pynq's ``Clocks``), else the rate the overlay's .hwh records, else the
board file's; on a twin, the board file's (its .hwh records the same).
"""

from __future__ import annotations

import warnings
from pathlib import Path

from insitu.boards import accelerator_params, pl_clock_hz
from insitu.errors import UsageError
from insitu.resources import cache_dir

from .driver import DEFAULT_TIMEOUT_S, Accelerator, BitstreamError, InsituOverlay, overlay_clock_hz
from .twin import MODES, TwinDevice, write_twin_overlay

__all__ = ["accelerator_params", "pl_clock_hz", "open_board", "board_device", "board_clock",
           "running_pl_clock_hz", "twin_overlay_dir", "RTL_TIMEOUT_S"]

#: Seconds any one wait may take on an RTL twin: the compiled one simulates a few hundred
#: thousand cycles a second (the network's largest op, under a million cycles, takes seconds;
#: the margin is for a loaded machine), the Amaranth one about a thousand.
RTL_TIMEOUT_S = {"rtl": 300.0, "rtl-amaranth": 1800.0}


def board_device():
    """The PYNQ device of the board this runs on, or a UsageError within seconds."""
    import pynq

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            devices = pynq.Device.devices
        except Exception as exc:                 # pynq's probes fail in many ways off a board
            devices, why = [], f" ({exc})"
        else:
            why = ""
    if not devices:
        raise UsageError("no PYNQ board here" + why + ": run this on the board's PYNQ image "
                         "(copy it there with `insitu deploy --board BOARD --host HOST`), or train "
                         "on a simulated twin with --board BOARD-sim")
    return devices[0]


def running_pl_clock_hz() -> int | None:
    """PL clock 0 as the PS runs it now (pynq's ``Clocks.fclk0_mhz`` reads the clock registers;
    on a board, after the overlay's download programmed them), or None where pynq cannot."""
    try:
        from pynq import Clocks

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mhz = float(Clocks.fclk0_mhz)
    except Exception:                            # no PS clock unit here, or pynq's probe failed
        return None
    return round(mhz * 1e6) if mhz > 0 else None


def board_clock(board, overlay=None, running: bool = False) -> tuple[int, str]:
    """The PL clock the figures use and where it came from: ``(hz, source)``.

    A twin: its board's ``pl_clock_hz`` (``"board file"``). A board: with ``running``, the rate
    the PS runs PL clock 0 at (``"PS clock registers"``); else the achieved rate the overlay's
    .hwh records (``"hwh"``); else the board file's."""
    if not board.is_twin:
        if running:
            hz = running_pl_clock_hz()
            if hz:
                return hz, "PS clock registers"
        if overlay is not None:
            hz = overlay_clock_hz(overlay)
            if hz:
                return hz, "hwh"
    return pl_clock_hz(board), "board file"


def twin_overlay_dir() -> Path:
    return cache_dir("overlays")


def open_board(board, mode: str = "fast", bitstream=None, timeout_s: float | None = None,
               fault: str | None = None) -> Accelerator:
    """The accelerator of ``board`` (an :class:`insitu.boards.Board`), ready to run ops.

    A real board needs ``bitstream`` (the .bit with its .hwh beside it) and a PYNQ image. A twin
    loads ``bitstream`` when given (a twin overlay), else one written for it; ``mode`` picks its
    model of the PL (``fast``, ``rtl`` (compiled with Verilator) or ``rtl-amaranth``); ``fault``
    injects a DMA fault (tests of the timeouts).
    """
    if board.kind != "fpga-soc":
        raise UsageError(f"{board.name} is not an FPGA board; the accelerator runs on "
                         "ultra96v2, zedboard and their -sim twins")
    if not board.is_twin:
        if bitstream is None:
            raise UsageError(f"--board {board.name} needs --bitstream FILE.bit (with its .hwh beside "
                             f"it; `insitu rtl generate` writes the Vivado scripts that build them)")
        for path in (Path(bitstream), Path(bitstream).with_suffix(".hwh")):
            if not path.is_file():
                raise BitstreamError(f"{path} is missing: pynq.Overlay needs the .bit and its .hwh side by side")
        overlay = InsituOverlay(bitstream, device=board_device())
        hz, source = board_clock(board, overlay, running=True)
        return Accelerator(overlay, timeout_s or DEFAULT_TIMEOUT_S, hz, source)
    if mode not in MODES:
        raise UsageError(f"unknown twin mode {mode!r}; choose one of {', '.join(MODES)}")
    device = TwinDevice(board.twin_of, mode, fault=fault)
    if bitstream is None:
        # Rewritten at every start (atomically): it always matches this insitu version, with the
        # board's accelerator parameters and PL clock.
        bitstream = write_twin_overlay(board.twin_of, twin_overlay_dir() / board.name,
                                       accelerator_params(board), clock_hz=pl_clock_hz(board))
    # The twin's PL clock is the board's pl_clock_hz; it has no PS clock unit to program.
    overlay = InsituOverlay(bitstream, device=device, set_pl_clocks=False)
    default = RTL_TIMEOUT_S.get(mode, DEFAULT_TIMEOUT_S)
    hz, source = board_clock(board, overlay)
    return Accelerator(overlay, timeout_s or default, hz, source)

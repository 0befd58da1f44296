"""The board's time of a training step and of an inference, from what the firmware counted.

The firmware (``firmware/fw_train.py``, ``Counter``) counts each step where it runs:

- on the Cortex-M7 twin, guest **instructions** (QEMU's ``-icount shift=0``: deterministic, one
  instruction per nanosecond of the twin's clock). They become the board's cycles by the board
  file's ``cycles_per_instruction``, a figure calibrated with CoreMark on the twin against Arm's
  published CoreMark/MHz for the Cortex-M7 (``python -m insitu.mcu.calibrate``; docs/mcu.md);
- on a board, core **cycles** (the DWT cycle counter);
- on the unix twin (x86 code) nothing: there is no board's time to give.

Seconds are cycles at the board file's ``cpu_hz``.
"""

from __future__ import annotations

from insitu.boards import Board
from insitu.errors import InsituError

STEPS = ("train", "infer")


def cycles_per_instruction(board: Board) -> float:
    """The board file's calibrated CPI (its twin's: the real board's)."""
    cpi = (board.mcu or {}).get("cycles_per_instruction")
    if cpi is None:
        raise InsituError(f"board {board.name} has no mcu.cycles_per_instruction: add the calibrated "
                          "figure to its board file (python -m insitu.mcu.calibrate)")
    return float(cpi)


def board_time(stats: dict, board: Board) -> dict | None:
    """``{"clock_hz", "counted", "cycles_per_instruction", "train": {...}, "infer": {...}}`` from
    the device's stats (``count``, ``<step>_steps``, ``<step>_mk``, ``<step>_k``); per step kind
    ``instructions_per_sample`` (the twin) or ``None`` (a board), ``cycles_per_sample``,
    ``seconds_per_sample``, ``samples``. None where nothing was counted."""
    counted = stats.get("count")
    if counted not in ("instructions", "cycles"):
        return None
    clock = board.cpu_hz
    cpi = cycles_per_instruction(board) if counted == "instructions" else None
    out: dict = {"clock_hz": clock, "counted": counted, "cycles_per_instruction": cpi}
    for step in STEPS:
        n = int(stats.get(f"{step}_steps", 0))
        if not n:
            out[step] = None
            continue
        total = (int(stats[f"{step}_mk"]) * 1_000_000 + int(stats[f"{step}_k"])) * 1000
        per = total / n
        cycles = per * cpi if cpi is not None else per
        out[step] = {"samples": n,
                     "instructions_per_sample": round(per) if cpi is not None else None,
                     "cycles_per_sample": round(cycles),
                     "seconds_per_sample": round(cycles / clock, 6)}
    return out


def describe(bt: dict | None) -> str:
    """``"412 ms / sample on the board at 216 MHz (training), 160 ms / inference"``, or ``""``."""
    if not bt or not bt.get("train"):
        return ""
    text = f"{1000 * bt['train']['seconds_per_sample']:,.0f} ms / training sample on the board at " \
           f"{bt['clock_hz'] / 1e6:.0f} MHz"
    if bt.get("infer"):
        text += f", {1000 * bt['infer']['seconds_per_sample']:,.0f} ms / inference"
    how = "counted by the board" if bt["counted"] == "cycles" else \
        f"{bt['cycles_per_instruction']} cycles per counted instruction"
    return f"{text} ({how})"

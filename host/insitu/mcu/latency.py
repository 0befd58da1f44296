"""The board's time of a compiled program, measured on the Cortex-M7 twin without flashing it.

`insitu train` measures the board's time of the run it makes (the firmware counts every step).
A comparison of many programs (`insitu mcu compare`, the Fig. 9 / Fig. 10 benchmarks) needs each
program's time without a training run over the link: :func:`measure_board_time` boots the twin
with the program in its PSRAM (:mod:`insitu.mcu.psram`: no UART transfer), runs the firmware's
own input path and counter (``fw_train.Input``, ``fw_train.Counter``) over a few samples, and
turns the counts into the board's time (:mod:`insitu.mcu.board_time`). The kernels are the ones
`insitu train` would deploy: C where they build, else viper (``code``).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from insitu.boards import get_board
from insitu.mcu import native, psram
from insitu.mcu.board_time import board_time
from insitu.mcu.flash import firmware_files
from insitu.errors import InsituError

#: Samples trained (then one inference) per measurement: steps differ by a few instructions
#: (saturations, the update's rounding), so the figure is their mean.
STEPS = 2

_SCRIPT = """
import gc, sys
with open("/flash/tte_model.bin", "wb") as fb:
    fb.write(section("blob"))
import fw_train, tte_model as M
fw_train.M = M
A = bytearray(M.ARENA_BYTES)
P = bytearray(M.PROGRAM_BYTES)
f = open("/flash/tte_model.bin", "rb")
f.readinto(P)
M.init(A, P, f)
counter = fw_train.Counter()
inp = fw_train.Input(A, P, f, counter)
x, y = section("x"), section("y")
n = M.INPUT_BYTES
for i in range(len(y) + 1):
    train = i < len(y)
    inp.begin()
    inp.put(x, (i % len(y)) * n, n)
    A[M.IO_OFF] = y[i % len(y)]
    gc.collect()
    counter.start()
    (M.train if train else M.infer)(A, P, f)
    counter.stop("train" if train else "infer")
print("CODE", M.CODE)
print("STATS", counter.text())
"""


def measure_board_time(compiled, x_codes: np.ndarray, labels: np.ndarray, board: str = "stm32f746-disco-sim",
                       steps: int = STEPS, heap_bytes: int = 1 << 20, kernels: str = "auto") -> dict:
    """``board_time`` (as in `insitu train --json`) of ``compiled`` on the Cortex-M7 twin, from
    ``steps`` training samples and one inference, plus ``code`` (the kernels that ran).
    ``kernels``: "auto" (C where they build) or "viper" (the viper kernels, for comparison)."""
    if len(x_codes) < steps:
        raise InsituError(f"measuring the board's time needs {steps} samples, got {len(x_codes)}")
    stream = np.concatenate([compiled.input_stream(x) for x in x_codes[:steps]])
    sections = {"blob": compiled.blob, "x": stream.tobytes(),
                "y": np.asarray(labels[:steps], np.uint8).tobytes()}
    with tempfile.TemporaryDirectory(prefix="insitu-latency-") as work:
        work = Path(work)
        src = work / "tte_model.py"
        src.write_text(compiled.module)
        for name, path in firmware_files().items():
            if name.endswith(".py") and name != "main.py":
                sections[name[:-3] + ".mpy"] = psram.cross_compile(Path(path), work / (name[:-3] + ".mpy")).read_bytes()
        sections["tte_model.mpy"] = psram.cross_compile(src, work / "tte_model.mpy").read_bytes()
        if kernels != "viper":
            try:
                sections[f"{native.MODULE}.mpy"] = native.native_mpy().read_bytes()
            except InsituError:
                pass                                # the viper kernels run; `code` says so
        out, _ = psram.run_on_twin(work / "twin", sections, _SCRIPT, timeout_s=1800, heap_bytes=heap_bytes)
    said = dict(line.split(" ", 1) for line in out.splitlines() if line.startswith(("CODE ", "STATS ")))
    stats = {k: (int(v) if v.isdigit() else v) for k, v in (kv.split("=") for kv in said["STATS"].split())}
    result = board_time(stats, get_board(board))
    if result is None:
        raise InsituError(f"the twin counted nothing: {said}")
    return {**result, "code": said["CODE"]}

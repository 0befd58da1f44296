"""Benchmark (prints figures): where a training step's Cortex-M7 instructions go, per kernel.

For each model (INSITU_MCU_PROFILE_MODELS, default the paper's MobileNetV2-w0.35 and mbv2-28),
the program `insitu train --board stm32f746-disco-sim --algo sparse --model M` runs (its default
scheme) is compiled, and a copy of its generated module that times every kernel call
(``time.ticks_us()`` around it: on the twin, under QEMU's ``-icount shift=0``, 1 us = 1000
instructions) runs on the Cortex-M7 twin: init, one training step (not counted: the first), a
second one and an inference, counted. The kernels are the ones the board gets: the C kernels
(tte_native.mpy) and, for comparison, the viper ones (INSITU_MCU_PROFILE_CODE=c,viper).

Printed per op kind (conv_fwd split by path: pointwise, depthwise 3x3, other), instructions per
training step and per inference, in millions, and each kind's share.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_mcu_profile.py
"""

import os
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import pytest

from insitu.boards import get_board
from insitu.mcu import native
from insitu.mcu.board_runs import Prepared, default_scheme
from insitu.resources import package_dir
from insitu.sparse import DEFAULT_LR, abi

from insitu.mcu.psram import cross_compile, run_on_twin

pytestmark = pytest.mark.benchmark

FIRMWARE = package_dir("firmware")
MODELS = os.environ.get("INSITU_MCU_PROFILE_MODELS", "mbv2-w0.35,mbv2-28").split(",")
CODES = os.environ.get("INSITU_MCU_PROFILE_CODE", "c,viper").split(",")


def conv_path(f: dict) -> str:
    """The path of tte_kernels.conv_fwd (and of the C kernel) a conv_fwd call takes."""
    if f["K"] == 1 and f["stride"] == 1 and f["pad"] == 0 and f["pad_x"] == 0 and (f["OH"], f["OW"]) == (f["H"], f["W"]):
        return "conv_fwd pointwise"
    if f["K"] == 3 and f["groups"] == f["C"]:
        return "conv_fwd depthwise 3x3"
    if f["K"] in (5, 7) and f["groups"] == f["C"]:
        return "conv_fwd depthwise 5x5/7x7"
    return "conv_fwd other"


def kind_of(program, pos: int) -> str:
    op, f = abi.fields(program, pos)
    return conv_path(f) if op == "conv_fwd" else op


def profiled_module(compiled) -> str:
    """compiled.module's calls, each timed into T[i] (i: the call's place in its segment)."""
    base = compiled.module
    head = base[:base.index("\ndef init(")]
    lines = [head.replace("from tte_ops import CODE, ", "from tte_ops import CODE, load, load_rows, "),
             "import time", "T = [0] * %d" % max(len(c) for c in compiled.calls.values())]
    stages = [seg for seg in compiled.calls if seg.startswith("stage")]
    for seg in compiled.calls:
        lines.append(f"def {seg}(A, P, f):")
        lines.append("    u = time.ticks_us")
        lines.append("    d = time.ticks_diff")
        for i, pos in enumerate(compiled.calls[seg]):
            op = abi.NAMES[int(compiled.program[pos])]
            args = f"A, P, {pos}, f" if op in ("load", "load_rows") else f"A, P, {pos}"
            lines.append(f"    t = u(); {op}({args}); T[{i}] = d(u(), t)")
        lines.append("    pass")
    lines.append(f"STAGES = ({''.join(s + ', ' for s in stages)})")
    return "\n".join(lines) + "\n"


SCRIPT = """
import gc
with open("/flash/tte_model.bin", "wb") as fb:
    fb.write(section("blob"))
import tte_model as M
A = bytearray(M.ARENA_BYTES)
P = bytearray(M.PROGRAM_BYTES)
f = open("/flash/tte_model.bin", "rb")
f.readinto(P)
M.init(A, P, f)
A[M.IO_OFF] = 1
print("CODE", M.CODE)
x = section("x")
for seg in ("train", "train", "infer"):
    at = 0
    for p, n in enumerate(M.WINDOWS):     # the input a window at a time, each window's patch run
        A[M.INPUT_OFF:M.INPUT_OFF + n] = x[at:at + n]
        at += n
        if M.STAGES:
            gc.collect()
            M.STAGES[p](A, P, f)
            print("stage%d" % p, " ".join(str(t) for t in M.T))
    gc.collect()
    getattr(M, seg)(A, P, f)
    print(seg, " ".join(str(t) for t in M.T))
"""


def profile(model: str, code: str, work: Path) -> dict:
    board = get_board("stm32f746-disco-sim")
    prep = Prepared(model, "digits", default_scheme(model, (board.mcu or {})["training_budget_bytes"]), DEFAULT_LR, 0)
    c = prep.compiled
    work.mkdir(parents=True, exist_ok=True)
    src = work / "tte_model.py"
    src.write_text(profiled_module(c))
    sections = {}
    modules = ["tte_abi", "tte_ops"] + (["tte_kernels"] if code == "viper" else [])
    for name in modules:
        sections[f"{name}.mpy"] = cross_compile(FIRMWARE / f"{name}.py", work / f"{name}.mpy").read_bytes()
    if code == "c":
        sections[f"{native.MODULE}.mpy"] = native.native_mpy().read_bytes()
    sections["tte_model.mpy"] = cross_compile(src, work / "tte_model.mpy").read_bytes()
    sections["blob"] = c.blob
    sections["x"] = c.input_stream(prep.x_test[0]).tobytes()
    out, _ = run_on_twin(work, sections, SCRIPT, timeout_s=3600, heap_bytes=1 << 20)
    lines = [line.split() for line in out.splitlines() if line.strip()]
    assert lines[0] == ["CODE", code], lines[0]
    runs = {}
    for row in lines[1:]:
        runs[row[0]] = [int(v) for v in row[1:]]        # the second "train" overwrites the first
    result = {}
    stages = [seg for seg in c.calls if seg.startswith("stage")]
    for seg in ("train", "infer"):
        per = defaultdict(int)
        for part in (*stages, seg):                 # the input's stages run before either
            for i, pos in enumerate(c.calls[part]):
                per[kind_of(c.program, pos)] += runs[part][i] * 1000     # instructions (1 us = 1000)
        result[seg] = dict(per)
    return result


@pytest.mark.parametrize("model", MODELS)
def test_profile(model, tmp_path, capsys):
    got = {code: profile(model, code, tmp_path / code) for code in CODES}
    with capsys.disabled():
        for seg in ("train", "infer"):
            kinds = sorted({k for g in got.values() for k in g[seg]}, key=lambda k: -got[CODES[0]][seg].get(k, 0))
            totals = {code: sum(got[code][seg].values()) for code in CODES}
            print(f"\n{model}, one {'training step' if seg == 'train' else 'inference'} on the Cortex-M7 twin, "
                  "millions of instructions (share)")
            print(f"{'kernel':28s}" + "".join(f"{code:>20s}" for code in CODES))
            for k in kinds:
                print(f"{k:28s}" + "".join(f"{got[code][seg].get(k, 0) / 1e6:12.2f} ({got[code][seg].get(k, 0) / max(1, totals[code]):4.0%})"
                                           for code in CODES))
            print(f"{'total':28s}" + "".join(f"{totals[code] / 1e6:12.2f}       " for code in CODES))

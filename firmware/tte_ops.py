# The kernels the generated tte_model calls: the C kernels (tte_native.mpy, a native module for
# the board's Cortex-M7) where this MicroPython can load them, else the viper kernels
# (tte_kernels.py: the unix twin, or a board without the .mpy). CODE says which; the host
# reports it. load and load_rows read the weight blob (a file) and stay in Python either way.
try:
    from tte_native import (conv_fwd, add_fwd, gap_fwd, loss_grad, argmax, act_bwd, grad_scale_ch,
                            conv_bwd_x, conv_grad_w, conv_upd_w, apply_w, bias_grad, bias_upd, apply_b,
                            gap_bwd, grad_add, acc_i32, zero, patch, window, act_mask, mask_bwd, copy)
    CODE = "c"
except (ImportError, ValueError):      # absent, or built for another arch ("incompatible .mpy")
    from tte_kernels import (conv_fwd, add_fwd, gap_fwd, loss_grad, argmax, act_bwd, grad_scale_ch,
                             conv_bwd_x, conv_grad_w, conv_upd_w, apply_w, bias_grad, bias_upd, apply_b,
                             gap_bwd, grad_add, acc_i32, zero, patch, window, act_mask, mask_bwd)
    from tte_kernels import _copy as copy
    CODE = "viper"
from tte_abi import (OP_ACC_I32, OP_ACT_BWD, OP_ACT_MASK, OP_ADD_FWD, OP_APPLY_B, OP_APPLY_W, OP_ARGMAX,
                     OP_BIAS_GRAD, OP_BIAS_UPD, OP_CONV_BWD_X, OP_CONV_FWD, OP_CONV_GRAD_W, OP_CONV_UPD_W,
                     OP_GAP_BWD, OP_GAP_FWD, OP_GRAD_ADD, OP_GRAD_SCALE_CH, OP_LOAD, OP_LOAD_ROWS,
                     OP_LOSS_GRAD, OP_MASK_BWD, OP_PATCH, OP_WINDOW, OP_ZERO)

_S = bytearray(512)          # the blob's bytes pass through here (a slice of A would allocate)


def _word(P, i):
    # P[i] of a table of little-endian int32 words (a bytearray or an array('i')); offsets and
    # sizes are small non-negative ints.
    if isinstance(P, bytearray):
        return P[4 * i] | (P[4 * i + 1] << 8) | (P[4 * i + 2] << 16) | (P[4 * i + 3] << 24)
    return P[i]


def _read(A, dst, f, n):
    while n > 0:
        k = f.readinto(_S, min(n, len(_S)))
        if not k:
            raise ValueError("load: the weight blob ends early")
        copy(A, dst, _S, k)
        dst += k
        n -= k


# fields(load): blob_off, dst_off, n
def load(A, P, o, f):
    f.seek(_word(P, o + 1))
    _read(A, _word(P, o + 2), f, _word(P, o + 3))


# fields(load_rows): blob_off, dst_off, rows, n, stride
def load_rows(A, P, o, f):
    src = _word(P, o + 1)
    dst = _word(P, o + 2)
    n = _word(P, o + 4)
    stride = _word(P, o + 5)
    for r in range(_word(P, o + 3)):
        f.seek(src + r * stride)
        _read(A, dst + r * n, f, n)


_BY_OP = {OP_CONV_FWD: conv_fwd, OP_ADD_FWD: add_fwd, OP_GAP_FWD: gap_fwd, OP_LOSS_GRAD: loss_grad,
          OP_ARGMAX: argmax, OP_ACT_BWD: act_bwd, OP_GRAD_SCALE_CH: grad_scale_ch,
          OP_CONV_BWD_X: conv_bwd_x, OP_CONV_GRAD_W: conv_grad_w, OP_CONV_UPD_W: conv_upd_w,
          OP_APPLY_W: apply_w, OP_BIAS_GRAD: bias_grad, OP_BIAS_UPD: bias_upd, OP_APPLY_B: apply_b,
          OP_GAP_BWD: gap_bwd, OP_GRAD_ADD: grad_add, OP_PATCH: patch, OP_ACC_I32: acc_i32, OP_ZERO: zero,
          OP_WINDOW: window, OP_ACT_MASK: act_mask, OP_MASK_BWD: mask_bwd}


def run(A, P, o, f=None):
    # The call at P[o] (tests and tools; the generated tte_model calls the kernels directly).
    op = _word(P, o)
    if op == OP_LOAD:
        load(A, P, o, f)
    elif op == OP_LOAD_ROWS:
        load_rows(A, P, o, f)
    elif op in _BY_OP:
        _BY_OP[op](A, P, o)
    else:
        raise ValueError("unknown opcode %d at P[%d]" % (op, o))

# Integer kernels of the int8 real quantized graph (tiny-training eq. 1), for MicroPython.
# Bit-exact with host/insitu/numerics.py: rounding is (v + 2**(shift-1)) >> shift (ties toward +inf),
# results saturate, nothing wraps. Buffers are preallocated `array`s owned by the caller.


def shift_round(v, shift):
    # v * 2**-shift rounded half up; MicroPython's >> on ints is an arithmetic (floor) shift.
    if shift <= 0:
        return v << -shift
    return (v + (1 << (shift - 1))) >> shift


def saturate(v, lo, hi):
    if v < lo:
        return lo
    if v > hi:
        return hi
    return v


def requantize(acc, multiplier, shift):
    # cast2int8(s * acc) with s = multiplier * 2**-shift.
    return saturate(shift_round(acc * multiplier, shift), -128, 127)


def dense_int8(x, w, b, multiplier, shift, out, n_in, n_out):
    # out[o] = requantize(sum_i w[o*n_in + i] * x[i] + b[o]) per output channel o.
    # x, w: array('b'); b, multiplier, shift: array('i') / array('b') per channel; out: array('b').
    for o in range(n_out):
        acc = b[o]
        row = o * n_in
        for i in range(n_in):
            acc += w[row + i] * x[i]
        out[o] = requantize(acc, multiplier[o], shift[o])
    return out

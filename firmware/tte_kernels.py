# Kernels of the compiled training program (the kernel ABI, insitu.sparse.abi) for MicroPython.
#
# Every public function is one opcode, called as kernel(A, P, o): A is the arena (a bytearray),
# P the parameter table (an array('i'), or the arena itself: P is only ever read as 32-bit words
# by viper code), P[o] the opcode and P[o+1:] its fields, in the order of insitu.sparse.abi.OPS
# (restated as "# fields(op):" above each kernel; tests/unit checks them against the ABI).
# The runtime kernels load and load_rows (they read the weight blob) and the dispatch by opcode
# are in tte_ops.py, which picks these kernels or the C ones (tte_native.mpy).
# Bit-exact with the golden model insitu.sparse.golden: tests/firmware runs both on random calls.
#
# Viper notes. ptr8/ptr16 loads are unsigned, and so are ptr32 loads on a 64-bit port: values are
# sign-extended by hand. No integer literal reaches 2**30, not even negated (-0x40000000 is a
# boxed object negated at run time on a 32-bit port, whose small ints have 31 bits: viper refuses
# it). Sums are 32-bit words on the device: the golden model refuses calls whose sums leave int32,
# so wrapping partial sums still end exact.
# Memory: nothing is allocated per call, on 32-bit words too: no viper function returns an int
# that may reach 2**30 (it would be boxed), no step needs big ints, and load reads the blob through
# _S. Every requantization goes through _requant on the module's scratch buffer _S: a header of 8
# words, then up to _CHUNK int32 sums.
import micropython
from micropython import const

from tte_abi import (IO_LABEL, IO_P_LABEL, IO_PREDICTED, IO_STEP, LOSS_GRAD_FRAC, SR_BITS, SR_K_SALT, SR_K_STEP, SR_M1, SR_M2)

_CHUNK = const(256)          # sums per _requant call; also the widest conv row: abi.MAX_ROW (tested)
_S = bytearray(4 * (8 + _CHUNK))
# _S header: [0] n, [1] mode, [2] dst (arena byte offset), [3] m, [4] sh, [5] lo, [6] hi,
# [7] rounding key of the first sum (_SUB_I8_SR); sums at [8:].
_TO_S = const(0)             # r clamped to [lo, hi], back into _S
_TO_I8 = const(1)            # y[i] = clamp(r, lo, hi), i8 at dst
_TO_I16 = const(2)           # the same, i16
_SUB_I8 = const(3)           # w[i] = clamp(w[i] - r, lo, hi), i8 at dst
_SUB_I32 = const(4)          # b[i] = sat32(b[i] - r), i32 at dst
_SUB_I8_SR = const(5)        # _SUB_I8 after r = (r + rnd) >> SR_BITS, rnd keyed by S[7] + i (insitu.numerics.sr_noise)
_BIG = const(0x3FFFFFFF)     # stands for an r beyond +-2**16 (see _requant)
_B_GRAD = const(0)           # _bias kinds: bias_grad, bias_upd, apply_b
_B_UPD = const(1)
_B_APPLY = const(2)


@micropython.viper
def _requant(A: ptr8, S: ptr32):
    # Each sum v in S[8:8+n] becomes r = rq(v, m, sh) = floor((v*m + 2**(sh-1)) / 2**sh), written
    # out by the header's mode. Exact in 32-bit words for |v| < 2**31, 0 <= m < 2**15, 1 <= sh <= 62:
    #   v = vh*2**15 + vl with vl in [0, 2**15) and vh in [-2**16, 2**16), so |vh*m| < 2**31 - 2**16,
    #   vl*m < 2**30, and t = vh*m + (vl*m >> 15) = floor(v*m / 2**15) fits in 31 bits;
    #   v*m = t*2**15 + f with f = vl*m & 0x7FFF.
    #   sh >= 16: u = floor(v*m / 2**(sh-1)) = t >> (sh-16) (a shift of 31 already gives 0 or -1,
    #     so longer ones are cut to 31), and r = floor((u+1) / 2) = (u >> 1) + (u & 1), |r| <= 2**30.
    #   sh <= 15: r = t*2**(15-sh) + ((f + 2**(sh-1)) >> sh), the second term in [0, 2**(15-sh)]:
    #     for |t| <= 2**16, |r| <= 2**30 + 2**14. For larger |t|, |r| >= 2**16 has t's sign and
    #     lies beyond every i8/i16 bound: +-_BIG stands for it. An i32 update (_SUB_I32) takes it
    #     exact instead, in 16-bit limbs: r = rh*2**16 + rl, with |rh| < 2**30 (|r| < 2**46).
    n = S[0]
    mode = S[1]
    dst = S[2]
    m = S[3]
    sh = S[4]
    lo = S[5]
    h = (lo >> 16) & 0xFFFF
    lo = (((h ^ 0x8000) - 0x8000) << 16) | (lo & 0xFFFF)
    hi = S[6]
    h = (hi >> 16) & 0xFFFF
    hi = (((h ^ 0x8000) - 0x8000) << 16) | (hi & 0xFFFF)
    k = sh - 16
    if k > 31:
        k = 31
    half = 0
    if sh <= 15:
        half = 1 << (sh - 1)
    imin = -0x3FFFFFFF - 1            # -2**30, a small int on 32 bits (0x40000000 is not)
    imin += imin                      # -2**31 in a machine word
    imax = -1 - imin
    y16 = ptr16(uint(A) + dst)
    y32 = ptr32(uint(A) + dst)
    for i in range(n):
        v = S[8 + i]
        h = (v >> 16) & 0xFFFF
        v = (((h ^ 0x8000) - 0x8000) << 16) | (v & 0xFFFF)
        vl = (v & 0x7FFF) * m
        t = (v >> 15) * m + (vl >> 15)
        wide = 0
        if sh > 15:
            u = t >> k
            r = (u >> 1) + (u & 1)
        elif t > 0x10000:
            r = _BIG
            wide = 1
        elif t < -0x10000:
            r = -_BIG
            wide = 1
        else:
            r = (t << (15 - sh)) + (((vl & 0x7FFF) + half) >> sh)
        if mode == _SUB_I8_SR:
            # rnd = the top SR_BITS bits of mix(key), mix as insitu.numerics.sr_noise says, in int32 words
            # (h: sign-extend the low 32 bits, the same on 32- and 64-bit words).
            x = S[7] + i
            h = (x >> 16) & 0xFFFF
            x = (((h ^ 0x8000) - 0x8000) << 16) | (x & 0xFFFF)
            x = (x ^ ((x >> 16) & 0xFFFF)) * int(SR_M1)
            h = (x >> 16) & 0xFFFF
            x = (((h ^ 0x8000) - 0x8000) << 16) | (x & 0xFFFF)
            x = (x ^ ((x >> 15) & 0x1FFFF)) * int(SR_M2)
            h = (x >> 16) & 0xFFFF
            x = (((h ^ 0x8000) - 0x8000) << 16) | (x & 0xFFFF)
            x = x ^ ((x >> 16) & 0xFFFF)
            r = (r + ((x >> (32 - int(SR_BITS))) & ((1 << int(SR_BITS)) - 1))) >> int(SR_BITS)
            r = ((A[dst + i] ^ 0x80) - 0x80) - r
        elif mode == _SUB_I32:
            b = y32[i]
            h = (b >> 16) & 0xFFFF
            b = (((h ^ 0x8000) - 0x8000) << 16) | (b & 0xFFFF)
            if wide:
                # b - r with r = t*2**q + c (q = 15 - sh in [0, 14], c in [0, 2**q]) in limbs:
                # t*2**q = (t >> (16-q))*2**16 + (t mod 2**(16-q))*2**q. The difference's high
                # limb dh is exact in a word; it fits int32 iff dh is in [-2**15, 2**15).
                q = 15 - sh
                rl = ((t & ((1 << (16 - q)) - 1)) << q) + (((vl & 0x7FFF) + half) >> sh)
                rh = (t >> (16 - q)) + (rl >> 16)
                dl = (b & 0xFFFF) - (rl & 0xFFFF)
                dh = (b >> 16) - rh + (dl >> 16)
                if dh < -0x8000:
                    b = imin
                elif dh > 0x7FFF:
                    b = imax
                else:
                    b = (dh << 16) | (dl & 0xFFFF)
            elif r > 0 and b < imin + r:
                b = imin
            elif r < 0 and b > imax + r:
                b = imax
            else:
                b -= r
            y32[i] = b
            continue
        if mode == _SUB_I8:
            r = ((A[dst + i] ^ 0x80) - 0x80) - r
        if r < lo:
            r = lo
        elif r > hi:
            r = hi
        if mode == _TO_I16:
            y16[i] = r
        elif mode == _TO_S:
            S[8 + i] = r
        else:
            A[dst + i] = r


@micropython.viper
def _signed(P: ptr32, i: int) -> int:
    # P[i] as a signed 32-bit value (a ptr32 load is zero-extended on a 64-bit port).
    v = P[i]
    h = (v >> 16) & 0xFFFF
    return (((h ^ 0x8000) - 0x8000) << 16) | (v & 0xFFFF)


@micropython.viper
def _copy(A: ptr8, dst: int, src: ptr8, n: int):
    for i in range(n):
        A[dst + i] = src[i]


# --------------------------------------------------------------------------- forward

# pad: the zero rows above the map, pad_x: the zero columns left of it (they differ on a patch)
# fields(conv_fwd): x_off, w_off, b_off, m_off, sh_off, y_off, C, H, W, O, OH, OW, K, stride, pad, groups, lo, hi, pad_x
@micropython.viper
def conv_fwd(A: ptr8, P: ptr32, o: int):
    K = P[o + 13]
    if (K == 1 and P[o + 14] == 1 and P[o + 15] == 0 and P[o + 19] == 0 and P[o + 11] == P[o + 8]
            and P[o + 12] == P[o + 9]):
        _conv_pw(A, P, o)
    elif K == 3 and P[o + 16] == P[o + 7]:       # groups == C: one input channel per output
        _conv_dw3(A, P, o)
    else:
        _conv_any(A, P, o)


@micropython.viper
def _conv_any(A: ptr8, P: ptr32, o: int):
    # Any geometry, one output row at a time: every kernel tap adds its weight times a strided
    # run of an input row to the row's sums (the runs are clipped to the unpadded input).
    x = P[o + 1]
    w = P[o + 2]
    bs = ptr32(uint(A) + P[o + 3])
    ms = ptr32(uint(A) + P[o + 4])
    ss = ptr32(uint(A) + P[o + 5])
    y = P[o + 6]
    C = P[o + 7]
    H = P[o + 8]
    W = P[o + 9]
    O = P[o + 10]
    OH = P[o + 11]
    OW = P[o + 12]
    K = P[o + 13]
    s = P[o + 14]
    pad = P[o + 15]
    G = P[o + 16]
    px = P[o + 19]
    if OW > _CHUNK:
        raise ValueError("conv_fwd: output rows longer than _CHUNK")
    S = ptr32(_S)
    S[0] = OW
    S[1] = _TO_I8
    S[5] = P[o + 17]
    S[6] = P[o + 18]
    Cg = C // G
    Og = O // G
    HW = H * W
    for oc in range(O):
        v = bs[oc]
        h = (v >> 16) & 0xFFFF
        bias = (((h ^ 0x8000) - 0x8000) << 16) | (v & 0xFFFF)
        S[3] = ms[oc]
        S[4] = ss[oc]
        xg = x + (oc // Og) * Cg * HW
        wo = w + oc * Cg * K * K
        for oy in range(OH):
            for i in range(OW):
                S[8 + i] = bias
            iy0 = oy * s - pad
            for ci in range(Cg):
                for ky in range(K):
                    iy = iy0 + ky
                    if iy < 0 or iy >= H:
                        continue
                    xr = xg + ci * HW + iy * W - px
                    wr = wo + (ci * K + ky) * K
                    for kx in range(K):
                        wv = (A[wr + kx] ^ 0x80) - 0x80
                        ox0 = 0
                        if kx < px:
                            ox0 = (px - kx + s - 1) // s
                        ox1 = (W - 1 + px - kx) // s + 1
                        if ox1 > OW:
                            ox1 = OW
                        p = xr + ox0 * s + kx
                        for ox in range(ox0, ox1):
                            S[8 + ox] += wv * ((A[p] ^ 0x80) - 0x80)
                            p += s
            S[2] = y + (oc * OH + oy) * OW
            _requant(A, S)


@micropython.viper
def _conv_dw3(A: ptr8, P: ptr32, o: int):
    # 3x3 depthwise (any stride, pad, channel multiplier): the nine weights in registers; the
    # interior outputs, whose taps all fall inside the input, unrolled; the border checked per tap.
    x = P[o + 1]
    w = P[o + 2]
    bs = ptr32(uint(A) + P[o + 3])
    ms = ptr32(uint(A) + P[o + 4])
    ss = ptr32(uint(A) + P[o + 5])
    y = P[o + 6]
    H = P[o + 8]
    W = P[o + 9]
    O = P[o + 10]
    OH = P[o + 11]
    OW = P[o + 12]
    s = P[o + 14]
    pad = P[o + 15]
    Og = O // P[o + 16]
    px = P[o + 19]
    if OW > _CHUNK:
        raise ValueError("conv_fwd: output rows longer than _CHUNK")
    S = ptr32(_S)
    S[0] = OW
    S[1] = _TO_I8
    S[5] = P[o + 17]
    S[6] = P[o + 18]
    HW = H * W
    oxa = (px + s - 1) // s                   # interior columns: 0 <= ox*s - px, ox*s - px + 2 < W
    oxb = (W - 3 + px) // s + 1
    if oxb > OW:
        oxb = OW
    if oxb < oxa:
        oxb = oxa
    for oc in range(O):
        v = bs[oc]
        h = (v >> 16) & 0xFFFF
        bias = (((h ^ 0x8000) - 0x8000) << 16) | (v & 0xFFFF)
        S[3] = ms[oc]
        S[4] = ss[oc]
        xc = x + (oc // Og) * HW
        wo = w + oc * 9
        w0 = (A[wo] ^ 0x80) - 0x80
        w1 = (A[wo + 1] ^ 0x80) - 0x80
        w2 = (A[wo + 2] ^ 0x80) - 0x80
        w3 = (A[wo + 3] ^ 0x80) - 0x80
        w4 = (A[wo + 4] ^ 0x80) - 0x80
        w5 = (A[wo + 5] ^ 0x80) - 0x80
        w6 = (A[wo + 6] ^ 0x80) - 0x80
        w7 = (A[wo + 7] ^ 0x80) - 0x80
        w8 = (A[wo + 8] ^ 0x80) - 0x80
        for oy in range(OH):
            iy = oy * s - pad
            xa = 0
            xb = 0
            if iy >= 0 and iy + 3 <= H:
                xa = oxa
                xb = oxb
                r0 = xc + iy * W - px
                r1 = r0 + W
                r2 = r1 + W
                for ox in range(xa, xb):
                    p = ox * s
                    S[8 + ox] = (bias + w0 * ((A[r0 + p] ^ 0x80) - 0x80)
                                 + w1 * ((A[r0 + p + 1] ^ 0x80) - 0x80)
                                 + w2 * ((A[r0 + p + 2] ^ 0x80) - 0x80)
                                 + w3 * ((A[r1 + p] ^ 0x80) - 0x80)
                                 + w4 * ((A[r1 + p + 1] ^ 0x80) - 0x80)
                                 + w5 * ((A[r1 + p + 2] ^ 0x80) - 0x80)
                                 + w6 * ((A[r2 + p] ^ 0x80) - 0x80)
                                 + w7 * ((A[r2 + p + 1] ^ 0x80) - 0x80)
                                 + w8 * ((A[r2 + p + 2] ^ 0x80) - 0x80))
            for ox in range(OW):
                if ox >= xa and ox < xb:
                    continue
                acc = bias
                ix = ox * s - px
                for ky in range(3):
                    yy = iy + ky
                    if yy < 0 or yy >= H:
                        continue
                    for kx in range(3):
                        if ix + kx >= 0 and ix + kx < W:
                            acc += ((A[wo + ky * 3 + kx] ^ 0x80) - 0x80) * ((A[xc + yy * W + ix + kx] ^ 0x80) - 0x80)
                S[8 + ox] = acc
            S[2] = y + (oc * OH + oy) * OW
            _requant(A, S)


@micropython.viper
def _conv_pw(A: ptr8, P: ptr32, o: int):
    # 1x1, stride 1, no padding (pointwise convs and dense layers): each output position is a dot
    # product over the group's input channels, in chunks of _CHUNK positions; four positions at a
    # time share each weight load (1.7x faster than one at a time).
    x = P[o + 1]
    w = P[o + 2]
    bs = ptr32(uint(A) + P[o + 3])
    ms = ptr32(uint(A) + P[o + 4])
    ss = ptr32(uint(A) + P[o + 5])
    y = P[o + 6]
    C = P[o + 7]
    HW = P[o + 8] * P[o + 9]
    O = P[o + 10]
    G = P[o + 16]
    S = ptr32(_S)
    S[1] = _TO_I8
    S[5] = P[o + 17]
    S[6] = P[o + 18]
    Cg = C // G
    Og = O // G
    for oc in range(O):
        v = bs[oc]
        h = (v >> 16) & 0xFFFF
        bias = (((h ^ 0x8000) - 0x8000) << 16) | (v & 0xFFFF)
        S[3] = ms[oc]
        S[4] = ss[oc]
        xg = x + (oc // Og) * Cg * HW
        wo = w + oc * Cg
        p0 = 0
        while p0 < HW:
            n = HW - p0
            if n > _CHUNK:
                n = _CHUNK
            i = 0
            while i + 4 <= n:
                a0 = bias
                a1 = bias
                a2 = bias
                a3 = bias
                p = xg + p0 + i
                for ci in range(Cg):
                    wv = (A[wo + ci] ^ 0x80) - 0x80
                    a0 += wv * ((A[p] ^ 0x80) - 0x80)
                    a1 += wv * ((A[p + 1] ^ 0x80) - 0x80)
                    a2 += wv * ((A[p + 2] ^ 0x80) - 0x80)
                    a3 += wv * ((A[p + 3] ^ 0x80) - 0x80)
                    p += HW
                S[8 + i] = a0
                S[9 + i] = a1
                S[10 + i] = a2
                S[11 + i] = a3
                i += 4
            while i < n:
                acc = bias
                p = xg + p0 + i
                for ci in range(Cg):
                    acc += ((A[wo + ci] ^ 0x80) - 0x80) * ((A[p] ^ 0x80) - 0x80)
                    p += HW
                S[8 + i] = acc
                i += 1
            S[0] = n
            S[2] = y + oc * HW + p0
            _requant(A, S)
            p0 += n


@micropython.viper
def _add(A: ptr8, P: ptr32, o: int, wide: int):
    # y = rq(a*ma + b*mb, sh): i8 with the fields' clamp (add_fwd) or i16 saturated (grad_add).
    a = P[o + 1]
    b = P[o + 2]
    y = P[o + 3]
    n = P[o + 4]
    ma = P[o + 5]
    mb = P[o + 6]
    S = ptr32(_S)
    S[3] = 1
    S[4] = P[o + 7]
    if wide:
        S[1] = _TO_I16
        S[5] = -32768
        S[6] = 32767
    else:
        S[1] = _TO_I8
        S[5] = P[o + 8]
        S[6] = P[o + 9]
    a16 = ptr16(uint(A) + a)
    b16 = ptr16(uint(A) + b)
    i0 = 0
    while i0 < n:
        k = n - i0
        if k > _CHUNK:
            k = _CHUNK
        if wide:
            for i in range(k):
                S[8 + i] = ((a16[i0 + i] ^ 0x8000) - 0x8000) * ma + ((b16[i0 + i] ^ 0x8000) - 0x8000) * mb
            S[2] = y + 2 * i0
        else:
            for i in range(k):
                S[8 + i] = ((A[a + i0 + i] ^ 0x80) - 0x80) * ma + ((A[b + i0 + i] ^ 0x80) - 0x80) * mb
            S[2] = y + i0
        S[0] = k
        _requant(A, S)
        i0 += k


# fields(add_fwd): a_off, b_off, y_off, n, ma, mb, sh, lo, hi
def add_fwd(A, P, o):
    _add(A, P, o, 0)


# fields(gap_fwd): x_off, y_off, C, HW, m, sh
@micropython.viper
def gap_fwd(A: ptr8, P: ptr32, o: int):
    x = P[o + 1]
    y = P[o + 2]
    C = P[o + 3]
    HW = P[o + 4]
    S = ptr32(_S)
    S[1] = _TO_I8
    S[3] = P[o + 5]
    S[4] = P[o + 6]
    S[5] = -128
    S[6] = 127
    c0 = 0
    while c0 < C:
        n = C - c0
        if n > _CHUNK:
            n = _CHUNK
        for i in range(n):
            acc = 0
            p = x + (c0 + i) * HW
            for q in range(HW):
                acc += (A[p + q] ^ 0x80) - 0x80
            S[8 + i] = acc
        S[0] = n
        S[2] = y + c0
        _requant(A, S)
        c0 += n


# fields(argmax): z_off, n, io_off
@micropython.viper
def argmax(A: ptr8, P: ptr32, o: int):
    z = P[o + 1]
    n = P[o + 2]
    io = ptr32(uint(A) + P[o + 3])
    best = 0
    zmax = (A[z] ^ 0x80) - 0x80
    for k in range(1, n):
        v = (A[z + k] ^ 0x80) - 0x80
        if v > zmax:
            zmax = v
            best = k
    io[int(IO_PREDICTED)] = best


# fields(loss_grad): z_off, g_off, n, exp_off, io_off
@micropython.viper
def loss_grad(A: ptr8, P: ptr32, o: int):
    # The exp table's entries are in [0, 2**16] (the golden model checks it): e * 2**14 + S // 2
    # stays below 2**31 for any n < 2**14.
    z = P[o + 1]
    g16 = ptr16(uint(A) + P[o + 2])
    n = P[o + 3]
    E = ptr32(uint(A) + P[o + 4])
    io = ptr32(uint(A) + P[o + 5])
    one = 1 << int(LOSS_GRAD_FRAC)
    label = io[int(IO_LABEL)]
    if label < 0 or label >= n:
        raise ValueError("loss_grad: label outside the classes")
    best = 0
    zmax = (A[z] ^ 0x80) - 0x80
    for k in range(1, n):
        v = (A[z + k] ^ 0x80) - 0x80
        if v > zmax:
            zmax = v
            best = k
    tot = 0
    for k in range(n):
        tot += E[zmax - ((A[z + k] ^ 0x80) - 0x80)]
    if tot == 0:
        raise ValueError("loss_grad: the exp table sums to 0")
    for k in range(n):
        q = (E[zmax - ((A[z + k] ^ 0x80) - 0x80)] * one + tot // 2) // tot
        if k == label:
            io[int(IO_P_LABEL)] = q
            q -= one
        g16[k] = q
    io[int(IO_PREDICTED)] = best
    io[int(IO_STEP)] = io[int(IO_STEP)] + 1


# --------------------------------------------------------------------------- backward

# fields(act_bwd): y_off, g_off, n, lo, hi
@micropython.viper
def act_bwd(A: ptr8, P: ptr32, o: int):
    y = P[o + 1]
    g16 = ptr16(uint(A) + P[o + 2])
    n = P[o + 3]
    lo = int(_signed(P, o + 4))
    hi = int(_signed(P, o + 5))
    for i in range(n):
        v = (A[y + i] ^ 0x80) - 0x80
        if v <= lo or v >= hi:
            g16[i] = 0


# fields(act_mask): y_off, m_off, n, lo, hi
@micropython.viper
def act_mask(A: ptr8, P: ptr32, o: int):
    y = P[o + 1]
    m = P[o + 2]
    n = P[o + 3]
    lo = int(_signed(P, o + 4))
    hi = int(_signed(P, o + 5))
    for j in range((n + 7) >> 3):
        bits = 0
        for b in range(8):
            i = (j << 3) + b
            if i < n:
                v = (A[y + i] ^ 0x80) - 0x80
                if lo < v and v < hi:
                    bits |= 1 << b
        A[m + j] = bits


# fields(mask_bwd): m_off, g_off, n
@micropython.viper
def mask_bwd(A: ptr8, P: ptr32, o: int):
    m = P[o + 1]
    g16 = ptr16(uint(A) + P[o + 2])
    n = P[o + 3]
    for i in range(n):
        if not (A[m + (i >> 3)] >> (i & 7)) & 1:
            g16[i] = 0


# fields(grad_scale_ch): g_off, C, HW, m_off, sh_off
@micropython.viper
def grad_scale_ch(A: ptr8, P: ptr32, o: int):
    g = P[o + 1]
    C = P[o + 2]
    HW = P[o + 3]
    ms = ptr32(uint(A) + P[o + 4])
    ss = ptr32(uint(A) + P[o + 5])
    g16 = ptr16(uint(A) + g)
    S = ptr32(_S)
    S[1] = _TO_I16
    S[5] = -32768
    S[6] = 32767
    for c in range(C):
        S[3] = ms[c]
        S[4] = ss[c]
        p0 = 0
        while p0 < HW:
            n = HW - p0
            if n > _CHUNK:
                n = _CHUNK
            base = c * HW + p0
            for i in range(n):
                S[8 + i] = (g16[base + i] ^ 0x8000) - 0x8000
            S[0] = n
            S[2] = g + 2 * base
            _requant(A, S)
            p0 += n


# fields(conv_bwd_x): gy_off, w_off, gx_off, C, H, W, O, OH, OW, K, stride, pad, groups, m, sh
@micropython.viper
def conv_bwd_x(A: ptr8, P: ptr32, o: int):
    # One input row (c, iy) at a time: each output row oy that a kernel row ky maps onto iy adds
    # w times its gradients, strided, into the row's sums.
    g16 = ptr16(uint(A) + P[o + 1])
    w = P[o + 2]
    gx = P[o + 3]
    C = P[o + 4]
    H = P[o + 5]
    W = P[o + 6]
    O = P[o + 7]
    OH = P[o + 8]
    OW = P[o + 9]
    K = P[o + 10]
    s = P[o + 11]
    pad = P[o + 12]
    G = P[o + 13]
    if W > _CHUNK:
        raise ValueError("conv_bwd_x: input rows longer than _CHUNK")
    S = ptr32(_S)
    S[0] = W
    S[1] = _TO_I16
    S[3] = P[o + 14]
    S[4] = P[o + 15]
    S[5] = -32768
    S[6] = 32767
    Cg = C // G
    Og = O // G
    for c in range(C):
        grp = c // Cg
        ci = c - grp * Cg
        for iy in range(H):
            for i in range(W):
                S[8 + i] = 0
            for oc in range(grp * Og, grp * Og + Og):
                wc = w + (oc * Cg + ci) * K * K
                for ky in range(K):
                    t = iy + pad - ky
                    if t < 0:
                        break
                    if t % s:
                        continue
                    oy = t // s
                    if oy >= OH:
                        continue
                    gr = (oc * OH + oy) * OW
                    for kx in range(K):
                        wv = (A[wc + ky * K + kx] ^ 0x80) - 0x80
                        ox0 = 0
                        if kx < pad:
                            ox0 = (pad - kx + s - 1) // s
                        ox1 = (W - 1 + pad - kx) // s + 1
                        if ox1 > OW:
                            ox1 = OW
                        j = 8 + ox0 * s + kx - pad
                        for ox in range(ox0, ox1):
                            S[j] += wv * ((g16[gr + ox] ^ 0x8000) - 0x8000)
                            j += s
            S[2] = gx + 2 * (c * H + iy) * W
            _requant(A, S)


@micropython.viper
def _grad_w(A: ptr8, P: ptr32, o: int, upd: int):
    # G[j, ci, ky, kx] one at a time, as a sum over the output positions whose tap falls inside
    # the input. upd = 0: stored (conv_grad_w); 1: buffered in _S and applied to the rows.
    g16 = ptr16(uint(A) + P[o + 1])
    x = P[o + 2]
    dst = P[o + 3]
    idx = ptr32(uint(A) + P[o + 4])
    n_sel = P[o + 5]
    f = o + 5 + 2 * upd                       # conv_upd_w has um_off, ush_off before the geometry
    ums = ptr32(uint(A) + P[o + 6])           # read for conv_upd_w only
    ushs = ptr32(uint(A) + P[o + 7])
    C = P[f + 1]
    H = P[f + 2]
    W = P[f + 3]
    O = P[f + 4]
    OH = P[f + 5]
    OW = P[f + 6]
    K = P[f + 7]
    s = P[f + 8]
    pad = P[f + 9]
    G = P[f + 10]
    Cg = C // G
    Og = O // G
    HW = H * W
    row = Cg * K * K
    gw = ptr32(uint(A) + dst)
    S = ptr32(_S)
    S[1] = _SUB_I8_SR
    S[5] = -128
    S[6] = 127
    key = 0
    if upd:
        # The rounding key of element 0 (insitu.numerics.sr_noise): step * SR_K_STEP + salt * SR_K_SALT, kept
        # in the word, never returned (a viper int return >= 2**30 is a boxed object on 32 bits);
        # only its low 32 bits matter (_requant sign-extends S[7] + i).
        io = ptr32(uint(A) + P[f + 11])
        key = io[int(IO_STEP)] * int(SR_K_STEP) + P[f + 12] * int(SR_K_SALT)
    for j in range(n_sel):
        oc = idx[j]
        xg = x + (oc // Og) * Cg * HW
        if upd:
            S[3] = ums[j]
            S[4] = ushs[j]
        fill = 0
        start = j * row
        e = start
        for ci in range(Cg):
            xc = xg + ci * HW
            for ky in range(K):
                oy0 = 0
                if ky < pad:
                    oy0 = (pad - ky + s - 1) // s
                oy1 = (H - 1 + pad - ky) // s + 1
                if oy1 > OH:
                    oy1 = OH
                for kx in range(K):
                    ox0 = 0
                    if kx < pad:
                        ox0 = (pad - kx + s - 1) // s
                    ox1 = (W - 1 + pad - kx) // s + 1
                    if ox1 > OW:
                        ox1 = OW
                    acc = 0
                    for oy in range(oy0, oy1):
                        gr = (oc * OH + oy) * OW
                        p = xc + (oy * s + ky - pad) * W + ox0 * s + kx - pad
                        for ox in range(ox0, ox1):
                            acc += ((g16[gr + ox] ^ 0x8000) - 0x8000) * ((A[p] ^ 0x80) - 0x80)
                            p += s
                    if upd:
                        S[8 + fill] = acc
                        fill += 1
                        if fill == _CHUNK:
                            S[0] = fill
                            S[2] = dst + start
                            S[7] = key + start
                            _requant(A, S)
                            start += fill
                            fill = 0
                    else:
                        gw[e] = acc
                    e += 1
        if fill:
            S[0] = fill
            S[2] = dst + start
            S[7] = key + start
            _requant(A, S)


# fields(conv_grad_w): gy_off, x_off, gw_off, idx_off, n_sel, C, H, W, O, OH, OW, K, stride, pad, groups
def conv_grad_w(A, P, o):
    _grad_w(A, P, o, 0)


# fields(conv_upd_w): gy_off, x_off, w_off, idx_off, n_sel, um_off, ush_off, C, H, W, O, OH, OW, K, stride, pad, groups, io_off, salt
def conv_upd_w(A, P, o):
    _grad_w(A, P, o, 1)


# fields(apply_w): gw_off, w_off, n_sel, row_len, um_off, ush_off, io_off, salt
@micropython.viper
def apply_w(A: ptr8, P: ptr32, o: int):
    gw = ptr32(uint(A) + P[o + 1])
    w = P[o + 2]
    n_sel = P[o + 3]
    row = P[o + 4]
    ums = ptr32(uint(A) + P[o + 5])
    ushs = ptr32(uint(A) + P[o + 6])
    io = ptr32(uint(A) + P[o + 7])            # the rounding key, as in _grad_w
    key = io[int(IO_STEP)] * int(SR_K_STEP) + P[o + 8] * int(SR_K_SALT)
    S = ptr32(_S)
    S[1] = _SUB_I8_SR
    S[5] = -128
    S[6] = 127
    for j in range(n_sel):
        S[3] = ums[j]
        S[4] = ushs[j]
        e0 = j * row
        end = e0 + row
        while e0 < end:
            n = end - e0
            if n > _CHUNK:
                n = _CHUNK
            for i in range(n):
                S[8 + i] = gw[e0 + i]
            S[0] = n
            S[2] = w + e0
            S[7] = key + e0
            _requant(A, S)
            e0 += n


@micropython.viper
def _bias(A: ptr8, P: ptr32, o: int, kind: int):
    # Gb[o] = sum_p gy[o, p], then stored (bias_grad), or b[o] = sat32(b[o] - rq(Gb[o], ...))
    # (bias_upd), or the same step from a stored Gb (apply_b).
    src = P[o + 1]
    dst = P[o + 2]
    O = P[o + 3]
    HW = P[o + 4]
    f = o + 4                                 # um_off, ush_off follow at P[f + 1], P[f + 2]
    if kind == _B_APPLY:
        f = o + 3
    g16 = ptr16(uint(A) + src)
    g32 = ptr32(uint(A) + src)
    gb = ptr32(uint(A) + dst)
    ums = ptr32(uint(A) + P[f + 1])
    ushs = ptr32(uint(A) + P[f + 2])
    S = ptr32(_S)
    S[0] = 1
    S[1] = _SUB_I32
    p = 0
    for oc in range(O):
        if kind == _B_APPLY:
            acc = g32[oc]
        else:
            acc = 0
            for i in range(HW):
                acc += (g16[p] ^ 0x8000) - 0x8000
                p += 1
        if kind == _B_GRAD:
            gb[oc] = acc
        else:
            S[8] = acc
            S[2] = dst + 4 * oc
            S[3] = ums[oc]
            S[4] = ushs[oc]
            _requant(A, S)


# fields(bias_grad): gy_off, gb_off, O, HW
def bias_grad(A, P, o):
    _bias(A, P, o, _B_GRAD)


# fields(bias_upd): gy_off, b_off, O, HW, um_off, ush_off
def bias_upd(A, P, o):
    _bias(A, P, o, _B_UPD)


# fields(apply_b): gb_off, b_off, O, um_off, ush_off
def apply_b(A, P, o):
    _bias(A, P, o, _B_APPLY)


# fields(gap_bwd): gy_off, gx_off, C, HW, m, sh
@micropython.viper
def gap_bwd(A: ptr8, P: ptr32, o: int):
    gy = ptr16(uint(A) + P[o + 1])
    gx = ptr16(uint(A) + P[o + 2])
    C = P[o + 3]
    HW = P[o + 4]
    S = ptr32(_S)
    S[1] = _TO_S
    S[3] = P[o + 5]
    S[4] = P[o + 6]
    S[5] = -32768
    S[6] = 32767
    c0 = 0
    while c0 < C:
        n = C - c0
        if n > _CHUNK:
            n = _CHUNK
        for i in range(n):
            S[8 + i] = (gy[c0 + i] ^ 0x8000) - 0x8000
        S[0] = n
        _requant(A, S)
        for i in range(n):
            v = S[8 + i]
            p = (c0 + i) * HW
            for q in range(HW):
                gx[p + q] = v
        c0 += n


# fields(grad_add): a_off, b_off, y_off, n, ma, mb, sh
def grad_add(A, P, o):
    _add(A, P, o, 1)


# --------------------------------------------------------------------------- runtime

# fields(patch): src_off, dst_off, idx_off, n_sel, row_bytes
@micropython.viper
def patch(A: ptr8, P: ptr32, o: int):
    src = P[o + 1]
    dst = P[o + 2]
    idx = ptr32(uint(A) + P[o + 3])
    n_sel = P[o + 4]
    rb = P[o + 5]
    for j in range(n_sel):
        d = dst + idx[j] * rb
        s = src + j * rb
        for i in range(rb):
            A[d + i] = A[s + i]


# fields(window): src_off, dst_off, C, h, w, src_H, src_W, src_y, src_x, dst_H, dst_W, dst_y, dst_x
@micropython.viper
def window(A: ptr8, P: ptr32, o: int):
    h = P[o + 4]
    w = P[o + 5]
    sH = P[o + 6]
    sW = P[o + 7]
    dH = P[o + 10]
    dW = P[o + 11]
    src = P[o + 1] + P[o + 8] * sW + P[o + 9]
    dst = P[o + 2] + P[o + 12] * dW + P[o + 13]
    for c in range(P[o + 3]):
        for i in range(h):
            s = src + i * sW
            d = dst + i * dW
            for j in range(w):
                A[d + j] = A[s + j]
        src += sH * sW
        dst += dH * dW


# fields(acc_i32): src_off, dst_off, n
@micropython.viper
def acc_i32(A: ptr8, P: ptr32, o: int):
    src = ptr32(uint(A) + P[o + 1])
    dst = ptr32(uint(A) + P[o + 2])
    n = P[o + 3]
    imin = -0x3FFFFFFF - 1            # -2**30, a small int on 32 bits (0x40000000 is not)
    imin += imin                      # -2**31 in a machine word
    imax = -1 - imin
    for i in range(n):
        a = dst[i]
        h = (a >> 16) & 0xFFFF
        a = (((h ^ 0x8000) - 0x8000) << 16) | (a & 0xFFFF)
        b = src[i]
        h = (b >> 16) & 0xFFFF
        b = (((h ^ 0x8000) - 0x8000) << 16) | (b & 0xFFFF)
        if b > 0 and a > imax - b:
            a = imax
        elif b < 0 and a < imin - b:
            a = imin
        else:
            a += b
        dst[i] = a


# fields(zero): dst_off, n
@micropython.viper
def zero(A: ptr8, P: ptr32, o: int):
    dst = P[o + 1]
    for i in range(P[o + 2]):
        A[dst + i] = 0

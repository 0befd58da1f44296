/* The backward kernels: input gradient of a conv (conv_bwd_x), weight gradient of its selected
 * output channels (conv_grad_w, and conv_upd_w that applies it at once), the SGD steps of stored
 * gradients (apply_w, apply_b) and the bias gradient (bias_grad, bias_upd). Bit-exact with
 * insitu.sparse.golden.
 *
 * Speed. The sums are int16 gradients times int8 values: both go to SMLAD as pairs of int16 in a
 * word (2 MACs an instruction), the pair along the sum's index; the inner loops are assembly
 * (portable C twins for the host's tests):
 * - conv_bwd_x of a pointwise conv (a matrix product over the output channels o): gradients and
 *   weights are repacked, a block at a time, into words of two consecutive o (Gs, Ws on the
 *   stack); a 4x2 block of outputs (4 channels, 2 pixels) is 3 LDRD + 8 SMLAD per pair of o
 *   (tte_bwd_mk42: unrolled, entered at the step that leaves the count), requantized and stored
 *   in the same loop (tte_bwd_pw42). Long sums (O > 32) go in chunks, their partial sums in the
 *   rows of gx not yet written (pw_bwd_x);
 * - conv_bwd_x of a depthwise conv, stride 1: the zero-padded gradient rows are read directly
 *   by the flipped kernel (a correlation: no scatter), 3x3 with the three rows and the weights in
 *   registers, two outputs a step (tte_bwd_dw3a/b); stride 2 (3x3, pad 1): each gradient word
 *   feeds an even and an odd output (dw_bwd_x_s2k3p1);
 * - the weight gradient of a pointwise conv (a sum over pixels): x is read as int8 four pixels a
 *   word and widened by SXTB16 into (p0, p2), (p1, p3); the gradient rows of four selected
 *   channels are repacked in that order, so one x word feeds 8 SMLAD (tte_bwd_gw14);
 * - the weight gradient of a depthwise conv: x zero-padded and widened once into int16 phase
 *   maps, the gradient map given the same row stride, each kernel tap is one long dot product,
 *   three taps sharing each gradient word (gw_map, tte_bwd_dot3s).
 * Other geometries go through simpler loops (bwd_x_generic, dw_bwd_x_s1, gw_rows, gw_direct).
 *
 * Requantization rq(v, m, sh) of a 32-bit sum with sh >= 17 is exact as one SMMLA and a shift:
 * with L = max(0, 33 - sh), M = m << L (< 2**31) and s = sh + L >= 33,
 *   rq(v, m, sh) = floor((v*M + 2**(s-1)) / 2**s) = (C + floor(v*M / 2**32)) >> (s - 32), C = 2**(s-33)
 * (floor(floor(X / 2**32) / 2**k) = floor(X / 2**(32+k))); for 16 <= sh <= 32 it is one SMMULR,
 * floor((v*R + 2**31) / 2**32) with R = m << (32 - sh); smaller shifts take the 64-bit rq.
 *
 * Scratch is on the stack (under 2 KB a call, the deepest path included); nothing is static.
 */
#include "tte_native.h"

/* Loops stay loops: a zeroing or copying loop turned into a call of memset or memcpy costs
 * more than it saves on the short rows here. */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("no-tree-loop-distribute-patterns")
#endif

/* a word of scratch written as int16 (strict aliasing) */
typedef uint32_t __attribute__((may_alias)) u32a;

/* ------------------------------------------------------------------------------------------
 * Requantization: rq(v, m, sh) of a 32-bit sum, fast (sh >= 17, one SMMLA) or in 64 bits. */

typedef struct {
    int32_t M, C, S, fast, m, sh;
    int32_t R;        /* 16 <= sh <= 32: rq(v, m, sh) = SMMULR(v, R), R = m << (32 - sh); else 0 */
} rqp;

static rqp rq_prep(int32_t m, int32_t sh) {
    rqp q;
    q.m = m;
    q.sh = sh;
    q.M = q.C = q.S = 0;
    q.fast = rq_smmla(m, sh, &q.M, &q.C, &q.S);
    q.R = sh >= 16 && sh <= 32 ? m << (32 - sh) : 0;
    return q;
}

/* floor((a * b + 2**31) / 2**32) (SMMULR) */
static inline int32_t smmulr(int32_t a, int32_t b) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("smmulr %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return (int32_t)(((int64_t)a * b + 0x80000000LL) >> 32);
#endif
}

/* rq(v) for a fast q: |result| < 2**30 */
static inline int32_t rq_fast(int32_t v, int32_t M, int32_t C, int32_t S) {
    return smmla(v, M, C) >> S;
}

static inline int32_t rq16(int32_t v, const rqp *q) {
    return q->fast ? ssat16(rq_fast(v, q->M, q->C, q->S)) : sat16(rq(v, q->m, q->sh));
}

/* The weight step of n elements (the i-th: G[i * gs], rounding noise of element e0 + i):
 * w[i] = sat8(w[i] - floor((rq(G, m, sh) + rnd) / 2**SR_BITS)) (conv_upd_w, apply_w); or,
 * with w == 0, the gradients stored: gw[i] = G[i * gs] (conv_grad_w). */
/* sr_noise(key, e) for SR_BITS == 8: the last step of the mix (x ^= x >> 16) leaves the top
 * byte as it is */
static inline int32_t sr_noise8(uint32_t key, uint32_t e) {
#if SR_BITS == 8
    uint32_t x = key + e;
    x ^= x >> 16;
    x *= SR_M1;
    x ^= x >> 15;
    x *= SR_M2;
    return (int32_t)(x >> 24);
#else
    return sr_noise(key, e);
#endif
}

static void emit(int8_t *w, int32_t *gw, const int32_t *G, int gs, int n, uint32_t key, const rqp *q) {
    if (!w) {
        for (int i = 0; i < n; i++) {
            gw[i] = G[i * gs];
        }
    } else if (q->R) {
        int32_t R = q->R;
        for (int i = 0; i < n; i++) {
            int32_t d = (smmulr(G[i * gs], R) + sr_noise8(key, (uint32_t)i)) >> SR_BITS;
            w[i] = (int8_t)ssat8(w[i] - d);
        }
    } else if (q->fast) {
        int32_t M = q->M, C = q->C, S = q->S;
        for (int i = 0; i < n; i++) {
            int32_t d = (rq_fast(G[i * gs], M, C, S) + sr_noise8(key, (uint32_t)i)) >> SR_BITS;
            w[i] = (int8_t)ssat8(w[i] - d);
        }
    } else {
        for (int i = 0; i < n; i++) {
            int64_t d = (rq(G[i * gs], q->m, q->sh) + sr_noise(key, (uint32_t)i)) >> SR_BITS;
            w[i] = (int8_t)clamp64((int64_t)w[i] - d, -128, 127);
        }
    }
}

/* ------------------------------------------------------------------------------------------
 * conv_bwd_x */

/* Any geometry: one input row (c, iy) at a time, every (o, ky, kx) that reaches it adding w times
 * its gradient row into the row's 32-bit sums. */
__attribute__((cold)) static void bwd_x_generic(const int16_t *gy, const int8_t *w, int16_t *gx, int C, int H, int W, int O, int OH,
                          int OW, int K, int s, int pad, int G, const rqp *q) {
    int32_t acc[MAX_ROW];
    int Cg = C / G, Og = O / G, KK = K * K;
    for (int c = 0; c < C; c++) {
        int grp = c / Cg, ci = c - grp * Cg;
        for (int iy = 0; iy < H; iy++) {
            for (int i = 0; i < W; i++) {
                acc[i] = 0;
            }
            for (int oc = grp * Og; oc < grp * Og + Og; oc++) {
                const int8_t *wc = w + (oc * Cg + ci) * KK;
                for (int ky = 0; ky < K; ky++) {
                    int t = iy + pad - ky;
                    if (t < 0) {
                        break;
                    }
                    if (t % s) {
                        continue;
                    }
                    int oy = t / s;
                    if (oy >= OH) {
                        continue;
                    }
                    const int16_t *g = gy + (oc * OH + oy) * OW;
                    for (int kx = 0; kx < K; kx++) {
                        int32_t wv = wc[ky * K + kx];
                        int u = W - 1 + pad - kx;      /* the last ox: ox*s + kx - pad <= W - 1 */
                        if (!wv || u < 0) {
                            continue;
                        }
                        int ox0 = kx < pad ? (pad - kx + s - 1) / s : 0, ox1 = u / s + 1;
                        if (ox1 > OW) {
                            ox1 = OW;
                        }
                        int32_t *a = acc + ox0 * s + kx - pad;
                        for (int ox = ox0; ox < ox1; ox++, a += s) {
                            *a += wv * g[ox];
                        }
                    }
                }
            }
            int16_t *out = gx + (c * H + iy) * W;
            for (int i = 0; i < W; i++) {
                out[i] = (int16_t)rq16(acc[i], q);
            }
        }
    }
}

/* Pointwise (K = 1, stride 1, pad 0) of one group: gx[c, p] = rq(sum_o w[o, c] * gy[o, p]), a
 * matrix product summed over o, in pairs of o: blocks of quads of channels c and pairs of pixels
 * p, repacked on the stack as words of int16 pairs (zeros past the ends):
 *   Ws[cq][k] = 4 words (w[2k, c+i], w[2k+1, c+i]), i < 4     (c = c0 + 4 cq: SXTB16 of w rows)
 *   Gs[pp][k] = 2 words (gy[2k, p+i], gy[2k+1, p+i]), i < 2   (p = p0 + 2 pp: PKHBT/PKHTB)
 * A 4x2 block of outputs is then 3 LDRD + 8 SMLAD per pair of o (mk42, unrolled: entered at the
 * step that leaves n of them). Up to 2*PW_K1 channels o are summed in one run (Ws made once per
 * block of channels, Gs once per block of pixels and of channels); more in chunks of at most
 * 2*PW_KC, the blocks' sums kept between chunks in gx itself, or on the stack. */
#define PW_K1 16           /* pairs of o in one run of mk42 (its unrolled steps) */
#define PW_KC 12           /* pairs of o in a chunk */
#define PW_SCRATCH 352     /* words of Ws, Gs and sums */
#define PW_GS 80           /* words of Gs when one chunk does */
#define PW_CQG 4           /* quads in a block of sums in gx */

/* acc[8] += the 4x2 block: acc[2i + j] += sum_k smlad(a[4k + i], b[2k + j]), 1 <= n <= PW_K1;
 * tte_bwd_mk42z: the same from acc = 0 (acc is only written). tte_bwd_pw42: for one quad of
 * channels, every pair of pixels from b (2n words each) up to end, the block requantized and
 * stored (the SMMULR form when R != 0, else the SMMLA one). The three share the unrolled steps,
 * entered at the one that leaves n, and leave them through the address on top of the stack. */
typedef struct {
    const uint32_t *a; /* 0: Ws of the quad */
    const uint32_t *b; /* 4: Gs of the next pair */
    int16_t *out;      /* 8: gx[c, p] of the next pair */
    int32_t rs;        /* 12: bytes from a channel's row to the next */
    int16_t *end;      /* 16: out after the last pair */
    int32_t n;         /* 20: pairs of o (the entry, once started) */
    int32_t R, M, C, S;/* 24, 28, 32, 36: requantization */
    int32_t zero[8];   /* 40 */
} pwctx;

/* tte_bwd_acc42: for one quad, blocks of sums (channel i's two at acc + i * rs bytes) from acc,
 * advancing ps bytes a block, up to end, += the pairs of pixels from b (2n words each) */
typedef struct {
    const uint32_t *a; /* 0 */
    const uint32_t *b; /* 4 */
    int32_t *acc, *end;/* 8, 12 */
    int32_t n;         /* 16: pairs of o (the entry, once started) */
    int32_t rs, ps;    /* 20, 24: bytes */
} accctx;

#if defined(__ARM_FEATURE_DSP)
void tte_bwd_mk42(int32_t *acc, const uint32_t *a, const uint32_t *b, int n);
void tte_bwd_mk42z(int32_t *acc, const uint32_t *a, const uint32_t *b, int n);
void tte_bwd_pw42(pwctx *k);
void tte_bwd_acc42(accctx *k);
#define MK42_STEP                   \
    "ldrd r11, r12, [r2], #8\n\t"   \
    "ldrd r0, lr, [r1], #16\n\t"    \
    "smlad r3, r0, r11, r3\n\t"     \
    "smlad r4, r0, r12, r4\n\t"     \
    "smlad r5, lr, r11, r5\n\t"     \
    "smlad r6, lr, r12, r6\n\t"     \
    "ldrd r0, lr, [r1, #-8]\n\t"    \
    "smlad r7, r0, r11, r7\n\t"     \
    "smlad r8, r0, r12, r8\n\t"     \
    "smlad r9, lr, r11, r9\n\t"     \
    "smlad r10, lr, r12, r10\n\t"
#define MK42_4 MK42_STEP MK42_STEP MK42_STEP MK42_STEP
/* lr = the step that leaves n (r3) steps: each is 11 instructions of 4 bytes */
#define MK42_ENTRY(N)                   \
    "add.w r12, " N ", " N ", lsl #1\n\t" \
    "add.w r12, r12, " N ", lsl #3\n\t"   \
    "adr.w lr, .Lbwd_steps_end\n\t"     \
    "sub.w lr, lr, r12, lsl #2\n\t"     \
    "orr.w lr, lr, #1\n\t"
/* push the address of label L (Thumb) */
#define MK42_CONT(L)                    \
    "adr.w r12, " L "\n\t"              \
    "orr.w r12, r12, #1\n\t"            \
    "str r12, [sp, #-4]!\n\t"
#define RQ8_R(R)                                                                   \
    "smmulr r3, r3, " R "\n\tsmmulr r4, r4, " R "\n\tsmmulr r5, r5, " R "\n\t"     \
    "smmulr r6, r6, " R "\n\tsmmulr r7, r7, " R "\n\tsmmulr r8, r8, " R "\n\t"     \
    "smmulr r9, r9, " R "\n\tsmmulr r10, r10, " R "\n\t"
#define RQ1_A(X) "smmla " X ", " X ", r0, r1\n\tasr " X ", " X ", lr\n\t"
__asm__(
    "\t.text\n\t.syntax unified\n\t.thumb\n\t.align 2\n"
    "\t.type tte_bwd_mk42z, %function\n\t.thumb_func\n"
    "tte_bwd_mk42z:\n\t"
    "push {r0, r4-r11, lr}\n\t"
    MK42_CONT(".Lmk42_done")
    MK42_ENTRY("r3")
    "movs r3, #0\n\tmovs r4, #0\n\tmovs r5, #0\n\tmovs r6, #0\n\t"
    "movs r7, #0\n\tmov r8, r3\n\tmov r9, r3\n\tmov r10, r3\n\t"
    "bx lr\n\t"
    "\t.size tte_bwd_mk42z, .-tte_bwd_mk42z\n"
    "\t.align 2\n\t.type tte_bwd_mk42, %function\n\t.thumb_func\n"
    "tte_bwd_mk42:\n\t"
    "push {r0, r4-r11, lr}\n\t"
    MK42_CONT(".Lmk42_done")
    MK42_ENTRY("r3")
    "ldmia r0, {r3-r10}\n\t"
    "bx lr\n\t"
    MK42_4 MK42_4 MK42_4 MK42_4
    ".Lbwd_steps_end:\n\t"
    "ldr pc, [sp], #4\n\t"
    ".Lmk42_done:\n\t"
    "pop {r0}\n\t"
    "stmia r0, {r3-r10}\n\t"
    "pop {r4-r11, pc}\n\t"
    ".size tte_bwd_mk42, .-tte_bwd_mk42\n"
    "\t.align 2\n\t.type tte_bwd_pw42, %function\n\t.thumb_func\n"
    "tte_bwd_pw42:\n\t"
    "push {r0, r4-r11, lr}\n\t"
    "ldr r3, [r0, #20]\n\t"
    MK42_ENTRY("r3")
    "str lr, [r0, #20]\n\t"
    "1:\n\t"
    "ldr r12, [sp]\n\t"
    MK42_CONT("7f")
    "ldr r12, [sp, #4]\n\t"
    "ldrd r1, r2, [r12]\n\t"
    "ldr lr, [r12, #20]\n\t"
    "add.w r0, r12, #40\n\t"
    "ldmia r0, {r3-r10}\n\t"
    "bx lr\n\t"
    "7:\n\t"
    "ldr r12, [sp]\n\t"
    "str r2, [r12, #4]\n\t"
    "ldr r0, [r12, #24]\n\t"
    "cbz r0, 5f\n\t"
    RQ8_R("r0")
    "b 6f\n\t"
    "5:\n\t"
    "ldrd r0, r1, [r12, #28]\n\t"
    "ldr lr, [r12, #36]\n\t"
    RQ1_A("r3") RQ1_A("r4") RQ1_A("r5") RQ1_A("r6") RQ1_A("r7") RQ1_A("r8") RQ1_A("r9") RQ1_A("r10")
    "6:\n\t"
    "ssat r3, #16, r3\n\tssat r4, #16, r4\n\tssat r5, #16, r5\n\tssat r6, #16, r6\n\t"
    "ssat r7, #16, r7\n\tssat r8, #16, r8\n\tssat r9, #16, r9\n\tssat r10, #16, r10\n\t"
    "pkhbt r3, r3, r4, lsl #16\n\t"
    "pkhbt r5, r5, r6, lsl #16\n\t"
    "pkhbt r7, r7, r8, lsl #16\n\t"
    "pkhbt r9, r9, r10, lsl #16\n\t"
    "ldrd r0, r1, [r12, #8]\n\t"
    "str r3, [r0]\n\t"
    "str r5, [r0, r1]\n\t"
    "add.w r2, r0, r1, lsl #1\n\t"
    "str r7, [r2]\n\t"
    "str r9, [r2, r1]\n\t"
    "adds r0, #4\n\t"
    "str r0, [r12, #8]\n\t"
    "ldr r1, [r12, #16]\n\t"
    "cmp r0, r1\n\t"
    "bne 1b\n\t"
    "pop {r0, r4-r11, pc}\n\t"
    ".size tte_bwd_pw42, .-tte_bwd_pw42\n"
    "\t.align 2\n\t.type tte_bwd_acc42, %function\n\t.thumb_func\n"
    "tte_bwd_acc42:\n\t"
    "push {r0, r4-r11, lr}\n\t"
    "ldr r3, [r0, #16]\n\t"
    MK42_ENTRY("r3")
    "str lr, [r0, #16]\n\t"
    "1:\n\t"
    MK42_CONT("7f")
    "ldr r12, [sp, #4]\n\t"
    "ldr r0, [r12, #8]\n\t"
    "ldr r1, [r12, #20]\n\t"
    "ldrd r3, r4, [r0]\n\t"
    "add r0, r1\n\t"
    "ldrd r5, r6, [r0]\n\t"
    "add r0, r1\n\t"
    "ldrd r7, r8, [r0]\n\t"
    "add r0, r1\n\t"
    "ldrd r9, r10, [r0]\n\t"
    "ldrd r1, r2, [r12]\n\t"
    "ldr lr, [r12, #16]\n\t"
    "bx lr\n\t"
    "7:\n\t"
    "ldr r12, [sp]\n\t"
    "str r2, [r12, #4]\n\t"
    "ldr r0, [r12, #8]\n\t"
    "ldr r1, [r12, #20]\n\t"
    "strd r3, r4, [r0]\n\t"
    "add r2, r0, r1\n\t"
    "strd r5, r6, [r2]\n\t"
    "add r2, r1\n\t"
    "strd r7, r8, [r2]\n\t"
    "add r2, r1\n\t"
    "strd r9, r10, [r2]\n\t"
    "ldr r1, [r12, #24]\n\t"
    "add r0, r1\n\t"
    "str r0, [r12, #8]\n\t"
    "ldr r1, [r12, #12]\n\t"
    "cmp r0, r1\n\t"
    "bne 1b\n\t"
    "pop {r0, r4-r11, pc}\n\t"
    ".size tte_bwd_acc42, .-tte_bwd_acc42\n");
#else
static void tte_bwd_mk42(int32_t *acc, const uint32_t *a, const uint32_t *b, int n) {
    for (int k = 0; k < n; k++, a += 4, b += 2) {
        for (int i = 0; i < 4; i++) {
            acc[2 * i] = smlad(a[i], b[0], acc[2 * i]);
            acc[2 * i + 1] = smlad(a[i], b[1], acc[2 * i + 1]);
        }
    }
}

static void tte_bwd_mk42z(int32_t *acc, const uint32_t *a, const uint32_t *b, int n) {
    memset(acc, 0, 32);
    tte_bwd_mk42(acc, a, b, n);
}

static void tte_bwd_acc42(accctx *k) {
    for (; k->acc != k->end; k->acc = (int32_t *)((uint8_t *)k->acc + k->ps), k->b += 2 * k->n) {
        int32_t acc[8];
        for (int i = 0; i < 4; i++) {
            memcpy(acc + 2 * i, (uint8_t *)k->acc + i * k->rs, 8);
        }
        tte_bwd_mk42(acc, k->a, k->b, k->n);
        for (int i = 0; i < 4; i++) {
            memcpy((uint8_t *)k->acc + i * k->rs, acc + 2 * i, 8);
        }
    }
}

static void tte_bwd_pw42(pwctx *k) {
    int32_t acc[8];
    for (; k->out != k->end; k->out += 2, k->b += 2 * k->n) {
        tte_bwd_mk42z(acc, k->a, k->b, k->n);
        for (int i = 0; i < 4; i++) {
            int32_t r0, r1;
            if (k->R) {
                r0 = smmulr(acc[2 * i], k->R), r1 = smmulr(acc[2 * i + 1], k->R);
            } else {
                r0 = rq_fast(acc[2 * i], k->M, k->C, k->S), r1 = rq_fast(acc[2 * i + 1], k->M, k->C, k->S);
            }
            write_u32((uint8_t *)k->out + i * k->rs, pkhbt16((uint32_t)ssat16(r0), (uint32_t)ssat16(r1)));
        }
    }
}
#endif

/* Gs for pixel pairs pp < npp (from p0) and o pairs k0 .. k0+kn */
static void pw_gs(uint32_t *gs, const int16_t *gy, int HW, int Og, int p0, int npp, int k0, int kn) {
    int full = p0 + 2 * npp > HW ? npp - 1 : npp;   /* the last pair may have one pixel */
    int kf = 2 * (k0 + kn) <= Og ? kn : kn - 1;      /* pairs of o with both rows */
    const int16_t *src0 = gy + 2 * k0 * HW + p0;
    for (int pp = 0; pp < npp; pp++) {
        const int16_t *src = src0 + 2 * pp;
        u32a *d = (u32a *)(gs + 2 * kn * pp);
        if (pp < full) {
            int k = 0;
            for (; k + 2 <= kf; k += 2, src += 4 * HW, d += 4) {
                uint32_t a = read_u32(src), b = read_u32(src + HW);
                uint32_t e = read_u32(src + 2 * HW), f = read_u32(src + 3 * HW);
                d[0] = pkhbt16(a, b);
                d[1] = pkhtb16(b, a);
                d[2] = pkhbt16(e, f);
                d[3] = pkhtb16(f, e);
            }
            if (k < kf) {
                uint32_t a = read_u32(src), b = read_u32(src + HW);
                d[0] = pkhbt16(a, b);
                d[1] = pkhtb16(b, a);
                src += 2 * HW, d += 2, k++;
            }
            if (k < kn) {                            /* o + 1 == Og */
                uint32_t a = read_u32(src);
                d[0] = (uint16_t)a;
                d[1] = a >> 16;
            }
        } else {                                     /* one pixel */
            for (int k = 0; k < kn; k++, src += 2 * HW, d += 2) {
                d[0] = (uint16_t)src[0] | (k < kf ? (uint32_t)src[HW] << 16 : 0);
                d[1] = 0;
            }
        }
    }
}

/* Ws for channel quads cq < ncq (from c0) and o pairs k0 .. k0+kn */
static void pw_ws(uint32_t *ws, const int8_t *w, int Cg, int Og, int c0, int ncq, int k0, int kn) {
    int kf = 2 * (k0 + kn) <= Og ? kn : kn - 1;      /* pairs of o with both rows */
    for (int cq = 0; cq < ncq; cq++) {
        int c = c0 + 4 * cq;
        u32a *d = (u32a *)(ws + 4 * kn * cq);
        const int8_t *r0 = w + 2 * k0 * Cg + c;
        int k = 0;
        if (c + 4 <= Cg) {
            for (; k < kf; k++, d += 4, r0 += 2 * Cg) {
                uint32_t x = read_u32(r0), y = read_u32(r0 + Cg);
                uint32_t e = sxtb16(x), f = sxtb16(y), e1 = sxtb16_ror8(x), f1 = sxtb16_ror8(y);
                d[0] = pkhbt16(e, f);
                d[1] = pkhbt16(e1, f1);
                d[2] = pkhtb16(f, e);
                d[3] = pkhtb16(f1, e1);
            }
        }
        for (; k < kn; k++, d += 4, r0 += 2 * Cg) {     /* the last 1..3 channels, or o + 1 == Og */
            uint32_t x = 0, y = 0;
            for (int i = 0; i < 4 && c + i < Cg; i++) {
                x |= (uint32_t)(uint8_t)r0[i] << (8 * i);
                if (k < kf) {
                    y |= (uint32_t)(uint8_t)r0[Cg + i] << (8 * i);
                }
            }
            uint32_t e = sxtb16(x), f = sxtb16(y), e1 = sxtb16_ror8(x), f1 = sxtb16_ror8(y);
            d[0] = pkhbt16(e, f);
            d[1] = pkhbt16(e1, f1);
            d[2] = pkhtb16(f, e);
            d[3] = pkhtb16(f1, e1);
        }
    }
}

/* The 4x2 block of outputs at (c, p) from its sums */
static void pw_store(int16_t *gx, const int32_t *acc, int c, int p, int Cg, int HW, int32_t M, int32_t Cr, int32_t S) {
    int nc = Cg - c < 4 ? Cg - c : 4;
    int16_t *out = gx + c * HW + p;
    if (p + 1 < HW) {
        for (int i = 0; i < nc; i++, out += HW, acc += 2) {
            write_u32(out, pkhbt16((uint32_t)ssat16(rq_fast(acc[0], M, Cr, S)),
                                 (uint32_t)ssat16(rq_fast(acc[1], M, Cr, S))));
        }
    } else {
        for (int i = 0; i < nc; i++, out += HW, acc += 2) {
            *out = (int16_t)ssat16(rq_fast(acc[0], M, Cr, S));
        }
    }
}

static void pw_bwd_x(const int16_t *gy, const int8_t *w, int16_t *gx, int Cg, int Og, int HW, const rqp *q) {
    uint32_t scratch[PW_SCRATCH];
    uint32_t *ws = scratch, *gs;
    int32_t *accs;
    int32_t M = q->M, Cr = q->C, S = q->S;
    int nk = (Og + 1) >> 1;
    if (nk <= PW_K1) {                     /* one run of mk42 for every block */
        pwctx k;
        k.rs = 2 * HW;
        k.R = q->R, k.M = M, k.C = Cr, k.S = S;
        memset(k.zero, 0, sizeof k.zero);
        /* one chunk: Ws, Gs and one block of sums */
        int CQ = (PW_SCRATCH - PW_GS - 8) / (4 * nk), PP = PW_GS / (2 * nk);
        gs = scratch + 4 * nk * CQ;
        accs = (int32_t *)(gs + 2 * nk * PP);
        for (int c0 = 0; c0 < Cg; c0 += 4 * CQ) {
            int ncq = (Cg - c0 + 3) >> 2;
            if (ncq > CQ) {
                ncq = CQ;
            }
            pw_ws(ws, w, Cg, Og, c0, ncq, 0, nk);
            for (int p0 = 0; p0 < HW; p0 += 2 * PP) {
                int npp = (HW - p0 + 1) >> 1;
                if (npp > PP) {
                    npp = PP;
                }
                pw_gs(gs, gy, HW, Og, p0, npp, 0, nk);
                int full = p0 + 2 * npp > HW ? npp - 1 : npp;   /* pairs of two pixels */
                const uint32_t *a = ws;
                for (int c = c0; c < c0 + 4 * ncq; c += 4, a += 4 * nk) {
                    int pp = 0;
                    if (c + 4 <= Cg && full) {
                        k.a = a;
                        k.b = gs;
                        k.out = gx + c * HW + p0;
                        k.end = k.out + 2 * full;
                        k.n = nk;
                        tte_bwd_pw42(&k);
                        pp = full;
                    }
                    for (; pp < npp; pp++) {
                        tte_bwd_mk42z(accs, a, gs + 2 * nk * pp, nk);
                        pw_store(gx, accs, c, p0 + 2 * pp, Cg, HW, M, Cr, S);
                    }
                }
            }
        }
        return;
    }
    /* More than one chunk. While the rows of gx not yet written hold twice a block's channels
     * (HW even), the block's int32 sums (channel-major) go there, for every pixel: Ws is made
     * once a chunk, and the sums become gx in place (each int16 written at or below its sum).
     * The rest, in blocks of pixels with the sums on the stack. */
    int nch = (nk + PW_KC - 1) / PW_KC, kc = (nk + nch - 1) / nch;
    accctx k;
    int c0 = 0;
    if (!(HW & 1)) {
        gs = ws + 4 * PW_KC * PW_CQG;                  /* Ws: 4 quads, Gs: 6 pairs */
        int PPG = (PW_SCRATCH - 4 * PW_KC * PW_CQG) / (2 * PW_KC);
        for (;;) {
            uintptr_t base = (uintptr_t)(gx + c0 * HW), al = (base + 3) & ~(uintptr_t)3;
            int room = (int)((uintptr_t)(gx + Cg * HW) - al);      /* bytes */
            int nb = room / (16 * HW) * 4;                         /* channels: 4 HW bytes each */
            if (nb > 4 * PW_CQG) {
                nb = 4 * PW_CQG;
            }
            if (nb < 8) {                  /* two quads at least: Gs serves them all */
                break;
            }
            int32_t *sums = (int32_t *)al;
            for (int i = 0; i < nb * HW; i++) {
                sums[i] = 0;
            }
            k.rs = 4 * HW, k.ps = 8;
            for (int k0 = 0; k0 < nk; k0 += kc) {
                int kn = nk - k0 < kc ? nk - k0 : kc;
                pw_ws(ws, w, Cg, Og, c0, nb >> 2, k0, kn);
                for (int p0 = 0; p0 < HW; p0 += 2 * PPG) {
                    int npp = (HW - p0) >> 1;
                    if (npp > PPG) {
                        npp = PPG;
                    }
                    pw_gs(gs, gy, HW, Og, p0, npp, k0, kn);
                    for (int cq = 0; cq < nb >> 2; cq++) {
                        k.a = ws + 4 * kn * cq;
                        k.b = gs;
                        k.acc = sums + 4 * cq * HW + p0;
                        k.end = k.acc + 2 * npp;
                        k.n = kn;
                        tte_bwd_acc42(&k);
                    }
                }
            }
            int16_t *out = gx + c0 * HW;
            if (q->R) {
                for (int i = 0; i < nb * HW; i++) {
                    out[i] = (int16_t)ssat16(smmulr(sums[i], q->R));
                }
            } else {
                for (int i = 0; i < nb * HW; i++) {
                    out[i] = (int16_t)ssat16(rq_fast(sums[i], M, Cr, S));
                }
            }
            c0 += nb;
        }
    }
    int CQ = 3, PP = 4;
    gs = ws + 4 * PW_KC * CQ;                          /* Ws, Gs and the sums: 144 + 96 + 96 words */
    accs = (int32_t *)(gs + 2 * PW_KC * PP);
    k.rs = 8, k.ps = 32;
    for (; c0 < Cg; c0 += 4 * CQ) {
        int ncq = (Cg - c0 + 3) >> 2;
        if (ncq > CQ) {
            ncq = CQ;
        }
        for (int p0 = 0; p0 < HW; p0 += 2 * PP) {
            int npp = (HW - p0 + 1) >> 1;
            if (npp > PP) {
                npp = PP;
            }
            for (int i = 0; i < 8 * ncq * npp; i++) {
                accs[i] = 0;
            }
            for (int k0 = 0; k0 < nk; k0 += kc) {
                int kn = nk - k0 < kc ? nk - k0 : kc;
                pw_ws(ws, w, Cg, Og, c0, ncq, k0, kn);
                pw_gs(gs, gy, HW, Og, p0, npp, k0, kn);
                for (int cq = 0; cq < ncq; cq++) {
                    k.a = ws + 4 * kn * cq;
                    k.b = gs;
                    k.acc = accs + 8 * npp * cq;
                    k.end = k.acc + 8 * npp;
                    k.n = kn;
                    tte_bwd_acc42(&k);
                }
            }
            const int32_t *acc = accs;
            for (int cq = 0; cq < ncq; cq++) {
                for (int pp = 0; pp < npp; pp++, acc += 8) {
                    pw_store(gx, acc, c0 + 4 * cq, p0 + 2 * pp, Cg, HW, M, Cr, S);
                }
            }
        }
    }
}

/* Depthwise, stride 1 (pad <= K - 1): gx[iy, ix] = rq(sum_{ky, a} wf[ky][a] * B_r[ix + a]) with
 * r = iy + pad - ky, wf[ky][a] = w[ky, K-1-a] and B_r the gradient row r zero-padded by
 * K-1-pad on the left (a ring of K such rows). Two outputs a step, per kernel row:
 *   s0 += sum_m smlad(B[ix+2m, ix+2m+1], (wf[2m], wf[2m+1]))
 *   s1 += B[ix+1] * wf[0] + sum_m smlad(B[ix+2m+2, ix+2m+3], (wf[2m+1], wf[2m+2]))      */
#define DW_KMAX 7
#define DW_STACK 1400  /* bytes of the ring and the row of sums */

static inline __attribute__((always_inline)) void dw_s1_pass(int32_t *acc, const int16_t *B, const int8_t *wrow,
                                                             int W, int K, int first) {
    uint32_t E[(DW_KMAX + 1) / 2], Od[(DW_KMAX + 1) / 2];
    int nE = (K + 1) / 2, nO = K / 2;
    for (int m = 0; m < nE; m++) {
        int a = 2 * m;   /* wf[a] = wrow[K-1-a] */
        int32_t lo = wrow[K - 1 - a], hi = a + 1 < K ? wrow[K - 2 - a] : 0;
        E[m] = pkhbt16((uint32_t)lo, (uint32_t)hi);
    }
    for (int m = 0; m < nO; m++) {
        int a = 2 * m + 1;
        int32_t lo = wrow[K - 1 - a], hi = a + 1 < K ? wrow[K - 2 - a] : 0;
        Od[m] = pkhbt16((uint32_t)lo, (uint32_t)hi);
    }
    for (int ix = 0; ix < W; ix += 2) {
        const u32a *b = (const u32a *)(B + ix);
        int32_t s0 = first ? 0 : acc[ix], s1 = first ? 0 : acc[ix + 1];
        for (int m = 0; m < nE; m++) {
            s0 = smlad(b[m], E[m], s0);
        }
        s1 = smlatb(b[0], E[0], s1);
        for (int m = 0; m < nO; m++) {
            s1 = smlad(b[m + 1], Od[m], s1);
        }
        acc[ix] = s0;
        acc[ix + 1] = s1;
    }
}

static void pad_row(int16_t *B, int BL, int PL, const int16_t *g, int n) {
    int i = 0;
    for (; i < PL; i++) {
        B[i] = 0;
    }
    int16_t *d = B + PL;
    int j = 0;
    for (; j + 2 <= n; j += 2) {
        write_u32(d + j, read_u32(g + j));
    }
    if (j < n) {
        d[j] = g[j];
    }
    for (i = PL + n; i < BL; i++) {
        B[i] = 0;
    }
}

static void dw_bwd_x_s1(const int16_t *gy, const int8_t *w, int16_t *gx, int C, int H, int W, int OH, int OW,
                        int K, int pad, const rqp *q) {
    int BL = (W + K + 3) & ~1, PL = K - 1 - pad;
    uint32_t mem[DW_STACK / 4];
    int32_t *acc = (int32_t *)mem;                     /* W + 1 sums */
    int16_t *ring = (int16_t *)(mem + ((W + 2) & ~1)); /* K rows of BL */
    int tag[DW_KMAX];
    int32_t M = q->M, Cr = q->C, S = q->S;
    for (int c = 0; c < C; c++) {
        const int8_t *wc = w + c * K * K;
        const int16_t *g = gy + c * OH * OW;
        for (int i = 0; i < K; i++) {
            tag[i] = -1;
        }
        for (int iy = 0; iy < H; iy++) {
            int first = 1;
            for (int ky = 0; ky < K; ky++) {
                int r = iy + pad - ky;
                if (r < 0 || r >= OH) {
                    continue;
                }
                int16_t *B = ring + (r % K) * BL;
                if (tag[r % K] != r) {
                    pad_row(B, BL, PL, g + r * OW, OW);
                    tag[r % K] = r;
                }
                switch (K) {
                case 7:
                    dw_s1_pass(acc, B, wc + ky * K, W, 7, first);
                    break;
                case 5:
                    dw_s1_pass(acc, B, wc + ky * K, W, 5, first);
                    break;
                default:
                    dw_s1_pass(acc, B, wc + ky * K, W, K, first);
                    break;
                }
                first = 0;
            }
            int16_t *out = gx + (c * H + iy) * W;
            if (first) {
                memset(out, 0, 2 * (size_t)W);      /* rq(0) = 0 */
                continue;
            }
            for (int ix = 0; ix < W; ix++) {
                out[ix] = (int16_t)ssat16(rq_fast(acc[ix], M, Cr, S));
            }
        }
    }
}

/* Depthwise 3x3, stride 1: the same correlation, the three rows in registers, two outputs a
 * step. The zero-padded gradient rows (B[j] = gy[r, j - 2 + pad]) lie at a fixed stride RS (a
 * constant of the code: LDRD offsets), either a band of whole rows (narrow maps, RS = DW3_RS1)
 * or a ring of 3 rows stored twice (slots r % 3 and r % 3 + 3: every window is 3 consecutive
 * slots; RS = DW3_RS2). Per step, per kernel row (E = (wf0, wf1), Y = (wf1, wf2), wf[a] = w[ky, 2-a]):
 *   A = (B[ix], B[ix+1]), B' = (B[ix+2], B[ix+3]);
 *   s0 += smlad(A, E) + B'.lo * Y.hi,   s1 += A.hi * E.lo + smlad(B', Y)               */
#define DW3_RS1 24     /* int16 in a band row: W + 2 <= DW3_RS1 */
#define DW3_BAND 30    /* rows in the band */
#define DW3_RS2 120    /* int16 in a ring row: W + 2 <= DW3_RS2 */

typedef struct {
    const int16_t *p;  /* the window of the first output row: the first of its 3 rows, at B[0] */
    int16_t *out, *end;/* the outputs: from out, rows of W (even) up to end */
    int32_t R;         /* SMMULR multiplier */
    uint32_t w[6];     /* E, Y of the window's rows 0, 1, 2 */
    int32_t rowbytes;  /* 2 W */
    int32_t pskip;     /* 2 RS - 2 W: from the end of a row to the next */
} dw3ctx;

#if defined(__ARM_FEATURE_DSP)
void tte_bwd_dw3a(dw3ctx *k);
void tte_bwd_dw3b(dw3ctx *k);
#define DW3_STR(x) #x
#define DW3_XSTR(x) DW3_STR(x)
#define DW3_ASM(name, RS)                                  \
    "\t.align 2\n\t.type " name ", %function\n\t.thumb_func\n" \
    name ":\n\t"                                           \
    "push {r0, r4-r11, lr}\n\t"                            \
    "sub sp, #4\n\t"                                       \
    "ldm r0!, {r1, r2, r3, r4}\n\t"  /* p, out, end, R */  \
    "ldm r0, {r5-r10}\n\t"           /* E0 Y0 E1 Y1 E2 Y2 */\
    "2:\n\t"                                               \
    "ldr r12, [sp, #4]\n\t"                                \
    "ldr r11, [r12, #40]\n\t"                              \
    "add r11, r2\n\t"                                      \
    "str r11, [sp]\n\t"              /* the row's end */   \
    "1:\n\t"                                               \
    "ldrd r11, r12, [r1]\n\t"                              \
    "smuad r0, r11, r5\n\t"                                \
    "smlabt r0, r12, r6, r0\n\t"                           \
    "smultb lr, r11, r5\n\t"                               \
    "smlad lr, r12, r6, lr\n\t"                            \
    "ldrd r11, r12, [r1, #" DW3_XSTR(2 * RS) "]\n\t"       \
    "smlad r0, r11, r7, r0\n\t"                            \
    "smlabt r0, r12, r8, r0\n\t"                           \
    "smlatb lr, r11, r7, lr\n\t"                           \
    "smlad lr, r12, r8, lr\n\t"                            \
    "ldrd r11, r12, [r1, #" DW3_XSTR(4 * RS) "]\n\t"       \
    "smlad r0, r11, r9, r0\n\t"                            \
    "smlabt r0, r12, r10, r0\n\t"                          \
    "smlatb lr, r11, r9, lr\n\t"                           \
    "smlad lr, r12, r10, lr\n\t"                           \
    "smmulr r0, r0, r4\n\t"                                \
    "smmulr lr, lr, r4\n\t"                                \
    "ssat r0, #16, r0\n\t"                                 \
    "ssat lr, #16, lr\n\t"                                 \
    "pkhbt r0, r0, lr, lsl #16\n\t"                        \
    "str r0, [r2], #4\n\t"                                 \
    "adds r1, #4\n\t"                                      \
    "ldr r0, [sp]\n\t"                                     \
    "cmp r2, r0\n\t"                                       \
    "bne 1b\n\t"                                           \
    "ldr r12, [sp, #4]\n\t"                                \
    "ldr r11, [r12, #44]\n\t"                              \
    "add r1, r11\n\t"                                      \
    "cmp r2, r3\n\t"                                       \
    "bne 2b\n\t"                                           \
    "add sp, #4\n\t"                                       \
    "pop {r0, r4-r11, pc}\n\t"                             \
    ".size " name ", .-" name "\n"
__asm__("\t.text\n\t.syntax unified\n\t.thumb\n"
        DW3_ASM("tte_bwd_dw3a", DW3_RS1) DW3_ASM("tte_bwd_dw3b", DW3_RS2));
#endif

/* the same in C (any fast q): n outputs of one row from k->out (n may be odd) */
static void dw3row_c(const int16_t *p, int16_t *out, int n, const uint32_t *w, int RS, const rqp *q) {
    int32_t M = q->M, Cr = q->C, S = q->S;
    for (int ix = 0; ix < n; ix += 2, p += 2) {
        int32_t s0 = 0, s1 = 0;
        for (int r = 0; r < 3; r++) {
            const u32a *b = (const u32a *)(p + r * RS);
            uint32_t E = w[2 * r], Y = w[2 * r + 1];
            s0 = smlabt(b[1], Y, smlad(b[0], E, s0));
            s1 = smlad(b[1], Y, smlatb(b[0], E, s1));
        }
        out[ix] = (int16_t)ssat16(rq_fast(s0, M, Cr, S));
        if (ix + 1 < n) {
            out[ix + 1] = (int16_t)ssat16(rq_fast(s1, M, Cr, S));
        }
    }
}

/* A zero-padded row: n (even) int16 at the word-aligned B (and at B2 too, unless 0),
 * B[j] = g[j - PL] for 0 <= j - PL < len, else 0; g == 0: all zeros. */
static void fill_row2(int16_t *B, int16_t *B2, int n, int PL, const int16_t *g, int len) {
    u32a *d = (u32a *)B, *d2 = (u32a *)(B2 ? B2 : B);
    int nw = n >> 1, i = 0;
    if (g) {
        /* word i holds g[2i - PL], g[2i - PL + 1]: both inside for i0 <= i <= i1 */
        int i0 = (PL + 1) >> 1, i1 = len - 2 + PL >= 0 ? (len - 2 + PL) >> 1 : -1;
        if (i1 > nw - 1) {
            i1 = nw - 1;
        }
        while (i < nw && 2 * i - PL < len) {
            if (i == i0 && i <= i1) {
                const int16_t *gp = g + 2 * i - PL;
                for (; i <= i1; i++, gp += 2) {
                    uint32_t v = read_u32(gp);
                    d[i] = v;
                    d2[i] = v;
                }
                continue;
            }
            int a = 2 * i - PL;
            uint32_t v = (a >= 0 ? (uint16_t)g[a] : 0) | (a + 1 >= 0 && a + 1 < len ? (uint32_t)(uint16_t)g[a + 1] << 16 : 0);
            d[i] = v;
            d2[i] = v;
            i++;
        }
    }
    for (; i < nw; i++) {
        d[i] = 0;
        d2[i] = 0;
    }
}

/* fill_row2 for PL == 1 and n == len + 2 (len even): B = [0, g[0 .. len), 0] */
static inline __attribute__((always_inline)) void fill_row_pl1(int16_t *B, const int16_t *g, int len) {
    u32a *d = (u32a *)B, *e = d + (len >> 1);
    if (!g) {
        for (; d <= e; d++) {
            *d = 0;
        }
        return;
    }
    *d++ = (uint32_t)(uint16_t)g[0] << 16;
    for (g++; d < e; d++, g += 2) {
        *d = read_u32(g);
    }
    *d = (uint16_t)*g;
}

static void dw_bwd_x_s1k3(const int16_t *gy, const int8_t *w, int16_t *gx, int C, int H, int W, int pad,
                          const rqp *q) {
    int16_t buf[6 * DW3_RS2];              /* the band, or the ring; word aligned (RS even) */
    int PL = 2 - pad, n = (W + 4) & ~1;    /* zeros left of a gradient row (and rows above) */
    int OH = H + 2 * pad - 2, OW = W + 2 * pad - 2;
    int band = W + 2 <= DW3_RS1 && !(W & 1), RS = band ? DW3_RS1 : DW3_RS2;
    dw3ctx k;
    k.R = q->R;
    k.rowbytes = 2 * W;
    k.pskip = 2 * (RS - W);
#if defined(__ARM_FEATURE_DSP)
    int use_asm = q->R && W >= 2;
#endif
    for (int c = 0; c < C; c++) {
        const int8_t *wc = w + 9 * c;
        const int16_t *g = gy + c * OH * OW;
        for (int r = 0; r < 3; r++) {     /* window row r: kernel row 2 - r */
            const int8_t *wr = wc + 3 * (2 - r);
            k.w[2 * r] = pkhbt16((uint32_t)(int32_t)wr[2], (uint32_t)(int32_t)wr[1]);
            k.w[2 * r + 1] = pkhbt16((uint32_t)(int32_t)wr[1], (uint32_t)(int32_t)wr[0]);
        }
        if (band) {                        /* output rows iy0 .. iy1: padded rows iy0 .. iy1 + 2 */
            for (int iy0 = 0; iy0 < H; iy0 += DW3_BAND - 2) {
                int iy1 = iy0 + DW3_BAND - 2 < H ? iy0 + DW3_BAND - 2 : H;
                for (int R = iy0; R < iy1 + 2; R++) {
                    int r = R - PL;
                    const int16_t *src = r >= 0 && r < OH ? g + r * OW : 0;
                    if (PL == 1) {         /* pad 1: OW == W, even */
                        fill_row_pl1(buf + (R - iy0) * RS, src, OW);
                    } else {
                        fill_row2(buf + (R - iy0) * RS, 0, n, PL, src, OW);
                    }
                }
                k.p = buf;
                k.out = gx + (c * H + iy0) * W;
                k.end = k.out + (iy1 - iy0) * W;
#if defined(__ARM_FEATURE_DSP)
                if (use_asm) {
                    tte_bwd_dw3a(&k);
                    continue;
                }
#endif
                for (int iy = iy0; iy < iy1; iy++) {
                    dw3row_c(buf + (iy - iy0) * RS, gx + (c * H + iy) * W, W, k.w, RS, q);
                }
            }
            continue;
        }
        for (int R = 0; R < H + 2; R++) {  /* the ring: padded row R is gradient row R - PL */
            int16_t *B = buf + (R % 3) * RS;
            int r = R - PL;
            fill_row2(B, B + 3 * RS, n, PL, r >= 0 && r < OH ? g + r * OW : 0, OW);
            if (R < 2) {
                continue;
            }
            int iy = R - 2;                /* its window: padded rows iy .. iy + 2 */
            k.p = buf + (iy % 3) * RS;
            k.out = gx + (c * H + iy) * W;
#if defined(__ARM_FEATURE_DSP)
            if (use_asm) {
                k.end = k.out + (W & ~1);
                k.rowbytes = 2 * (W & ~1);
                tte_bwd_dw3b(&k);
                if (W & 1) {
                    dw3row_c(k.p + W - 1, k.out + W - 1, 1, k.w, RS, q);
                }
                continue;
            }
#endif
            dw3row_c(k.p, k.out, W, k.w, RS, q);
        }
    }
}

/* Depthwise 3x3, stride 2, pad 1: per kernel row ky that reaches the output row, with B the
 * gradient row zero-padded by one on the left and h = ix / 2 + 1 (ix even), the word
 * (B[h], B[h+1]) gives gx[ix] += B[h] * w[ky, 1], gx[ix+1] += smlad(word, (w[ky, 2], w[ky, 0])).
 * The channel's padded rows are made once (in bands of DW2_ROWS rows for tall maps). Other
 * strided depthwise convs take the generic path. */
#define DW2_RS 72      /* int16 in a padded row: W / 2 + 4 <= DW2_RS */
#define DW2_ROWS 8

/* The SMMULR form: output rows 2t (kernel row 1 on gradient row t) and 2t + 1 (row 0 on t + 1,
 * row 2 on t), a zero row after the band's last. */
static void dw_bwd_x_s2k3p1(const int16_t *gy, const int8_t *w, int16_t *gx, int C, int H, int W, int OH, int OW,
                            int32_t R) {
    int16_t rows[(DW2_ROWS + 1) * DW2_RS];
    int n = (W / 2 + 4) & ~1, even = !(OW & 1);
    for (int c = 0; c < C; c++) {
        const int8_t *wc = w + c * 9;
        const int16_t *g = gy + c * OH * OW;
        uint32_t w20_0 = pkhbt16((uint32_t)(int32_t)wc[2], (uint32_t)(int32_t)wc[0]);
        uint32_t w20_1 = pkhbt16((uint32_t)(int32_t)wc[5], (uint32_t)(int32_t)wc[3]);
        uint32_t w20_2 = pkhbt16((uint32_t)(int32_t)wc[8], (uint32_t)(int32_t)wc[6]);
        uint32_t w1_0 = (uint32_t)(int32_t)wc[1], w1_1 = (uint32_t)(int32_t)wc[4], w1_2 = (uint32_t)(int32_t)wc[7];
        int16_t *out = gx + c * H * W;
        for (int t0 = 0; t0 < OH; t0 += DW2_ROWS) {      /* gradient rows t0 .. t1, and t1 */
            int t1 = t0 + DW2_ROWS < OH ? t0 + DW2_ROWS : OH;
            for (int r = t0; r <= t1; r++) {
                const int16_t *src = r < OH ? g + r * OW : 0;
                if (even) {
                    fill_row_pl1(rows + (r - t0) * DW2_RS, src, OW);
                } else {
                    fill_row2(rows + (r - t0) * DW2_RS, 0, n, 1, src, OW);
                }
            }
            for (int t = t0; t < t1; t++) {
                const int16_t *b = rows + (t - t0) * DW2_RS + 1, *e = b + W / 2;
                int16_t *o = out + 2 * t * W;
                for (const int16_t *p = b; p < e; p++, o += 2) {     /* row 2t */
                    uint32_t x = read_u32(p);
                    write_u32(o, pkhbt16((uint32_t)ssat16(smmulr(smlabb(x, w1_1, 0), R)),
                                       (uint32_t)ssat16(smmulr(smlad(x, w20_1, 0), R))));
                }
                if (W & 1) {
                    *o = (int16_t)ssat16(smmulr(smlabb(read_u32(e), w1_1, 0), R));
                }
                if (2 * t + 1 >= H) {
                    break;
                }
                o = out + (2 * t + 1) * W;
                for (const int16_t *p = b; p < e; p++, o += 2) {     /* row 2t + 1 */
                    uint32_t x0 = read_u32(p + DW2_RS), x2 = read_u32(p);
                    int32_t s0 = smlabb(x2, w1_2, smlabb(x0, w1_0, 0));
                    int32_t s1 = smlad(x2, w20_2, smlad(x0, w20_0, 0));
                    write_u32(o, pkhbt16((uint32_t)ssat16(smmulr(s0, R)), (uint32_t)ssat16(smmulr(s1, R))));
                }
                if (W & 1) {
                    *o = (int16_t)ssat16(smmulr(smlabb(read_u32(e), w1_2, smlabb(read_u32(e + DW2_RS), w1_0, 0)), R));
                }
            }
        }
    }
}

void op_conv_bwd_x(uint8_t *A, const int32_t *P, int o) {
    const int16_t *gy = AT(const int16_t, CONV_BWD_X_GY_OFF);
    const int8_t *w = AT(const int8_t, CONV_BWD_X_W_OFF);
    int16_t *gx = AT(int16_t, CONV_BWD_X_GX_OFF);
    int C = P[o + CONV_BWD_X_C], H = P[o + CONV_BWD_X_H], W = P[o + CONV_BWD_X_W], O = P[o + CONV_BWD_X_O];
    int OH = P[o + CONV_BWD_X_OH], OW = P[o + CONV_BWD_X_OW], K = P[o + CONV_BWD_X_K];
    int s = P[o + CONV_BWD_X_STRIDE], pad = P[o + CONV_BWD_X_PAD], G = P[o + CONV_BWD_X_GROUPS];
    rqp q = rq_prep(P[o + CONV_BWD_X_M], P[o + CONV_BWD_X_SH]);
    int Cg = C / G, Og = O / G;
    if (q.fast) {
        if (K == 1 && s == 1 && pad == 0) {
            for (int g = 0; g < G; g++) {
                pw_bwd_x(gy + g * Og * H * W, w + g * Og * Cg, gx + g * Cg * H * W, Cg, Og, H * W, &q);
            }
            return;
        }
        if (Cg == 1 && Og == 1 && W <= MAX_ROW) {
            if (s == 1 && K == 3 && pad <= 2 && W + 2 <= DW3_RS2) {
                dw_bwd_x_s1k3(gy, w, gx, C, H, W, pad, &q);
                return;
            }
            if (s == 1 && pad <= K - 1 && K <= DW_KMAX
                && 4 * ((W + 2) & ~1) + 2 * K * ((W + K + 3) & ~1) <= DW_STACK) {
                dw_bwd_x_s1(gy, w, gx, C, H, W, OH, OW, K, pad, &q);
                return;
            }
            if (s == 2 && K == 3 && pad == 1 && q.R && W / 2 + 4 <= DW2_RS && 2 * OH >= H) {
                dw_bwd_x_s2k3p1(gy, w, gx, C, H, W, OH, OW, q.R);
                return;
            }
        }
    }
    bwd_x_generic(gy, w, gx, C, H, W, O, OH, OW, K, s, pad, G, &q);
}

/* ------------------------------------------------------------------------------------------
 * conv_grad_w, conv_upd_w: G[j, c', ky, kx] = sum_{oy, ox} gy[idx[j], oy, ox] * x[g*Cg + c', oy*s+ky-pad, ox*s+kx-pad] */

typedef struct {
    const int16_t *gy;
    const int8_t *x;
    int8_t *w;          /* conv_upd_w: the trained rows */
    int32_t *gw;        /* conv_grad_w */
    const int32_t *idx, *um, *ush;
    int n_sel, C, H, W, O, OH, OW, K, s, pad, G;
    uint32_t key;
} gwcall;

static rqp row_rq(const gwcall *c, int j) {
    if (c->w) {
        return rq_prep(c->um[j], c->ush[j]);
    }
    rqp q;
    memset(&q, 0, sizeof q);
    return q;
}

/* Pointwise (K = 1, stride 1, pad 0, groups 1): G[j, c] = sum_p gy[idx[j], p] * x[c, p]. Four
 * selected channels at a time, their gradients repacked for a chunk of pixels as
 * Gr[quad][r] = (g_r[4q], g_r[4q+2]), (g_r[4q+1], g_r[4q+3]); a word of x (4 pixels of channel c)
 * widened by SXTB16 into (x[4q], x[4q+2]) and (x[4q+1], x[4q+3]) then takes 8 SMLAD. Channels
 * go in chunks of GW_CC, the sums over pixel chunks in acc. */
#define GW_PQ 24   /* quads of pixels in a chunk: Gr is 8 * GW_PQ words */
#define GW_CC 32   /* channels c in a chunk: acc is 4 * GW_CC words */

/* s[0..4) += sum over n quads q of x (4 int8 pixels a word, any alignment) and g (8 words a
 * quad: (g_r[4q], g_r[4q+2]), (g_r[4q+1], g_r[4q+3]) for r < 4) */
#if defined(__ARM_FEATURE_DSP)
void tte_bwd_gw14(const int8_t *x, const uint32_t *g, int n, int32_t *s);
#define GW14_QUAD                           \
    "ldr r8, [r0], #4\n\t"                   \
    "sxtb16 r9, r8\n\t"                       \
    "sxtb16 r8, r8, ror #8\n\t"               \
    "ldm r1!, {r10, r11, r12, lr}\n\t"        \
    "smlad r4, r9, r10, r4\n\t"               \
    "smlad r4, r8, r11, r4\n\t"               \
    "smlad r5, r9, r12, r5\n\t"               \
    "smlad r5, r8, lr, r5\n\t"                \
    "ldm r1!, {r10, r11, r12, lr}\n\t"        \
    "smlad r6, r9, r10, r6\n\t"               \
    "smlad r6, r8, r11, r6\n\t"               \
    "smlad r7, r9, r12, r7\n\t"               \
    "smlad r7, r8, lr, r7\n\t"
__asm__(
    "\t.text\n\t.syntax unified\n\t.thumb\n\t.align 2\n"
    "\t.type tte_bwd_gw14, %function\n\t.thumb_func\n"
    "tte_bwd_gw14:\n\t"
    "push {r4-r11, lr}\n\t"
    "ldm r3, {r4-r7}\n\t"
    "lsrs r2, r2, #1\n\t"            /* pairs of quads; carry: one more */
    "bcc 1f\n\t"
    GW14_QUAD
    "1:\n\t"
    "cbz r2, 2f\n\t"
    "3:\n\t"
    GW14_QUAD GW14_QUAD
    "subs r2, #1\n\t"
    "bne 3b\n\t"
    "2:\n\t"
    "stm r3, {r4-r7}\n\t"
    "pop {r4-r11, pc}\n\t"
    ".size tte_bwd_gw14, .-tte_bwd_gw14\n");
#else
static void tte_bwd_gw14(const int8_t *x, const uint32_t *g, int n, int32_t *s) {
    int32_t s0 = s[0], s1 = s[1], s2 = s[2], s3 = s[3];
    for (int i = 0; i < n; i++, x += 4, g += 8) {
        uint32_t xw = read_u32(x), x02 = sxtb16(xw), x13 = sxtb16_ror8(xw);
        s0 = smlad(x13, g[1], smlad(x02, g[0], s0));
        s1 = smlad(x13, g[3], smlad(x02, g[2], s1));
        s2 = smlad(x13, g[5], smlad(x02, g[4], s2));
        s3 = smlad(x13, g[7], smlad(x02, g[6], s3));
    }
    s[0] = s0, s[1] = s1, s[2] = s2, s[3] = s3;
}
#endif

static void pw_grad_w(const gwcall *cl) {
    uint32_t gr[8 * GW_PQ];
    int32_t acc[4 * GW_CC];
    int HW = cl->H * cl->W, Cg = cl->C, nq = HW >> 2;
    for (int j0 = 0; j0 < cl->n_sel; j0 += 4) {
        int nj = cl->n_sel - j0 < 4 ? cl->n_sel - j0 : 4;
        const int16_t *rows[4];
        for (int r = 0; r < 4; r++) {
            rows[r] = r < nj ? cl->gy + cl->idx[j0 + r] * HW : 0;
        }
        for (int c0 = 0; c0 < Cg; c0 += GW_CC) {
            int cc = Cg - c0 < GW_CC ? Cg - c0 : GW_CC;
            for (int i = 0; i < 4 * cc; i++) {
                acc[i] = 0;
            }
            for (int q0 = 0; q0 < nq; q0 += GW_PQ) {
                int nqc = nq - q0 < GW_PQ ? nq - q0 : GW_PQ;
                if (c0 == 0 || nq > GW_PQ) {
                    for (int r = 0; r < 4; r++) {
                        uint32_t *d = gr + 2 * r;
                        if (!rows[r]) {
                            for (int i = 0; i < nqc; i++, d += 8) {
                                d[0] = d[1] = 0;
                            }
                            continue;
                        }
                        const int16_t *g = rows[r] + 4 * q0;
                        for (int i = 0; i < nqc; i++, d += 8, g += 4) {
                            uint32_t a = read_u32(g), b = read_u32(g + 2);
                            d[0] = pkhbt16(a, b);
                            d[1] = pkhtb16(b, a);
                        }
                    }
                }
                const int8_t *xc = cl->x + c0 * HW + 4 * q0;
                for (int c = 0; c < cc; c++, xc += HW) {
                    tte_bwd_gw14(xc, gr, nqc, acc + 4 * c);
                }
            }
            for (int p = 4 * nq; p < HW; p++) {     /* the last 0..3 pixels */
                for (int c = 0; c < cc; c++) {
                    int32_t xv = cl->x[(c0 + c) * HW + p];
                    for (int r = 0; r < nj; r++) {
                        acc[4 * c + r] += xv * rows[r][p];
                    }
                }
            }
            for (int r = 0; r < nj; r++) {
                int j = j0 + r;
                rqp q = row_rq(cl, j);
                emit(cl->w ? cl->w + j * Cg + c0 : 0, cl->w ? 0 : cl->gw + j * Cg + c0, acc + r, 4, cc,
                     cl->key + (uint32_t)(j * Cg + c0), &q);
            }
        }
    }
}

/* Any geometry, one (j, c') at a time, one input row at a time: the row, zero-padded
 * (X[t] = x[c, iy, t - pad]), is widened into s phase rows of int16, ph[q][i] = X[i*s + q]; every
 * kernel row ky that maps an output row oy onto iy adds, for each kx, the dot product of the
 * gradient row oy with ph[kx % s][kx / s ...] (pairs of int16, SMLAD). */
#define GW_KMAX 8
#define GW_SMAX 4
#define GW_PH (MAX_ROW + 4 * GW_KMAX + 4 * GW_SMAX)

static inline int32_t dot16(const int16_t *a, const int16_t *b, int n, int32_t s) {
    int i = 0;
    for (; i + 2 <= n; i += 2) {
        s = smlad(read_u32(a + i), read_u32(b + i), s);
    }
    if (i < n) {
        s += a[i] * b[i];
    }
    return s;
}

/* the three taps of a 3-wide kernel row at phase offsets b0, b1, b2 */
static inline void dot16x3(const int16_t *g, const int16_t *b0, const int16_t *b1, const int16_t *b2, int n,
                           int32_t *s) {
    int32_t s0 = s[0], s1 = s[1], s2 = s[2];
    int i = 0;
    for (; i + 2 <= n; i += 2) {
        uint32_t gv = read_u32(g + i);
        s0 = smlad(gv, read_u32(b0 + i), s0);
        s1 = smlad(gv, read_u32(b1 + i), s1);
        s2 = smlad(gv, read_u32(b2 + i), s2);
    }
    if (i < n) {
        s0 += g[i] * b0[i];
        s1 += g[i] * b1[i];
        s2 += g[i] * b2[i];
    }
    s[0] = s0, s[1] = s1, s[2] = s2;
}

__attribute__((cold)) static void gw_rows(const gwcall *cl) {
    int16_t ph[GW_PH];
    int32_t Gk[GW_KMAX * GW_KMAX];
    int K = cl->K, s = cl->s, pad = cl->pad, W = cl->W, OW = cl->OW, OH = cl->OH;
    int Cg = cl->C / cl->G, Og = cl->O / cl->G, KK = K * K, row = Cg * KK;
    int PN = (W + 2 * pad + K + s - 1) / s + 2;   /* entries of a phase row */
    PN = (PN + 1) & ~1;
    for (int j = 0; j < cl->n_sel; j++) {
        int oc = cl->idx[j];
        rqp q = row_rq(cl, j);
        for (int ci = 0; ci < Cg; ci++) {
            const int8_t *xc = cl->x + ((oc / Og) * Cg + ci) * cl->H * W;
            for (int t = 0; t < KK; t++) {
                Gk[t] = 0;
            }
            for (int iy = 0; iy < cl->H; iy++) {
                int any = 0;
                for (int ky = 0; ky < K; ky++) {
                    int t = iy + pad - ky;
                    if (t >= 0 && t % s == 0 && t / s < OH) {
                        any = 1;
                    }
                }
                if (!any) {
                    continue;
                }
                /* the phase rows: ph[q * PN + i] = X[i*s + q] */
                memset(ph, 0, 2 * (size_t)(s * PN));
                const int8_t *xr = xc + iy * W;
                if (s == 1) {
                    int16_t *d = ph + pad;
                    int i = 0;
                    for (; i + 4 <= W; i += 4) {
                        uint32_t v = read_u32(xr + i), e = sxtb16(v), f = sxtb16_ror8(v);
                        write_u32(d + i, pkhbt16(e, f));
                        write_u32(d + i + 2, pkhtb16(f, e));
                    }
                    for (; i < W; i++) {
                        d[i] = xr[i];
                    }
                } else {
                    for (int i = 0; i < W; i++) {
                        int t = i + pad;
                        ph[(t % s) * PN + t / s] = xr[i];
                    }
                }
                for (int ky = 0; ky < K; ky++) {
                    int t = iy + pad - ky;
                    if (t < 0 || t % s || t / s >= OH) {
                        continue;
                    }
                    const int16_t *g = cl->gy + (oc * OH + t / s) * OW;
                    int32_t *Gr = Gk + ky * K;
                    if (K == 3) {
                        dot16x3(g, ph + (0 % s) * PN + 0 / s, ph + (1 % s) * PN + 1 / s, ph + (2 % s) * PN + 2 / s,
                                OW, Gr);
                    } else {
                        for (int kx = 0; kx < K; kx++) {
                            Gr[kx] = dot16(g, ph + (kx % s) * PN + kx / s, OW, Gr[kx]);
                        }
                    }
                }
            }
            int e = j * row + ci * KK;
            emit(cl->w ? cl->w + e : 0, cl->w ? 0 : cl->gw + e, Gk, 1, KK, cl->key + (uint32_t)e, &q);
        }
    }
}

/* Any geometry, plain loops (kernels wider than GW_KMAX, strides above GW_SMAX). */
__attribute__((cold)) static void gw_direct(const gwcall *cl) {
    int K = cl->K, s = cl->s, pad = cl->pad, H = cl->H, W = cl->W, OW = cl->OW, OH = cl->OH;
    int Cg = cl->C / cl->G, Og = cl->O / cl->G, KK = K * K, row = Cg * KK;
    for (int j = 0; j < cl->n_sel; j++) {
        int oc = cl->idx[j];
        rqp q = row_rq(cl, j);
        for (int ci = 0; ci < Cg; ci++) {
            const int8_t *xc = cl->x + ((oc / Og) * Cg + ci) * H * W;
            for (int t = 0; t < KK; t++) {
                int ky = t / K, kx = t % K;
                int32_t acc = 0;
                for (int oy = 0; oy < OH; oy++) {
                    int iy = oy * s + ky - pad;
                    if (iy < 0 || iy >= H) {
                        continue;
                    }
                    const int16_t *g = cl->gy + (oc * OH + oy) * OW;
                    for (int ox = 0; ox < OW; ox++) {
                        int ix = ox * s + kx - pad;
                        if (ix >= 0 && ix < W) {
                            acc += g[ox] * xc[iy * W + ix];
                        }
                    }
                }
                int e = j * row + ci * KK + t;
                emit(cl->w ? cl->w + e : 0, cl->w ? 0 : cl->gw + e, &acc, 1, 1, cl->key + (uint32_t)e, &q);
            }
        }
    }
}

/* Depthwise (one input channel a row), the whole map at once: x zero-padded and split into s*s
 * phase maps of int16, P[qy][qx][a][b] = X[a*s + qy][b*s + qx] (X[t][u] = x[t - pad][u - pad]),
 * and the gradient map gP with the same row stride RS (zeros past OW): then
 *   G[ky][kx] = sum_i gP[i] * P[ky % s][kx % s][i + (ky / s) RS + kx / s],  i < OH RS,
 * one long dot product a tap (the zeros of gP meet whatever P holds past a row), three taps
 * sharing each gradient word. */
#define GW_MAP 560     /* int16 of the phase maps and gP */

static inline void dot3(const int16_t *g, const int16_t *b0, const int16_t *b1, const int16_t *b2, int n,
                        int32_t *s) {
    int32_t s0 = s[0], s1 = s[1], s2 = s[2];
    const u32a *gw = (const u32a *)g;
    for (int i = 0; i < n; i += 2, gw++) {
        uint32_t gv = *gw;
        s0 = smlad(gv, read_u32(b0 + i), s0);
        s1 = smlad(gv, read_u32(b1 + i), s1);
        s2 = smlad(gv, read_u32(b2 + i), s2);
    }
    s[0] = s0, s[1] = s1, s[2] = s2;
}

/* dot3 with b1 = b0 + 1, b2 = b0 + 2 (n even, g word aligned): the word at b0 + i + 2 is the
 * next step's b0 + i */
#if defined(__ARM_FEATURE_DSP)
void tte_bwd_dot3s(const int16_t *g, const int16_t *b0, int pairs, int32_t *s);
#define DOT3S_STEP(A, C)                \
    "ldr lr, [r0], #4\n\t"              \
    "ldr r9, [r1, #-2]\n\t"             \
    "ldr " C ", [r1], #4\n\t"           \
    "smlad r4, lr, " A ", r4\n\t"       \
    "smlad r5, lr, r9, r5\n\t"          \
    "smlad r6, lr, " C ", r6\n\t"
__asm__(
    "\t.text\n\t.syntax unified\n\t.thumb\n\t.align 2\n"
    "\t.type tte_bwd_dot3s, %function\n\t.thumb_func\n"
    "tte_bwd_dot3s:\n\t"
    "push {r4-r9, lr}\n\t"
    "ldm r3, {r4, r5, r6}\n\t"
    "ldr r7, [r1], #4\n\t"
    "lsrs r2, r2, #1\n\t"
    "bcc 1f\n\t"
    DOT3S_STEP("r7", "r8")
    "mov r7, r8\n\t"
    "1:\n\t"
    "cbz r2, 2f\n\t"
    "3:\n\t"
    DOT3S_STEP("r7", "r8") DOT3S_STEP("r8", "r7")
    "subs r2, #1\n\t"
    "bne 3b\n\t"
    "2:\n\t"
    "stm r3, {r4, r5, r6}\n\t"
    "pop {r4-r9, pc}\n\t"
    ".size tte_bwd_dot3s, .-tte_bwd_dot3s\n");
#define dot3s(g, b0, n, s) tte_bwd_dot3s(g, b0, (n) >> 1, s)
#else
static inline void dot3s(const int16_t *g, const int16_t *b0, int n, int32_t *s) {
    dot3(g, b0, b0 + 1, b0 + 2, n, s);
}
#endif

static int gw_map_size(const gwcall *cl, int *RS, int *rows) {
    int s = cl->s;
    *RS = ((cl->W + 2 * cl->pad + s - 1) / s + 1) & ~1;
    *rows = (cl->H + 2 * cl->pad + s - 1) / s + 1;
    return s * s * *rows * *RS + cl->OH * *RS;
}

static void gw_map(const gwcall *cl) {
    int16_t map[GW_MAP];                   /* word aligned: RS is even */
    int RS, rows;
    int size = gw_map_size(cl, &RS, &rows);
    int K = cl->K, s = cl->s, pad = cl->pad, H = cl->H, W = cl->W, OH = cl->OH, OW = cl->OW, KK = K * K;
    int Og = cl->O / cl->G, PS = rows * RS, N = OH * RS;
    int16_t *gP = map + s * s * PS;
    int last = -1;                         /* the input channel in the phase maps */
    for (int j = 0; j < cl->n_sel; j++) {
        int oc = cl->idx[j], c = oc / Og;
        rqp q = row_rq(cl, j);
        if (c != last) {
            u32a *z = (u32a *)map;
            for (int i = 0; i < (s * s * PS) >> 1; i++) {
                z[i] = 0;
            }
            const int8_t *xr = cl->x + c * H * W;
            for (int iy = 0; iy < H; iy++, xr += W) {
                int t = iy + pad;
                if (s == 1) {
                    int16_t *d = map + t * RS + pad;
                    int i = 0;
                    for (; i + 4 <= W; i += 4) {
                        uint32_t v = read_u32(xr + i), e = sxtb16(v), f = sxtb16_ror8(v);
                        write_u32(d + i, pkhbt16(e, f));
                        write_u32(d + i + 2, pkhtb16(f, e));
                    }
                    for (; i < W; i++) {
                        d[i] = xr[i];
                    }
                } else {
                    int16_t *d = map + (t % s) * s * PS + (t / s) * RS;
                    for (int ix = 0; ix < W; ix++) {
                        int u = ix + pad;
                        d[(u % s) * PS + u / s] = xr[ix];
                    }
                }
            }
            last = c;
        }
        const int16_t *g = cl->gy + oc * OH * OW;
        for (int oy = 0; oy < OH; oy++, g += OW) {
            int16_t *d = gP + oy * RS;
            int i = 0;
            for (; i + 2 <= OW; i += 2) {
                write_u32(d + i, read_u32(g + i));
            }
            for (; i < RS; i++) {
                d[i] = i < OW ? g[i] : 0;
            }
        }
        int32_t Gk[GW_KMAX * GW_KMAX];
        for (int t = 0; t < KK; t++) {
            Gk[t] = 0;
        }
        for (int ky = 0; ky < K; ky++) {
            const int16_t *prow = map + (ky % s) * s * PS + (ky / s) * RS;
            int kx = 0;
            if (s == 1 && K == 3) {
                dot3s(gP, prow, N, Gk + ky * K);
                continue;
            }
            for (; kx + 3 <= K; kx += 3) {
                dot3(gP, prow + (kx % s) * PS + kx / s, prow + ((kx + 1) % s) * PS + (kx + 1) / s,
                     prow + ((kx + 2) % s) * PS + (kx + 2) / s, N, Gk + ky * K + kx);
            }
            for (; kx < K; kx++) {
                Gk[ky * K + kx] = dot16(gP, prow + (kx % s) * PS + kx / s, N, 0);
            }
        }
        int e = j * KK;
        emit(cl->w ? cl->w + e : 0, cl->w ? 0 : cl->gw + e, Gk, 1, KK, cl->key + (uint32_t)e, &q);
    }
    (void)size;
}

static void grad_w(const gwcall *cl) {
    int RS, rows;
    if (cl->K == 1 && cl->s == 1 && cl->pad == 0 && cl->G == 1) {
        pw_grad_w(cl);
    } else if (cl->C == cl->G && cl->K <= GW_KMAX && cl->pad < GW_KMAX && cl->s <= GW_SMAX
               && gw_map_size(cl, &RS, &rows) <= GW_MAP) {
        gw_map(cl);
    } else if (cl->K <= GW_KMAX && cl->s <= GW_SMAX && cl->W <= MAX_ROW && cl->pad <= GW_KMAX) {
        gw_rows(cl);
    } else {
        gw_direct(cl);
    }
}

void op_conv_grad_w(uint8_t *A, const int32_t *P, int o) {
    gwcall c;
    c.gy = AT(const int16_t, CONV_GRAD_W_GY_OFF);
    c.x = AT(const int8_t, CONV_GRAD_W_X_OFF);
    c.w = 0;
    c.gw = AT(int32_t, CONV_GRAD_W_GW_OFF);
    c.idx = AT(const int32_t, CONV_GRAD_W_IDX_OFF);
    c.um = c.ush = 0;
    c.n_sel = P[o + CONV_GRAD_W_N_SEL];
    c.C = P[o + CONV_GRAD_W_C], c.H = P[o + CONV_GRAD_W_H], c.W = P[o + CONV_GRAD_W_W];
    c.O = P[o + CONV_GRAD_W_O], c.OH = P[o + CONV_GRAD_W_OH], c.OW = P[o + CONV_GRAD_W_OW];
    c.K = P[o + CONV_GRAD_W_K], c.s = P[o + CONV_GRAD_W_STRIDE], c.pad = P[o + CONV_GRAD_W_PAD];
    c.G = P[o + CONV_GRAD_W_GROUPS];
    c.key = 0;
    grad_w(&c);
}

void op_conv_upd_w(uint8_t *A, const int32_t *P, int o) {
    gwcall c;
    c.gy = AT(const int16_t, CONV_UPD_W_GY_OFF);
    c.x = AT(const int8_t, CONV_UPD_W_X_OFF);
    c.w = AT(int8_t, CONV_UPD_W_W_OFF);
    c.gw = 0;
    c.idx = AT(const int32_t, CONV_UPD_W_IDX_OFF);
    c.um = AT(const int32_t, CONV_UPD_W_UM_OFF);
    c.ush = AT(const int32_t, CONV_UPD_W_USH_OFF);
    c.n_sel = P[o + CONV_UPD_W_N_SEL];
    c.C = P[o + CONV_UPD_W_C], c.H = P[o + CONV_UPD_W_H], c.W = P[o + CONV_UPD_W_W];
    c.O = P[o + CONV_UPD_W_O], c.OH = P[o + CONV_UPD_W_OH], c.OW = P[o + CONV_UPD_W_OW];
    c.K = P[o + CONV_UPD_W_K], c.s = P[o + CONV_UPD_W_STRIDE], c.pad = P[o + CONV_UPD_W_PAD];
    c.G = P[o + CONV_UPD_W_GROUPS];
    c.key = sr_key(AT(const int32_t, CONV_UPD_W_IO_OFF)[IO_STEP], P[o + CONV_UPD_W_SALT]);
    grad_w(&c);
}

void op_apply_w(uint8_t *A, const int32_t *P, int o) {
    const int32_t *gw = AT(const int32_t, APPLY_W_GW_OFF);
    int8_t *w = AT(int8_t, APPLY_W_W_OFF);
    const int32_t *um = AT(const int32_t, APPLY_W_UM_OFF), *ush = AT(const int32_t, APPLY_W_USH_OFF);
    int n_sel = P[o + APPLY_W_N_SEL], row = P[o + APPLY_W_ROW_LEN];
    uint32_t key = sr_key(AT(const int32_t, APPLY_W_IO_OFF)[IO_STEP], P[o + APPLY_W_SALT]);
    for (int j = 0; j < n_sel; j++) {
        rqp q = rq_prep(um[j], ush[j]);
        emit(w + j * row, 0, gw + j * row, 1, row, key + (uint32_t)(j * row), &q);
    }
}

/* ------------------------------------------------------------------------------------------
 * Biases: Gb[o] = sum_p gy[o, p]; b[o] = sat32(b[o] - rq(Gb[o], um[o], ush[o])). */

static int32_t row_sum16(const int16_t *g, int n) {
    int32_t s = 0;
    int i = 0;
    if (n && ((uintptr_t)g & 2)) {
        s = g[0];
        i = 1;
    }
    const u32a *v = (const u32a *)(g + i);   /* word aligned */
    int words = (n - i) >> 1;
    int k = 0;
    for (; k + 4 <= words; k += 4) {
        uint32_t a = v[k], b = v[k + 1], c = v[k + 2], d = v[k + 3];
        s = smlad(a, 0x00010001u, s);
        s = smlad(b, 0x00010001u, s);
        s = smlad(c, 0x00010001u, s);
        s = smlad(d, 0x00010001u, s);
    }
    for (; k < words; k++) {
        s = smlad(v[k], 0x00010001u, s);
    }
    if (i + 2 * words < n) {
        s += g[n - 1];
    }
    return s;
}

/* sat32(b - rq(Gb, m, sh)): for sh >= 17, |rq| < 2**30 and QSUB saturates the difference */
static inline int32_t qsub(int32_t a, int32_t b) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("qsub %0, %1, %2" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return sat32((int64_t)a - b);
#endif
}

static int32_t bias_step(int32_t b, int32_t Gb, int32_t m, int32_t sh) {
    if (sh >= 17) {
        rqp q = rq_prep(m, sh);
        return qsub(b, rq_fast(Gb, q.M, q.C, q.S));
    }
    return sat32((int64_t)b - rq(Gb, m, sh));
}

void op_bias_grad(uint8_t *A, const int32_t *P, int o) {
    const int16_t *gy = AT(const int16_t, BIAS_GRAD_GY_OFF);
    int32_t *gb = AT(int32_t, BIAS_GRAD_GB_OFF);
    int O = P[o + BIAS_GRAD_O], HW = P[o + BIAS_GRAD_HW];
    for (int c = 0; c < O; c++) {
        gb[c] = row_sum16(gy + c * HW, HW);
    }
}

void op_bias_upd(uint8_t *A, const int32_t *P, int o) {
    const int16_t *gy = AT(const int16_t, BIAS_UPD_GY_OFF);
    int32_t *b = AT(int32_t, BIAS_UPD_B_OFF);
    const int32_t *um = AT(const int32_t, BIAS_UPD_UM_OFF), *ush = AT(const int32_t, BIAS_UPD_USH_OFF);
    int O = P[o + BIAS_UPD_O], HW = P[o + BIAS_UPD_HW];
    for (int c = 0; c < O; c++) {
        b[c] = bias_step(b[c], row_sum16(gy + c * HW, HW), um[c], ush[c]);
    }
}

void op_apply_b(uint8_t *A, const int32_t *P, int o) {
    const int32_t *gb = AT(const int32_t, APPLY_B_GB_OFF);
    int32_t *b = AT(int32_t, APPLY_B_B_OFF);
    const int32_t *um = AT(const int32_t, APPLY_B_UM_OFF), *ush = AT(const int32_t, APPLY_B_USH_OFF);
    for (int c = 0, O = P[o + APPLY_B_O]; c < O; c++) {
        b[c] = bias_step(b[c], gb[c], um[c], ush[c]);
    }
}

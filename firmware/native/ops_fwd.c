/* The forward kernels (conv_fwd, add_fwd, gap_fwd), the loss gradient and the elementwise
 * gradient kernels (grad_scale_ch, gap_bwd, grad_add), bit-exact with insitu.sparse.golden.
 *
 * conv_fwd takes the fastest of five paths that fits the call:
 * - dense (1x1 on a 1x1 map): dot products of int8 rows, two output channels at a time;
 * - depthwise 3x3 (groups == C, stride 1 or 2, any channel multiplier): a band of the input
 *   channel's rows, zero-padded, in the strip buffer; four outputs of a row at a time from
 *   unaligned words of three rows (SXTB16 gives the pairs of taps kx = 0, 2 for SMLAD, SMLAxB
 *   adds the middle tap), in assembly over the whole band: no bounds checks, no border cases;
 * - depthwise 5x5 and 7x7 (the same conditions): the same band; four outputs of a row at a time
 *   from the aligned words of the block (SXTB16 pairs against pairs of taps two apart, SMLAxB/
 *   SMLAxT for single taps), the kernel rows in a loop whose weights come by one LDM a row;
 * - the engine, every other conv, as CMSIS-NN computes them: a strip of output pixels is laid
 *   out once as int16 pairs of the reduction (packed from four input channels x four pixels at
 *   once for a pointwise conv, im2col of the kernel's taps otherwise), then each output channel
 *   runs over the strip four pixels at a time: SMLAD on int16 pairs (two MACs an instruction),
 *   the strip read by LDM, each weight pair word used for four pixels from a register;
 * - a plain loop for what no buffer holds (a reduction longer than ENGINE_MAX_R).
 * Requantization (rq, then the clamp): for sh >= 17, rq(v, m, sh) = SMMLA(v, M, 2**(S-1)) >> S
 * exactly, with M = m << max(0, 33 - sh), S = max(1, sh - 32) (the top word of v*M plus the
 * rounding half, then the rest of the shift: floor(floor(X / 2**32) / 2**S) = floor(X / 2**(32+S)));
 * four int8 results are saturated, packed and clamped at once (SSAT, BFI, then SSUB8/SEL against
 * lo and hi in every byte). Shifts below 17 take the 64-bit rq of tte_native.h.
 *
 * The assembly (__ARM_FEATURE_DSP: the Cortex-M7's Thumb-2 with the DSP extension) has portable
 * C twins that compute the same sums for the host's tests; the Cortex-M7 twin checks the
 * assembly (tests/firmware, qemu-c). Instructions per MAC on the twin: tests/benchmarks/
 * test_bench_native_fwd.py.
 */
#include "tte_native.h"

/* Scratch (BSS; a native module's BSS is allocated with the module): the engine's strip of
 * int16 pairs and its packed weight row; the depthwise paths' row buffers use the strip (and the
 * 5x5/7x7 path's partial blocks the weight row's buffer). */
#define STRIP_WORDS 1024
#define WROW_WORDS 256
/* The engine needs one quad (4 pixels x the padded reduction) in the strip. */
#define ENGINE_MAX_R (STRIP_WORDS / 2)
uint32_t tte_fwd_strip[STRIP_WORDS];
uint32_t tte_fwd_wrow[WROW_WORDS];

/* Four int32 saturated to int8 and packed into a word, r0 in the low byte (SSAT, BFI). */
static inline uint32_t pack4_sat8(int32_t r0, int32_t r1, int32_t r2, int32_t r3) {
#if defined(__ARM_FEATURE_DSP)
    uint32_t v;
    __asm__("ssat %0, #8, %1\n\t"
            "ssat %2, #8, %2\n\t"
            "ssat %3, #8, %3\n\t"
            "ssat %4, #8, %4\n\t"
            "bfi %0, %2, #8, #8\n\t"
            "bfi %0, %3, #16, #8\n\t"
            "bfi %0, %4, #24, #8"
            : "=&r"(v), "+r"(r0), "+r"(r1), "+r"(r2), "+r"(r3));
    return v;
#else
    return ((uint32_t)ssat8(r0) & 0xFF) | (((uint32_t)ssat8(r1) & 0xFF) << 8) | (((uint32_t)ssat8(r2) & 0xFF) << 16)
           | ((uint32_t)ssat8(r3) << 24);
#endif
}

/* Bytewise signed clamp of four int8 in a word to [lo, hi] (lo4, hi4: each bound in every byte). */
static inline uint32_t clamp4(uint32_t v, uint32_t lo4, uint32_t hi4) {
#if defined(__ARM_FEATURE_DSP)
    uint32_t t;
    __asm__("ssub8 %1, %0, %2\n\t"
            "sel %0, %0, %2\n\t"
            "ssub8 %1, %0, %3\n\t"
            "sel %0, %3, %0"
            : "+r"(v), "=&r"(t) : "r"(lo4), "r"(hi4));
    return v;
#else
    uint32_t r = 0;
    for (int i = 0; i < 32; i += 8) {
        int32_t x = (int8_t)(v >> i), lo = (int8_t)(lo4 >> i), hi = (int8_t)(hi4 >> i);
        x = x < lo ? lo : x > hi ? hi : x;
        r |= (uint32_t)(uint8_t)x << i;
    }
    return r;
#endif
}

/* ------------------------------------------------------------------ requantization */

/* A channel's requantization and clamp, prepared once. */
typedef struct {
    int32_t M, A, S;      /* the SMMLA form (sh >= 17) */
    int32_t m, sh;        /* the 64-bit form (sh < 17: slow) */
    int32_t slow;
    int32_t lo, hi;
    uint32_t lo4, hi4;    /* lo, hi in every byte */
} rq_t;

static inline void rq_prep(rq_t *q, int32_t m, int32_t sh, int32_t lo, int32_t hi) {
    q->m = m;
    q->sh = sh;
    q->M = q->A = q->S = 0;
    q->slow = !rq_smmla(m, sh, &q->M, &q->A, &q->S);
    q->lo = lo;
    q->hi = hi;
    q->lo4 = (uint32_t)(uint8_t)lo * 0x01010101u;
    q->hi4 = (uint32_t)(uint8_t)hi * 0x01010101u;
}

/* rq(v) clamped to [lo, hi]. */
static inline int32_t rq1(const rq_t *q, int32_t v) {
    if (q->slow) {
        return clamp64(rq(v, q->m, q->sh), q->lo, q->hi);
    }
    int32_t r = ssat8(smmla(v, q->M, q->A) >> q->S);
    return r < q->lo ? q->lo : r > q->hi ? q->hi : r;
}

/* Four sums of consecutive outputs y[0..n) (n <= 4) requantized, clamped and stored. */
static inline void rq_store4(int8_t *y, int n, int32_t a0, int32_t a1, int32_t a2, int32_t a3, const rq_t *q) {
    if (n == 4 && !q->slow) {
        int32_t S = q->S, M = q->M, Ad = q->A;
        uint32_t v = pack4_sat8(smmla(a0, M, Ad) >> S, smmla(a1, M, Ad) >> S, smmla(a2, M, Ad) >> S,
                                smmla(a3, M, Ad) >> S);
        write_u32(y, clamp4(v, q->lo4, q->hi4));
        return;
    }
    int32_t a[4] = {a0, a1, a2, a3};
    for (int j = 0; j < n; j++) {
        y[j] = (int8_t)rq1(q, a[j]);
    }
}

/* ------------------------------------------------------------------ conv_fwd: geometry */

typedef struct {
    const int8_t *x, *w;
    const int32_t *b, *m, *sh;
    int8_t *y;
    int C, H, W, O, OH, OW, K, s, pad, px, G, lo, hi;
    int Cg, Og, R;        /* channels of a group (in, out), the reduction Cg*K*K */
} conv_t;

static void conv_decode(conv_t *g, uint8_t *A, const int32_t *P, int o) {
    g->x = AT(const int8_t, CONV_FWD_X_OFF);
    g->w = AT(const int8_t, CONV_FWD_W_OFF);
    g->b = AT(const int32_t, CONV_FWD_B_OFF);
    g->m = AT(const int32_t, CONV_FWD_M_OFF);
    g->sh = AT(const int32_t, CONV_FWD_SH_OFF);
    g->y = AT(int8_t, CONV_FWD_Y_OFF);
    g->C = P[o + CONV_FWD_C];
    g->H = P[o + CONV_FWD_H];
    g->W = P[o + CONV_FWD_W];
    g->O = P[o + CONV_FWD_O];
    g->OH = P[o + CONV_FWD_OH];
    g->OW = P[o + CONV_FWD_OW];
    g->K = P[o + CONV_FWD_K];
    g->s = P[o + CONV_FWD_STRIDE];
    g->pad = P[o + CONV_FWD_PAD];
    g->px = P[o + CONV_FWD_PAD_X];
    g->G = P[o + CONV_FWD_GROUPS];
    g->lo = P[o + CONV_FWD_LO];
    g->hi = P[o + CONV_FWD_HI];
    g->Cg = g->C / g->G;
    g->Og = g->O / g->G;
    g->R = g->Cg * g->K * g->K;
}

static inline void conv_rq(const conv_t *g, rq_t *q, int oc) {
    rq_prep(q, g->m[oc], g->sh[oc], g->lo, g->hi);
}

/* ------------------------------------------------------------------ conv_fwd: plain loops */

/* Any geometry, one output at a time (the reduction too long for the engine's strip). */
static void __attribute__((noinline)) conv_plain(const conv_t *g) {
    int HW = g->H * g->W, K = g->K;
    rq_t q;
    for (int oc = 0; oc < g->O; oc++) {
        conv_rq(g, &q, oc);
        const int8_t *xg = g->x + (oc / g->Og) * g->Cg * HW;
        const int8_t *wo = g->w + oc * g->R;
        int8_t *yo = g->y + oc * g->OH * g->OW;
        for (int oy = 0; oy < g->OH; oy++) {
            for (int ox = 0; ox < g->OW; ox++) {
                int32_t acc = g->b[oc];
                int iy0 = oy * g->s - g->pad, ix0 = ox * g->s - g->px;
                for (int c = 0; c < g->Cg; c++) {
                    for (int ky = 0; ky < K; ky++) {
                        int iy = iy0 + ky;
                        if (iy < 0 || iy >= g->H) {
                            continue;
                        }
                        const int8_t *xr = xg + c * HW + iy * g->W;
                        const int8_t *wr = wo + (c * K + ky) * K;
                        for (int kx = 0; kx < K; kx++) {
                            int ix = ix0 + kx;
                            if (ix >= 0 && ix < g->W) {
                                acc += wr[kx] * xr[ix];
                            }
                        }
                    }
                }
                yo[oy * g->OW + ox] = (int8_t)rq1(&q, acc);
            }
        }
    }
}

/* 1x1 on a 1x1 map (dense layers): dot products of int8 rows, two output channels at a time. */
static inline int32_t dot8(const int8_t *a, const int8_t *b, int n, int32_t acc) {
    int c = 0;
    for (; c + 4 <= n; c += 4) {
        uint32_t xa = read_u32(a + c), xb = read_u32(b + c);
        acc = smlad(sxtb16(xa), sxtb16(xb), acc);
        acc = smlad(sxtb16_ror8(xa), sxtb16_ror8(xb), acc);
    }
    for (; c < n; c++) {
        acc += a[c] * b[c];
    }
    return acc;
}

static void __attribute__((noinline)) conv_dense(const conv_t *g) {
    int Cg = g->Cg;
    rq_t q;
    for (int grp = 0; grp < g->G; grp++) {
        const int8_t *xg = g->x + grp * Cg;
        int oc = grp * g->Og, end = oc + g->Og;
        for (; oc + 2 <= end; oc += 2) {
            const int8_t *w0 = g->w + oc * Cg, *w1 = w0 + Cg;
            int32_t a0 = g->b[oc], a1 = g->b[oc + 1];
            int c = 0;
            for (; c + 4 <= Cg; c += 4) {
                uint32_t xw = read_u32(xg + c), u0 = read_u32(w0 + c), u1 = read_u32(w1 + c);
                uint32_t xe = sxtb16(xw), xo = sxtb16_ror8(xw);
                a0 = smlad(xe, sxtb16(u0), a0);
                a0 = smlad(xo, sxtb16_ror8(u0), a0);
                a1 = smlad(xe, sxtb16(u1), a1);
                a1 = smlad(xo, sxtb16_ror8(u1), a1);
            }
            for (; c < Cg; c++) {
                a0 += xg[c] * w0[c];
                a1 += xg[c] * w1[c];
            }
            conv_rq(g, &q, oc);
            g->y[oc] = (int8_t)rq1(&q, a0);
            conv_rq(g, &q, oc + 1);
            g->y[oc + 1] = (int8_t)rq1(&q, a1);
        }
        if (oc < end) {
            conv_rq(g, &q, oc);
            g->y[oc] = (int8_t)rq1(&q, dot8(xg, g->w + oc * Cg, Cg, g->b[oc]));
        }
    }
}

/* ------------------------------------------------------------------ conv_fwd: the engine */

/* The strip: quads of 4 consecutive output pixels (of the flat output map), each Rp/2 pair-steps
 * x 4 words; word (t, j) of a quad holds, for pixel j, the int16 pair of reduction elements
 * (4k, 4k+2) at t = 2k and (4k+1, 4k+3) at t = 2k+1: the order SXTB16 gives a word of 4 int8
 * weights. Rp: the reduction R rounded up to 8 (zeros past R in the packed weights). */

/* Four sums of one output channel over one quad: acc[j] += sum_t xq[t][j] * wq[t] over nit
 * iterations of 4 pair-steps; wq: packed weights (pair words). For partial quads and the
 * 64-bit requantization; eng_run below does the full quads. */
static inline void mk4_packed(const uint32_t *xp, const uint32_t *wp, int nit, int32_t *acc) {
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    for (int t = 0; t < 4 * nit; t++, xp += 4) {
        uint32_t w = wp[t];
        a0 = smlad(xp[0], w, a0);
        a1 = smlad(xp[1], w, a1);
        a2 = smlad(xp[2], w, a2);
        a3 = smlad(xp[3], w, a3);
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

/* The same with the weights read as int8 (wb: the row; R a multiple of 8). */
static inline void mk4_int8(const uint32_t *xp, const int8_t *wb, int nit, int32_t *acc) {
    int32_t a0 = acc[0], a1 = acc[1], a2 = acc[2], a3 = acc[3];
    for (int k = 0; k < 2 * nit; k++, xp += 8) {
        uint32_t u = read_u32(wb + 4 * k), we = sxtb16(u), wo = sxtb16_ror8(u);
        a0 = smlad(xp[0], we, a0);
        a1 = smlad(xp[1], we, a1);
        a2 = smlad(xp[2], we, a2);
        a3 = smlad(xp[3], we, a3);
        a0 = smlad(xp[4], wo, a0);
        a1 = smlad(xp[5], wo, a1);
        a2 = smlad(xp[6], wo, a2);
        a3 = smlad(xp[7], wo, a3);
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

/* One output channel over the full quads of a strip: what the assembly below reads (offsets
 * fixed for 32-bit pointers). */
typedef struct {
    int32_t M, A, S;             /* 0, 4, 8: the SMMLA requantization */
    uint32_t lo4, hi4;           /* 12, 16 */
    int8_t *y, *yend;            /* 20, 24: the outputs (4 a quad) */
    int32_t bias;                /* 28 */
    const void *w, *wend;        /* 32, 36: packed pair words, or the int8 row */
    const uint32_t *xq;          /* 40: the strip */
} eng_t;

#if defined(__ARM_FEATURE_DSP)
typedef char eng_t_is_32bit[sizeof(eng_t) == 44 ? 1 : -1];

/* Thumb-2: r0-r3 the sums, r4-r7 a pair-step of the quad (LDM), r8/r10 weights, r9 the weight
 * pointer, r12 its end, lr the strip, r11 the context. */
#define ENG_MAC(W)                                     \
    "ldmia lr!, {r4, r5, r6, r7}\n\t"                  \
    "smlad r0, r4, " W ", r0\n\t"                      \
    "smlad r1, r5, " W ", r1\n\t"                      \
    "smlad r2, r6, " W ", r2\n\t"                      \
    "smlad r3, r7, " W ", r3\n\t"
#define ENG_HEAD                                       \
    "ldr lr, [r11, #40]\n\t"                           \
    "1:\n\t"                                           \
    "ldr r0, [r11, #28]\n\t"                           \
    "mov r1, r0\n\t"                                   \
    "mov r2, r0\n\t"                                   \
    "mov r3, r0\n\t"                                   \
    "ldrd r9, r12, [r11, #32]\n\t"                     \
    "2:\n\t"
#define ENG_PACKED                                     \
    "ldrd r8, r10, [r9], #8\n\t"                       \
    ENG_MAC("r8") ENG_MAC("r10")                       \
    "ldrd r8, r10, [r9], #8\n\t"                       \
    ENG_MAC("r8") ENG_MAC("r10")                       \
    "cmp r9, r12\n\t"                                  \
    "bne 2b\n\t"
#define ENG_INT8                                       \
    "ldr r8, [r9], #4\n\t"                             \
    "sxtb16 r10, r8\n\t"                               \
    "sxtb16 r8, r8, ror #8\n\t"                        \
    ENG_MAC("r10") ENG_MAC("r8")                       \
    "ldr r8, [r9], #4\n\t"                             \
    "sxtb16 r10, r8\n\t"                               \
    "sxtb16 r8, r8, ror #8\n\t"                        \
    ENG_MAC("r10") ENG_MAC("r8")                       \
    "cmp r9, r12\n\t"                                  \
    "bne 2b\n\t"
/* rq of r0-r3 (M, A, S: registers), saturated to int8. S1: S == 1, the shift folded into SSAT. */
#define RQ_SN(M, A, S)                                 \
    "smmla r0, r0, " M ", " A "\n\t"                   \
    "smmla r1, r1, " M ", " A "\n\t"                   \
    "smmla r2, r2, " M ", " A "\n\t"                   \
    "smmla r3, r3, " M ", " A "\n\t"                   \
    "asr r0, r0, " S "\n\t"                            \
    "asr r1, r1, " S "\n\t"                            \
    "asr r2, r2, " S "\n\t"                            \
    "asr r3, r3, " S "\n\t"                            \
    "ssat r0, #8, r0\n\t"                              \
    "ssat r1, #8, r1\n\t"                              \
    "ssat r2, #8, r2\n\t"                              \
    "ssat r3, #8, r3\n\t"
#define RQ_S1(M, A, S)                                 \
    "smmla r0, r0, " M ", " A "\n\t"                   \
    "smmla r1, r1, " M ", " A "\n\t"                   \
    "smmla r2, r2, " M ", " A "\n\t"                   \
    "smmla r3, r3, " M ", " A "\n\t"                   \
    "ssat r0, #8, r0, asr #1\n\t"                      \
    "ssat r1, #8, r1, asr #1\n\t"                      \
    "ssat r2, #8, r2, asr #1\n\t"                      \
    "ssat r3, #8, r3, asr #1\n\t"
/* pack r0-r3 into r0, clamp bytewise to [lo4 (r7), hi4 (r8)] */
#define RQ_PACK(LO, HI)                                \
    "bfi r0, r1, #8, #8\n\t"                           \
    "bfi r0, r2, #16, #8\n\t"                          \
    "bfi r0, r3, #24, #8\n\t"                          \
    "ssub8 r1, r0, " LO "\n\t"                         \
    "sel r0, r0, " LO "\n\t"                           \
    "ssub8 r1, r0, " HI "\n\t"                         \
    "sel r0, " HI ", r0\n\t"
#define ENG_TAIL(RQ)                                   \
    "ldm r11, {r4, r5, r6, r7, r8, r10, r12}\n\t"      \
    RQ("r4", "r5", "r6") RQ_PACK("r7", "r8")           \
    "str r0, [r10], #4\n\t"                            \
    "str r10, [r11, #20]\n\t"                          \
    "cmp r10, r12\n\t"                                 \
    "bne 1b\n\t"
#define ASM_CLOBBERS "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", "r12", "lr", "cc", "memory"
#define ASM_FN(name, text, ctx_t)                                          \
    static void __attribute__((noinline)) name(ctx_t *k) {                 \
        register ctx_t *r11 __asm__("r11") = k;                            \
        __asm__ volatile(text : : "r"(r11) : ASM_CLOBBERS);                \
    }
ASM_FN(eng_packed_sn, ENG_HEAD ENG_PACKED ENG_TAIL(RQ_SN), eng_t)
ASM_FN(eng_packed_s1, ENG_HEAD ENG_PACKED ENG_TAIL(RQ_S1), eng_t)
ASM_FN(eng_int8_sn, ENG_HEAD ENG_INT8 ENG_TAIL(RQ_SN), eng_t)
ASM_FN(eng_int8_s1, ENG_HEAD ENG_INT8 ENG_TAIL(RQ_S1), eng_t)
#endif

/* Four sums, requantized by the SMMLA form (no 64-bit channel), packed and clamped. */
static inline uint32_t rq_pack4(int32_t a0, int32_t a1, int32_t a2, int32_t a3, int32_t M, int32_t Ad, int32_t S,
                                uint32_t lo4, uint32_t hi4) {
    return clamp4(pack4_sat8(smmla(a0, M, Ad) >> S, smmla(a1, M, Ad) >> S, smmla(a2, M, Ad) >> S, smmla(a3, M, Ad) >> S),
                  lo4, hi4);
}

/* The full quads of a strip for one output channel (k->y < k->yend; the SMMLA form). */
static void eng_run(eng_t *k, int raw) {
#if defined(__ARM_FEATURE_DSP)
    if (k->S == 1) {
        (raw ? eng_int8_s1 : eng_packed_s1)(k);
    } else {
        (raw ? eng_int8_sn : eng_packed_sn)(k);
    }
#else
    const uint32_t *xp = k->xq;
    int nw = raw ? (int)((const int8_t *)k->wend - (const int8_t *)k->w) : (int)((const uint32_t *)k->wend - (const uint32_t *)k->w);
    int nit = raw ? nw / 8 : nw / 4;
    for (int8_t *y = k->y; y < k->yend; y += 4, xp += 16 * nit) {
        int32_t acc[4] = {k->bias, k->bias, k->bias, k->bias};
        if (raw) {
            mk4_int8(xp, (const int8_t *)k->w, nit, acc);
        } else {
            mk4_packed(xp, (const uint32_t *)k->w, nit, acc);
        }
        write_u32(y, rq_pack4(acc[0], acc[1], acc[2], acc[3], k->M, k->A, k->S, k->lo4, k->hi4));
    }
#endif
}

/* The weight row w[0..R) as pair words (zeros past R) into wq[0 .. Rp/2). */
static void __attribute__((noinline)) pack_wrow(uint32_t *wq, const int8_t *w, int R, int Rp) {
    int r = R & ~7;
#if defined(__ARM_FEATURE_DSP)
    if (r > 0) {
        const int8_t *we = w + r;
        __asm__ volatile(
            "1:\n\t"
            "ldr r4, [%[w]], #4\n\t"
            "ldr r5, [%[w]], #4\n\t"
            "sxtb16 r6, r4\n\t"
            "sxtb16 r7, r4, ror #8\n\t"
            "sxtb16 r8, r5\n\t"
            "sxtb16 r9, r5, ror #8\n\t"
            "stmia %[d]!, {r6, r7, r8, r9}\n\t"
            "cmp %[w], %[e]\n\t"
            "bne 1b"
            : [w] "+r"(w), [d] "+r"(wq) : [e] "r"(we) : "r4", "r5", "r6", "r7", "r8", "r9", "cc", "memory");
    }
#else
    for (int i = 0; i < r; i += 8, wq += 4, w += 8) {
        uint32_t u = read_u32(w), v = read_u32(w + 4);
        wq[0] = sxtb16(u);
        wq[1] = sxtb16_ror8(u);
        wq[2] = sxtb16(v);
        wq[3] = sxtb16_ror8(v);
    }
#endif
    for (; r < Rp; r += 4, wq += 2, w += 4) {
        uint32_t u = 0;
        for (int i = 0; i < 4 && r + i < R; i++) {
            u |= (uint32_t)(uint8_t)w[i] << (8 * i);
        }
        wq[0] = sxtb16(u);
        wq[1] = sxtb16_ror8(u);
    }
}

/* The halfword index of reduction element r, pixel 0, in a quad. */
static inline int quad_half(int r) {
    return (r >> 2) * 16 + (r & 1) * 8 + ((r >> 1) & 1);
}

/* One quad of a pointwise strip, channel groups of 4 (ng of them): x[c .. c+4, 0 .. 4] (rows HW
 * apart) -> 8 pair words: pixel j's (c, c+2), then pixel j's (c+1, c+3). */
static void __attribute__((noinline)) pack_pw_quad(uint32_t *d, const int8_t *x, int HW, int ng) {
#if defined(__ARM_FEATURE_DSP)
    const int8_t *xe = x + 4 * HW * ng, *xb = x + HW;
    int HW2 = 2 * HW;
    __asm__ volatile(
#define PW_HALF(X)                                       \
        "ldr r4, [" X "]\n\t"                           \
        "ldr r5, [" X ", %[HW2]]\n\t"                   \
        "sxtb16 r6, r4\n\t"                             \
        "sxtb16 r4, r4, ror #8\n\t"                     \
        "sxtb16 r7, r5\n\t"                             \
        "sxtb16 r5, r5, ror #8\n\t"                     \
        "pkhbt r8, r6, r7, lsl #16\n\t"                 \
        "pkhtb r9, r7, r6, asr #16\n\t"                 \
        "pkhbt r6, r4, r5, lsl #16\n\t"                 \
        "pkhtb r7, r5, r4, asr #16\n\t"                 \
        "strd r8, r6, [%[d]], #8\n\t"                   \
        "strd r9, r7, [%[d]], #8\n\t"
        "1:\n\t"
        PW_HALF("%[x]") PW_HALF("%[xb]")
#undef PW_HALF
        "add %[x], %[x], %[HW2], lsl #1\n\t"
        "add %[xb], %[xb], %[HW2], lsl #1\n\t"
        "cmp %[x], %[e]\n\t"
        "bne 1b"
        : [x] "+r"(x), [xb] "+r"(xb), [d] "+r"(d)
        : [e] "r"(xe), [HW2] "r"(HW2)
        : "r4", "r5", "r6", "r7", "r8", "r9", "cc", "memory");
#else
    for (int k = 0; k < ng; k++, d += 8, x += 4 * HW) {
        uint32_t ua = read_u32(x), ub = read_u32(x + HW), uc = read_u32(x + 2 * HW), ud = read_u32(x + 3 * HW);
        uint32_t ea = sxtb16(ua), oa = sxtb16_ror8(ua), ec = sxtb16(uc), oc = sxtb16_ror8(uc);
        uint32_t eb = sxtb16(ub), ob = sxtb16_ror8(ub), ed = sxtb16(ud), od = sxtb16_ror8(ud);
        d[0] = (ea & 0xFFFFu) | (ec << 16);
        d[1] = (oa & 0xFFFFu) | (oc << 16);
        d[2] = (ec & 0xFFFF0000u) | (ea >> 16);
        d[3] = (oc & 0xFFFF0000u) | (oa >> 16);
        d[4] = (eb & 0xFFFFu) | (ed << 16);
        d[5] = (ob & 0xFFFFu) | (od << 16);
        d[6] = (ed & 0xFFFF0000u) | (eb >> 16);
        d[7] = (od & 0xFFFF0000u) | (ob >> 16);
    }
#endif
}

/* Pointwise strip: quads of pixels p0 = 4*(q0+i) of the flat map, channels c0 .. c0+Cg. */
static void __attribute__((noinline)) strip_pointwise(uint32_t *xq, const int8_t *xg, int HW, int Cg, int Rp, int q0, int nq) {
    int qw = 2 * Rp;
    for (int i = 0; i < nq; i++) {
        int p0 = 4 * (q0 + i), c = 0;
        if (p0 + 4 <= HW && Cg >= 4) {
            pack_pw_quad(xq + i * qw, xg + p0, HW, Cg / 4);
            c = Cg & ~3;
        }
        /* the rest: element by element, zeros past the map and past Cg (up to Rp) */
        int16_t *h = (int16_t *)(xq + i * qw);
        for (; c < Rp; c++) {
            int hi = quad_half(c);
            for (int j = 0; j < 4; j++) {
                h[hi + 2 * j] = (c < Cg && p0 + j < HW) ? xg[c * HW + p0 + j] : 0;
            }
        }
    }
}

/* im2col strip: quad i covers the flat outputs 4*(q0+i) .. +4 (zeros past OH*OW). The 4
 * pixels' columns (their R inputs in the weights' order, as bytes) are gathered into cols (COL
 * bytes apart; in the weight row's buffer, free while the strip is built): a kernel row of up to
 * 4 taps by one word where it lies inside the input row. Then SXTB16 of word k of a column gives
 * its pair word of step 2k, of it rotated by 8 that of step 2k+1. A column's bytes past R are
 * left as they are: the packed weights are zero there. */
#define COL 256
static void __attribute__((noinline)) strip_im2col(uint32_t *xq, const conv_t *g, const int8_t *xg, int Rp, int q0, int nq) {
    int qw = 2 * Rp, K = g->K, s = g->s, H = g->H, W = g->W, HW = H * W, OW = g->OW, OHW = g->OH * OW;
    int Cg = g->Cg, R = g->R;
    int8_t *cols = (int8_t *)tte_fwd_wrow;             /* 4 columns of COL bytes (Rp + 4 <= COL) */
    int p0 = 4 * q0, oy = p0 / OW, ox0 = p0 - oy * OW;
    if (Rp + 4 > COL) {                                  /* long columns: one pixel at a time */
        for (int i = 0; i < nq; i++) {
            for (int j = 0; j < 4; j++) {
                int p = 4 * (q0 + i) + j, py = p / OW, pxo = p - py * OW;
                int8_t *c8 = cols;
                for (int c = 0; c < Cg; c++) {
                    for (int ky = 0; ky < K; ky++) {
                        int iy = py * s + ky - g->pad;
                        for (int kx = 0; kx < K; kx++) {
                            int ix = pxo * s + kx - g->px;
                            *c8++ = (p < OHW && iy >= 0 && iy < H && ix >= 0 && ix < W) ? xg[c * HW + iy * W + ix] : 0;
                        }
                    }
                }
                uint32_t *d = xq + i * qw + j;
                for (int k = 0; k < Rp / 4; k++, d += 8) {
                    uint32_t u = read_u32(cols + 4 * k);
                    d[0] = sxtb16(u);
                    d[4] = sxtb16_ror8(u);
                }
            }
        }
        return;
    }
    for (int i = 0; i < nq; i++, p0 += 4) {
        int iy0 = oy * s - g->pad, ix0 = ox0 * s - g->px;
        if (K <= 4 && ox0 + 4 <= OW && p0 + 4 <= OHW && ix0 >= 0 && ix0 + 3 * s + 4 <= W) {
            /* four pixels of one output row, every kernel row inside the input row: words */
            const int8_t *xc = xg + ix0;
            int8_t *c8 = cols;
            for (int c = 0; c < Cg; c++, xc += HW) {
                const int8_t *xr = xc + iy0 * W;
                for (int ky = 0, iy = iy0; ky < K; ky++, iy++, xr += W, c8 += K) {
                    uint32_t u0 = 0, u1 = 0, u2 = 0, u3 = 0;
                    if ((unsigned)iy < (unsigned)H) {
                        u0 = read_u32(xr);
                        u1 = read_u32(xr + s);
                        u2 = read_u32(xr + 2 * s);
                        u3 = read_u32(xr + 3 * s);
                    }
                    write_u32(c8, u0);                 /* the bytes past K: the next row's */
                    write_u32(c8 + COL, u1);
                    write_u32(c8 + 2 * COL, u2);
                    write_u32(c8 + 3 * COL, u3);
                }
            }
        } else if (K <= 4 && ox0 + 4 <= OW && p0 + 4 <= OHW) {
            /* one output row, some kernel rows at the input's left or right edge */
            const int8_t *xc = xg;
            int8_t *c8 = cols;
            for (int c = 0; c < Cg; c++, xc += HW) {
                for (int ky = 0, iy = iy0; ky < K; ky++, iy++, c8 += K) {
                    const int8_t *xr = xc + iy * W;
                    for (int j = 0, ix = ix0; j < 4; j++, ix += s) {
                        int8_t *cj = c8 + j * COL;
                        if ((unsigned)iy >= (unsigned)H) {
                            write_u32(cj, 0);
                        } else if (ix >= 0 && ix + 4 <= W) {
                            write_u32(cj, read_u32(xr + ix));
                        } else {
                            for (int kx = 0; kx < K; kx++) {
                                cj[kx] = (ix + kx >= 0 && ix + kx < W) ? xr[ix + kx] : 0;
                            }
                        }
                    }
                }
            }
        } else {
            for (int j = 0; j < 4; j++) {
                int p = p0 + j, py = p / OW, pxo = p - py * OW;
                int8_t *c8 = cols + j * COL;
                if (p >= OHW) {
                    memset(c8, 0, (size_t)R);
                    continue;
                }
                for (int c = 0; c < Cg; c++) {
                    for (int ky = 0; ky < K; ky++) {
                        int iy = py * s + ky - g->pad;
                        for (int kx = 0; kx < K; kx++) {
                            int ix = pxo * s + kx - g->px;
                            *c8++ = (iy >= 0 && iy < H && ix >= 0 && ix < W) ? xg[c * HW + iy * W + ix] : 0;
                        }
                    }
                }
            }
        }
        /* spread: pixel j's column word k -> quad words (2k, j) and (2k+1, j) */
        uint32_t *d = xq + i * qw;
        const uint32_t *cw = (const uint32_t *)(void *)cols;
        for (int k = 0; k < Rp / 4; k++, d += 8, cw++) {
            uint32_t u0 = cw[0], u1 = cw[COL / 4], u2 = cw[2 * COL / 4], u3 = cw[3 * COL / 4];
            d[0] = sxtb16(u0);
            d[1] = sxtb16(u1);
            d[2] = sxtb16(u2);
            d[3] = sxtb16(u3);
            d[4] = sxtb16_ror8(u0);
            d[5] = sxtb16_ror8(u1);
            d[6] = sxtb16_ror8(u2);
            d[7] = sxtb16_ror8(u3);
        }
        ox0 += 4;
        if (ox0 >= OW) {
            ox0 -= OW;
            oy++;
            if (ox0 >= OW) {                             /* OW < 4: recompute */
                oy = (p0 + 4) / OW;
                ox0 = p0 + 4 - oy * OW;
            }
        }
    }
}

/* Every conv whose padded reduction Rp fits the strip: strips of quads (4 consecutive outputs of
 * the flat output map), then every output channel of the group over the strip. pointwise: 1x1,
 * stride 1, no padding, whole map (the strip is packed from 4 channels x 4 pixels at a time);
 * otherwise im2col. */
static void __attribute__((noinline)) conv_engine(const conv_t *g, int pointwise) {
    int R = g->R, Rp = (R + 7) & ~7, qw = 2 * Rp, nit = Rp / 8;
    int HW = g->H * g->W, OHW = g->OH * g->OW;
    int qmax = STRIP_WORDS / qw;
    int nq = (OHW + 3) / 4;
    /* int8 weights in the loop when a strip is too short to pay for packing them */
    int raw = (R & 7) == 0 && (qmax < 4 || nq < 4);
    uint32_t *xq = tte_fwd_strip, *wq = tte_fwd_wrow;
    rq_t q;
    eng_t k;
    rq_prep(&q, 0, 17, g->lo, g->hi);
    k.lo4 = q.lo4;
    k.hi4 = q.hi4;
    for (int grp = 0; grp < g->G; grp++) {
        const int8_t *xg = g->x + grp * g->Cg * HW;
        for (int q0 = 0; q0 < nq; q0 += qmax) {
            int ns = nq - q0 < qmax ? nq - q0 : qmax;
            int nfull = 4 * (q0 + ns) <= OHW ? ns : ns - 1;
            if (pointwise) {
                strip_pointwise(xq, xg, HW, g->Cg, Rp, q0, ns);
            } else {
                strip_im2col(xq, g, xg, Rp, q0, ns);
            }
            k.w = raw ? (const void *)g->w : (const void *)wq;
            k.xq = xq;
            for (int oc = grp * g->Og; oc < (grp + 1) * g->Og; oc++) {
                const int8_t *wo = g->w + oc * R;
                int8_t *y = g->y + oc * OHW + 4 * q0;
                if (!raw) {
                    pack_wrow(wq, wo, R, Rp);
                } else {
                    k.w = wo;
                }
                int i = 0;
                if (nfull > 0 && rq_smmla(g->m[oc], g->sh[oc], &k.M, &k.A, &k.S)) {
                    k.y = y;
                    k.yend = y + 4 * nfull;
                    k.bias = g->b[oc];
                    k.wend = (const int8_t *)k.w + (raw ? Rp : 2 * Rp);
                    eng_run(&k, raw);
                    i = nfull;
                }
                if (i < ns) {                  /* a partial quad, or the 64-bit rq */
                    int32_t bias = g->b[oc];
                    conv_rq(g, &q, oc);
                    for (; i < ns; i++) {
                        int32_t acc[4] = {bias, bias, bias, bias};
                        if (raw) {
                            mk4_int8(xq + i * qw, wo, nit, acc);
                        } else {
                            mk4_packed(xq + i * qw, wq, nit, acc);
                        }
                        int n = OHW - 4 * (q0 + i) < 4 ? OHW - 4 * (q0 + i) : 4;
                        rq_store4(y + 4 * i, n, acc[0], acc[1], acc[2], acc[3], &q);
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ conv_fwd: depthwise 3x3 */

/* The depthwise paths (KxK, K = 3, 5, 7) read their input from a band of padded rows in the strip
 * buffer: row r of the band is input row oy0*s - pad + r shifted right by pad_x, zero outside the
 * map, RB bytes apart (what the blocks of 4 outputs of a row read: 4s*q .. 4s*q + 3s + K - 1 at
 * block q, rounded up to words; the words the blocks load stay inside). Rows are copied where
 * pad_x + their data is word-aligned; the margins stay zero (the buffer is cleared once a call). */
static inline int dw_row_bytes(const conv_t *g) {
    int nb = (g->OW + 3) / 4;
    return (4 * g->s * nb + g->K - 1 + 3) & ~3;
}

/* Output rows a band holds (0: not even one; the band's buffer is the strip, less 4 bytes of
 * alignment lead). */
static inline int dw_band_rows(const conv_t *g) {
    int nr = (4 * STRIP_WORDS - 4) / dw_row_bytes(g);
    return nr < g->K ? 0 : (nr - g->K) / g->s + 1;
}

/* n rows of ncopy bytes, sW apart at s, to RB apart at d (d and RB word-aligned: the band's
 * rows), a word at a time: the bytes from ncopy to the next word boundary are written zero (the
 * row's right margin, or the next row's left one: ncopy <= RB - pad_x). 16 bytes by LDM (LDRs
 * where s is not word-aligned) and STM. */
static void __attribute__((noinline)) copy_rows(int8_t *d, int RB, const int8_t *s, int sW, int nrows, int ncopy) {
    int n16 = ncopy & ~15, nw = ncopy & ~3, t = ncopy & 3;
#if defined(__ARM_FEATURE_DSP)
    int aligned = ((((uintptr_t)s | (uintptr_t)sW) & 3) == 0);
#endif
    for (int r = 0; r < nrows; r++, d += RB, s += sW) {
        const int8_t *sp = s;
        int8_t *dp = d;
        if (n16) {
#if defined(__ARM_FEATURE_DSP)
            const int8_t *e = s + n16;
            if (aligned) {
                __asm__ volatile(
                    "1:\n\t"
                    "ldmia %[s]!, {r4, r5, r6, r7}\n\t"
                    "stmia %[d]!, {r4, r5, r6, r7}\n\t"
                    "cmp %[s], %[e]\n\t"
                    "bne 1b"
                    : [s] "+r"(sp), [d] "+r"(dp) : [e] "r"(e) : "r4", "r5", "r6", "r7", "cc", "memory");
            } else {                                    /* unaligned LDR, never LDM */
                __asm__ volatile(
                    "1:\n\t"
                    "ldr r4, [%[s]]\n\t"
                    "ldr r5, [%[s], #4]\n\t"
                    "ldr r6, [%[s], #8]\n\t"
                    "ldr r7, [%[s], #12]\n\t"
                    "adds %[s], %[s], #16\n\t"
                    "stmia %[d]!, {r4, r5, r6, r7}\n\t"
                    "cmp %[s], %[e]\n\t"
                    "bne 1b"
                    : [s] "+r"(sp), [d] "+r"(dp) : [e] "r"(e) : "r4", "r5", "r6", "r7", "cc", "memory");
            }
#else
            memcpy(dp, sp, (size_t)n16);
            sp += n16;
            dp += n16;
#endif
        }
        for (; sp != s + nw; sp += 4, dp += 4) {
            write_u32(dp, read_u32(sp));
        }
        if (t) {                                        /* the last 1..3 bytes, zeros above */
            uint32_t v = 0;
            if (nw) {
                v = read_u32(s + ncopy - 4) >> (8 * (4 - t));
            } else {
                for (int j = 0; j < t; j++) {
                    v |= (uint32_t)(uint8_t)s[j] << (8 * j);
                }
            }
            write_u32(dp, v);
        }
    }
}

/* One channel over a band of output rows, blocks of 4 outputs, for the assembly (offsets for
 * 32-bit pointers). */
typedef struct {
    int32_t M, A, S;             /* 0, 4, 8 */
    uint32_t lo4, hi4;           /* 12, 16 */
    int32_t bias;                /* 20 */
    uint32_t w[6];               /* 24: per kernel row (w0, w2) as an int16 pair, then w1 */
    const int8_t *p0, *p1, *p2;  /* 48: the three input rows of the first output row */
    int8_t *y;                   /* 60: the first output */
    int32_t row_y;               /* 64: output bytes of a row's full blocks (4 a block) */
    int32_t adv_p, adv_y;        /* 68, 72: from a row's end to the next row's start */
    int8_t *yend;                /* 76: y after the band's last row */
} dw_t;

#if defined(__ARM_FEATURE_DSP)
typedef char dw_t_is_32bit[sizeof(dw_t) == 80 ? 1 : -1];

/* r0-r3 the sums, r4-r6 the rows, r7/r8 unpacked input pairs, r9 (w0, w2), r10 w1, r11 the
 * context, r12 the output, lr the row's end. */
#define DW_HEAD                                        \
    "ldr r4, [r11, #48]\n\t"                           \
    "ldr r5, [r11, #52]\n\t"                           \
    "ldr r6, [r11, #56]\n\t"                           \
    "ldr r12, [r11, #60]\n\t"                          \
    "3:\n\t"                                           \
    "ldr lr, [r11, #64]\n\t"                           \
    "add lr, r12, lr\n\t"                              \
    "1:\n\t"                                           \
    "ldr r0, [r11, #20]\n\t"                           \
    "ldrd r9, r10, [r11, #24]\n\t"
/* Stride 1: output j of a block reads bytes j..j+2 (pairs (j, j+2) by SXTB16 for (w0, w2), the
 * middle byte by SMLAxB); the first kernel row starts every sum at the bias (r0). */
#define DW1_FIRST(P)                                   \
    "ldr r7, [" P ", #2]\n\t"                          \
    "sxtb16 r3, r7, ror #8\n\t"                        \
    "sxtb16 r7, r7\n\t"                                \
    "smlad r3, r3, r9, r0\n\t"                         \
    "smlatb r3, r7, r10, r3\n\t"                       \
    "smlad r2, r7, r9, r0\n\t"                         \
    "ldr r7, [" P "], #4\n\t"                          \
    "sxtb16 r8, r7, ror #8\n\t"                        \
    "sxtb16 r7, r7\n\t"                                \
    "smlatb r2, r8, r10, r2\n\t"                       \
    "smlad r1, r8, r9, r0\n\t"                         \
    "smlatb r1, r7, r10, r1\n\t"                       \
    "smlad r0, r7, r9, r0\n\t"                         \
    "smlabb r0, r8, r10, r0\n\t"
#define DW1_ROW(P)                                     \
    "ldr r7, [" P ", #2]\n\t"                          \
    "sxtb16 r8, r7, ror #8\n\t"                        \
    "sxtb16 r7, r7\n\t"                                \
    "smlad r3, r8, r9, r3\n\t"                         \
    "smlatb r3, r7, r10, r3\n\t"                       \
    "smlad r2, r7, r9, r2\n\t"                         \
    "ldr r7, [" P "], #4\n\t"                          \
    "sxtb16 r8, r7, ror #8\n\t"                        \
    "sxtb16 r7, r7\n\t"                                \
    "smlatb r2, r8, r10, r2\n\t"                       \
    "smlad r1, r8, r9, r1\n\t"                         \
    "smlatb r1, r7, r10, r1\n\t"                       \
    "smlad r0, r7, r9, r0\n\t"                         \
    "smlabb r0, r8, r10, r0\n\t"
/* Stride 2: output j reads bytes 2j..2j+2 */
#define DW2_FIRST(P)                                   \
    "ldr r7, [" P ", #4]\n\t"                          \
    "sxtb16 r8, r7, ror #8\n\t"                        \
    "sxtb16 r7, r7\n\t"                                \
    "smlad r2, r7, r9, r0\n\t"                         \
    "smlabb r2, r8, r10, r2\n\t"                       \
    "smlatb r3, r8, r10, r0\n\t"                       \
    "ldr r7, [" P ", #6]\n\t"                          \
    "sxtb16 r7, r7\n\t"                                \
    "smlad r3, r7, r9, r3\n\t"                         \
    "ldr r7, [" P ", #2]\n\t"                          \
    "sxtb16 r7, r7\n\t"                                \
    "smlad r1, r7, r9, r0\n\t"                         \
    "ldr r7, [" P "], #8\n\t"                          \
    "sxtb16 r8, r7, ror #8\n\t"                        \
    "sxtb16 r7, r7\n\t"                                \
    "smlatb r1, r8, r10, r1\n\t"                       \
    "smlad r0, r7, r9, r0\n\t"                         \
    "smlabb r0, r8, r10, r0\n\t"
#define DW2_ROW(P)                                     \
    "ldr r7, [" P ", #4]\n\t"                          \
    "sxtb16 r8, r7, ror #8\n\t"                        \
    "sxtb16 r7, r7\n\t"                                \
    "smlad r2, r7, r9, r2\n\t"                         \
    "smlabb r2, r8, r10, r2\n\t"                       \
    "smlatb r3, r8, r10, r3\n\t"                       \
    "ldr r7, [" P ", #6]\n\t"                          \
    "sxtb16 r7, r7\n\t"                                \
    "smlad r3, r7, r9, r3\n\t"                         \
    "ldr r7, [" P ", #2]\n\t"                          \
    "sxtb16 r7, r7\n\t"                                \
    "smlad r1, r7, r9, r1\n\t"                         \
    "ldr r7, [" P "], #8\n\t"                          \
    "sxtb16 r8, r7, ror #8\n\t"                        \
    "sxtb16 r7, r7\n\t"                                \
    "smlatb r1, r8, r10, r1\n\t"                       \
    "smlad r0, r7, r9, r0\n\t"                         \
    "smlabb r0, r8, r10, r0\n\t"
#define DW_BODY(FIRST, ROW)                            \
    FIRST("r4")                                        \
    "ldrd r9, r10, [r11, #32]\n\t"                     \
    ROW("r5")                                          \
    "ldrd r9, r10, [r11, #40]\n\t"                     \
    ROW("r6")
/* requantize (M r9, A r10, S r8), clamp (lo4 r9, hi4 r10), store; the next block, row, band */
#define DW_TAIL_SN                                     \
    "ldrd r9, r10, [r11]\n\t"                          \
    "ldr r8, [r11, #8]\n\t"                            \
    RQ_SN("r9", "r10", "r8")
#define DW_TAIL_S1                                     \
    "ldrd r9, r10, [r11]\n\t"                          \
    RQ_S1("r9", "r10", "r8")
#define DW_TAIL(RQ)                                    \
    RQ                                                 \
    "ldrd r9, r10, [r11, #12]\n\t"                     \
    RQ_PACK("r9", "r10")                               \
    "str r0, [r12], #4\n\t"                            \
    "cmp r12, lr\n\t"                                  \
    "bne 1b\n\t"                                       \
    "ldrd r7, r8, [r11, #68]\n\t"                      \
    "add r4, r4, r7\n\t"                               \
    "add r5, r5, r7\n\t"                               \
    "add r6, r6, r7\n\t"                               \
    "add r12, r12, r8\n\t"                             \
    "ldr r7, [r11, #76]\n\t"                           \
    "cmp r12, r7\n\t"                                  \
    "bne 3b\n\t"
ASM_FN(dw1_sn, DW_HEAD DW_BODY(DW1_FIRST, DW1_ROW) DW_TAIL(DW_TAIL_SN), dw_t)
ASM_FN(dw1_s1, DW_HEAD DW_BODY(DW1_FIRST, DW1_ROW) DW_TAIL(DW_TAIL_S1), dw_t)
ASM_FN(dw2_sn, DW_HEAD DW_BODY(DW2_FIRST, DW2_ROW) DW_TAIL(DW_TAIL_SN), dw_t)
ASM_FN(dw2_s1, DW_HEAD DW_BODY(DW2_FIRST, DW2_ROW) DW_TAIL(DW_TAIL_S1), dw_t)
#endif

/* The four sums of the block of outputs whose taps start at r0, r1, r2 (the rows). */
static inline void dw_block(const int8_t *r0, const int8_t *r1, const int8_t *r2, int s, const uint32_t *w,
                            int32_t bias, int32_t *acc) {
    int32_t a0 = bias, a1 = bias, a2 = bias, a3 = bias;
    const int8_t *rows[3] = {r0, r1, r2};
    for (int ky = 0; ky < 3; ky++) {
        const int8_t *p = rows[ky];
        uint32_t wp = w[2 * ky], wm = w[2 * ky + 1];
        if (s == 1) {
            uint32_t u0 = read_u32(p), u1 = read_u32(p + 2);
            uint32_t e = sxtb16(u0), od = sxtb16_ror8(u0), e2 = sxtb16(u1), o2 = sxtb16_ror8(u1);
            a0 = smlabb(od, wm, smlad(e, wp, a0));
            a1 = smlatb(e, wm, smlad(od, wp, a1));
            a2 = smlatb(od, wm, smlad(e2, wp, a2));
            a3 = smlatb(e2, wm, smlad(o2, wp, a3));
        } else {
            uint32_t u0 = read_u32(p), u1 = read_u32(p + 4);
            uint32_t e0 = sxtb16(u0), o0 = sxtb16_ror8(u0), e1 = sxtb16(u1), o1 = sxtb16_ror8(u1);
            a0 = smlabb(o0, wm, smlad(e0, wp, a0));
            a1 = smlatb(o0, wm, smlad(sxtb16(read_u32(p + 2)), wp, a1));
            a2 = smlabb(o1, wm, smlad(e1, wp, a2));
            a3 = smlatb(o1, wm, smlad(sxtb16(read_u32(p + 6)), wp, a3));
        }
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

/* The full blocks of a band's rows (k->y < k->yend, row_y > 0; the SMMLA form). */
static void dw_run(dw_t *k, int s) {
#if defined(__ARM_FEATURE_DSP)
    if (k->S == 1) {
        (s == 1 ? dw1_s1 : dw2_s1)(k);
    } else {
        (s == 1 ? dw1_sn : dw2_sn)(k);
    }
#else
    const int8_t *r0 = k->p0, *r1 = k->p1, *r2 = k->p2;
    for (int8_t *y = k->y; y != k->yend; y += k->adv_y, r0 += k->adv_p, r1 += k->adv_p, r2 += k->adv_p) {
        for (int8_t *e = y + k->row_y; y != e; y += 4, r0 += 4 * s, r1 += 4 * s, r2 += 4 * s) {
            int32_t acc[4];
            dw_block(r0, r1, r2, s, k->w, k->bias, acc);
            write_u32(y, rq_pack4(acc[0], acc[1], acc[2], acc[3], k->M, k->A, k->S, k->lo4, k->hi4));
        }
    }
#endif
}

static void __attribute__((noinline)) conv_dw3(const conv_t *g) {
    int H = g->H, W = g->W, HW = H * W, OH = g->OH, OW = g->OW, s = g->s, px = g->px;
    int nb = (OW + 3) / 4, nbf = OW / 4;                  /* blocks of 4 outputs a row, full ones */
    int RB = dw_row_bytes(g), band = dw_band_rows(g);
    /* the band's rows start where row + pad_x is word-aligned (RB is a multiple of 4) */
    int8_t *buf = (int8_t *)tte_fwd_strip + ((4 - (px & 3)) & 3);
    int ncopy = W < RB - px ? W : RB - px;                /* the columns the blocks read */
    int mult = g->Og;
    rq_t q;
    dw_t k;
    rq_prep(&q, 0, 17, g->lo, g->hi);
    k.lo4 = q.lo4;
    k.hi4 = q.hi4;
    k.p0 = buf;
    k.p1 = buf + RB;
    k.p2 = buf + 2 * RB;
    k.row_y = 4 * nbf;
    k.adv_p = s * RB - 4 * s * nbf;
    k.adv_y = OW - 4 * nbf;
    memset(tte_fwd_strip, 0, 4 * STRIP_WORDS);
    for (int oy0 = 0; oy0 < OH; oy0 += band) {
        int nrows = OH - oy0 < band ? OH - oy0 : band;
        int nr = (nrows - 1) * s + 3, iy0 = oy0 * s - g->pad;
        for (int c = 0; c < g->C; c++) {
            const int8_t *xc = g->x + c * HW;
            int r0 = iy0 < 0 ? -iy0 : 0, r1 = H - iy0 < nr ? H - iy0 : nr;   /* rows inside the map */
            if (ncopy > 0 && r1 > r0) {
                copy_rows(buf + r0 * RB + px, RB, xc + (iy0 + r0) * W, W, r1 - r0, ncopy);
            }
            if (oy0 > 0) {                                 /* pad rows: zero (data of an earlier band) */
                for (int r = 0; r < nr; r++) {
                    if (r < r0 || r >= r1) {
                        memset(buf + r * RB, 0, (size_t)RB);
                    }
                }
            }
            for (int oc = c * mult; oc < (c + 1) * mult; oc++) {
                const int8_t *w = g->w + 9 * oc;
                int8_t *yo = g->y + (oc * OH + oy0) * OW;
                for (int ky = 0; ky < 3; ky++) {
                    int32_t w0 = w[3 * ky], w1 = w[3 * ky + 1], w2 = w[3 * ky + 2];
                    k.w[2 * ky] = ((uint32_t)w0 & 0xFFFFu) | ((uint32_t)w2 << 16);
                    k.w[2 * ky + 1] = (uint32_t)w1 & 0xFFFFu;
                }
                k.bias = g->b[oc];
                int bq0 = 0;
                if (nbf > 0 && rq_smmla(g->m[oc], g->sh[oc], &k.M, &k.A, &k.S)) {
                    k.y = yo;
                    k.yend = yo + nrows * OW;
                    dw_run(&k, s);
                    bq0 = nbf;
                }
                if (bq0 < nb) {                            /* partial blocks, the 64-bit rq */
                    conv_rq(g, &q, oc);
                    for (int oy = 0; oy < nrows; oy++) {
                        const int8_t *r0 = buf + oy * s * RB;
                        for (int bq = bq0; bq < nb; bq++) {
                            int32_t acc[4];
                            int off = 4 * s * bq, n = OW - 4 * bq < 4 ? OW - 4 * bq : 4;
                            dw_block(r0 + off, r0 + RB + off, r0 + 2 * RB + off, s, k.w, k.bias, acc);
                            rq_store4(yo + oy * OW + 4 * bq, n, acc[0], acc[1], acc[2], acc[3], &q);
                        }
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ conv_fwd: depthwise 5x5, 7x7 */

/* The same band of padded rows as the 3x3 path (dw_row_bytes), four outputs of a row at a time,
 * the K kernel rows in a loop. A kernel row's taps go by int16 pairs Wab = (w_a, w_b) (a in the
 * low half) against the pairs SXTB16 gives of the aligned words at 0, 4, 8 (and 12) bytes of the
 * block: E_k = (x_k, x_k+2), O_k = (x_k+1, x_k+3). A sum takes SMLAD of a pair of pairs, or
 * SMLAxB/SMLAxT of a single tap (one half of each): K = 5 with W02, W13, W24 (14 multiplies for
 * the 20 MACs of a block's row at either stride), K = 7 with W02, W13, W46, W35, W24 (18 for 28).
 * Each kernel row's words end with the step of the input pointer to the next row (RB; from the
 * last row, back to the next block's first row: 4s - (K-1)*RB, the only one <= 0: the row loop's
 * end). Partial blocks (the last of a row where OW is not a multiple of 4) go through the same
 * loop, into a scratch word a row (the weight row buffer). */
#define DWK_ROWW(K) ((K) == 5 ? 4 : 6)  /* words of a kernel row */
#define DWK_W (7 * 6)                   /* the kernel rows' words, at the end of w[] */

/* One channel over a band of output rows, blocks of 4 outputs, for the assembly (offsets from
 * bias, for 32-bit pointers). */
typedef struct {
    uint32_t w[DWK_W];           /* -4*DWK_W: the kernel's rows end here (the assembly walks them) */
    int32_t bias[4];             /* 0: each sum's start */
    int32_t M, A, S;             /* 16, 20, 24 */
    uint32_t lo4, hi4;           /* 28, 32 */
    int8_t *y, *rowend;          /* 36, 40: the next output, the end of its row's blocks */
    int32_t row_y;               /* 44: output bytes of a row's blocks (4 a block) */
    int32_t adv_p, adv_y;        /* 48, 52: from a row's end to the next row's start */
    int8_t *yend;                /* 56: y after the band's last row */
    const int8_t *p;             /* 60: the first block's input in the band's first row */
} dwk_t;

/* The four sums of the block of outputs whose taps start at p (the band's row of kernel row 0):
 * the assembly's sums, in C (the host's twin; the 64-bit requantization on the device). */
static void dwk_block(const int8_t *p, int K, int s, const uint32_t *w, int32_t bias, int32_t *acc) {
    int32_t a0 = bias, a1 = bias, a2 = bias, a3 = bias;
    int rw = DWK_ROWW(K);
    for (int ky = 0; ky < K; ky++, p += (int32_t)w[rw - 1], w += rw) {
        uint32_t u0 = read_u32(p), u4 = read_u32(p + 4);
        uint32_t E0 = sxtb16(u0), O0 = sxtb16_ror8(u0), E4 = sxtb16(u4), O4 = sxtb16_ror8(u4);
        uint32_t W02 = w[0], W13 = w[1];
        if (K == 5) {
            uint32_t W24 = w[2];
            if (s == 1) {
                a0 = smlabt(E4, W24, smlad(O0, W13, smlad(E0, W02, a0)));
                a1 = smlabt(O4, W24, smlabt(E4, W13, smlatb(E0, W13, smlad(O0, W02, a1))));
                a2 = smlabt(O4, W13, smlatb(O0, W13, smlad(E4, W24, smlatb(E0, W02, a2))));
                a3 = smlad(E4, W13, smlad(O4, W24, smlatb(O0, W02, a3)));
            } else {
                uint32_t u8 = read_u32(p + 8), E8 = sxtb16(u8), O8 = sxtb16_ror8(u8);
                a0 = smlabt(E4, W24, smlad(O0, W13, smlad(E0, W02, a0)));
                a1 = smlabt(O4, W13, smlad(E4, W24, smlatb(O0, W13, smlatb(E0, W02, a1))));
                a2 = smlabt(E8, W24, smlad(O4, W13, smlad(E4, W02, a2)));
                a3 = smlabt(O8, W13, smlad(E8, W24, smlatb(O4, W13, smlatb(E4, W02, a3))));
            }
        } else {
            uint32_t W46 = w[2], W35 = w[3], W24 = w[4];
            uint32_t u8 = read_u32(p + 8), E8 = sxtb16(u8), O8 = sxtb16_ror8(u8);
            if (s == 1) {
                a0 = smlabt(O4, W35, smlad(E4, W46, smlad(O0, W13, smlad(E0, W02, a0))));
                a1 = smlad(E4, W35, smlatb(E0, W13, smlad(O4, W46, smlad(O0, W02, a1))));
                a2 = smlad(O4, W35, smlatb(O0, W13, smlabt(E8, W46, smlad(E4, W24, smlatb(E0, W02, a2)))));
                a3 = smlabt(E8, W35, smlad(E4, W13, smlabt(O8, W46, smlad(O4, W24, smlatb(O0, W02, a3)))));
            } else {
                uint32_t E12 = sxtb16(read_u32(p + 12));
                a0 = smlabt(O4, W35, smlad(E4, W46, smlad(O0, W13, smlad(E0, W02, a0))));
                a1 = smlad(O4, W35, smlatb(O0, W13, smlabt(E8, W46, smlad(E4, W24, smlatb(E0, W02, a1)))));
                a2 = smlabt(O8, W35, smlad(E8, W46, smlad(O4, W13, smlad(E4, W02, a2))));
                a3 = smlad(O8, W35, smlatb(O4, W13, smlabt(E12, W46, smlad(E8, W24, smlatb(E4, W02, a3)))));
            }
        }
    }
    acc[0] = a0;
    acc[1] = a1;
    acc[2] = a2;
    acc[3] = a3;
}

#if defined(__ARM_FEATURE_DSP)
typedef char dwk_t_is_32bit[sizeof(dwk_t) == 4 * DWK_W + 64 ? 1 : -1];

/* r0-r3 the sums, r4 the input (a block's row), r5/r6 unpacked input pairs (E, O), r7-r11 the
 * row's weight pairs, lr its step, r12 the kernel rows, then the context (at bias) after them. */
#define DWK_HEAD(WB)                                   \
    "ldr r4, [r12, #60]\n\t"                           \
    "ldr r8, [r12, #36]\n\t"                           \
    "ldr r9, [r12, #44]\n\t"                           \
    "add r9, r8, r9\n\t"                               \
    "str r9, [r12, #40]\n\t"                           \
    "1:\n\t"                                           \
    "ldm r12, {r0, r1, r2, r3}\n\t"                    \
    "sub r12, r12, #" WB "\n\t"                        \
    "2:\n\t"
#define DWK_LOAD(OFF)                                  \
    "ldr r5, [r4, #" OFF "]\n\t"                       \
    "sxtb16 r6, r5, ror #8\n\t"                        \
    "sxtb16 r5, r5\n\t"
#define DWK_NEXT                                       \
    "add r4, r4, lr\n\t"                               \
    "cmp lr, #0\n\t"                                   \
    "bgt 2b\n\t"
/* K = 5 (r7 W02, r8 W13, r9 W24), stride 1: output j reads x_j .. x_j+4 */
#define DWK5_S1                                        \
    "ldm r12!, {r7, r8, r9, lr}\n\t"                   \
    DWK_LOAD("4")                                      \
    "smlabt r0, r5, r9, r0\n\t"                        \
    "smlabt r1, r5, r8, r1\n\t"                        \
    "smlabt r1, r6, r9, r1\n\t"                        \
    "smlad r2, r5, r9, r2\n\t"                         \
    "smlabt r2, r6, r8, r2\n\t"                        \
    "smlad r3, r6, r9, r3\n\t"                         \
    "smlad r3, r5, r8, r3\n\t"                         \
    DWK_LOAD("0")                                      \
    "smlad r0, r5, r7, r0\n\t"                         \
    "smlad r0, r6, r8, r0\n\t"                         \
    "smlad r1, r6, r7, r1\n\t"                         \
    "smlatb r1, r5, r8, r1\n\t"                        \
    "smlatb r2, r5, r7, r2\n\t"                        \
    "smlatb r2, r6, r8, r2\n\t"                        \
    "smlatb r3, r6, r7, r3\n\t"                        \
    DWK_NEXT
/* K = 5, stride 2: output j reads x_2j .. x_2j+4 */
#define DWK5_S2                                        \
    "ldm r12!, {r7, r8, r9, lr}\n\t"                   \
    DWK_LOAD("8")                                      \
    "smlabt r2, r5, r9, r2\n\t"                        \
    "smlad r3, r5, r9, r3\n\t"                         \
    "smlabt r3, r6, r8, r3\n\t"                        \
    DWK_LOAD("4")                                      \
    "smlabt r0, r5, r9, r0\n\t"                        \
    "smlad r1, r5, r9, r1\n\t"                         \
    "smlabt r1, r6, r8, r1\n\t"                        \
    "smlad r2, r5, r7, r2\n\t"                         \
    "smlad r2, r6, r8, r2\n\t"                         \
    "smlatb r3, r5, r7, r3\n\t"                        \
    "smlatb r3, r6, r8, r3\n\t"                        \
    DWK_LOAD("0")                                      \
    "smlad r0, r5, r7, r0\n\t"                         \
    "smlad r0, r6, r8, r0\n\t"                         \
    "smlatb r1, r5, r7, r1\n\t"                        \
    "smlatb r1, r6, r8, r1\n\t"                        \
    DWK_NEXT
/* K = 7 (r7 W02, r8 W13, r9 W46, r10 W35, r11 W24), stride 1 */
#define DWK7_S1                                        \
    "ldm r12!, {r7, r8, r9, r10, r11, lr}\n\t"         \
    DWK_LOAD("8")                                      \
    "smlabt r2, r5, r9, r2\n\t"                        \
    "smlabt r3, r6, r9, r3\n\t"                        \
    "smlabt r3, r5, r10, r3\n\t"                       \
    DWK_LOAD("4")                                      \
    "smlad r0, r5, r9, r0\n\t"                         \
    "smlabt r0, r6, r10, r0\n\t"                       \
    "smlad r1, r6, r9, r1\n\t"                         \
    "smlad r1, r5, r10, r1\n\t"                        \
    "smlad r2, r5, r11, r2\n\t"                        \
    "smlad r2, r6, r10, r2\n\t"                        \
    "smlad r3, r6, r11, r3\n\t"                        \
    "smlad r3, r5, r8, r3\n\t"                         \
    DWK_LOAD("0")                                      \
    "smlad r0, r5, r7, r0\n\t"                         \
    "smlad r0, r6, r8, r0\n\t"                         \
    "smlad r1, r6, r7, r1\n\t"                         \
    "smlatb r1, r5, r8, r1\n\t"                        \
    "smlatb r2, r5, r7, r2\n\t"                        \
    "smlatb r2, r6, r8, r2\n\t"                        \
    "smlatb r3, r6, r7, r3\n\t"                        \
    DWK_NEXT
/* K = 7, stride 2 */
#define DWK7_S2                                        \
    "ldm r12!, {r7, r8, r9, r10, r11, lr}\n\t"         \
    "ldr r5, [r4, #12]\n\t"                            \
    "sxtb16 r5, r5\n\t"                                \
    "smlabt r3, r5, r9, r3\n\t"                        \
    DWK_LOAD("8")                                      \
    "smlabt r1, r5, r9, r1\n\t"                        \
    "smlad r2, r5, r9, r2\n\t"                         \
    "smlabt r2, r6, r10, r2\n\t"                       \
    "smlad r3, r5, r11, r3\n\t"                        \
    "smlad r3, r6, r10, r3\n\t"                        \
    DWK_LOAD("4")                                      \
    "smlad r0, r5, r9, r0\n\t"                         \
    "smlabt r0, r6, r10, r0\n\t"                       \
    "smlad r1, r5, r11, r1\n\t"                        \
    "smlad r1, r6, r10, r1\n\t"                        \
    "smlad r2, r5, r7, r2\n\t"                         \
    "smlad r2, r6, r8, r2\n\t"                         \
    "smlatb r3, r5, r7, r3\n\t"                        \
    "smlatb r3, r6, r8, r3\n\t"                        \
    DWK_LOAD("0")                                      \
    "smlad r0, r5, r7, r0\n\t"                         \
    "smlad r0, r6, r8, r0\n\t"                         \
    "smlatb r1, r5, r7, r1\n\t"                        \
    "smlatb r1, r6, r8, r1\n\t"                        \
    DWK_NEXT
/* requantize (M r5, A r6, S r7), clamp (lo4 r5, hi4 r6), store; the next block, row, band */
#define DWK_TAIL                                       \
    "ldrd r5, r6, [r12, #16]\n\t"                      \
    "ldr r7, [r12, #24]\n\t"                           \
    RQ_SN("r5", "r6", "r7")                            \
    "ldrd r5, r6, [r12, #28]\n\t"                      \
    RQ_PACK("r5", "r6")                                \
    "ldrd r8, r9, [r12, #36]\n\t"                      \
    "str r0, [r8], #4\n\t"                             \
    "str r8, [r12, #36]\n\t"                           \
    "cmp r8, r9\n\t"                                   \
    "bne 1b\n\t"                                       \
    "ldrd r5, r6, [r12, #48]\n\t"                      \
    "add r4, r4, r5\n\t"                               \
    "add r8, r8, r6\n\t"                               \
    "ldr r7, [r12, #44]\n\t"                           \
    "add r9, r8, r7\n\t"                               \
    "strd r8, r9, [r12, #36]\n\t"                      \
    "ldr r7, [r12, #56]\n\t"                           \
    "cmp r8, r7\n\t"                                   \
    "bne 1b\n\t"
#define DWK_FN(name, body, WB)                                                               \
    static void __attribute__((noinline)) name(dwk_t *k) {                                   \
        register int32_t *r12 __asm__("r12") = k->bias;                                      \
        __asm__ volatile(DWK_HEAD(WB) body DWK_TAIL                                          \
                         : "+r"(r12) :                                                       \
                         : "r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9", "r10", \
                           "r11", "lr", "cc", "memory");                                     \
    }
DWK_FN(dwk5_s1, DWK5_S1, "80")
DWK_FN(dwk5_s2, DWK5_S2, "80")
DWK_FN(dwk7_s1, DWK7_S1, "168")
DWK_FN(dwk7_s2, DWK7_S2, "168")
#endif

/* The blocks of a band's rows (k->y != k->yend, row_y > 0; the SMMLA form). */
static void dwk_run(dwk_t *k, int K, int s) {
#if defined(__ARM_FEATURE_DSP)
    (K == 5 ? (s == 1 ? dwk5_s1 : dwk5_s2) : (s == 1 ? dwk7_s1 : dwk7_s2))(k);
#else
    const int8_t *p = k->p;
    const uint32_t *w = k->w + DWK_W - K * DWK_ROWW(K);
    for (int8_t *y = k->y; y != k->yend; y += k->adv_y, p += k->adv_p) {
        for (int8_t *e = y + k->row_y; y != e; y += 4, p += 4 * s) {
            int32_t acc[4];
            dwk_block(p, K, s, w, k->bias[0], acc);
            write_u32(y, rq_pack4(acc[0], acc[1], acc[2], acc[3], k->M, k->A, k->S, k->lo4, k->hi4));
        }
    }
#endif
}

static void __attribute__((noinline)) conv_dwk(const conv_t *g) {
    int H = g->H, W = g->W, HW = H * W, OH = g->OH, OW = g->OW, s = g->s, px = g->px, K = g->K;
    int nb = (OW + 3) / 4, nbf = OW / 4, ntail = OW - 4 * nbf;   /* blocks a row, full ones */
    int RB = dw_row_bytes(g), band = dw_band_rows(g), rw = DWK_ROWW(K);
    int8_t *buf = (int8_t *)tte_fwd_strip + ((4 - (px & 3)) & 3);
    int ncopy = W < RB - px ? W : RB - px;
    int mult = g->Og;
    uint32_t *tail = tte_fwd_wrow;                        /* a partial block's word, a row */
    rq_t q;
    dwk_t k;
    uint32_t *wk = k.w + DWK_W - K * rw;
    rq_prep(&q, 0, 17, g->lo, g->hi);
    k.lo4 = q.lo4;
    k.hi4 = q.hi4;
    for (int ky = 0; ky < K; ky++) {                      /* the input's steps between kernel rows */
        wk[ky * rw + rw - 1] = (uint32_t)(ky < K - 1 ? RB : 4 * s - (K - 1) * RB);
    }
    memset(tte_fwd_strip, 0, 4 * STRIP_WORDS);
    for (int oy0 = 0; oy0 < OH; oy0 += band) {
        int nrows = OH - oy0 < band ? OH - oy0 : band;
        int nr = (nrows - 1) * s + K, iy0 = oy0 * s - g->pad;
        for (int c = 0; c < g->C; c++) {
            const int8_t *xc = g->x + c * HW;
            int r0 = iy0 < 0 ? -iy0 : 0, r1 = H - iy0 < nr ? H - iy0 : nr;   /* rows inside the map */
            if (r1 < r0) {
                r1 = r0;
            }
            if (ncopy > 0 && r1 > r0) {
                copy_rows(buf + r0 * RB + px, RB, xc + (iy0 + r0) * W, W, r1 - r0, ncopy);
            }
            if (oy0 > 0) {                                 /* pad rows: zero (data of an earlier band) */
                for (int r = 0; r < nr; r++) {
                    if (r < r0 || r >= r1) {
                        memset(buf + r * RB, 0, (size_t)RB);
                    }
                }
            }
            for (int oc = c * mult; oc < (c + 1) * mult; oc++) {
                const int8_t *w = g->w + K * K * oc;
                int8_t *yo = g->y + (oc * OH + oy0) * OW;
                for (int ky = 0; ky < K; ky++) {         /* the pairs from words of the row's taps */
                    const int8_t *wr = w + K * ky;
                    uint32_t *d = wk + ky * rw, u0 = read_u32(wr);
                    d[0] = sxtb16(u0);                             /* (w0, w2) */
                    d[1] = sxtb16_ror8(u0);                        /* (w1, w3) */
                    if (K == 5) {
                        d[2] = sxtb16_ror8(read_u32(wr + 1));      /* (w2, w4) */
                    } else {
                        uint32_t u2 = read_u32(wr + 2);
                        d[2] = sxtb16_ror8(read_u32(wr + 3));      /* (w4, w6) */
                        d[3] = sxtb16_ror8(u2);                    /* (w3, w5) */
                        d[4] = sxtb16(u2);                         /* (w2, w4) */
                    }
                }
                int32_t bias = g->b[oc];
                k.bias[0] = k.bias[1] = k.bias[2] = k.bias[3] = bias;
                if (rq_smmla(g->m[oc], g->sh[oc], &k.M, &k.A, &k.S)) {
                    if (nbf > 0) {
                        k.p = buf;
                        k.y = yo;
                        k.yend = yo + nrows * OW;
                        k.row_y = 4 * nbf;
                        k.adv_p = s * RB - 4 * s * nbf;
                        k.adv_y = OW - 4 * nbf;
                        dwk_run(&k, K, s);
                    }
                    /* the partial blocks: a column of them, into a word a row, WROW_WORDS rows a time */
                    for (int oy = 0; ntail && oy < nrows; oy += WROW_WORDS) {
                        int n = nrows - oy < WROW_WORDS ? nrows - oy : WROW_WORDS;
                        k.p = buf + oy * s * RB + 4 * s * nbf;
                        k.y = (int8_t *)tail;
                        k.yend = (int8_t *)(tail + n);
                        k.row_y = 4;
                        k.adv_p = s * RB - 4 * s;
                        k.adv_y = 0;
                        dwk_run(&k, K, s);
                        int8_t *yt = yo + oy * OW + 4 * nbf;
                        for (int i = 0; i < n; i++, yt += OW) {
                            uint32_t v = tail[i];
                            for (int j = 0; j < ntail; j++, v >>= 8) {
                                yt[j] = (int8_t)v;
                            }
                        }
                    }
                } else {                                   /* the 64-bit rq */
                    conv_rq(g, &q, oc);
                    for (int oy = 0; oy < nrows; oy++) {
                        const int8_t *pr = buf + oy * s * RB;
                        for (int bq = 0; bq < nb; bq++) {
                            int32_t acc[4];
                            int n = OW - 4 * bq < 4 ? OW - 4 * bq : 4;
                            dwk_block(pr + 4 * s * bq, K, s, wk, bias, acc);
                            rq_store4(yo + oy * OW + 4 * bq, n, acc[0], acc[1], acc[2], acc[3], &q);
                        }
                    }
                }
            }
        }
    }
}

/* ------------------------------------------------------------------ conv_fwd */

void op_conv_fwd(uint8_t *A, const int32_t *P, int o) {
    conv_t g;
    conv_decode(&g, A, P, o);
    if (g.O <= 0 || g.OH <= 0 || g.OW <= 0) {
        return;
    }
    int whole = g.pad == 0 && g.px == 0 && g.OH == g.H && g.OW == g.W;
    if (g.K == 1 && g.s == 1 && whole && g.H * g.W == 1) {
        conv_dense(&g);
    } else if (g.K == 3 && g.G == g.C && (g.s == 1 || g.s == 2) && dw_band_rows(&g) > 0) {
        conv_dw3(&g);
    } else if ((g.K == 5 || g.K == 7) && g.G == g.C && (g.s == 1 || g.s == 2) && dw_band_rows(&g) > 0) {
        conv_dwk(&g);
    } else if (g.R <= ENGINE_MAX_R) {
        conv_engine(&g, g.K == 1 && g.s == 1 && whole);
    } else {
        conv_plain(&g);
    }
}

/* ------------------------------------------------------------------ add_fwd, grad_add */

/* floor((v + 2**(sh-1)) / 2**sh) for |v| < 2**31 and 1 <= sh <= 62, without overflow. */
static inline int32_t shift_round32(int32_t v, int32_t sh) {
    if (sh >= 32) {                      /* |v| < 2**31 <= 2**(sh-1): always 0 */
        return 0;
    }
    int32_t u = v >> (sh - 1);
    return (u >> 1) + (u & 1);
}

void op_add_fwd(uint8_t *A, const int32_t *P, int o) {
    const int8_t *a = AT(const int8_t, ADD_FWD_A_OFF), *b = AT(const int8_t, ADD_FWD_B_OFF);
    int8_t *y = AT(int8_t, ADD_FWD_Y_OFF);
    int n = P[o + ADD_FWD_N], sh = P[o + ADD_FWD_SH], lo = P[o + ADD_FWD_LO], hi = P[o + ADD_FWD_HI];
    uint32_t ma = (uint32_t)P[o + ADD_FWD_MA], mb = (uint32_t)P[o + ADD_FWD_MB];
    if (sh >= 32) {                      /* |a*ma + b*mb| < 2**24: every result rounds to 0 */
        int32_t r = 0 < lo ? lo : 0 > hi ? hi : 0;
        memset(y, (uint8_t)r, (size_t)(n > 0 ? n : 0));
        return;
    }
    /* v + 2**(sh-1) fits int32 (|v| < 2**24, sh <= 31) */
    uint32_t mm = (ma & 0xFFFFu) | (mb << 16);
    int32_t half = (int32_t)(1u << (sh - 1));
    uint32_t lo4 = (uint32_t)(uint8_t)lo * 0x01010101u, hi4 = (uint32_t)(uint8_t)hi * 0x01010101u;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        uint32_t ua = read_u32(a + i), ub = read_u32(b + i);
        uint32_t ea = sxtb16(ua), oa = sxtb16_ror8(ua), eb = sxtb16(ub), ob = sxtb16_ror8(ub);
        int32_t v0 = smlad(pkhbt16(ea, eb), mm, half) >> sh;
        int32_t v1 = smlad(pkhbt16(oa, ob), mm, half) >> sh;
        int32_t v2 = smlad(pkhtb16(eb, ea), mm, half) >> sh;
        int32_t v3 = smlad(pkhtb16(ob, oa), mm, half) >> sh;
        write_u32(y + i, clamp4(pack4_sat8(v0, v1, v2, v3), lo4, hi4));
    }
    for (; i < n; i++) {
        int32_t r = (a[i] * (int32_t)ma + b[i] * (int32_t)mb + half) >> sh;
        y[i] = (int8_t)(r < lo ? lo : r > hi ? hi : r);
    }
}

void op_grad_add(uint8_t *A, const int32_t *P, int o) {
    const int16_t *a = AT(const int16_t, GRAD_ADD_A_OFF), *b = AT(const int16_t, GRAD_ADD_B_OFF);
    int16_t *y = AT(int16_t, GRAD_ADD_Y_OFF);
    int n = P[o + GRAD_ADD_N], sh = P[o + GRAD_ADD_SH];
    int32_t ma = P[o + GRAD_ADD_MA], mb = P[o + GRAD_ADD_MB];
    if (sh >= 32) {                      /* |a*ma + b*mb| < 2**31: every result rounds to 0 */
        memset(y, 0, (size_t)(n > 0 ? 2 * n : 0));
        return;
    }
    uint32_t mm = ((uint32_t)ma & 0xFFFFu) | ((uint32_t)mb << 16);
    int i = 0;
    for (; i + 2 <= n; i += 2) {
        uint32_t ua = read_u32(a + i), ub = read_u32(b + i);
        /* a*ma + b*mb in int32: |.| <= 2 * 2**15 * (2**15 - 1) < 2**31 */
        int32_t v0 = smlad(pkhbt16(ua, ub), mm, 0);
        int32_t v1 = smlad(pkhtb16(ub, ua), mm, 0);
        int32_t r0 = ssat16(shift_round32(v0, sh)), r1 = ssat16(shift_round32(v1, sh));
        write_u32(y + i, pkhbt16((uint32_t)r0, (uint32_t)r1));
    }
    for (; i < n; i++) {
        y[i] = (int16_t)ssat16(shift_round32(a[i] * ma + b[i] * mb, sh));
    }
}

/* ------------------------------------------------------------------ gap_fwd, gap_bwd */

/* The sum of n int8 (the golden model keeps it inside int32). */
static int32_t sum8(const int8_t *x, int n) {
    int32_t acc = 0;
    int i = 0;
#if defined(__ARM_FEATURE_DSP)
    uint32_t u = 0;
    for (; i + 4 <= n; i += 4) {         /* USADA8 sums the bytes x + 128 */
        uint32_t w = read_u32(x + i) ^ 0x80808080u;
        __asm__("usada8 %0, %1, %2, %0" : "+r"(u) : "r"(w), "r"(0));
    }
    acc = (int32_t)(u - 128u * (uint32_t)i);
#endif
    for (; i < n; i++) {
        acc += x[i];
    }
    return acc;
}

void op_gap_fwd(uint8_t *A, const int32_t *P, int o) {
    const int8_t *x = AT(const int8_t, GAP_FWD_X_OFF);
    int8_t *y = AT(int8_t, GAP_FWD_Y_OFF);
    int C = P[o + GAP_FWD_C], HW = P[o + GAP_FWD_HW], m = P[o + GAP_FWD_M], sh = P[o + GAP_FWD_SH];
    rq_t q;
    rq_prep(&q, m, sh, -128, 127);
    for (int c = 0; c < C; c++) {
        y[c] = (int8_t)rq1(&q, sum8(x + c * HW, HW));
    }
}

/* sat16(rq(v, m, sh)) for |v| <= 2**15: v*m + 2**(sh-1) fits int32 for sh <= 31 (|v*m| < 2**30),
 * and the result is 0 for sh >= 32. */
static inline int32_t rq16(int32_t v, int32_t m, int32_t sh) {
    if (sh >= 32) {
        return 0;
    }
    return ssat16((v * m + (int32_t)(1u << (sh - 1))) >> sh);
}

void op_gap_bwd(uint8_t *A, const int32_t *P, int o) {
    const int16_t *gy = AT(const int16_t, GAP_BWD_GY_OFF);
    int16_t *gx = AT(int16_t, GAP_BWD_GX_OFF);
    int C = P[o + GAP_BWD_C], HW = P[o + GAP_BWD_HW], m = P[o + GAP_BWD_M], sh = P[o + GAP_BWD_SH];
    for (int c = 0; c < C; c++) {
        int16_t v = (int16_t)rq16(gy[c], m, sh);
        int16_t *d = gx + c * HW;
        int i = 0;
        if (((uintptr_t)d & 2) && i < HW) {
            d[i++] = v;
        }
        uint32_t vv = (uint32_t)(uint16_t)v * 0x10001u;
        for (; i + 2 <= HW; i += 2) {
            write_u32(d + i, vv);
        }
        if (i < HW) {
            d[i] = v;
        }
    }
}

/* ------------------------------------------------------------------ grad_scale_ch */

/* d[i] = sat16((d[i]*m + half) >> sh) for n int16 (sh <= 31: d*m + half fits int32). */
static void __attribute__((noinline)) scale16(int16_t *d, int n, int32_t m, int32_t half, int32_t sh) {
    int i = 0;
    if (((uintptr_t)d & 2) && n > 0) {
        d[0] = (int16_t)ssat16((d[0] * m + half) >> sh);
        i = 1;
    }
#if defined(__ARM_FEATURE_DSP)
    int n8 = (n - i) & ~7;
    if (n8 > 0) {                        /* 8 a time, the word-aligned middle: LDM/STM */
        int16_t *p = d + i, *e = d + i + n8;
        __asm__ volatile(
#define SCALE_WORD(R)                                    \
            "smlabb r8, " R ", %[m], %[half]\n\t"        \
            "smlatb r9, " R ", %[m], %[half]\n\t"        \
            "asr r8, r8, %[sh]\n\t"                      \
            "asr r9, r9, %[sh]\n\t"                      \
            "ssat r8, #16, r8\n\t"                       \
            "ssat r9, #16, r9\n\t"                       \
            "pkhbt " R ", r8, r9, lsl #16\n\t"
            "1:\n\t"
            "ldmia %[p], {r4, r5, r6, r7}\n\t"
            SCALE_WORD("r4") SCALE_WORD("r5") SCALE_WORD("r6") SCALE_WORD("r7")
            "stmia %[p]!, {r4, r5, r6, r7}\n\t"
            "cmp %[p], %[e]\n\t"
            "bne 1b"
#undef SCALE_WORD
            : [p] "+r"(p) : [e] "r"(e), [m] "r"(m), [half] "r"(half), [sh] "r"(sh)
            : "r4", "r5", "r6", "r7", "r8", "r9", "cc", "memory");
        i += n8;
    }
#endif
    for (; i + 2 <= n; i += 2) {
        uint32_t u = read_u32(d + i);
        int32_t r0 = ssat16(smlabb(u, (uint32_t)m, half) >> sh);
        int32_t r1 = ssat16(smlatb(u, (uint32_t)m, half) >> sh);
        write_u32(d + i, pkhbt16((uint32_t)r0, (uint32_t)r1));
    }
    if (i < n) {
        d[i] = (int16_t)ssat16((d[i] * m + half) >> sh);
    }
}

void op_grad_scale_ch(uint8_t *A, const int32_t *P, int o) {
    int16_t *g = AT(int16_t, GRAD_SCALE_CH_G_OFF);
    int C = P[o + GRAD_SCALE_CH_C], HW = P[o + GRAD_SCALE_CH_HW];
    const int32_t *ms = AT(const int32_t, GRAD_SCALE_CH_M_OFF), *shs = AT(const int32_t, GRAD_SCALE_CH_SH_OFF);
    for (int c = 0; c < C; c++) {
        int16_t *d = g + c * HW;
        int32_t m = ms[c], sh = shs[c];
        if (sh >= 32) {                  /* |g*m| < 2**30 < 2**(sh-1): every result is 0 */
            memset(d, 0, (size_t)(2 * HW));
        } else {                         /* g*m + 2**(sh-1) fits int32 */
            scale16(d, HW, m, (int32_t)(1u << (sh - 1)), sh);
        }
    }
}

/* ------------------------------------------------------------------ loss_grad */

void op_loss_grad(uint8_t *A, const int32_t *P, int o) {
    const int8_t *z = AT(const int8_t, LOSS_GRAD_Z_OFF);
    int16_t *g = AT(int16_t, LOSS_GRAD_G_OFF);
    const int32_t *E = AT(const int32_t, LOSS_GRAD_EXP_OFF);
    int32_t *io = AT(int32_t, LOSS_GRAD_IO_OFF);
    int n = P[o + LOSS_GRAD_N];
    int32_t label = io[IO_LABEL], one = 1 << LOSS_GRAD_FRAC;
    if (n <= 0) {
        return;
    }
    int best = 0, zmax = z[0];
    for (int k = 1; k < n; k++) {
        if (z[k] > zmax) {
            zmax = z[k];
            best = k;
        }
    }
    uint32_t tot = 0;
    for (int k = 0; k < n; k++) {
        tot += (uint32_t)E[zmax - z[k]];
    }
    if (tot == 0) {                      /* the golden model refuses such a table */
        return;
    }
    /* e * 2**14 + tot / 2 < 2**31 (the golden model's domain): unsigned 32-bit division */
    for (int k = 0; k < n; k++) {
        int32_t qk = (int32_t)(((uint32_t)E[zmax - z[k]] * (uint32_t)one + tot / 2) / tot);
        if (k == label) {
            io[IO_P_LABEL] = qk;
            qk -= one;
        }
        g[k] = (int16_t)qk;
    }
    io[IO_PREDICTED] = best;
    io[IO_STEP] = (int32_t)((uint32_t)io[IO_STEP] + 1u);
}

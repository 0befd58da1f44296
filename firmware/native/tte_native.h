/* The training program's kernels in C (one function per opcode of insitu.sparse.abi), for the
 * Cortex-M7 as a MicroPython native module (tte_native.c) and for the host (a shared library the
 * tests run against the golden model, insitu.sparse.golden). Plain C99 on stdint types: nothing
 * here knows MicroPython.
 *
 * Every kernel is op_NAME(A, P, o): A the arena, P the parameter table read as int32 words, P[o]
 * the opcode and P[o + NAME_FIELD] its fields (tte_abi.h, generated from the ABI). Tensors in the
 * arena are aligned to their element size (the compiler's plan), so typed pointers are safe;
 * int8 data read four at a time goes through read_u32 (the M7 allows unaligned LDR).
 *
 * Numerics (host/insitu/numerics.py, restated by insitu.sparse.abi): rq(v, m, sh) =
 * floor((v*m + 2**(sh-1)) / 2**sh) with 0 <= m < 2**15, 1 <= sh <= 62, then saturation. Sums of
 * products are 32-bit words: the golden model refuses calls whose sums leave int32, so partial
 * sums that wrap (built with -fwrapv) still end exact.
 */
#ifndef TTE_NATIVE_H
#define TTE_NATIVE_H

#include <stdint.h>
#include <string.h>

#include "tte_abi.h"

#define TTE_OPS(X) \
    X(conv_fwd) X(add_fwd) X(gap_fwd) X(loss_grad) X(argmax) X(act_bwd) X(grad_scale_ch) \
    X(conv_bwd_x) X(conv_grad_w) X(conv_upd_w) X(apply_w) X(bias_grad) X(bias_upd) X(apply_b) \
    X(gap_bwd) X(grad_add) X(acc_i32) X(zero) X(patch) X(window) X(act_mask) X(mask_bwd)

#define TTE_DECLARE(name) void op_##name(uint8_t *A, const int32_t *P, int o);
TTE_OPS(TTE_DECLARE)
#undef TTE_DECLARE

/* A typed view of the arena at the byte offset held in field F of the call at P[o]. */
#define AT(type, F) ((type *)(A + P[o + (F)]))

/* rq(v, m, sh) exactly, in 64 bits (|v*m| < 2**46). */
static inline int64_t rq(int32_t v, int32_t m, int32_t sh) {
    return ((int64_t)v * m + ((int64_t)1 << (sh - 1))) >> sh;
}

static inline int32_t clamp64(int64_t r, int32_t lo, int32_t hi) {
    return r < lo ? lo : r > hi ? hi : (int32_t)r;
}

static inline int32_t sat8(int64_t r) { return clamp64(r, -128, 127); }
static inline int32_t sat16(int64_t r) { return clamp64(r, -32768, 32767); }
static inline int32_t sat32(int64_t r) { return clamp64(r, INT32_MIN, INT32_MAX); }

/* rnd of element e of a weight update keyed by key = step*SR_K_STEP + salt*SR_K_SALT
 * (insitu.numerics.sr_noise): the top SR_BITS bits of the hash, in [0, 2**SR_BITS). */
static inline int32_t sr_noise(uint32_t key, uint32_t e) {
    uint32_t x = key + e;
    x ^= x >> 16;
    x *= SR_M1;
    x ^= x >> 15;
    x *= SR_M2;
    x ^= x >> 16;
    return (int32_t)(x >> (32 - SR_BITS));
}

static inline uint32_t sr_key(int32_t step, int32_t salt) {
    return (uint32_t)step * SR_K_STEP + (uint32_t)salt * SR_K_SALT;
}

static inline uint32_t read_u32(const void *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Dual 16-bit multiply-accumulate: acc + lo(x)*lo(y) + hi(x)*hi(y), the halves signed. SMLAD
 * on a core with the DSP extension (the Cortex-M7), plain C elsewhere (the host's tests). */
static inline int32_t smlad(uint32_t x, uint32_t y, int32_t acc) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("smlad %0, %1, %2, %3" : "=r"(r) : "r"(x), "r"(y), "r"(acc));
    return r;
#else
    return (int32_t)((uint32_t)acc + (uint32_t)((int32_t)(int16_t)x * (int16_t)y)
                     + (uint32_t)((int32_t)(int16_t)(x >> 16) * (int16_t)(y >> 16)));
#endif
}

/* Four int8 in a word -> two words of two int16 each: bytes 0 and 2 (SXTB16), bytes 1 and 3
 * (SXTB16 of the word rotated by 8), as CMSIS-NN widens int8 operands for SMLAD. */
static inline uint32_t sxtb16(uint32_t x) {
#if defined(__ARM_FEATURE_DSP)
    uint32_t r;
    __asm__("sxtb16 %0, %1" : "=r"(r) : "r"(x));
    return r;
#else
    return ((uint32_t)(uint16_t)(int16_t)(int8_t)x) | ((uint32_t)(uint16_t)(int16_t)(int8_t)(x >> 16) << 16);
#endif
}

static inline uint32_t sxtb16_ror8(uint32_t x) {
#if defined(__ARM_FEATURE_DSP)
    uint32_t r;
    __asm__("sxtb16 %0, %1, ror #8" : "=r"(r) : "r"(x));
    return r;
#else
    return sxtb16((x >> 8) | (x << 24));
#endif
}

/* More DSP instructions the kernels share (plain C elsewhere). */

/* (a * b + (c << 32)) >> 32: the top word of a 64-bit multiply-accumulate. */
static inline int32_t smmla(int32_t a, int32_t b, int32_t c) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("smmla %0, %1, %2, %3" : "=r"(r) : "r"(a), "r"(b), "r"(c));
    return r;
#else
    return (int32_t)(((int64_t)a * b + ((int64_t)c << 32)) >> 32);
#endif
}

/* acc + lo16(x) * lo16(y), acc + hi16(x) * lo16(y) (halves signed). */
static inline int32_t smlabb(uint32_t x, uint32_t y, int32_t acc) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("smlabb %0, %1, %2, %3" : "=r"(r) : "r"(x), "r"(y), "r"(acc));
    return r;
#else
    return (int32_t)((uint32_t)acc + (uint32_t)((int32_t)(int16_t)x * (int16_t)y));
#endif
}

static inline int32_t smlatb(uint32_t x, uint32_t y, int32_t acc) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("smlatb %0, %1, %2, %3" : "=r"(r) : "r"(x), "r"(y), "r"(acc));
    return r;
#else
    return (int32_t)((uint32_t)acc + (uint32_t)((int32_t)(int16_t)(x >> 16) * (int16_t)y));
#endif
}

/* acc + lo16(x) * hi16(y) (halves signed). */
static inline int32_t smlabt(uint32_t x, uint32_t y, int32_t acc) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("smlabt %0, %1, %2, %3" : "=r"(r) : "r"(x), "r"(y), "r"(acc));
    return r;
#else
    return (int32_t)((uint32_t)acc + (uint32_t)((int32_t)(int16_t)x * (int16_t)(y >> 16)));
#endif
}

static inline int32_t ssat8(int32_t x) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("ssat %0, #8, %1" : "=r"(r) : "r"(x));
    return r;
#else
    return x < -128 ? -128 : x > 127 ? 127 : x;
#endif
}

static inline int32_t ssat16(int32_t x) {
#if defined(__ARM_FEATURE_DSP)
    int32_t r;
    __asm__("ssat %0, #16, %1" : "=r"(r) : "r"(x));
    return r;
#else
    return x < -32768 ? -32768 : x > 32767 ? 32767 : x;
#endif
}

/* PKHBT a, b, LSL 16: the low halves of a and b; PKHTB a, b, ASR 16: the high halves of b and a. */
static inline uint32_t pkhbt16(uint32_t a, uint32_t b) {
#if defined(__ARM_FEATURE_DSP)
    uint32_t r;
    __asm__("pkhbt %0, %1, %2, lsl #16" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return (a & 0xFFFFu) | (b << 16);
#endif
}

static inline uint32_t pkhtb16(uint32_t a, uint32_t b) {
#if defined(__ARM_FEATURE_DSP)
    uint32_t r;
    __asm__("pkhtb %0, %1, %2, asr #16" : "=r"(r) : "r"(a), "r"(b));
    return r;
#else
    return (a & 0xFFFF0000u) | (b >> 16);
#endif
}

static inline void write_u32(void *p, uint32_t v) {
    memcpy(p, &v, 4);
}

/* The SMMLA form of rq(., m, sh) for sh >= 17, exactly: rq(v, m, sh) = SMMLA(v, M, A) >> S with
 * M = m << max(0, 33 - sh) (< 2**31), S = max(1, sh - 32), A = 2**(S - 1) (the top word of v*M
 * plus the rounding half, then the rest of the shift). Returns 0 where sh < 17 needs the 64-bit rq. */
static inline int rq_smmla(int32_t m, int32_t sh, int32_t *M, int32_t *A, int32_t *S) {
    if (sh < 17) {
        return 0;
    }
    *M = sh < 33 ? m << (33 - sh) : m;
    *S = sh < 33 ? 1 : sh - 32;
    *A = 1 << (*S - 1);
    return 1;
}

#endif

/* The kernels that move, mask and pick (no requantization): copies of the runtime, activation
 * masks, accumulation. Bit-exact with insitu.sparse.golden. */
#include "tte_native.h"

void op_zero(uint8_t *A, const int32_t *P, int o) {
    memset(A + P[o + ZERO_DST_OFF], 0, (size_t)P[o + ZERO_N]);
}

void op_acc_i32(uint8_t *A, const int32_t *P, int o) {
    const int32_t *src = AT(const int32_t, ACC_I32_SRC_OFF);
    int32_t *dst = AT(int32_t, ACC_I32_DST_OFF);
    for (int i = 0, n = P[o + ACC_I32_N]; i < n; i++) {
        dst[i] = sat32((int64_t)dst[i] + src[i]);
    }
}

/* In order: a repeated row index keeps its last row, as the golden model says. */
void op_patch(uint8_t *A, const int32_t *P, int o) {
    const int32_t *idx = AT(const int32_t, PATCH_IDX_OFF);
    int rb = P[o + PATCH_ROW_BYTES];
    uint8_t *src = A + P[o + PATCH_SRC_OFF], *dst = A + P[o + PATCH_DST_OFF];
    for (int j = 0, n = P[o + PATCH_N_SEL]; j < n; j++) {
        memmove(dst + idx[j] * rb, src + j * rb, (size_t)rb);
    }
}

void op_window(uint8_t *A, const int32_t *P, int o) {
    int h = P[o + WINDOW_H], w = P[o + WINDOW_W];
    int sH = P[o + WINDOW_SRC_H], sW = P[o + WINDOW_SRC_W], dH = P[o + WINDOW_DST_H], dW = P[o + WINDOW_DST_W];
    const uint8_t *src = A + P[o + WINDOW_SRC_OFF] + P[o + WINDOW_SRC_Y] * sW + P[o + WINDOW_SRC_X];
    uint8_t *dst = A + P[o + WINDOW_DST_OFF] + P[o + WINDOW_DST_Y] * dW + P[o + WINDOW_DST_X];
    for (int c = 0, C = P[o + WINDOW_C]; c < C; c++, src += sH * sW, dst += dH * dW) {
        for (int i = 0; i < h; i++) {
            memmove(dst + i * dW, src + i * sW, (size_t)w);
        }
    }
}

void op_act_bwd(uint8_t *A, const int32_t *P, int o) {
    const int8_t *y = AT(const int8_t, ACT_BWD_Y_OFF);
    int16_t *g = AT(int16_t, ACT_BWD_G_OFF);
    int lo = P[o + ACT_BWD_LO], hi = P[o + ACT_BWD_HI];
    for (int i = 0, n = P[o + ACT_BWD_N]; i < n; i++) {
        if (!(y[i] > lo && y[i] < hi)) {
            g[i] = 0;
        }
    }
}

void op_act_mask(uint8_t *A, const int32_t *P, int o) {
    const int8_t *y = AT(const int8_t, ACT_MASK_Y_OFF);
    uint8_t *m = A + P[o + ACT_MASK_M_OFF];
    int lo = P[o + ACT_MASK_LO], hi = P[o + ACT_MASK_HI], n = P[o + ACT_MASK_N];
    for (int b = 0; b < (n + 7) / 8; b++) {
        int bits = 0;
        for (int i = 0; i < 8 && 8 * b + i < n; i++) {
            int v = y[8 * b + i];
            bits |= (v > lo && v < hi) << i;
        }
        m[b] = (uint8_t)bits;
    }
}

void op_mask_bwd(uint8_t *A, const int32_t *P, int o) {
    const uint8_t *m = A + P[o + MASK_BWD_M_OFF];
    int16_t *g = AT(int16_t, MASK_BWD_G_OFF);
    for (int i = 0, n = P[o + MASK_BWD_N]; i < n; i++) {
        if (!((m[i >> 3] >> (i & 7)) & 1)) {
            g[i] = 0;
        }
    }
}

void op_argmax(uint8_t *A, const int32_t *P, int o) {
    const int8_t *z = AT(const int8_t, ARGMAX_Z_OFF);
    int best = 0;
    for (int k = 1, n = P[o + ARGMAX_N]; k < n; k++) {
        if (z[k] > z[best]) {
            best = k;
        }
    }
    AT(int32_t, ARGMAX_IO_OFF)[IO_PREDICTED] = best;
}

/* tte_native: the C kernels (ops_*.c) as a MicroPython native module (.mpy with Thumb-2 machine
 * code for armv7emsp: the STM32F746 and its Cortex-M7 twin). Each kernel is a function of
 * (A, P, o) like its viper twin in tte_kernels.py, so the generated tte_model calls either;
 * tte_ops.py imports this module where the board can load it, the viper kernels elsewhere.
 * copy(A, dst, src, n) copies n bytes of a buffer into the arena (the blob's loads). */
#include "py/dynruntime.h"

#include "tte_native.h"

typedef void op_fn(uint8_t *A, const int32_t *P, int o);

static mp_obj_t call(op_fn *fn, mp_obj_t A_in, mp_obj_t P_in, mp_obj_t o_in) {
    mp_buffer_info_t a, p;
    mp_get_buffer_raise(A_in, &a, MP_BUFFER_RW);
    mp_get_buffer_raise(P_in, &p, MP_BUFFER_READ);
    fn(a.buf, p.buf, mp_obj_get_int(o_in));
    return mp_const_none;
}

#define TTE_WRAP(name) \
    static mp_obj_t name##_py(mp_obj_t A, mp_obj_t P, mp_obj_t o) { return call(op_##name, A, P, o); } \
    static MP_DEFINE_CONST_FUN_OBJ_3(name##_obj, name##_py);
TTE_OPS(TTE_WRAP)

static mp_obj_t copy_py(size_t n_args, const mp_obj_t *args) {
    mp_buffer_info_t a, s;
    mp_get_buffer_raise(args[0], &a, MP_BUFFER_RW);
    mp_get_buffer_raise(args[2], &s, MP_BUFFER_READ);
    memcpy((uint8_t *)a.buf + mp_obj_get_int(args[1]), s.buf, mp_obj_get_int(args[3]));
    return mp_const_none;
}
static MP_DEFINE_CONST_FUN_OBJ_VAR_BETWEEN(copy_obj, 4, 4, copy_py);

mp_obj_t mpy_init(mp_obj_fun_bc_t *self, size_t n_args, size_t n_kw, mp_obj_t *args) {
    MP_DYNRUNTIME_INIT_ENTRY
    // Spelled out: the build finds each MP_QSTR_ name in the source text, before macros expand.
    mp_store_global(MP_QSTR_conv_fwd, MP_OBJ_FROM_PTR(&conv_fwd_obj));
    mp_store_global(MP_QSTR_add_fwd, MP_OBJ_FROM_PTR(&add_fwd_obj));
    mp_store_global(MP_QSTR_gap_fwd, MP_OBJ_FROM_PTR(&gap_fwd_obj));
    mp_store_global(MP_QSTR_loss_grad, MP_OBJ_FROM_PTR(&loss_grad_obj));
    mp_store_global(MP_QSTR_argmax, MP_OBJ_FROM_PTR(&argmax_obj));
    mp_store_global(MP_QSTR_act_bwd, MP_OBJ_FROM_PTR(&act_bwd_obj));
    mp_store_global(MP_QSTR_grad_scale_ch, MP_OBJ_FROM_PTR(&grad_scale_ch_obj));
    mp_store_global(MP_QSTR_conv_bwd_x, MP_OBJ_FROM_PTR(&conv_bwd_x_obj));
    mp_store_global(MP_QSTR_conv_grad_w, MP_OBJ_FROM_PTR(&conv_grad_w_obj));
    mp_store_global(MP_QSTR_conv_upd_w, MP_OBJ_FROM_PTR(&conv_upd_w_obj));
    mp_store_global(MP_QSTR_apply_w, MP_OBJ_FROM_PTR(&apply_w_obj));
    mp_store_global(MP_QSTR_bias_grad, MP_OBJ_FROM_PTR(&bias_grad_obj));
    mp_store_global(MP_QSTR_bias_upd, MP_OBJ_FROM_PTR(&bias_upd_obj));
    mp_store_global(MP_QSTR_apply_b, MP_OBJ_FROM_PTR(&apply_b_obj));
    mp_store_global(MP_QSTR_gap_bwd, MP_OBJ_FROM_PTR(&gap_bwd_obj));
    mp_store_global(MP_QSTR_grad_add, MP_OBJ_FROM_PTR(&grad_add_obj));
    mp_store_global(MP_QSTR_acc_i32, MP_OBJ_FROM_PTR(&acc_i32_obj));
    mp_store_global(MP_QSTR_zero, MP_OBJ_FROM_PTR(&zero_obj));
    mp_store_global(MP_QSTR_patch, MP_OBJ_FROM_PTR(&patch_obj));
    mp_store_global(MP_QSTR_window, MP_OBJ_FROM_PTR(&window_obj));
    mp_store_global(MP_QSTR_act_mask, MP_OBJ_FROM_PTR(&act_mask_obj));
    mp_store_global(MP_QSTR_mask_bwd, MP_OBJ_FROM_PTR(&mask_bwd_obj));
    mp_store_global(MP_QSTR_copy, MP_OBJ_FROM_PTR(&copy_obj));
    MP_DYNRUNTIME_INIT_EXIT
}

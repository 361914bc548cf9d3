/*
 * abi.c — the public header's constants and struct layouts as this library was compiled
 * (fg_abi_constant, fg_abi_layout), so a binding that mirrors them (python/fastgrad/_lib.py)
 * reads or checks them instead of keeping copies that can drift. The ops' ids and operands
 * come from the op table (fg_op_describe), not from here.
 */
#include "internal.h"

#include <stddef.h>
#include <string.h>

#define C(name) {#name, (int64_t)(name)}
static const struct {
    const char *name;
    int64_t value;
} constants[] = {
    C(FG_VERSION), C(FG_MAX_RANK), C(FG_MAX_OPERANDS),
    C(FG_OK), C(FG_ERR_NULL_POINTER), C(FG_ERR_INVALID_VALUE), C(FG_ERR_SHAPE), C(FG_ERR_DTYPE),
    C(FG_ERR_WRONG_DEVICE), C(FG_ERR_MISALIGNED), C(FG_ERR_WORKSPACE), C(FG_ERR_OVERFLOW), C(FG_ERR_ALIAS),
    C(FG_ERR_UNSUPPORTED), C(FG_ERR_NO_DEVICE), C(FG_ERR_OUT_OF_MEMORY), C(FG_ERR_BACKEND),
    C(FG_ERR_DEVICE_VALUE), C(FG_ERR_INTERNAL),
    C(FG_F32), C(FG_F16), C(FG_BF16), C(FG_F64), C(FG_I32), C(FG_I64),
    C(FG_BACKEND_CPU), C(FG_BACKEND_CUDA),
    C(FG_PLAN_ALLOW_TF32), C(FG_PLAN_CONSUME_PRE), C(FG_PLAN_ACT_SLOPE), C(FG_PLAN_CONSUME_DY),
    C(FG_ROLE_INPUT), C(FG_ROLE_OUTPUT),
    C(FG_UNARY_SCALE), C(FG_UNARY_POW), C(FG_UNARY_LEAKY_RELU), C(FG_UNARY_ELU), C(FG_UNARY_CLAMP),
    C(FG_UNARY_SOFTCAP),
    C(FG_BINARY_LERP), C(FG_BINARY_AXPBY),
    C(FG_ACT_NONE), C(FG_ACT_RELU), C(FG_ACT_GELU), C(FG_ACT_GELU_TANH), C(FG_ACT_SILU), C(FG_ACT_SIGMOID),
    C(FG_ACT_TANH),
    C(FG_ACT_SAVED_PRE), C(FG_ACT_SAVED_SLOPE),
    C(FG_REDUCTION_MEAN), C(FG_REDUCTION_SUM), C(FG_REDUCTION_NONE),
    C(FG_LOSS_MSE), C(FG_LOSS_MAE), C(FG_LOSS_HUBER),
    C(FG_NORM_LAYER), C(FG_NORM_RMS),
    C(FG_ENCODER_PRE_LAYER), C(FG_ENCODER_PRE_RMS), C(FG_ENCODER_POST_LAYER), C(FG_ENCODER_POST_BATCH),
    C(FG_ENCODER_SAVE_ALL), C(FG_ENCODER_SAVE_LESS), C(FG_ENCODER_SAVE_MIN),
};
#undef C

#define S(type) {#type, NULL, sizeof(type)}
#define F(type, field) {#type, #field, offsetof(type, field)}
static const struct {
    const char *type, *field;
    size_t value;
} layouts[] = {
    S(fg_tensor), F(fg_tensor, data), F(fg_tensor, dtype), F(fg_tensor, rank), F(fg_tensor, shape),
    F(fg_tensor, stride),
    S(fg_context_desc), F(fg_context_desc, backend), F(fg_context_desc, device), F(fg_context_desc, stream),
    F(fg_context_desc, allow_tf32), F(fg_context_desc, num_threads),
    S(fg_plan_desc), F(fg_plan_desc, op), F(fg_plan_desc, operands), F(fg_plan_desc, accumulate),
    F(fg_plan_desc, flags), F(fg_plan_desc, options), F(fg_plan_desc, options_size), F(fg_plan_desc, alignment),
    S(fg_precision), F(fg_precision, storage), F(fg_precision, math), F(fg_precision, accumulator),
    F(fg_precision, tf32), F(fg_precision, deterministic), F(fg_precision, bit_stable),
    S(fg_plan_info), F(fg_plan_info, op), F(fg_plan_info, op_name), F(fg_plan_info, dtype),
    F(fg_plan_info, backend), F(fg_plan_info, arch), F(fg_plan_info, kernel), F(fg_plan_info, precision),
    F(fg_plan_info, workspace_bytes),
    S(fg_operand_info), F(fg_operand_info, name), F(fg_operand_info, role), F(fg_operand_info, optional),
    S(fg_op_info), F(fg_op_info, op), F(fg_op_info, name), F(fg_op_info, family), F(fg_op_info, n_operands),
    F(fg_op_info, operands), F(fg_op_info, flags), F(fg_op_info, options_type), F(fg_op_info, options_size),
    S(fg_elementwise_options), F(fg_elementwise_options, kind), F(fg_elementwise_options, scalars),
    S(fg_linear_act_options), F(fg_linear_act_options, act), F(fg_linear_act_options, saved),
    F(fg_linear_act_options, consume), F(fg_linear_act_options, dropout),
    S(fg_logp_options), F(fg_logp_options, temperature), F(fg_logp_options, softcap),
    F(fg_logp_options, use_ignore_index), F(fg_logp_options, ignore_index), F(fg_logp_options, reduction),
    F(fg_logp_options, label_smoothing), F(fg_logp_options, z_loss), F(fg_logp_options, grad_scale),
    F(fg_logp_options, max_tile_elements), F(fg_logp_options, vocab_start), F(fg_logp_options, vocab_total),
    S(fg_adamw_hparams), F(fg_adamw_hparams, lr), F(fg_adamw_hparams, beta1), F(fg_adamw_hparams, beta2),
    F(fg_adamw_hparams, eps), F(fg_adamw_hparams, weight_decay), F(fg_adamw_hparams, step),
    F(fg_adamw_hparams, grad_scale),
    S(fg_patch_options), F(fg_patch_options, patch_len), F(fg_patch_options, stride), F(fg_patch_options, pad_end),
    S(fg_regression_loss_options), F(fg_regression_loss_options, kind), F(fg_regression_loss_options, reduction),
    F(fg_regression_loss_options, delta), F(fg_regression_loss_options, grad_scale),
    S(fg_dropout_options), F(fg_dropout_options, p), F(fg_dropout_options, seed), F(fg_dropout_options, offset),
    S(fg_norm_options), F(fg_norm_options, kind), F(fg_norm_options, eps), F(fg_norm_options, dropout),
    S(fg_batch_norm_options), F(fg_batch_norm_options, eval), F(fg_batch_norm_options, eps),
    F(fg_batch_norm_options, momentum), F(fg_batch_norm_options, dropout),
    S(fg_revin_options), F(fg_revin_options, eps), F(fg_revin_options, denorm), F(fg_revin_options, subtract_last),
    S(fg_attention_options), F(fg_attention_options, scale), F(fg_attention_options, causal),
    F(fg_attention_options, dropout_p), F(fg_attention_options, seed), F(fg_attention_options, offset),
    S(fg_encoder_layer_desc), F(fg_encoder_layer_desc, d_model), F(fg_encoder_layer_desc, heads),
    F(fg_encoder_layer_desc, d_ff), F(fg_encoder_layer_desc, activation), F(fg_encoder_layer_desc, norm),
    F(fg_encoder_layer_desc, norm_eps), F(fg_encoder_layer_desc, bn_momentum),
    F(fg_encoder_layer_desc, attn_scale), F(fg_encoder_layer_desc, causal),
    F(fg_encoder_layer_desc, residual_scores), F(fg_encoder_layer_desc, dropout),
    F(fg_encoder_layer_desc, dropout_ffn), F(fg_encoder_layer_desc, dropout_attn),
    F(fg_encoder_layer_desc, save), F(fg_encoder_layer_desc, dropout_proj),
    S(fg_encoder_layer_params), F(fg_encoder_layer_params, w_qkv), F(fg_encoder_layer_params, b_qkv),
    F(fg_encoder_layer_params, w_q), F(fg_encoder_layer_params, b_q), F(fg_encoder_layer_params, w_k),
    F(fg_encoder_layer_params, b_k), F(fg_encoder_layer_params, w_v), F(fg_encoder_layer_params, b_v),
    F(fg_encoder_layer_params, w_o), F(fg_encoder_layer_params, b_o), F(fg_encoder_layer_params, w_1),
    F(fg_encoder_layer_params, b_1), F(fg_encoder_layer_params, w_2), F(fg_encoder_layer_params, b_2),
    F(fg_encoder_layer_params, norm1_w), F(fg_encoder_layer_params, norm1_b),
    F(fg_encoder_layer_params, norm2_w), F(fg_encoder_layer_params, norm2_b),
    F(fg_encoder_layer_params, running_mean1), F(fg_encoder_layer_params, running_var1),
    F(fg_encoder_layer_params, running_mean2), F(fg_encoder_layer_params, running_var2),
    S(fg_encoder_layer_run), F(fg_encoder_layer_run, train), F(fg_encoder_layer_run, seed),
    F(fg_encoder_layer_run, offset),
};
#undef S
#undef F

fg_status fg_abi_constant(const char *name, int64_t *value) {
    if (!name) return fg_fail(FG_ERR_NULL_POINTER, "abi_constant: name is NULL");
    if (!value) return fg_fail(FG_ERR_NULL_POINTER, "abi_constant: value is NULL");
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++)
        if (strcmp(constants[i].name, name) == 0) {
            *value = constants[i].value;
            fg_clear_error();
            return FG_OK;
        }
    return fg_fail(FG_ERR_INVALID_VALUE, "abi_constant: %.64s is not a constant of fastgrad.h", name);
}

fg_status fg_abi_layout(const char *type, const char *field, size_t *value) {
    if (!type) return fg_fail(FG_ERR_NULL_POINTER, "abi_layout: type is NULL");
    if (!value) return fg_fail(FG_ERR_NULL_POINTER, "abi_layout: value is NULL");
    for (size_t i = 0; i < sizeof layouts / sizeof layouts[0]; i++) {
        if (strcmp(layouts[i].type, type) != 0) continue;
        if ((field == NULL) != (layouts[i].field == NULL)) continue;
        if (field && strcmp(layouts[i].field, field) != 0) continue;
        *value = layouts[i].value;
        fg_clear_error();
        return FG_OK;
    }
    return fg_fail(FG_ERR_INVALID_VALUE, "abi_layout: %.64s%s%.64s is not a public struct or field", type,
                   field ? "." : "", field ? field : "");
}

/*
 * act_steps.c — the names of the linear + activation family's steps: a plan's kernel
 * string (fg_plan_info.kernel) and a backend's launch record (fg_context_last_kernels) are
 * made of the same labels, so a test can compare what a plan named with what ran.
 */
#include "internal.h"

#include <stdio.h>

const char *fg_act_step_name(fg_act_step s) {
    switch (s) {
    case FG_ACT_STEP_FORWARD: return "act";
    case FG_ACT_STEP_GRAD: return "act_grad";
    case FG_ACT_STEP_CAST: return "cast";
    case FG_ACT_STEP_TILE_FORWARD: return "linear_act_tile";
    case FG_ACT_STEP_TILE_GRAD: return "linear_act_grad_tile";
    case FG_ACT_STEP_TILE_BACKWARD: return "linear_act_bwd_tile";
    case FG_ACT_STEP_TILE_BACKWARD90: return "linear_act_bwd90";
    case FG_ACT_STEP_GEMM_FORWARD: return "linear_act_gemm90";
    case FG_ACT_STEP_GEMM_INPUT: return "gemm90_dx";
    case FG_ACT_STEP_GEMM_WEIGHT: return "gemm90_dw";
    case FG_ACT_STEP_GEMM_INPUT_FORM: return "gemm90_dx_formed_g";
    }
    return "?";
}

void fg_act_step_label(char *buf, size_t len, fg_act_step step, int act, fg_dtype dtype) {
    static const char *const acts[] = {"none", "relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "given_slope"};
    snprintf(buf, len, "%s_%s<%s>", fg_act_step_name(step), act >= 0 && act <= FG_ACT_GIVEN_SLOPE ? acts[act] : "?",
             fg_dtype_name(dtype));
}

void fg_act_call_label(char *buf, size_t len, const fg_act_call *c) {
    char step[48];
    fg_act_step_label(step, sizeof step, c->step, c->act, c->dtype);
    snprintf(buf, len, "%s%s", step, c->drop.on ? "+dropout" : "");
}

/*
 * backend.cu — the CUDA backend's table (fg_backend_ops) and its plan hook for linear +
 * activation: which of the backend's kernels take a problem is decided here, once, when a
 * plan is made, from the shapes, the dtype, the device's arch and the alignment the caller
 * declared — the front door (src/ops/linear_act.c) only follows the path. Its products go
 * through the GEMM primitive (src/cuda/gemm.cu), which picks cuBLASLt or the own sm_90a GEMM and
 * says which epilogues it fuses. Each entry records what it launched for
 * fg_context_last_kernels.
 */
#include "cuda_internal.h"

#include <string.h>

static fg_status cuda_gemm(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws, size_t ws_bytes,
                           bool run) {
    return fg_cuda_gemm(ctx, g, info, ws, ws_bytes, run);
}

static fg_status cuda_elementwise(fg_context *ctx, const fg_ew *e, fg_kernel_info *info, void *ws, size_t ws_bytes,
                                  bool run) {
    FG_TRY(fg_cuda_elementwise(ctx, e, info, ws, ws_bytes, run));
    if (run) fg_record_kernel(ctx, info->name);
    return FG_OK;
}

static fg_status cuda_adamw(fg_context *ctx, const fg_adamw_run *r) {
    FG_TRY(fg_cuda_adamw(ctx, r));
    fg_record_kernel(ctx, "adamw_multi_tensor");
    return FG_OK;
}

static fg_status cuda_logp(fg_context *ctx, const fg_logp_call *c) { return fg_cuda_logp(ctx, c); }

/* dw = gᵀ·x reduces over all N rows into an M × K result: when that result is only a few
 * GEMM tiles and N is long, cuBLASLt runs it on a few SMs. The rows are split into `parts`
 * products written side by side in f32 (one batched GEMM), summed in order by the cast.
 * 0: no split — also for M, K ≤ 128, where the GEMM primitive's skinny kernel (src/cuda/gemm.cu)
 * splits the rows itself in one product up to FG_SKINNY_MAX_OUTS outputs, and cuBLASLt's own
 * split-K runs the rest (the split here was not re-measured for them). */
static int64_t dw_parts(fg_context *ctx, const fg_act_problem *p) {
    const fg_dtype t = p->dtype;
    const int64_t N = p->N, K = p->K, M = p->M;
    const int64_t tiles = ((M + 127) / 128) * ((K + 127) / 128);
    if (tiles >= 32 || N < 16384) return 0;
    /* the f32 split kernel for weight gradients splits the tokens into ranges itself */
    const fg_gemm whole = fg_gemm_plain(t, 1, M, K, N, fg_mat_at(NULL, 1, M), fg_mat_at(NULL, K, 1), fg_mat_at(NULL, K, 1),
                                        p->accumulate ? 1.0 : 0.0, false, NULL, p->tf32, false, p->align);
    if (fg_cuda_split_wgrad_takes(ctx->device, &whole, false)) return 0;
    if (t != FG_F64 && M >= 2 && K >= 2 && M <= 128 && K <= 128) return 0;
    const int64_t parts = N / 2048;
    return parts > 64 ? 64 : parts;
}

/* Asks the GEMM primitive whether it fuses this product's epilogue (act, pre or its slope) or
 * forms its operand (a = dy ⊙ act′(pre) with its column sums): planning, no pointers. */
static fg_status gemm_takes(fg_context *ctx, const fg_act_problem *p, bool forward, bool keep, int form, bool *yes) {
    fg_gemm g = forward ? fg_gemm_plain(p->dtype, 1, p->N, p->M, p->K, fg_mat_at(NULL, p->K, 1), fg_mat_at(NULL, 1, p->K),
                                        fg_mat_at(NULL, p->M, 1), 0.0, p->has_bias, NULL, p->tf32, false, p->align)
                        : fg_gemm_plain(p->dtype, 1, p->N, p->K, p->M, fg_mat_at(NULL, p->M, 1), fg_mat_at(NULL, p->K, 1),
                                        fg_mat_at(NULL, p->K, 1), p->accumulate ? 1.0 : 0.0, false, NULL, p->tf32, false,
                                        p->align);
    if (forward) {
        g.act = p->kind;
        g.epi.has_aux = keep;
        g.epi.slope = keep && p->slope;
    } else {
        g.epi.form = form;
        g.epi.col_sums = p->want_db;
    }
    fg_kernel_info info;
    FG_TRY(fg_gemm_execute(ctx, &g, &info, NULL, 0, false));
    *yes = forward ? info.act_fused : info.formed;
    return FG_OK;
}

static fg_status cuda_act_plan(fg_context *ctx, const fg_act_problem *p, fg_act_path *path) {
    memset(path, 0, sizeof *path);
    path->fwd = FG_ACT_STEP_FORWARD;
    path->fused = FG_ACT_STEP_FORWARD; /* none */
    path->pass_drop = true;           /* the passes and the short-K tiles apply the dropout */
    const bool a16 = p->align >= 16;  /* the own kernels load 16-byte vectors */
    const bool act = p->kind != FG_ACT_NONE;
    if (p->forward) {
        /* relu without pre: cuBLASLt's epilogue, before any own kernel */
        if (!p->keep && p->kind == FG_ACT_RELU) FG_TRY(gemm_takes(ctx, p, true, false, 0, &path->epilogue));
        if (path->epilogue) return FG_OK;
        if (act && a16 && fg_cuda_act_tile_fits(p->dtype, p->K, p->M)) { /* short K: product + act in one tile */
            path->fwd = FG_ACT_STEP_TILE_FORWARD;
            return FG_OK;
        }
        if (act) FG_TRY(gemm_takes(ctx, p, true, p->keep, 0, &path->epilogue)); /* the own GEMM's epilogue */
        return FG_OK;
    }
    /* the whole backward in one kernel: from a kept pre on sm_90a (wgmma, every activation),
       else the mma.sync one (the cheap-slope activations, any alignment) */
    if (p->want_dx && p->want_dw) {
        if (p->keep && p->N >= 1 && p->act != FG_ACT_NONE && a16 &&
            fg_cuda_act_bwd90_fits(ctx->device, p->dtype, p->K, p->M))
            path->fused = FG_ACT_STEP_TILE_BACKWARD90;
        else if (fg_cuda_act_bwd_tile_fits(p->dtype, p->act, p->K, p->M))
            path->fused = FG_ACT_STEP_TILE_BACKWARD;
        if (path->fused != FG_ACT_STEP_FORWARD) {
            path->fused_scratch = fg_cuda_act_bwd_tile_scratch(ctx->device, p->N, p->K, p->M, &path->fused_parts);
            return FG_OK;
        }
    }
    /* pre recomputed inside the gradient's tile kernel */
    path->tile_grad = !p->keep && act && a16 && fg_cuda_act_tile_fits(p->dtype, p->K, p->M);
    /* or g formed by dx's product, where the GEMM primitive can */
    if (!path->tile_grad && p->want_dx && act) FG_TRY(gemm_takes(ctx, p, false, p->keep, p->act, &path->form));
    if (!path->form && p->want_db) path->grad_scratch = fg_cuda_act_scratch(p->dtype, p->N, p->M);
    path->dw_parts = p->want_dw ? dw_parts(ctx, p) : 0;
    return FG_OK;
}

static fg_status cuda_act(fg_context *ctx, const fg_act_call *c) {
    FG_TRY(fg_cuda_act(ctx, c));
    if (c->step != FG_ACT_STEP_CAST) {
        char label[64];
        fg_act_call_label(label, sizeof label, c);
        fg_record_kernel(ctx, label);
    }
    return FG_OK;
}

static fg_status cuda_series(fg_context *ctx, fg_series_call *c, bool run) {
    FG_TRY(fg_cuda_series(ctx, c, run));
    if (run) fg_record_kernel(ctx, c->name);
    return FG_OK;
}

/* Designated in the struct's declaration order (C++ requires it). */
extern "C" const fg_backend_ops fg_cuda_backend = {
    .name = "cuda",
    .f64_kernels = false,
    .gemm = cuda_gemm,
    .elementwise = cuda_elementwise,
    .adamw = cuda_adamw,
    .logp_scratch = fg_cuda_logp_scratch,
    .logp = cuda_logp,
    .act_plan = cuda_act_plan,
    .act = cuda_act,
    .norm = fg_cuda_norm,
    .attn_plan = fg_cuda_attn_plan,
    .attn = fg_cuda_attn,
    .series = cuda_series,
};

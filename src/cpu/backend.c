/*
 * backend.c — the CPU backend's table: the functions the front doors and the plan
 * mechanism reach the CPU kernels through (src/core/internal.h, fg_backend_ops). The CPU
 * backend has one path per step (OpenBLAS or its own kernels for products, OpenMP loops for
 * the rest); its plan hook for linear + activation puts the forward's activation in the short-k
 * product's store where that product runs, else GEMM, then the activation pass; and the backward's
 * g in dx's product where the GEMM forms it (gemm.c's narrow product), else the gradient pass.
 * Each entry records what it launched for fg_context_last_kernels.
 */
#include "cpu.h"

#include <string.h>

static fg_status cpu_gemm(fg_context *ctx, const fg_gemm *g, fg_kernel_info *info, void *ws, size_t ws_bytes,
                          bool run) {
    return fg_cpu_gemm(ctx, g, info, ws, ws_bytes, run);
}

static fg_status cpu_elementwise(fg_context *ctx, const fg_ew *e, fg_kernel_info *info, void *ws, size_t ws_bytes,
                                 bool run) {
    FG_TRY(fg_cpu_elementwise(ctx, e, info, ws, ws_bytes, run));
    if (run) fg_record_kernel(ctx, info->name);
    return FG_OK;
}

static fg_status cpu_adamw(fg_context *ctx, const fg_adamw_run *r) {
    FG_TRY(fg_cpu_adamw(ctx, r));
    fg_record_kernel(ctx, "cpu:adamw");
    return FG_OK;
}

static size_t cpu_logp_scratch(int64_t rows, int64_t cols) {
    (void)rows, (void)cols;
    return 0;
}

static fg_status cpu_logp(fg_context *ctx, const fg_logp_call *c) { return fg_cpu_logp(ctx, c); }

static fg_status cpu_act_plan(fg_context *ctx, const fg_act_problem *p, fg_act_path *path) {
    memset(path, 0, sizeof *path);
    /* the forward as one short-k product with the activation (and pre or its slope) in its
       store, where that kernel takes the product: no pre written and read again */
    path->epilogue = p->forward && fg_cpu_smallk_fits(p->dtype, p->N, p->M, p->K);
    path->fwd = FG_ACT_STEP_FORWARD;
    path->fused = FG_ACT_STEP_FORWARD; /* none */
    /* the backward's g = dy ⊙ act′(pre) (and db's sums) made by dx's product where the GEMM
       primitive can (the narrow product on AVX-512): no pass writing g for that product to read
       again. Asked with dx's product as the driver runs it (planning: no pointers; beta 1 when
       accumulating, as src/ops/linear_act.c then runs it). */
    if (!p->forward && p->want_dx && p->act != FG_ACT_NONE && p->keep && p->B == 1) {
        fg_gemm g = fg_gemm_plain(p->dtype, 1, p->N, p->K, p->M, fg_mat_at(NULL, p->M, 1), fg_mat_at(NULL, p->K, 1),
                                  fg_mat_at(NULL, p->K, 1), p->accumulate ? 1.0 : 0.0, false, NULL, p->tf32, false, p->align);
        g.epi.form = p->act;
        g.epi.col_sums = p->want_db;
        fg_kernel_info info;
        FG_TRY(fg_gemm_execute(ctx, &g, &info, NULL, 0, false));
        path->form = info.formed;
    }
    return FG_OK;
}

static fg_status cpu_act(fg_context *ctx, const fg_act_call *c) {
    FG_TRY(fg_cpu_act(ctx, c));
    if (c->step != FG_ACT_STEP_CAST) {
        char label[64];
        fg_act_call_label(label, sizeof label, c);
        fg_record_kernel(ctx, label);
    }
    return FG_OK;
}

static fg_status cpu_series(fg_context *ctx, fg_series_call *c, bool run) {
    FG_TRY(fg_cpu_series(ctx, c, run));
    if (run) fg_record_kernel(ctx, c->name);
    return FG_OK;
}

const fg_backend_ops fg_cpu_backend = {
    .name = "cpu",
    .f64_kernels = true,
    .gemm = cpu_gemm,
    .elementwise = cpu_elementwise,
    .adamw = cpu_adamw,
    .logp_scratch = cpu_logp_scratch,
    .logp = cpu_logp,
    .act_plan = cpu_act_plan,
    .act = cpu_act,
    .norm = fg_cpu_norm,
    .attn_plan = fg_cpu_attn_plan,
    .attn = fg_cpu_attn,
    .series = cpu_series,
};

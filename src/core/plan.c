/*
 * plan.c — the plan mechanism every op goes through: descriptor → fg_plan_create
 * (validate the structure, lower to GEMM primitives, let the backend pick kernels)
 * → fg_plan_can_implement (check the run's pointers) → fg_plan_workspace_size →
 * fg_plan_run. The one-call functions (fg_linear_forward, ...) are fg_run_once().
 */
#include "internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fg_plan {
    fg_context *ctx;
    const fg_op_entry *entry;
    fg_plan_desc desc;
    fg_lowered lowered;
    fg_plan_info info;
};

static const fg_op_entry *find_op(fg_op op) {
    const fg_op_entry *e = fg_linear_op_entry(op);
    if (!e) e = fg_matmul_op_entry(op);
    if (!e) e = fg_outer_op_entry(op);
    if (!e) e = fg_elementwise_op_entry(op);
    if (!e) e = fg_linear_logp_op_entry(op);
    if (!e) e = fg_linear_act_op_entry(op);
    return e;
}

static fg_status ew_execute(fg_context *ctx, const fg_ew *e, fg_kernel_info *k, void *ws, size_t ws_bytes,
                            bool run) {
    memset(k, 0, sizeof *k);
    k->deterministic = true;
    k->accumulator = e->dtype == FG_F64 ? FG_F64 : FG_F32;
    if (ctx->backend == FG_BACKEND_CPU) return fg_cpu_elementwise(ctx, e, k, ws, ws_bytes, run);
#ifdef FG_HAVE_CUDA
    if (ctx->backend == FG_BACKEND_CUDA) return fg_cuda_elementwise(ctx, e, k, ws, ws_bytes, run);
#endif
    return fg_fail(FG_ERR_NO_DEVICE, "elementwise: backend %d is not built in", (int)ctx->backend);
}

static fg_dtype accumulator_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

/* Builds the plan in place (no allocation), so the one-call path costs no malloc. */
static fg_status plan_init(fg_context *ctx, const fg_plan_desc *desc, struct fg_plan *p) {
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "plan_create: ctx is NULL");
    if (!desc) return fg_fail(FG_ERR_NULL_POINTER, "plan_create: desc is NULL");
    const fg_op_entry *e = find_op(desc->op);
    if (!e) return fg_fail(FG_ERR_INVALID_VALUE, "plan_create: desc.op=%d is not an op", (int)desc->op);
    const uint32_t known = FG_PLAN_ALLOW_TF32 | (desc->op == FG_OP_LINEAR_ACT_BACKWARD ? FG_PLAN_CONSUME_PRE : 0u) |
                           (desc->op == FG_OP_LINEAR_ACT_FORWARD || desc->op == FG_OP_LINEAR_ACT_BACKWARD ? FG_PLAN_ACT_SLOPE
                                                                                                        : 0u);
    if (desc->flags & ~known)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: unknown flags 0x%x", e->name, desc->flags & ~known);
    if (desc->accumulate != 0 && desc->accumulate != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate=%d must be 0 or 1", e->name,
                       desc->accumulate);
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    p->entry = e;
    p->desc = *desc;
    FG_TRY(e->lower(desc, &p->lowered));

    fg_plan_info *info = &p->info;
    info->op = e->op;
    info->op_name = e->name;
    int first_required = 0; /* the plan's dtype: its first operand that is not optional */
    while (first_required < e->n_operands - 1 && (e->optional_mask >> first_required & 1u)) first_required++;
    info->dtype = desc->operands[first_required].dtype;
    info->backend = ctx->backend;
    info->arch = ctx->arch;
    info->precision.storage = info->dtype;
    info->precision.math = accumulator_of(info->dtype);
    info->precision.accumulator = accumulator_of(info->dtype);
    info->precision.deterministic = 1;
    info->precision.bit_stable = 1;
    size_t used = 0;
    if (p->lowered.driver) {
        fg_kernel_info k;
        memset(&k, 0, sizeof k);
        k.deterministic = true;
        k.accumulator = accumulator_of(info->dtype);
        FG_TRY(p->lowered.driver(ctx, &p->desc, NULL, &k, NULL, 0, false));
        info->workspace_bytes = k.workspace_bytes;
        if (!k.deterministic) info->precision.deterministic = info->precision.bit_stable = 0;
        snprintf(info->kernel, sizeof info->kernel, "%s", k.name);
    }
    if (p->lowered.is_elementwise) {
        fg_kernel_info k;
        FG_TRY(ew_execute(ctx, &p->lowered.ew, &k, NULL, 0, false));
        info->workspace_bytes = k.workspace_bytes;
        if (k.accumulator == FG_F64) info->precision.accumulator = FG_F64;
        snprintf(info->kernel, sizeof info->kernel, "%s", k.name);
    }
    for (int i = 0; i < p->lowered.count; i++) {
        fg_gemm *g = &p->lowered.gemm[i];
        g->allow_tf32 = (desc->flags & FG_PLAN_ALLOW_TF32) && g->dtype == FG_F32;
        if (g->allow_tf32) info->precision.tf32 = 1;
        fg_kernel_info k;
        FG_TRY(fg_gemm_execute(ctx, g, &k, NULL, 0, false));
        if (!k.deterministic) info->precision.deterministic = info->precision.bit_stable = 0;
        if (k.accumulator == FG_F64) info->precision.accumulator = FG_F64;
        if (k.workspace_bytes > info->workspace_bytes) info->workspace_bytes = k.workspace_bytes;
        used += (size_t)snprintf(info->kernel + used, used < sizeof info->kernel ? sizeof info->kernel - used : 0,
                                 "%s%s", i ? " ; " : "", k.name);
        if (used >= sizeof info->kernel) used = sizeof info->kernel - 1;
    }
    return FG_OK;
}

static bool same_view(const fg_tensor *a, const fg_tensor *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->rank != b->rank) return false;
    int64_t sa[FG_MAX_RANK], sb[FG_MAX_RANK];
    fg_tensor_strides(a, sa);
    fg_tensor_strides(b, sb);
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d] || sa[d] != sb[d]) return false;
    return true;
}

/* Whether the plan uses operand i (an optional one is absent when its rank is 0; an
 * elementwise lowering says exactly which it reads and writes). */
static bool present(const struct fg_plan *p, int i) {
    if (p->lowered.is_elementwise) return p->lowered.ew.present >> i & 1u;
    return !(p->desc.operands[i].rank == 0 && (p->entry->optional_mask >> i & 1u));
}

static fg_status check_run(const struct fg_plan *p, const fg_tensor *ops) {
    const fg_op_entry *e = p->entry;
    if (!ops) return fg_fail(FG_ERR_NULL_POINTER, "%s: operands is NULL", e->name);
    for (int i = 0; i < e->n_operands; i++) {
        const fg_tensor *want = &p->desc.operands[i], *got = &ops[i];
        bool same = want->dtype == got->dtype && want->rank == got->rank;
        int64_t sw[FG_MAX_RANK], sg[FG_MAX_RANK]; /* effective strides: all-zero = contiguous */
        if (same) {
            fg_tensor_strides(want, sw);
            fg_tensor_strides(got, sg);
        }
        for (int d = 0; same && d < want->rank; d++)
            same = want->shape[d] == got->shape[d] && (want->shape[d] == 1 || sw[d] == sg[d]);
        if (!same) {
            char a[160], b[160];
            return fg_fail(FG_ERR_SHAPE, "%s: %s is %s %s but the plan was made for %s %s", e->name,
                           e->operand_names[i], fg_dtype_name(got->dtype), fg_shape_str(got, b, sizeof b),
                           fg_dtype_name(want->dtype), fg_shape_str(want, a, sizeof a));
        }
        if (!present(p, i)) continue;
        FG_TRY(fg_check_data(p->ctx, e->name, e->operand_names[i], got));
    }
    for (int i = 0; i < e->n_operands; i++) {
        if (!(e->output_mask >> i & 1u) || !present(p, i)) continue;
        for (int j = 0; j < e->n_operands; j++) {
            if (j == i || !present(p, j)) continue;
            if (e->inplace_ok && !(e->output_mask >> j & 1u) && !p->lowered.ew.broadcast &&
                same_view(&ops[i], &ops[j]))
                continue; /* exactly in place: each element is read before it is written */
            FG_TRY(fg_check_no_overlap(e->name, e->operand_names[i], &ops[i], e->operand_names[j],
                                       &ops[j]));
        }
    }
    return FG_OK;
}

static void resolve(fg_mat *m, const fg_tensor *ops, size_t es) {
    m->data = m->operand >= 0 ? (char *)ops[m->operand].data + m->offset * (int64_t)es : NULL;
}

static fg_status plan_run(struct fg_plan *p, const fg_tensor *ops, void *ws, size_t ws_bytes) {
    FG_TRY(check_run(p, ops));
    if (p->info.workspace_bytes > 0 && (!ws || ws_bytes < p->info.workspace_bytes))
        return fg_fail(FG_ERR_WORKSPACE, "%s: workspace of %zu bytes given, %zu needed", p->entry->name,
                       ws ? ws_bytes : 0, p->info.workspace_bytes);
    if (p->lowered.driver) {
        fg_kernel_info k;
        memset(&k, 0, sizeof k);
        FG_TRY(p->lowered.driver(p->ctx, &p->desc, ops, &k, ws, ws_bytes, true));
    }
    if (p->lowered.is_elementwise) {
        fg_ew e = p->lowered.ew;
        for (int i = 0; i < e.n_operands; i++) e.data[i] = (e.present >> i & 1u) ? ops[i].data : NULL;
        fg_kernel_info k;
        FG_TRY(ew_execute(p->ctx, &e, &k, ws, ws_bytes, true));
    }
    for (int i = 0; i < p->lowered.count; i++) {
        fg_gemm g = p->lowered.gemm[i];
        const size_t es = fg_dtype_size(g.dtype);
        resolve(&g.a, ops, es);
        resolve(&g.b, ops, es);
        resolve(&g.c, ops, es);
        g.bias = g.bias_operand >= 0 ? ops[g.bias_operand].data : NULL;
        fg_kernel_info k;
        FG_TRY(fg_gemm_execute(p->ctx, &g, &k, ws, ws_bytes, true));
    }
    fg_clear_error();
    return FG_OK;
}

fg_status fg_plan_create(fg_context *ctx, const fg_plan_desc *desc, fg_plan **out) {
    if (!out) return fg_fail(FG_ERR_NULL_POINTER, "plan_create: out is NULL");
    *out = NULL;
    struct fg_plan *p = malloc(sizeof *p);
    if (!p) return fg_fail(FG_ERR_OUT_OF_MEMORY, "plan_create: out of host memory");
    fg_status s = plan_init(ctx, desc, p);
    if (s != FG_OK) {
        free(p);
        return s;
    }
    *out = p;
    fg_clear_error();
    return FG_OK;
}

void fg_plan_destroy(fg_plan *plan) { free(plan); }

fg_status fg_plan_info_get(const fg_plan *plan, fg_plan_info *info) {
    if (!plan) return fg_fail(FG_ERR_NULL_POINTER, "plan_info_get: plan is NULL");
    if (!info) return fg_fail(FG_ERR_NULL_POINTER, "plan_info_get: info is NULL");
    *info = plan->info;
    return FG_OK;
}

fg_status fg_plan_workspace_size(const fg_plan *plan, size_t *bytes) {
    if (!plan) return fg_fail(FG_ERR_NULL_POINTER, "plan_workspace_size: plan is NULL");
    if (!bytes) return fg_fail(FG_ERR_NULL_POINTER, "plan_workspace_size: bytes is NULL");
    *bytes = plan->info.workspace_bytes;
    return FG_OK;
}

fg_status fg_plan_can_implement(const fg_plan *plan, const fg_tensor *operands) {
    if (!plan) return fg_fail(FG_ERR_NULL_POINTER, "plan_can_implement: plan is NULL");
    FG_TRY(check_run(plan, operands));
    fg_clear_error();
    return FG_OK;
}

fg_status fg_plan_run(fg_plan *plan, const fg_tensor *operands, void *workspace,
                      size_t workspace_bytes) {
    if (!plan) return fg_fail(FG_ERR_NULL_POINTER, "plan_run: plan is NULL");
    return plan_run(plan, operands, workspace, workspace_bytes);
}

fg_status fg_run_once(fg_context *ctx, fg_op op, const fg_tensor *const *operands, int n,
                      int accumulate) {
    return fg_run_once_ew(ctx, op, operands, n, accumulate, 0, NULL, 0);
}

fg_status fg_run_once_ew(fg_context *ctx, fg_op op, const fg_tensor *const *operands, int n,
                         int accumulate, int kind, const double *scalars, int n_scalars) {
    fg_plan_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.op = op;
    desc.accumulate = accumulate ? 1 : 0;
    desc.kind = kind;
    for (int i = 0; i < n_scalars && i < 4; i++) desc.scalars[i] = scalars[i];
    return fg_run_once_desc(ctx, &desc, operands, n);
}

fg_status fg_run_once_desc(fg_context *ctx, const fg_plan_desc *base, const fg_tensor *const *operands,
                           int n) {
    const fg_op_entry *e = find_op(base->op);
    if (!e || n != e->n_operands) return fg_fail(FG_ERR_INTERNAL, "run_once: bad op table");
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "%s: ctx is NULL", e->name);
    fg_plan_desc desc = *base;
    desc.flags = (base->flags & ~FG_PLAN_ALLOW_TF32) | (ctx->allow_tf32 ? FG_PLAN_ALLOW_TF32 : 0);
    fg_tensor ops[FG_MAX_OPERANDS];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < n; i++) {
        if (!operands[i]) {
            if (e->optional_mask >> i & 1u) continue;
            return fg_fail(FG_ERR_NULL_POINTER, "%s: %s is NULL", e->name, e->operand_names[i]);
        }
        ops[i] = *operands[i];
        if (ops[i].rank == 0 && (e->optional_mask >> i & 1u)) ops[i].data = NULL;
        desc.operands[i] = ops[i];
        desc.operands[i].data = NULL;
    }
    struct fg_plan p;
    FG_TRY(plan_init(ctx, &desc, &p));
    FG_TRY(check_run(&p, ops)); /* before the workspace may grow */
    void *ws = NULL;
    if (p.info.workspace_bytes) FG_TRY(fg_context_workspace(ctx, p.info.workspace_bytes, &ws));
    return plan_run(&p, ops, ws, p.info.workspace_bytes);
}

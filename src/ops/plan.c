/*
 * plan.c — the plan mechanism every op goes through: descriptor → fg_plan_create
 * (look the op up in the op table, check its flags and options, lower it to GEMM
 * primitives, an elementwise problem or its family's driver, and let the backend pick the
 * kernels for the declared alignment) → fg_plan_can_implement (check the run's pointers) →
 * fg_plan_workspace_size → fg_plan_run. The one-call functions (fg_linear_forward, ...) are
 * fg_run_op: a plan made in place for their pointers, run on the context's workspace.
 */
#include "../core/checks.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct fg_plan {
    fg_context *ctx;
    const fg_op_decl *decl;
    fg_plan_desc desc;      /* options point at opts */
    double opts[FG_OPTIONS_BYTES / sizeof(double)];
    unsigned output_mask, optional_mask;
    unsigned zero_mask;     /* outputs that are sums over an empty set: written as zeros */
    bool nothing_to_write;  /* every output absent or empty: the run returns at once */
    fg_lowered lowered;
    fg_plan_info info;
};

static fg_status ew_execute(fg_context *ctx, const fg_ew *e, fg_kernel_info *k, void *ws, size_t ws_bytes,
                            bool run) {
    memset(k, 0, sizeof *k);
    k->deterministic = true;
    k->accumulator = e->dtype == FG_F64 ? FG_F64 : FG_F32;
    return ctx->be->elementwise(ctx, e, k, ws, ws_bytes, run);
}

static fg_dtype accumulator_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

static bool power_of_two(uint32_t v) { return v && !(v & (v - 1)); }

/* A lowered GEMM: a sum over an empty batch is a product with k = 0 (c = beta·c, the zeros of
 * a sum over nothing), and no matrix it touches has a zero stride along a dim of size > 1. */
static fg_status check_gemm(const fg_op_decl *e, fg_gemm *g) {
    if (g->batch == 0 && g->c.bs == 0) {
        g->batch = 1;
        g->k = 0;
    }
    const fg_mat *m[3] = {&g->a, &g->b, &g->c};
    const int64_t rows[3] = {g->m, g->k, g->m}, cols[3] = {g->k, g->n, g->n};
    for (int i = 0; i < 3; i++) {
        if (m[i]->operand < 0) continue;
        const char *name = m[i]->operand < e->n_operands ? e->operands[m[i]->operand].name : "?";
        FG_TRY(fg_check_gemm_mat(e->name, name, m[i], rows[i], cols[i]));
    }
    return FG_OK;
}

/* Writes zeros into output t (a sum over an empty set) as products with k = 0 on the
 * context's backend: c = 0·c over a [rows, cols] block whose column stride is 1 (or one
 * column), once per index of t's remaining dims. Planning (run = false) sizes one block. */
static fg_status zero_fill(fg_context *ctx, const fg_tensor *t, fg_kernel_info *k, void *ws, size_t ws_bytes,
                           bool run) {
    int64_t st[FG_MAX_RANK];
    fg_tensor_strides(t, st);
    int rows_dim = -1, cols_dim = -1;
    for (int i = 0; i < t->rank; i++)
        if (t->shape[i] > 1 && st[i] == 1 && cols_dim < 0) cols_dim = i;
    for (int i = t->rank - 1; i >= 0; i--)
        if (t->shape[i] > 1 && i != cols_dim && rows_dim < 0) rows_dim = i;
    fg_mat c;
    memset(&c, 0, sizeof c);
    c.rs = rows_dim >= 0 ? st[rows_dim] : 1;
    c.cs = 1;
    const int64_t m = rows_dim >= 0 ? t->shape[rows_dim] : 1, n = cols_dim >= 0 ? t->shape[cols_dim] : 1;
    fg_mat none;
    memset(&none, 0, sizeof none);
    fg_gemm g = fg_gemm_plain(t->dtype, 1, m, n, 0, none, none, c, 0.0, false, NULL, false, false, 256);
    if (!run) return fg_gemm_execute(ctx, &g, k, NULL, 0, false);
    int64_t idx[FG_MAX_RANK] = {0};
    const size_t es = fg_dtype_size(t->dtype);
    for (;;) {
        int64_t off = 0;
        for (int i = 0; i < t->rank; i++) off += idx[i] * st[i];
        g.c.data = (char *)t->data + off * (int64_t)es;
        FG_TRY(fg_gemm_execute(ctx, &g, k, ws, ws_bytes, true));
        int d = t->rank - 1;
        for (; d >= 0; d--) {
            if (d == rows_dim || d == cols_dim) continue;
            if (++idx[d] < t->shape[d]) break;
            idx[d] = 0;
        }
        if (d < 0) return FG_OK;
    }
}

/* Builds the plan in place (no allocation), so the one-call path costs no malloc. */
static fg_status plan_init(fg_context *ctx, const fg_plan_desc *desc, struct fg_plan *p) {
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "plan_create: ctx is NULL");
    if (!desc) return fg_fail(FG_ERR_NULL_POINTER, "plan_create: desc is NULL");
    const fg_op_decl *e = fg_op_find(desc->op, NULL);
    if (!e) return fg_fail(FG_ERR_INVALID_VALUE, "plan_create: desc.op=%d is not an op", (int)desc->op);
    const uint32_t known = FG_PLAN_ALLOW_TF32 | e->flags;
    if (desc->flags & ~known)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: unknown flags 0x%x", e->name, desc->flags & ~known);
    if (desc->accumulate != 0 && desc->accumulate != 1)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate=%d must be 0 or 1", e->name, desc->accumulate);
    if (desc->alignment != 0 && !power_of_two(desc->alignment))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: alignment=%u is not a power of two", e->name, desc->alignment);
    if (desc->options && !e->options_size)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: takes no options, but desc.options is set", e->name);
    if (desc->options && desc->options_size == 0)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc.options is set but desc.options_size is 0", e->name);
    if (desc->options && desc->options_size > e->options_size)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: desc.options_size=%zu but %s has %zu bytes in this library",
                       e->name, desc->options_size, e->options_type, e->options_size);
    memset(p, 0, sizeof *p);
    p->ctx = ctx;
    p->decl = e;
    p->desc = *desc;
    if (desc->options) memcpy(p->opts, desc->options, desc->options_size); /* a shorter struct: zero tail */
    p->desc.options = p->opts;
    p->desc.options_size = e->options_size;
    if (p->desc.alignment == 0) p->desc.alignment = 16;
    for (int i = 0; i < e->n_operands; i++) {
        if (e->operands[i].output) p->output_mask |= 1u << i;
        if (e->operands[i].optional) p->optional_mask |= 1u << i;
    }
    for (int i = e->n_operands; i < FG_MAX_OPERANDS; i++) memset(&p->desc.operands[i], 0, sizeof(fg_tensor));
    /* One descriptor rule for every operand given, used by this op's configuration or not:
       an optional operand of rank 0 is absent and never looked at; every other passes the
       structural check (dtype, rank, shapes, strides, overflow) before the lowering reads it,
       and an output must not overlap itself. */
    for (int i = 0; i < e->n_operands; i++) {
        const fg_tensor *t = &p->desc.operands[i];
        if (t->rank == 0 && (p->optional_mask >> i & 1u)) continue;
        FG_TRY(fg_check_any_desc(e->name, e->operands[i].name, t, 0, FG_MAX_RANK));
        if (p->output_mask >> i & 1u) FG_TRY(fg_check_no_self_overlap(e->name, e->operands[i].name, t));
    }
    FG_TRY(e->lower(&p->desc, &p->lowered));
    p->nothing_to_write = true;
    for (int i = 0; i < e->n_operands; i++)
        if ((p->output_mask >> i & 1u) && p->desc.operands[i].rank != 0 && !fg_is_empty(&p->desc.operands[i]))
            p->nothing_to_write = false;
        else if ((p->output_mask >> i & 1u) && p->desc.operands[i].rank == 0 && !(p->optional_mask >> i & 1u))
            p->nothing_to_write = false; /* a required rank-0 output is a scalar */
    p->lowered.ew.align = p->desc.alignment;
    for (int i = 0; i < p->lowered.count; i++) FG_TRY(check_gemm(e, &p->lowered.gemm[i]));
    if (p->lowered.is_elementwise && p->lowered.ew.numel == 0 && !p->lowered.ew.accumulate)
        for (int i = 0; i < e->n_operands; i++) /* a gradient summed over an empty broadcast */
            if ((p->lowered.ew.outputs & p->lowered.ew.present) >> i & 1u && !fg_is_empty(&p->desc.operands[i]))
                p->zero_mask |= 1u << i;

    fg_plan_info *info = &p->info;
    info->op = e->op;
    info->op_name = e->name;
    int first_required = 0; /* the plan's dtype: its first operand that is not optional */
    while (first_required < e->n_operands - 1 && e->operands[first_required].optional) first_required++;
    info->dtype = desc->operands[first_required].dtype;
    info->backend = ctx->backend;
    info->arch = ctx->arch;
    info->precision.storage = info->dtype;
    info->precision.math = accumulator_of(info->dtype);
    info->precision.accumulator = accumulator_of(info->dtype);
    info->precision.deterministic = 1;
    info->precision.bit_stable = 1;
    if (p->lowered.driver) {
        fg_kernel_info k;
        memset(&k, 0, sizeof k);
        k.deterministic = true;
        k.accumulator = accumulator_of(info->dtype);
        FG_TRY(p->lowered.driver(ctx, &p->desc, NULL, p->lowered.priv, &k, NULL, 0, false));
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
    size_t need = 0;
    for (int i = 0; i < e->n_operands; i++) {
        if (!(p->zero_mask >> i & 1u)) continue;
        fg_kernel_info k;
        FG_TRY(zero_fill(ctx, &p->desc.operands[i], &k, NULL, 0, false));
        if (k.workspace_bytes > need) need = k.workspace_bytes;
        fg_gemm_name_append(info->kernel, sizeof info->kernel, &k);
    }
    for (int i = 0; i < p->lowered.count; i++) {
        fg_gemm *g = &p->lowered.gemm[i];
        g->allow_tf32 = (desc->flags & FG_PLAN_ALLOW_TF32) && g->dtype == FG_F32;
        g->align = p->desc.alignment;
        if (g->allow_tf32) info->precision.tf32 = 1;
        fg_kernel_info k;
        FG_TRY(fg_gemm_execute(ctx, g, &k, NULL, 0, false));
        if (!k.deterministic) info->precision.deterministic = info->precision.bit_stable = 0;
        if (k.accumulator == FG_F64) info->precision.accumulator = FG_F64;
        if (k.workspace_bytes > need) need = k.workspace_bytes;
        fg_gemm_name_append(info->kernel, sizeof info->kernel, &k);
    }
    if (need > info->workspace_bytes) info->workspace_bytes = need;
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
    return !(p->desc.operands[i].rank == 0 && (p->optional_mask >> i & 1u));
}

static fg_status check_run(const struct fg_plan *p, const fg_tensor *ops) {
    const fg_op_decl *e = p->decl;
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
                           e->operands[i].name, fg_dtype_name(got->dtype), fg_shape_str(got, b, sizeof b),
                           fg_dtype_name(want->dtype), fg_shape_str(want, a, sizeof a));
        }
        if (got->rank == 0 && (p->optional_mask >> i & 1u) && !present(p, i)) continue; /* absent */
        /* every operand given passes the pointer checks, whether this configuration reads it or not */
        FG_TRY(fg_check_data(p->ctx, e->name, e->operands[i].name, got));
        if (got->data && (uintptr_t)got->data % p->desc.alignment != 0 && fg_numel(got) > 0)
            return fg_fail(FG_ERR_MISALIGNED,
                           "%s: %s.data=%p is not aligned to the %u bytes the plan was made for (desc.alignment)",
                           e->name, e->operands[i].name, got->data, p->desc.alignment);
    }
    for (int i = 0; i < e->n_operands; i++) {
        if (!(p->output_mask >> i & 1u) || !present(p, i)) continue;
        for (int j = 0; j < e->n_operands; j++) {
            if (j == i || !present(p, j)) continue;
            if (e->inplace_ok && !(p->output_mask >> j & 1u) && !p->lowered.ew.broadcast &&
                same_view(&ops[i], &ops[j]))
                continue; /* exactly in place: each element is read before it is written */
            FG_TRY(fg_check_no_overlap(e->name, e->operands[i].name, &ops[i], e->operands[j].name, &ops[j],
                                       p->output_mask >> j & 1u));
        }
    }
    return FG_OK;
}

static void resolve(fg_mat *m, const fg_tensor *ops, size_t es) {
    const void *base = m->operand >= 0 ? ops[m->operand].data : NULL; /* NULL: an empty view */
    m->data = base ? (char *)base + m->offset * (int64_t)es : NULL;
}

static fg_status plan_run(struct fg_plan *p, const fg_tensor *ops, void *ws, size_t ws_bytes) {
    FG_TRY(check_run(p, ops));
    if (p->info.workspace_bytes > 0 && (!ws || ws_bytes < p->info.workspace_bytes))
        return fg_fail(FG_ERR_WORKSPACE, "%s: workspace of %zu bytes given, %zu needed", p->decl->name,
                       ws ? ws_bytes : 0, p->info.workspace_bytes);
    fg_record_reset(p->ctx);
    if (p->nothing_to_write) { /* an empty problem, whatever its other dims: nothing to compute */
        fg_clear_error();
        return FG_OK;
    }
    if (p->lowered.driver) {
        fg_kernel_info k;
        memset(&k, 0, sizeof k);
        FG_TRY(p->lowered.driver(p->ctx, &p->desc, ops, p->lowered.priv, &k, ws, ws_bytes, true));
    }
    for (int i = 0; i < p->decl->n_operands; i++) {
        if (!(p->zero_mask >> i & 1u)) continue;
        fg_kernel_info k;
        FG_TRY(zero_fill(p->ctx, &ops[i], &k, ws, ws_bytes, true));
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
    fg_clear_error();
    return FG_OK;
}

fg_status fg_plan_workspace_size(const fg_plan *plan, size_t *bytes) {
    if (!plan) return fg_fail(FG_ERR_NULL_POINTER, "plan_workspace_size: plan is NULL");
    if (!bytes) return fg_fail(FG_ERR_NULL_POINTER, "plan_workspace_size: bytes is NULL");
    *bytes = plan->info.workspace_bytes;
    fg_clear_error();
    return FG_OK;
}

fg_status fg_plan_can_implement(const fg_plan *plan, const fg_tensor *operands) {
    if (!plan) return fg_fail(FG_ERR_NULL_POINTER, "plan_can_implement: plan is NULL");
    FG_TRY(check_run(plan, operands));
    fg_clear_error();
    return FG_OK;
}

fg_status fg_plan_run(fg_plan *plan, const fg_tensor *operands, void *workspace, size_t workspace_bytes) {
    if (!plan) return fg_fail(FG_ERR_NULL_POINTER, "plan_run: plan is NULL");
    return plan_run(plan, operands, workspace, workspace_bytes);
}

/* The largest power of two (at most 256) that divides every given operand's data pointer (one
 * not aligned to its own elements is left out: the run refuses it, naming it). */
static uint32_t declared_alignment(const fg_tensor *ops, int n) {
    uintptr_t bits = 256;
    for (int i = 0; i < n; i++) {
        const size_t es = fg_dtype_size(ops[i].dtype);
        if (ops[i].data && es && (uintptr_t)ops[i].data % es == 0) bits |= (uintptr_t)ops[i].data;
    }
    return (uint32_t)(bits & (~bits + 1));
}

fg_status fg_run_op(fg_context *ctx, fg_op op, const void *options, const fg_tensor *const *operands, int n,
                    int accumulate, uint32_t flags) {
    return fg_run_op_ws(ctx, op, options, operands, n, accumulate, flags, NULL, 0, NULL);
}

fg_status fg_run_op_ws(fg_context *ctx, fg_op op, const void *options, const fg_tensor *const *operands, int n,
                       int accumulate, uint32_t flags, void *ws, size_t ws_bytes, size_t *need) {
    const fg_op_decl *e = fg_op_find(op, NULL);
    if (!e || n != e->n_operands) return fg_fail(FG_ERR_INTERNAL, "run_op: op %d is not in the op table", (int)op);
    if (!ctx) return fg_fail(FG_ERR_NULL_POINTER, "%s: ctx is NULL", e->name);
    fg_plan_desc desc;
    memset(&desc, 0, sizeof desc);
    desc.op = op;
    desc.accumulate = accumulate ? 1 : 0;
    desc.flags = (flags & ~FG_PLAN_ALLOW_TF32) | (ctx->allow_tf32 ? FG_PLAN_ALLOW_TF32 : 0);
    desc.options = options;
    desc.options_size = options ? e->options_size : 0;
    fg_tensor ops[FG_MAX_OPERANDS];
    memset(ops, 0, sizeof ops);
    for (int i = 0; i < n; i++) {
        if (!operands[i]) {
            if (e->operands[i].optional) continue;
            return fg_fail(FG_ERR_NULL_POINTER, "%s: %s is NULL", e->name, e->operands[i].name);
        }
        ops[i] = *operands[i];
        if (ops[i].rank == 0 && e->operands[i].optional) ops[i].data = NULL;
        desc.operands[i] = ops[i];
        desc.operands[i].data = NULL;
    }
    desc.alignment = declared_alignment(ops, n);
    struct fg_plan p;
    FG_TRY(plan_init(ctx, &desc, &p));
    if (need) { /* planning only: the pointers may not exist yet */
        *need = p.info.workspace_bytes;
        return FG_OK;
    }
    FG_TRY(check_run(&p, ops)); /* before the workspace may grow */
    if (ws) {
        if (ws_bytes < p.info.workspace_bytes)
            return fg_fail(FG_ERR_WORKSPACE, "%s: workspace of %zu bytes given, %zu needed", e->name, ws_bytes,
                           p.info.workspace_bytes);
        return plan_run(&p, ops, ws, p.info.workspace_bytes);
    }
    if (p.info.workspace_bytes) FG_TRY(fg_context_workspace(ctx, p.info.workspace_bytes, &ws));
    return plan_run(&p, ops, ws, p.info.workspace_bytes);
}

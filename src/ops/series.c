/*
 * series.c — front door of the series family: the pieces of a patch-based forecaster that no
 * other family provides. Patching turns a series x [..., L] into overlapping patches
 * [..., P, S] (PatchTST's replicate-pad at the end + unfold) and its backward adds the
 * patches' gradients back onto the steps they read (the overlap-add); the regression loss
 * gives the mean squared / absolute / Huber error of a forecast and its gradient in one pass;
 * the window gather copies a batch's training windows out of a series kept on the device.
 *
 * Validation first, then a driver that hands each step to the backend (src/cpu/series.c,
 * src/cuda/series.cu). The loss is reduced deterministically: fixed chunks of
 * FG_SERIES_CHUNK elements, each chunk's sum into the workspace, the chunks summed in order.
 * The chunking depends only on the element count, so every backend and thread count splits
 * the sum the same way.
 */
#include "../core/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { PF_X, PF_Y, PF_N };
enum { PB_DY, PB_DX, PB_N };
enum { RL_PRED, RL_TARGET, RL_LOSS, RL_DPRED, RL_N };
enum { SW_SERIES, SW_STARTS, SW_Y, SW_N };

static bool has(const fg_tensor *t) { return t->rank != 0; }
static fg_dtype acc_of(fg_dtype t) { return t == FG_F64 ? FG_F64 : FG_F32; }

/* ------------------------------------------------------------------ patching */

typedef struct patch_geom {
    int64_t patch_len, stride, pad_end;
} patch_geom;

static fg_status patch_options(const char *op, const fg_patch_options *o, patch_geom *g) {
    g->patch_len = o->patch_len ? o->patch_len : 16;
    g->stride = o->stride ? o->stride : 8;
    g->pad_end = o->pad_end;
    if (g->patch_len < 1 || g->patch_len > ((int64_t)1 << 40))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: patch.patch_len=%lld must be >= 1 (0 means 16)", op,
                       (long long)o->patch_len);
    if (g->stride < 1 || g->stride > ((int64_t)1 << 40))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: patch.stride=%lld must be >= 1 (0 means 8)", op, (long long)o->stride);
    if (g->pad_end < 0 || g->pad_end > ((int64_t)1 << 40))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: patch.pad_end=%lld must be >= 0", op, (long long)o->pad_end);
    return FG_OK;
}

/* The series x [..., L] and the patches y [..., P, S] agree: same leading dims, P from L. */
static fg_status patch_shapes(const char *op, const char *xn, const fg_tensor *x, const char *yn, const fg_tensor *y,
                              const patch_geom *g, int64_t *P) {
    char a[160], b[160];
    if (x->rank < 1)
        return fg_fail(FG_ERR_SHAPE, "%s: %s must have at least one dim (the time steps)", op, xn);
    if (y->rank != x->rank + 1)
        return fg_fail(FG_ERR_SHAPE, "%s: %s.shape=%s must be %s's shape %s with its last dim split into [P, S]", op, yn,
                       fg_shape_str(y, a, sizeof a), xn, fg_shape_str(x, b, sizeof b));
    for (int d = 0; d < x->rank - 1; d++)
        if (x->shape[d] != y->shape[d])
            return fg_fail(FG_ERR_SHAPE, "%s: %s.shape=%s and %s.shape=%s differ in dim %d", op, yn,
                           fg_shape_str(y, a, sizeof a), xn, fg_shape_str(x, b, sizeof b), d);
    const int64_t L = x->shape[x->rank - 1];
    if (L < 1) return fg_fail(FG_ERR_SHAPE, "%s: %s has no time steps (L = 0)", op, xn);
    if (L + g->pad_end < g->patch_len)
        return fg_fail(FG_ERR_SHAPE, "%s: L=%lld plus pad_end=%lld is shorter than one patch (patch_len=%lld)", op,
                       (long long)L, (long long)g->pad_end, (long long)g->patch_len);
    *P = (L + g->pad_end - g->patch_len) / g->stride + 1;
    if (y->shape[x->rank - 1] != *P || y->shape[x->rank] != g->patch_len)
        return fg_fail(FG_ERR_SHAPE,
                       "%s: %s.shape=%s but L=%lld, patch_len=%lld, stride=%lld, pad_end=%lld give [..., %lld, %lld]",
                       op, yn, fg_shape_str(y, a, sizeof a), (long long)L, (long long)g->patch_len,
                       (long long)g->stride, (long long)g->pad_end, (long long)*P, (long long)g->patch_len);
    return FG_OK;
}

/* The strided series view: leading dims with their strides (rows), the step stride. */
static void series_view(const fg_tensor *x, fg_series_call *c) {
    int64_t st[FG_MAX_RANK];
    fg_tensor_strides(x, st);
    c->lead_rank = x->rank - 1;
    c->rows = 1;
    for (int d = 0; d < x->rank - 1; d++) {
        c->lead_shape[d] = x->shape[d];
        c->lead_stride[d] = st[d];
        c->rows *= x->shape[d];
    }
    c->t_stride = st[x->rank - 1];
}

/* ------------------------------------------------------------------ regression loss */

static const char *const loss_names[] = {"mse", "mae", "huber"};

static fg_status loss_options(const char *op, const fg_regression_loss_options *o) {
    if ((int)o->kind < 0 || (int)o->kind > FG_LOSS_HUBER)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: loss.kind=%d is not an fg_loss_kind", op, (int)o->kind);
    if ((int)o->reduction < 0 || (int)o->reduction > FG_REDUCTION_NONE)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: loss.reduction=%d is not an fg_reduction", op, (int)o->reduction);
    if (!isfinite(o->delta) || o->delta < 0)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: loss.delta=%g must be finite and > 0 (0 means 1)", op, o->delta);
    if (!isfinite(o->grad_scale))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: loss.grad_scale=%g must be finite (0 means 1)", op, o->grad_scale);
    return FG_OK;
}

static bool same_shape(const fg_tensor *a, const fg_tensor *b) {
    if (a->rank != b->rank) return false;
    for (int d = 0; d < a->rank; d++)
        if (a->shape[d] != b->shape[d]) return false;
    return true;
}

/* ------------------------------------------------------------------ the driver */

static const fg_regression_loss_options *loss_opts(const fg_plan_desc *d) { return d->options; }

/* Plans (run = false: names the steps, sizes the workspace) or runs one op. */
static fg_status driver(fg_context *ctx, const fg_plan_desc *d, const fg_tensor *ops, void *priv, fg_kernel_info *info,
                        void *ws, size_t ws_bytes, bool run) {
    (void)priv;
    const fg_tensor *o = run ? ops : d->operands;
    fg_series_call c;
    memset(&c, 0, sizeof c);
    const char *name = d->op == FG_OP_PATCH_FORWARD    ? "patch_forward"
                       : d->op == FG_OP_PATCH_BACKWARD ? "patch_backward"
                       : d->op == FG_OP_SERIES_WINDOWS ? "series_windows"
                                                       : "regression_loss";
    const fg_dtype dt = o[0].dtype;
    if (dt == FG_F64 && !ctx->be->f64_kernels)
        return fg_fail(FG_ERR_UNSUPPORTED, "%s: the %s backend has no f64 kernels for it (f64 runs on the CPU)", name,
                       ctx->be->name);
    c.dtype = dt;
    c.acc = acc_of(dt);
    c.accumulate = d->accumulate != 0;
    if (d->op == FG_OP_SERIES_WINDOWS) {
        const fg_tensor *x = &o[SW_SERIES], *y = &o[SW_Y];
        int64_t st[FG_MAX_RANK];
        fg_tensor_strides(x, st);
        c.step = FG_SERIES_WINDOWS;
        c.T = x->shape[0], c.C = x->shape[1], c.src_rs = st[0], c.src_cs = st[1];
        c.rows = y->shape[0], c.W = y->shape[1];
        c.src = x->data;
        c.starts = o[SW_STARTS].data;
        c.starts_dtype = o[SW_STARTS].dtype;
        c.dst = y->data;
    } else if (d->op == FG_OP_PATCH_FORWARD || d->op == FG_OP_PATCH_BACKWARD) {
        patch_geom g;
        FG_TRY(patch_options(name, d->options, &g));
        const bool fwd = d->op == FG_OP_PATCH_FORWARD;
        const fg_tensor *x = fwd ? &o[PF_X] : &o[PB_DX], *y = fwd ? &o[PF_Y] : &o[PB_DY];
        c.step = fwd ? FG_SERIES_PATCH : FG_SERIES_UNPATCH;
        series_view(x, &c);
        c.L = x->shape[x->rank - 1];
        c.S = g.patch_len;
        c.stride = g.stride;
        c.P = y->shape[y->rank - 2];
        c.src = fwd ? x->data : y->data;
        c.dst = fwd ? y->data : x->data;
    } else {
        const fg_regression_loss_options *lo = loss_opts(d);
        c.step = FG_SERIES_LOSS;
        c.kind = (int)lo->kind;
        c.reduction = (int)lo->reduction;
        c.delta = lo->delta > 0 ? lo->delta : 1.0;
        c.n = fg_numel(&o[RL_PRED]);
        const double gs = lo->grad_scale != 0 ? lo->grad_scale : 1.0;
        c.grad_scale = lo->reduction == FG_REDUCTION_MEAN && c.n > 0 ? gs / (double)c.n : gs;
        c.out_scale = lo->reduction == FG_REDUCTION_MEAN && c.n > 0 ? 1.0 / (double)c.n : 1.0;
        c.pred = o[RL_PRED].data;
        c.target = o[RL_TARGET].data;
        c.loss = o[RL_LOSS].data;
        c.dpred = has(&o[RL_DPRED]) ? o[RL_DPRED].data : NULL;
        c.want_dpred = has(&o[RL_DPRED]);
        c.dpred_dtype = has(&o[RL_DPRED]) ? o[RL_DPRED].dtype : dt;
        c.chunks = (c.n + FG_SERIES_CHUNK - 1) / FG_SERIES_CHUNK;
        if (lo->reduction != FG_REDUCTION_NONE) {
            c.partials = ws;
            c.need = (size_t)(c.chunks > 0 ? c.chunks : 1) * fg_dtype_size(c.acc);
        }
    }
    if (!run) {
        c.need = 0;
        FG_TRY(ctx->be->series(ctx, &c, false));
        if (c.step == FG_SERIES_LOSS && c.reduction != FG_REDUCTION_NONE) {
            fg_series_call f = c;
            f.step = FG_SERIES_LOSS_FINISH;
            f.need = 0;
            f.name[0] = 0;
            FG_TRY(ctx->be->series(ctx, &f, false));
            fg_name_append(c.name, sizeof c.name, f.name);
            c.need = (size_t)(c.chunks > 0 ? c.chunks : 1) * fg_dtype_size(c.acc);
        }
        snprintf(info->name, sizeof info->name, "%s", c.name);
        info->workspace_bytes = c.need;
        info->deterministic = true;
        info->accumulator = c.acc;
        return FG_OK;
    }
    if (c.step == FG_SERIES_LOSS && c.reduction != FG_REDUCTION_NONE && ws_bytes < c.need)
        return fg_fail(FG_ERR_WORKSPACE, "%s: workspace of %zu bytes given, %zu needed", name, ws_bytes, c.need);
    FG_TRY(ctx->be->series(ctx, &c, true));
    if (c.step == FG_SERIES_LOSS && c.reduction != FG_REDUCTION_NONE) {
        c.step = FG_SERIES_LOSS_FINISH;
        FG_TRY(ctx->be->series(ctx, &c, true));
    }
    return FG_OK;
}

/* ------------------------------------------------------------------ lowering (validation) */

static fg_status check_float(const char *op, const char *what, const fg_tensor *t) {
    if (!fg_is_float(t->dtype))
        return fg_fail(FG_ERR_DTYPE, "%s: %s.dtype=%s but it must be f32, f16, bf16 or f64", op, what,
                       fg_dtype_name(t->dtype));
    return FG_OK;
}

static fg_status lower_patch_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "patch_forward";
    const fg_tensor *x = &d->operands[PF_X], *y = &d->operands[PF_Y];
    patch_geom g;
    int64_t P;
    FG_TRY(patch_options(op, d->options, &g));
    FG_TRY(fg_check_desc(op, "x", x, 1, FG_MAX_RANK - 1));
    FG_TRY(fg_check_desc(op, "y", y, 2, FG_MAX_RANK));
    FG_TRY(check_float(op, "x", x));
    if (y->dtype != x->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: y.dtype=%s but x.dtype=%s", op, fg_dtype_name(y->dtype), fg_dtype_name(x->dtype));
    FG_TRY(patch_shapes(op, "x", x, "y", y, &g, &P));
    FG_TRY(fg_check_contiguous(op, "y", y));
    if (d->accumulate) return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate must be 0", op);
    memset(out, 0, sizeof *out);
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_patch_backward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "patch_backward";
    const fg_tensor *dy = &d->operands[PB_DY], *dx = &d->operands[PB_DX];
    patch_geom g;
    int64_t P;
    FG_TRY(patch_options(op, d->options, &g));
    FG_TRY(fg_check_desc(op, "dy", dy, 2, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "dx", dx, 1, FG_MAX_RANK - 1));
    FG_TRY(check_float(op, "dy", dy));
    if (dx->dtype != dy->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: dx.dtype=%s but dy.dtype=%s", op, fg_dtype_name(dx->dtype),
                       fg_dtype_name(dy->dtype));
    FG_TRY(patch_shapes(op, "dx", dx, "dy", dy, &g, &P));
    FG_TRY(fg_check_contiguous(op, "dy", dy));
    memset(out, 0, sizeof *out);
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_loss(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "regression_loss";
    const fg_tensor *o = d->operands;
    const fg_regression_loss_options *lo = loss_opts(d);
    FG_TRY(loss_options(op, lo));
    FG_TRY(fg_check_desc(op, "pred", &o[RL_PRED], 0, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "target", &o[RL_TARGET], 0, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "loss", &o[RL_LOSS], 0, FG_MAX_RANK));
    FG_TRY(check_float(op, "pred", &o[RL_PRED]));
    const fg_dtype dt = o[RL_PRED].dtype, acc = acc_of(dt);
    char a[160], b[160];
    if (o[RL_TARGET].dtype != dt)
        return fg_fail(FG_ERR_DTYPE, "%s: target.dtype=%s but pred.dtype=%s", op, fg_dtype_name(o[RL_TARGET].dtype),
                       fg_dtype_name(dt));
    if (!same_shape(&o[RL_TARGET], &o[RL_PRED]))
        return fg_fail(FG_ERR_SHAPE, "%s: target.shape=%s but pred.shape=%s", op, fg_shape_str(&o[RL_TARGET], a, sizeof a),
                       fg_shape_str(&o[RL_PRED], b, sizeof b));
    FG_TRY(fg_check_contiguous(op, "pred", &o[RL_PRED]));
    FG_TRY(fg_check_contiguous(op, "target", &o[RL_TARGET]));
    if (o[RL_LOSS].dtype != acc)
        return fg_fail(FG_ERR_DTYPE, "%s: loss.dtype=%s but it must be %s for %s pred", op,
                       fg_dtype_name(o[RL_LOSS].dtype), fg_dtype_name(acc), fg_dtype_name(dt));
    if (lo->reduction == FG_REDUCTION_NONE) {
        if (!same_shape(&o[RL_LOSS], &o[RL_PRED]))
            return fg_fail(FG_ERR_SHAPE, "%s: loss.shape=%s but reduction none needs pred's shape %s", op,
                           fg_shape_str(&o[RL_LOSS], a, sizeof a), fg_shape_str(&o[RL_PRED], b, sizeof b));
        FG_TRY(fg_check_contiguous(op, "loss", &o[RL_LOSS]));
    } else if (fg_numel(&o[RL_LOSS]) != 1) {
        return fg_fail(FG_ERR_SHAPE, "%s: loss.shape=%s but a reduced loss has one element", op,
                       fg_shape_str(&o[RL_LOSS], a, sizeof a));
    }
    if (has(&o[RL_DPRED])) {
        FG_TRY(fg_check_desc(op, "dpred", &o[RL_DPRED], 0, FG_MAX_RANK));
        if (o[RL_DPRED].dtype != dt && o[RL_DPRED].dtype != FG_F32)
            return fg_fail(FG_ERR_DTYPE, "%s: dpred.dtype=%s but it must be pred's (%s) or f32", op,
                           fg_dtype_name(o[RL_DPRED].dtype), fg_dtype_name(dt));
        if (!same_shape(&o[RL_DPRED], &o[RL_PRED]))
            return fg_fail(FG_ERR_SHAPE, "%s: dpred.shape=%s but pred.shape=%s", op,
                           fg_shape_str(&o[RL_DPRED], a, sizeof a), fg_shape_str(&o[RL_PRED], b, sizeof b));
        FG_TRY(fg_check_contiguous(op, "dpred", &o[RL_DPRED]));
    } else if (d->accumulate) {
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate adds into dpred, which is absent", op);
    }
    memset(out, 0, sizeof *out);
    out->driver = driver;
    return FG_OK;
}

static fg_status lower_windows(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "series_windows";
    const fg_tensor *x = &d->operands[SW_SERIES], *st = &d->operands[SW_STARTS], *y = &d->operands[SW_Y];
    char a[160], b[160];
    FG_TRY(fg_check_desc(op, "series", x, 2, 2));
    FG_TRY(check_float(op, "series", x));
    FG_TRY(fg_check_any_desc(op, "starts", st, 1, 1));
    if (st->dtype != FG_I32 && st->dtype != FG_I64)
        return fg_fail(FG_ERR_DTYPE, "%s: starts.dtype=%s but it must be i32 or i64", op, fg_dtype_name(st->dtype));
    FG_TRY(fg_check_contiguous(op, "starts", st));
    FG_TRY(fg_check_desc(op, "y", y, 3, 3));
    if (y->dtype != x->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: y.dtype=%s but series.dtype=%s", op, fg_dtype_name(y->dtype),
                       fg_dtype_name(x->dtype));
    if (y->shape[0] != st->shape[0] || y->shape[2] != x->shape[1])
        return fg_fail(FG_ERR_SHAPE, "%s: y.shape=%s but starts has %lld windows of series.shape=%s (want [%lld, W, %lld])",
                       op, fg_shape_str(y, a, sizeof a), (long long)st->shape[0], fg_shape_str(x, b, sizeof b),
                       (long long)st->shape[0], (long long)x->shape[1]);
    if (y->shape[1] > x->shape[0])
        return fg_fail(FG_ERR_SHAPE, "%s: windows of W=%lld steps from a series of T=%lld", op, (long long)y->shape[1],
                       (long long)x->shape[0]);
    FG_TRY(fg_check_contiguous(op, "y", y));
    if (d->accumulate) return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate must be 0", op);
    memset(out, 0, sizeof *out);
    out->driver = driver;
    return FG_OK;
}

#define IN(n) {n, false, false}
#define OUT(n) {n, true, false}
#define OUT_OPT(n) {n, true, true}
static const fg_op_decl ops[] = {
    {FG_OP_PATCH_FORWARD, "patch_forward", PF_N, {[PF_X] = IN("x"), [PF_Y] = OUT("y")}, 0, "fg_patch_options",
     sizeof(fg_patch_options), false, lower_patch_forward},
    {FG_OP_PATCH_BACKWARD, "patch_backward", PB_N, {[PB_DY] = IN("dy"), [PB_DX] = OUT("dx")}, 0, "fg_patch_options",
     sizeof(fg_patch_options), false, lower_patch_backward},
    {FG_OP_REGRESSION_LOSS, "regression_loss", RL_N,
     {[RL_PRED] = IN("pred"), [RL_TARGET] = IN("target"), [RL_LOSS] = OUT("loss"), [RL_DPRED] = OUT_OPT("dpred")}, 0,
     "fg_regression_loss_options", sizeof(fg_regression_loss_options), false, lower_loss},
    {FG_OP_SERIES_WINDOWS, "series_windows", SW_N, {[SW_SERIES] = IN("series"), [SW_STARTS] = IN("starts"), [SW_Y] = OUT("y")},
     0, NULL, 0, false, lower_windows},
};
#undef IN
#undef OUT
#undef OUT_OPT

const fg_family fg_family_series = {"series", sizeof ops / sizeof ops[0], ops};

const char *fg_series_step_name(const fg_series_call *c) {
    switch (c->step) {
    case FG_SERIES_PATCH: return "patch";
    case FG_SERIES_UNPATCH: return "unpatch";
    case FG_SERIES_LOSS: return c->kind >= 0 && c->kind <= FG_LOSS_HUBER ? loss_names[c->kind] : "loss";
    case FG_SERIES_LOSS_FINISH: return "loss_finish";
    case FG_SERIES_WINDOWS: return "windows";
    }
    return "?";
}

/* ------------------------------------------------------------------ one-call functions */

fg_status fg_patch_forward(fg_context *ctx, const fg_patch_options *opt, const fg_tensor *x, const fg_tensor *y) {
    const fg_tensor *args[PF_N] = {x, y};
    return fg_run_op(ctx, FG_OP_PATCH_FORWARD, opt, args, PF_N, 0, 0);
}

fg_status fg_patch_backward(fg_context *ctx, const fg_patch_options *opt, const fg_tensor *dy, const fg_tensor *dx,
                            int accumulate) {
    const fg_tensor *args[PB_N] = {dy, dx};
    return fg_run_op(ctx, FG_OP_PATCH_BACKWARD, opt, args, PB_N, accumulate, 0);
}

fg_status fg_regression_loss(fg_context *ctx, const fg_regression_loss_options *opt, const fg_tensor *pred,
                             const fg_tensor *target, const fg_tensor *loss, const fg_tensor *dpred, int accumulate) {
    const fg_tensor *args[RL_N] = {pred, target, loss, dpred};
    return fg_run_op(ctx, FG_OP_REGRESSION_LOSS, opt, args, RL_N, accumulate, 0);
}

fg_status fg_series_windows(fg_context *ctx, const fg_tensor *series, const fg_tensor *starts, const fg_tensor *y) {
    const fg_tensor *args[SW_N] = {series, starts, y};
    return fg_run_op(ctx, FG_OP_SERIES_WINDOWS, NULL, args, SW_N, 0, 0);
}

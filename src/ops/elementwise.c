/*
 * elementwise.c — front door of the parameterized elementwise family: unary ops with
 * parameters (scale, pow, leaky_relu, elu, clamp, softcap) and binary ones (lerp with
 * a scalar or tensor weight, axpby), forward and backward, through the plan API.
 * Validates parameters (NaN, clamp lo > hi, softcap c <= 0), dtypes, numpy-style
 * broadcasting and aliasing, then lowers to one fg_ew problem: the full shape, each
 * operand's strides over it (0 where broadcast), which outputs are sums over broadcast
 * dims. src/cpu/elementwise.c and src/cuda/elementwise.cu run it.
 */
#include "../core/internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

enum { UF_X, UF_Y };
enum { UB_DY, UB_X, UB_DX };
enum { BF_A, BF_B, BF_W, BF_Y };
enum { BB_DY, BB_A, BB_B, BB_W, BB_DA, BB_DB, BB_DW };

static const char *const unary_names[] = {"scale", "pow", "leaky_relu", "elu", "clamp", "softcap"};
static const char *const binary_names[] = {"lerp", "axpby"};

static const fg_elementwise_options *opts(const fg_plan_desc *d) { return d->options; }

static fg_status check_scalars(const char *op, const fg_plan_desc *d) {
    const double *s = opts(d)->scalars;
    const int kind = opts(d)->kind;
    bool unary = d->op == FG_OP_UNARY_FORWARD || d->op == FG_OP_UNARY_BACKWARD;
    if (unary && (kind < 0 || kind > FG_UNARY_SOFTCAP))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: kind=%d is not an fg_unary", op, kind);
    if (!unary && (kind < 0 || kind > FG_BINARY_AXPBY))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: kind=%d is not an fg_binary", op, kind);
    const char *name = unary ? unary_names[kind] : binary_names[kind];
    if (unary && kind == FG_UNARY_CLAMP) {
        if (isnan(s[0]) || isnan(s[1]))
            return fg_fail(FG_ERR_INVALID_VALUE, "%s: clamp bounds lo=%g hi=%g must not be NaN", op, s[0], s[1]);
        if (s[0] > s[1])
            return fg_fail(FG_ERR_INVALID_VALUE, "%s: clamp lo=%g is greater than hi=%g", op, s[0], s[1]);
        return FG_OK;
    }
    int used = (!unary && kind == FG_BINARY_AXPBY) ? 2 : 1;
    for (int i = 0; i < used; i++)
        if (!isfinite(s[i]))
            return fg_fail(FG_ERR_INVALID_VALUE, "%s: %s parameter scalars[%d]=%g must be finite", op, name, i, s[i]);
    if (unary && kind == FG_UNARY_SOFTCAP && !(s[0] > 0))
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: softcap c=%g must be positive", op, s[0]);
    return FG_OK;
}

/* Maps operand i (shape broadcastable to the full shape) onto it. */
static fg_status map_operand(const char *op, const char *what, const fg_tensor *t, const fg_tensor *full,
                             fg_ew *e, int i, bool output) {
    char a[160], b[160];
    if (t->rank > full->rank)
        return fg_fail(FG_ERR_SHAPE, "%s: %s.shape=%s has more dims than %s", op, what, fg_shape_str(t, a, sizeof a),
                       fg_shape_str(full, b, sizeof b));
    int64_t st[FG_MAX_RANK];
    fg_tensor_strides(t, st);
    const int off = full->rank - t->rank;
    for (int d = 0; d < full->rank; d++) {
        int64_t n = d < off ? 1 : t->shape[d - off], s = d < off ? 0 : st[d - off];
        if (n != full->shape[d] && n != 1)
            return fg_fail(FG_ERR_SHAPE, "%s: %s.shape=%s does not broadcast to %s", op, what,
                           fg_shape_str(t, a, sizeof a), fg_shape_str(full, b, sizeof b));
        if (output && n > 1 && s == 0)
            return fg_fail(FG_ERR_SHAPE, "%s: output %s has a zero stride in dim %d", op, what, d - off);
        bool bcast = n == 1 && full->shape[d] != 1;
        e->stride[i][d] = bcast ? 0 : s;
        if (bcast) {
            e->broadcast = true;
            if (output) e->reduced |= 1u << i;
        }
    }
    e->present |= 1u << i;
    if (output) e->outputs |= 1u << i;
    return FG_OK;
}

/* Merges dims that every operand walks contiguously, drops size-1 dims. */
static void coalesce(fg_ew *e) {
    int r = 0;
    int64_t shape[FG_MAX_RANK], stride[FG_EW_MAX_OPERANDS][FG_MAX_RANK];
    for (int d = 0; d < e->rank; d++) {
        if (e->shape[d] == 1) continue;
        bool merge = r > 0;
        for (int i = 0; merge && i < e->n_operands; i++)
            if (e->present >> i & 1u) merge = stride[i][r - 1] == e->stride[i][d] * e->shape[d];
        if (merge) {
            shape[r - 1] *= e->shape[d];
            for (int i = 0; i < e->n_operands; i++) stride[i][r - 1] = e->stride[i][d];
        } else {
            shape[r] = e->shape[d];
            for (int i = 0; i < e->n_operands; i++) stride[i][r] = e->stride[i][d];
            r++;
        }
    }
    e->rank = r;
    for (int d = 0; d < r; d++) {
        e->shape[d] = shape[d];
        for (int i = 0; i < e->n_operands; i++) e->stride[i][d] = stride[i][d];
    }
}

/* Lowers with the operands in `present` (the op decides: a rank-0 operand is a scalar
 * tensor where it is required, absent where it is optional). */
static fg_status lower_common(const char *op, const fg_plan_desc *d, const fg_tensor *full, int n_operands,
                              unsigned present, unsigned outputs, fg_lowered *out) {
    FG_TRY(check_scalars(op, d));
    const fg_op_decl *decl = fg_op_find(d->op, NULL);
    memset(out, 0, sizeof *out);
    out->is_elementwise = true;
    fg_ew *e = &out->ew;
    e->dtype = full->dtype;
    e->op = d->op;
    e->kind = opts(d)->kind;
    memcpy(e->s, opts(d)->scalars, sizeof e->s);
    e->accumulate = d->accumulate != 0;
    e->n_operands = n_operands;
    e->rank = full->rank;
    for (int k = 0; k < full->rank; k++) e->shape[k] = full->shape[k];
    e->numel = fg_numel(full);
    for (int i = 0; i < n_operands; i++) {
        if (!(present >> i & 1u)) continue;
        const fg_tensor *t = &d->operands[i];
        FG_TRY(fg_check_desc(op, decl->operands[i].name, t, 0, FG_MAX_RANK));
        if (t->dtype != full->dtype)
            return fg_fail(FG_ERR_DTYPE, "%s: %s.dtype=%s but %s.dtype=%s", op, decl->operands[i].name,
                           fg_dtype_name(t->dtype), decl->operands[0].name, fg_dtype_name(full->dtype));
        FG_TRY(map_operand(op, decl->operands[i].name, t, full, e, i, outputs >> i & 1u));
    }
    coalesce(e);
    return FG_OK;
}

static fg_status same_shape(const char *op, const fg_tensor *g, const char *gn, const fg_tensor *in,
                            const char *inn) {
    bool same = g->rank == in->rank;
    for (int k = 0; same && k < g->rank; k++) same = g->shape[k] == in->shape[k];
    char a[160], b[160];
    if (!same)
        return fg_fail(FG_ERR_SHAPE, "%s: %s.shape=%s but %s.shape=%s", op, gn, fg_shape_str(g, a, sizeof a), inn,
                       fg_shape_str(in, b, sizeof b));
    return FG_OK;
}

static fg_status lower_unary_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "unary_forward";
    FG_TRY(fg_check_desc(op, "y", &d->operands[UF_Y], 0, FG_MAX_RANK));
    if (d->accumulate) return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate must be 0", op);
    return lower_common(op, d, &d->operands[UF_Y], 2, 3u, 1u << UF_Y, out);
}

static fg_status lower_unary_backward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "unary_backward";
    const fg_tensor *dy = &d->operands[UB_DY], *x = &d->operands[UB_X], *dx = &d->operands[UB_DX];
    FG_TRY(fg_check_desc(op, "dy", dy, 0, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "dx", dx, 0, FG_MAX_RANK));
    unsigned present = (1u << UB_DY) | (1u << UB_DX);
    if (opts(d)->kind != FG_UNARY_SCALE && x->rank == 0) /* rank 0 is an absent optional operand */
        return fg_fail(FG_ERR_NULL_POINTER, "%s: x is absent but %s's gradient reads it", op,
                       unary_names[opts(d)->kind >= 0 && opts(d)->kind <= FG_UNARY_SOFTCAP ? opts(d)->kind : 0]);
    if (opts(d)->kind != FG_UNARY_SCALE || x->rank != 0) { /* scale does not read x */
        FG_TRY(fg_check_desc(op, "x", x, 0, FG_MAX_RANK));
        FG_TRY(same_shape(op, dx, "dx", x, "x"));
        present |= 1u << UB_X;
    }
    return lower_common(op, d, dy, 3, present, 1u << UB_DX, out);
}

static fg_status lower_binary_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "binary_forward";
    FG_TRY(fg_check_desc(op, "y", &d->operands[BF_Y], 0, FG_MAX_RANK));
    if (d->accumulate) return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate must be 0", op);
    bool has_w = d->operands[BF_W].rank != 0;
    if (opts(d)->kind == FG_BINARY_AXPBY && has_w) return fg_fail(FG_ERR_INVALID_VALUE, "%s: axpby takes no w tensor", op);
    unsigned present = (1u << BF_A) | (1u << BF_B) | (1u << BF_Y) | (has_w ? 1u << BF_W : 0);
    return lower_common(op, d, &d->operands[BF_Y], 4, present, 1u << BF_Y, out);
}

static fg_status lower_binary_backward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "binary_backward";
    const fg_tensor *t = d->operands;
    FG_TRY(fg_check_desc(op, "dy", &t[BB_DY], 0, FG_MAX_RANK));
    bool lerp = opts(d)->kind == FG_BINARY_LERP, has_w = t[BB_W].rank != 0;
    bool want_da = t[BB_DA].rank != 0, want_db = t[BB_DB].rank != 0, want_dw = t[BB_DW].rank != 0;
    if (!want_da && !want_db && !want_dw)
        return fg_fail(FG_ERR_INVALID_VALUE, "%s: no gradient requested (da, db and dw are all absent)", op);
    if (!lerp && (has_w || want_dw)) return fg_fail(FG_ERR_INVALID_VALUE, "%s: axpby has no w and no dw", op);
    if (want_dw && !has_w) return fg_fail(FG_ERR_INVALID_VALUE, "%s: dw requested but w is a scalar", op);
    if (want_dw && (t[BB_A].rank == 0 || t[BB_B].rank == 0))
        return fg_fail(FG_ERR_NULL_POINTER, "%s: dw needs a and b", op);
    const fg_operand_decl *names = fg_op_find(d->op, NULL)->operands;
    const int pairs[3][2] = {{BB_DA, BB_A}, {BB_DB, BB_B}, {BB_DW, BB_W}};
    for (int p = 0; p < 3; p++) /* a gradient has its input's shape */
        if (t[pairs[p][0]].rank != 0 && t[pairs[p][1]].rank != 0)
            FG_TRY(same_shape(op, &t[pairs[p][0]], names[pairs[p][0]].name, &t[pairs[p][1]],
                                  names[pairs[p][1]].name));
    unsigned present = 1u << BB_DY;
    if (has_w) present |= 1u << BB_W;
    if (want_dw) present |= (1u << BB_A) | (1u << BB_B); /* a and b are read only for dw */
    if (want_da) present |= 1u << BB_DA;
    if (want_db) present |= 1u << BB_DB;
    if (want_dw) present |= 1u << BB_DW;
    unsigned outs = (1u << BB_DA) | (1u << BB_DB) | (1u << BB_DW);
    return lower_common(op, d, &t[BB_DY], 7, present, outs, out);
}

#define OPTS "fg_elementwise_options", sizeof(fg_elementwise_options)
static const fg_op_decl ops[] = {
    {FG_OP_UNARY_FORWARD, "unary_forward", 2, {[UF_X] = {"x", false, false}, [UF_Y] = {"y", true, false}}, 0, OPTS,
     true, lower_unary_forward},
    {FG_OP_UNARY_BACKWARD, "unary_backward", 3,
     {[UB_DY] = {"dy", false, false}, [UB_X] = {"x", false, true}, [UB_DX] = {"dx", true, false}}, 0, OPTS, true,
     lower_unary_backward},
    {FG_OP_BINARY_FORWARD, "binary_forward", 4,
     {[BF_A] = {"a", false, false}, [BF_B] = {"b", false, false}, [BF_W] = {"w", false, true},
      [BF_Y] = {"y", true, false}},
     0, OPTS, true, lower_binary_forward},
    {FG_OP_BINARY_BACKWARD, "binary_backward", 7,
     {[BB_DY] = {"dy", false, false}, [BB_A] = {"a", false, true}, [BB_B] = {"b", false, true},
      [BB_W] = {"w", false, true}, [BB_DA] = {"da", true, true}, [BB_DB] = {"db", true, true},
      [BB_DW] = {"dw", true, true}},
     0, OPTS, true, lower_binary_backward},
};
#undef OPTS

const fg_family fg_family_elementwise = {"elementwise", sizeof ops / sizeof ops[0], ops};

/* ------------------------------------------------------------------ one-call forms */

static fg_status run_ew(fg_context *ctx, fg_op op, const fg_tensor *const *args, int n, int accumulate, int kind,
                        const double *scalars, int n_scalars) {
    fg_elementwise_options o;
    memset(&o, 0, sizeof o);
    o.kind = kind;
    for (int i = 0; i < n_scalars && i < 4; i++) o.scalars[i] = scalars[i];
    return fg_run_op(ctx, op, &o, args, n, accumulate, 0);
}

static int n_scalars(fg_op op, int kind) {
    if (op == FG_OP_UNARY_FORWARD || op == FG_OP_UNARY_BACKWARD) return kind == FG_UNARY_CLAMP ? 2 : 1;
    return kind == FG_BINARY_AXPBY ? 2 : 1;
}

fg_status fg_unary_forward(fg_context *ctx, fg_unary kind, const double *scalars, const fg_tensor *x,
                           const fg_tensor *y) {
    if (!scalars) return fg_fail(FG_ERR_NULL_POINTER, "unary_forward: scalars is NULL");
    const fg_tensor *args[] = {x, y};
    return run_ew(ctx, FG_OP_UNARY_FORWARD, args, 2, 0, (int)kind, scalars,
                          n_scalars(FG_OP_UNARY_FORWARD, (int)kind));
}

fg_status fg_unary_backward(fg_context *ctx, fg_unary kind, const double *scalars, const fg_tensor *dy,
                            const fg_tensor *x, const fg_tensor *dx, int accumulate) {
    if (!scalars) return fg_fail(FG_ERR_NULL_POINTER, "unary_backward: scalars is NULL");
    const fg_tensor *args[] = {dy, x, dx};
    return run_ew(ctx, FG_OP_UNARY_BACKWARD, args, 3, accumulate, (int)kind, scalars,
                          n_scalars(FG_OP_UNARY_BACKWARD, (int)kind));
}

fg_status fg_lerp_forward(fg_context *ctx, const fg_tensor *a, const fg_tensor *b, const fg_tensor *w,
                          double w_scalar, const fg_tensor *y) {
    const fg_tensor *args[] = {a, b, w, y};
    return run_ew(ctx, FG_OP_BINARY_FORWARD, args, 4, 0, FG_BINARY_LERP, &w_scalar, 1);
}

fg_status fg_lerp_backward(fg_context *ctx, const fg_tensor *dy, const fg_tensor *a, const fg_tensor *b,
                           const fg_tensor *w, double w_scalar, const fg_tensor *da, const fg_tensor *db,
                           const fg_tensor *dw, int accumulate) {
    const fg_tensor *args[] = {dy, a, b, w, da, db, dw};
    return run_ew(ctx, FG_OP_BINARY_BACKWARD, args, 7, accumulate, FG_BINARY_LERP, &w_scalar, 1);
}

fg_status fg_axpby_forward(fg_context *ctx, const fg_tensor *a, const fg_tensor *b, double alpha, double beta,
                           const fg_tensor *y) {
    const double s[2] = {alpha, beta};
    const fg_tensor *args[] = {a, b, NULL, y};
    return run_ew(ctx, FG_OP_BINARY_FORWARD, args, 4, 0, FG_BINARY_AXPBY, s, 2);
}

fg_status fg_axpby_backward(fg_context *ctx, const fg_tensor *dy, double alpha, double beta, const fg_tensor *da,
                            const fg_tensor *db, int accumulate) {
    const double s[2] = {alpha, beta};
    const fg_tensor *args[] = {dy, NULL, NULL, NULL, da, db, NULL};
    return run_ew(ctx, FG_OP_BINARY_BACKWARD, args, 7, accumulate, FG_BINARY_AXPBY, s, 2);
}

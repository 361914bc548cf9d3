/*
 * linear.c — front door of the Linear family: y = x·wᵀ + b and its three split
 * backward kernels (input, weight, bias), each callable alone. Validates every
 * argument and lowers the op to one GEMM primitive (src/core/gemm.c), which each
 * backend runs: a single row becomes a GEMV, the bias gradient a deterministic
 * column sum (a GEMV against a vector of ones).
 */
#include "../core/internal.h"

#include <string.h>

enum { LF_X, LF_W, LF_B, LF_Y };
enum { LBI_DY, LBI_W, LBI_DX };
enum { LBW_DY, LBW_X, LBW_DW };
enum { LBB_DY, LBB_DB };

/* A [..., C] tensor as a matrix of rows: the leading dims must collapse. */
static fg_status rows_view(const char *op, const char *what, const fg_tensor *t, int operand,
                           int64_t *rows, fg_mat *m) {
    int64_t stride[FG_MAX_RANK], rs;
    fg_tensor_strides(t, stride);
    if (!fg_collapse_dims(t, t->rank - 1, rows, &rs))
        return fg_fail(FG_ERR_UNSUPPORTED,
                       "%s: the leading dims of %s do not collapse into one stride; make it contiguous",
                       op, what);
    memset(m, 0, sizeof *m);
    m->operand = operand;
    m->rs = rs;
    m->cs = stride[t->rank - 1];
    return fg_check_unit_stride(op, what, m, *rows, t->shape[t->rank - 1]);
}

static fg_status same_dtype(const char *op, const fg_tensor *ref, const char *ref_name,
                            const fg_tensor *t, const char *name) {
    if (t->dtype != ref->dtype)
        return fg_fail(FG_ERR_DTYPE, "%s: %s.dtype=%s but %s.dtype=%s", op, name,
                       fg_dtype_name(t->dtype), ref_name, fg_dtype_name(ref->dtype));
    return FG_OK;
}

/* y-like tensor must have the leading dims of x-like tensor and last dim `last`. */
static fg_status same_leading(const char *op, const fg_tensor *ref, const char *ref_name,
                              const fg_tensor *t, const char *name, int64_t last) {
    char a[160], b[160];
    bool ok = t->rank == ref->rank && t->shape[t->rank - 1] == last;
    for (int i = 0; ok && i < ref->rank - 1; i++) ok = t->shape[i] == ref->shape[i];
    if (!ok)
        return fg_fail(FG_ERR_SHAPE, "%s: %s.shape=%s but %s.shape=%s needs %s of [..., %lld]", op,
                       name, fg_shape_str(t, a, sizeof a), ref_name, fg_shape_str(ref, b, sizeof b),
                       name, (long long)last);
    return FG_OK;
}

static fg_status check_weight(const char *op, const fg_tensor *w, int64_t m, int64_t k,
                              fg_mat *wm) {
    char a[160];
    if (w->shape[0] != m || w->shape[1] != k)
        return fg_fail(FG_ERR_SHAPE, "%s: w.shape=%s but it must be [%lld, %lld]", op,
                       fg_shape_str(w, a, sizeof a), (long long)m, (long long)k);
    int64_t stride[FG_MAX_RANK];
    fg_tensor_strides(w, stride);
    *wm = fg_mat_of(LF_W, stride, 0, 1);
    return fg_check_unit_stride(op, "w", wm, m, k);
}

static fg_gemm gemm_init(fg_dtype dtype, int64_t m, int64_t n, int64_t k, double beta) {
    fg_gemm g;
    memset(&g, 0, sizeof g);
    g.dtype = dtype;
    g.batch = 1;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = 1.0;
    g.beta = beta;
    g.bias_operand = -1;
    return g;
}

static fg_status lower_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "linear_forward";
    const fg_tensor *x = &d->operands[LF_X], *w = &d->operands[LF_W], *b = &d->operands[LF_B],
                    *y = &d->operands[LF_Y];
    FG_TRY(fg_check_desc(op, "x", x, 1, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "w", w, 2, 2));
    bool has_bias = b->rank != 0;
    if (has_bias) FG_TRY(fg_check_desc(op, "b", b, 1, 1));
    FG_TRY(fg_check_desc(op, "y", y, 1, FG_MAX_RANK));
    FG_TRY(same_dtype(op, x, "x", w, "w"));
    if (has_bias) FG_TRY(same_dtype(op, x, "x", b, "b"));
    FG_TRY(same_dtype(op, x, "x", y, "y"));
    if (d->accumulate) return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate must be 0", op);
    const int64_t k = x->shape[x->rank - 1], m = w->shape[0];
    if (w->shape[1] != k) {
        char a[160], c[160];
        return fg_fail(FG_ERR_SHAPE, "%s: w.shape[1]=%lld but x.shape[-1]=%lld (w %s, x %s)", op,
                       (long long)w->shape[1], (long long)k, fg_shape_str(w, a, sizeof a),
                       fg_shape_str(x, c, sizeof c));
    }
    fg_mat wm;
    FG_TRY(check_weight(op, w, m, k, &wm));
    if (has_bias && b->shape[0] != m)
        return fg_fail(FG_ERR_SHAPE, "%s: b.shape[0]=%lld but w.shape[0]=%lld", op,
                       (long long)b->shape[0], (long long)m);
    FG_TRY(same_leading(op, x, "x", y, "y", m));
    int64_t n, ny;
    fg_mat xm, ym;
    FG_TRY(rows_view(op, "x", x, LF_X, &n, &xm));
    FG_TRY(rows_view(op, "y", y, LF_Y, &ny, &ym));
    fg_gemm g = gemm_init(x->dtype, n, m, k, 0.0);
    g.a = xm;
    g.b = fg_mat_t(wm);
    g.c = ym;
    if (has_bias) {
        int64_t bstride[FG_MAX_RANK];
        fg_tensor_strides(b, bstride);
        g.bias_operand = LF_B;
        g.bias_rs = 0;
        g.bias_cs = bstride[0];
    }
    out->count = 1;
    out->gemm[0] = g;
    return FG_OK;
}

static fg_status lower_backward_input(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "linear_backward_input";
    const fg_tensor *dy = &d->operands[LBI_DY], *w = &d->operands[LBI_W], *dx = &d->operands[LBI_DX];
    FG_TRY(fg_check_desc(op, "dy", dy, 1, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "w", w, 2, 2));
    FG_TRY(fg_check_desc(op, "dx", dx, 1, FG_MAX_RANK));
    FG_TRY(same_dtype(op, dy, "dy", w, "w"));
    FG_TRY(same_dtype(op, dy, "dy", dx, "dx"));
    const int64_t m = dy->shape[dy->rank - 1], k = w->shape[1];
    if (w->shape[0] != m)
        return fg_fail(FG_ERR_SHAPE, "%s: w.shape[0]=%lld but dy.shape[-1]=%lld", op,
                       (long long)w->shape[0], (long long)m);
    fg_mat wm;
    FG_TRY(check_weight(op, w, m, k, &wm));
    wm.operand = LBI_W;
    FG_TRY(same_leading(op, dy, "dy", dx, "dx", k));
    int64_t n, n2;
    fg_mat dym, dxm;
    FG_TRY(rows_view(op, "dy", dy, LBI_DY, &n, &dym));
    FG_TRY(rows_view(op, "dx", dx, LBI_DX, &n2, &dxm));
    fg_gemm g = gemm_init(dy->dtype, n, k, m, d->accumulate ? 1.0 : 0.0);
    g.a = dym;
    g.b = wm;
    g.c = dxm;
    out->count = 1;
    out->gemm[0] = g;
    return FG_OK;
}

static fg_status lower_backward_weight(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "linear_backward_weight";
    const fg_tensor *dy = &d->operands[LBW_DY], *x = &d->operands[LBW_X], *dw = &d->operands[LBW_DW];
    FG_TRY(fg_check_desc(op, "dy", dy, 1, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "x", x, 1, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "dw", dw, 2, 2));
    FG_TRY(same_dtype(op, dy, "dy", x, "x"));
    FG_TRY(same_dtype(op, dy, "dy", dw, "dw"));
    const int64_t m = dy->shape[dy->rank - 1], k = x->shape[x->rank - 1];
    FG_TRY(same_leading(op, dy, "dy", x, "x", k));
    fg_mat dwm;
    {
        char a[160];
        if (dw->shape[0] != m || dw->shape[1] != k)
            return fg_fail(FG_ERR_SHAPE, "%s: dw.shape=%s but it must be [%lld, %lld]", op,
                           fg_shape_str(dw, a, sizeof a), (long long)m, (long long)k);
        int64_t stride[FG_MAX_RANK];
        fg_tensor_strides(dw, stride);
        dwm = fg_mat_of(LBW_DW, stride, 0, 1);
        FG_TRY(fg_check_unit_stride(op, "dw", &dwm, m, k));
    }
    int64_t n, n2;
    fg_mat dym, xm;
    FG_TRY(rows_view(op, "dy", dy, LBW_DY, &n, &dym));
    FG_TRY(rows_view(op, "x", x, LBW_X, &n2, &xm));
    fg_gemm g = gemm_init(dy->dtype, m, k, n, d->accumulate ? 1.0 : 0.0);
    g.a = fg_mat_t(dym);
    g.b = xm;
    g.c = dwm;
    out->count = 1;
    out->gemm[0] = g;
    return FG_OK;
}

static fg_status lower_backward_bias(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "linear_backward_bias";
    const fg_tensor *dy = &d->operands[LBB_DY], *db = &d->operands[LBB_DB];
    FG_TRY(fg_check_desc(op, "dy", dy, 1, FG_MAX_RANK));
    FG_TRY(fg_check_desc(op, "db", db, 1, 1));
    FG_TRY(same_dtype(op, dy, "dy", db, "db"));
    const int64_t m = dy->shape[dy->rank - 1];
    if (db->shape[0] != m)
        return fg_fail(FG_ERR_SHAPE, "%s: db.shape[0]=%lld but dy.shape[-1]=%lld", op,
                       (long long)db->shape[0], (long long)m);
    int64_t n;
    fg_mat dym;
    FG_TRY(rows_view(op, "dy", dy, LBB_DY, &n, &dym));
    int64_t stride[FG_MAX_RANK];
    fg_tensor_strides(db, stride);
    /* db[1×m] = ones[1×n] · dy[n×m] */
    fg_gemm g = gemm_init(dy->dtype, 1, m, n, d->accumulate ? 1.0 : 0.0);
    memset(&g.a, 0, sizeof g.a);
    g.a.operand = FG_OPERAND_ONES;
    g.a.rs = n;
    g.a.cs = 1;
    g.b = dym;
    memset(&g.c, 0, sizeof g.c);
    g.c.operand = LBB_DB;
    g.c.rs = m * stride[0];
    g.c.cs = stride[0];
    out->count = 1;
    out->gemm[0] = g;
    return FG_OK;
}

static const fg_op_decl ops[] = {
    {FG_OP_LINEAR_FORWARD, "linear_forward", 4,
     {[LF_X] = {"x", false, false}, [LF_W] = {"w", false, false}, [LF_B] = {"b", false, true},
      [LF_Y] = {"y", true, false}},
     0, NULL, 0, false, lower_forward},
    {FG_OP_LINEAR_BACKWARD_INPUT, "linear_backward_input", 3,
     {[LBI_DY] = {"dy", false, false}, [LBI_W] = {"w", false, false}, [LBI_DX] = {"dx", true, false}},
     0, NULL, 0, false, lower_backward_input},
    {FG_OP_LINEAR_BACKWARD_WEIGHT, "linear_backward_weight", 3,
     {[LBW_DY] = {"dy", false, false}, [LBW_X] = {"x", false, false}, [LBW_DW] = {"dw", true, false}},
     0, NULL, 0, false, lower_backward_weight},
    {FG_OP_LINEAR_BACKWARD_BIAS, "linear_backward_bias", 2,
     {[LBB_DY] = {"dy", false, false}, [LBB_DB] = {"db", true, false}},
     0, NULL, 0, false, lower_backward_bias},
};

const fg_family fg_family_linear = {"linear", sizeof ops / sizeof ops[0], ops};

fg_status fg_linear_forward(fg_context *ctx, const fg_tensor *x, const fg_tensor *w,
                            const fg_tensor *b, const fg_tensor *y) {
    const fg_tensor *args[] = {x, w, b, y};
    return fg_run_op(ctx, FG_OP_LINEAR_FORWARD, NULL, args, 4, 0, 0);
}

fg_status fg_linear_backward_input(fg_context *ctx, const fg_tensor *dy, const fg_tensor *w,
                                   const fg_tensor *dx, int accumulate) {
    const fg_tensor *args[] = {dy, w, dx};
    return fg_run_op(ctx, FG_OP_LINEAR_BACKWARD_INPUT, NULL, args, 3, accumulate, 0);
}

fg_status fg_linear_backward_weight(fg_context *ctx, const fg_tensor *dy, const fg_tensor *x,
                                    const fg_tensor *dw, int accumulate) {
    const fg_tensor *args[] = {dy, x, dw};
    return fg_run_op(ctx, FG_OP_LINEAR_BACKWARD_WEIGHT, NULL, args, 3, accumulate, 0);
}

fg_status fg_linear_backward_bias(fg_context *ctx, const fg_tensor *dy, const fg_tensor *db,
                                  int accumulate) {
    const fg_tensor *args[] = {dy, db};
    return fg_run_op(ctx, FG_OP_LINEAR_BACKWARD_BIAS, NULL, args, 2, accumulate, 0);
}

/*
 * outer.c — front door of the Outer family: z = x ⊗ y for vectors x [N], y [M], and
 * its backward kernels dx = dz·y and dy = dzᵀ·x. The forward lowers to a rank-1 GEMM,
 * each backward to a GEMV (own bandwidth-bound kernels on CUDA).
 */
#include "../core/internal.h"

#include <string.h>

enum { OF_X, OF_Y, OF_Z };
enum { OBI_DZ, OBI_Y, OBI_DX };
enum { OBO_DZ, OBO_X, OBO_DY };

static fg_status same_dtypes(const char *op, const fg_tensor *t, const char *const *names) {
    for (int i = 1; i < 3; i++)
        if (t[i].dtype != t[0].dtype)
            return fg_fail(FG_ERR_DTYPE, "%s: %s.dtype=%s but %s.dtype=%s", op, names[i],
                           fg_dtype_name(t[i].dtype), names[0], fg_dtype_name(t[0].dtype));
    return FG_OK;
}

static int64_t stride0(const fg_tensor *t) {
    int64_t s[FG_MAX_RANK];
    fg_tensor_strides(t, s);
    return s[0];
}

/* A vector as a column (n×1) or row (1×n) matrix. */
static fg_mat column(int operand, const fg_tensor *t) {
    fg_mat m;
    memset(&m, 0, sizeof m);
    m.operand = operand;
    m.rs = stride0(t);
    m.cs = 1;
    return m;
}

static fg_mat row(int operand, const fg_tensor *t) { return fg_mat_t(column(operand, t)); }

static fg_status matrix(const char *op, const char *what, const fg_tensor *t, int operand,
                        int64_t n, int64_t m, fg_mat *out) {
    char a[160];
    if (t->shape[0] != n || t->shape[1] != m)
        return fg_fail(FG_ERR_SHAPE, "%s: %s.shape=%s but it must be [%lld, %lld]", op, what,
                       fg_shape_str(t, a, sizeof a), (long long)n, (long long)m);
    int64_t s[FG_MAX_RANK];
    fg_tensor_strides(t, s);
    *out = fg_mat_of(operand, s, 0, 1);
    return fg_check_unit_stride(op, what, out, n, m);
}

static fg_status vec_len(const char *op, const char *what, const fg_tensor *t, int64_t n,
                         const char *src) {
    if (t->shape[0] != n)
        return fg_fail(FG_ERR_SHAPE, "%s: %s.shape[0]=%lld but %s=%lld", op, what,
                       (long long)t->shape[0], src, (long long)n);
    return FG_OK;
}

static void set_gemm(fg_lowered *out, const fg_tensor *t, int64_t m, int64_t n, int64_t k,
                     int accumulate, fg_mat a, fg_mat b, fg_mat c) {
    fg_gemm g;
    memset(&g, 0, sizeof g);
    g.dtype = t->dtype;
    g.batch = 1;
    g.m = m;
    g.n = n;
    g.k = k;
    g.alpha = 1.0;
    g.beta = accumulate ? 1.0 : 0.0;
    g.bias_operand = -1;
    g.a = a;
    g.b = b;
    g.c = c;
    out->count = 1;
    out->gemm[0] = g;
}

static fg_status lower_forward(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "outer_forward";
    static const char *const names[] = {"x", "y", "z"};
    const fg_tensor *t = d->operands;
    FG_TRY(fg_check_desc(op, "x", &t[OF_X], 1, 1));
    FG_TRY(fg_check_desc(op, "y", &t[OF_Y], 1, 1));
    FG_TRY(fg_check_desc(op, "z", &t[OF_Z], 2, 2));
    FG_TRY(same_dtypes(op, t, names));
    if (d->accumulate) return fg_fail(FG_ERR_INVALID_VALUE, "%s: accumulate must be 0", op);
    int64_t n = t[OF_X].shape[0], m = t[OF_Y].shape[0];
    fg_mat z;
    FG_TRY(matrix(op, "z", &t[OF_Z], OF_Z, n, m, &z));
    set_gemm(out, &t[0], n, m, 1, 0, column(OF_X, &t[OF_X]), row(OF_Y, &t[OF_Y]), z);
    return FG_OK;
}

static fg_status lower_backward_input(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "outer_backward_input";
    static const char *const names[] = {"dz", "y", "dx"};
    const fg_tensor *t = d->operands;
    FG_TRY(fg_check_desc(op, "dz", &t[OBI_DZ], 2, 2));
    FG_TRY(fg_check_desc(op, "y", &t[OBI_Y], 1, 1));
    FG_TRY(fg_check_desc(op, "dx", &t[OBI_DX], 1, 1));
    FG_TRY(same_dtypes(op, t, names));
    int64_t n = t[OBI_DZ].shape[0], m = t[OBI_DZ].shape[1];
    FG_TRY(vec_len(op, "y", &t[OBI_Y], m, "dz.shape[1]"));
    FG_TRY(vec_len(op, "dx", &t[OBI_DX], n, "dz.shape[0]"));
    fg_mat dz;
    FG_TRY(matrix(op, "dz", &t[OBI_DZ], OBI_DZ, n, m, &dz));
    /* dx[n×1] = dz[n×m] · y[m×1] */
    set_gemm(out, &t[0], n, 1, m, d->accumulate, dz, column(OBI_Y, &t[OBI_Y]),
             column(OBI_DX, &t[OBI_DX]));
    return FG_OK;
}

static fg_status lower_backward_other(const fg_plan_desc *d, fg_lowered *out) {
    const char *op = "outer_backward_other";
    static const char *const names[] = {"dz", "x", "dy"};
    const fg_tensor *t = d->operands;
    FG_TRY(fg_check_desc(op, "dz", &t[OBO_DZ], 2, 2));
    FG_TRY(fg_check_desc(op, "x", &t[OBO_X], 1, 1));
    FG_TRY(fg_check_desc(op, "dy", &t[OBO_DY], 1, 1));
    FG_TRY(same_dtypes(op, t, names));
    int64_t n = t[OBO_DZ].shape[0], m = t[OBO_DZ].shape[1];
    FG_TRY(vec_len(op, "x", &t[OBO_X], n, "dz.shape[0]"));
    FG_TRY(vec_len(op, "dy", &t[OBO_DY], m, "dz.shape[1]"));
    fg_mat dz;
    FG_TRY(matrix(op, "dz", &t[OBO_DZ], OBO_DZ, n, m, &dz));
    /* dy[1×m] = x[1×n] · dz[n×m] */
    set_gemm(out, &t[0], 1, m, n, d->accumulate, row(OBO_X, &t[OBO_X]), dz,
             row(OBO_DY, &t[OBO_DY]));
    return FG_OK;
}

static const fg_op_decl ops[] = {
    {FG_OP_OUTER_FORWARD, "outer_forward", 3,
     {[OF_X] = {"x", false, false}, [OF_Y] = {"y", false, false}, [OF_Z] = {"z", true, false}},
     0, NULL, 0, false, lower_forward},
    {FG_OP_OUTER_BACKWARD_INPUT, "outer_backward_input", 3,
     {[OBI_DZ] = {"dz", false, false}, [OBI_Y] = {"y", false, false}, [OBI_DX] = {"dx", true, false}},
     0, NULL, 0, false, lower_backward_input},
    {FG_OP_OUTER_BACKWARD_OTHER, "outer_backward_other", 3,
     {[OBO_DZ] = {"dz", false, false}, [OBO_X] = {"x", false, false}, [OBO_DY] = {"dy", true, false}},
     0, NULL, 0, false, lower_backward_other},
};

const fg_family fg_family_outer = {"outer", sizeof ops / sizeof ops[0], ops};

fg_status fg_outer_forward(fg_context *ctx, const fg_tensor *x, const fg_tensor *y,
                           const fg_tensor *z) {
    const fg_tensor *args[] = {x, y, z};
    return fg_run_op(ctx, FG_OP_OUTER_FORWARD, NULL, args, 3, 0, 0);
}

fg_status fg_outer_backward_input(fg_context *ctx, const fg_tensor *dz, const fg_tensor *y,
                                  const fg_tensor *dx, int accumulate) {
    const fg_tensor *args[] = {dz, y, dx};
    return fg_run_op(ctx, FG_OP_OUTER_BACKWARD_INPUT, NULL, args, 3, accumulate, 0);
}

fg_status fg_outer_backward_other(fg_context *ctx, const fg_tensor *dz, const fg_tensor *x,
                                  const fg_tensor *dy, int accumulate) {
    const fg_tensor *args[] = {dz, x, dy};
    return fg_run_op(ctx, FG_OP_OUTER_BACKWARD_OTHER, NULL, args, 3, accumulate, 0);
}
